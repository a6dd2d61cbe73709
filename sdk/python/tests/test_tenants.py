"""Tenants (airlock serve --tenants): each token sees only its own boxes,
another's box is 404 as a box that does not exist, and a quota is
enforced with a problem the SDK raises as AirlockError quota_exceeded."""

from __future__ import annotations

import pytest

import airlock

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_tenants(server_env: dict) -> None:
    url = server_env["AIRLOCK_TEST_URL"]
    alice = airlock.Client(airlock.Endpoint(url=url, token=server_env["AIRLOCK_TEST_TENANT_ALICE"]))
    bob = airlock.Client(airlock.Endpoint(url=url, token=server_env["AIRLOCK_TEST_TENANT_BOB"]))
    try:
        async with airlock.SimpleBox(network="none", name="mine", client=alice) as a, \
                airlock.SimpleBox(network="none", name="mine", client=bob) as b:
            assert (await a.exec("echo", "alice")).stdout == "alice\n"
            assert [x["id"] for x in (await alice.request("GET", "/v1/boxes"))["boxes"]] == [a.id]
            assert [x["id"] for x in (await bob.request("GET", "/v1/boxes"))["boxes"]] == [b.id]
            # Each tenant's name is its own.
            assert (await bob.request("GET", "/v1/boxes/mine"))["id"] == b.id
            # Alice's box does not exist for bob: the SDK sees box_not_found.
            other = airlock.SimpleBox.attach(a.id, client=bob)
            with pytest.raises(airlock.AirlockError) as ei:
                await other.exec("true")
            assert (ei.value.status, ei.value.code) == (404, "box_not_found")
            # Alice's quota: one box.
            with pytest.raises(airlock.AirlockError) as ei:
                async with airlock.SimpleBox(network="none", client=alice):
                    pass
            assert (ei.value.status, ei.value.code) == (403, "quota_exceeded")
            assert "tenant alice" in ei.value.detail and "max-boxes" in ei.value.detail
    finally:
        await alice.aclose()
        await bob.aclose()

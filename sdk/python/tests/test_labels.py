"""Box labels: given at creation, matched by GET /v1/boxes?label=."""

from __future__ import annotations

import httpx
import pytest

import airlock

from .conftest import TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_labels(server_env: dict) -> None:
    async with airlock.SimpleBox(network="none", labels={"suite": "labels", "tier": "gold"}) as box:
        await box.exec("true")
        url = server_env["AIRLOCK_TEST_URL"]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers) as c:
            got = (await c.get("/v1/boxes", params=[("label", "suite=labels"), ("label", "tier")])).json()["boxes"]
            assert [b["id"] for b in got] == [box.id]
            assert got[0]["labels"] == {"suite": "labels", "tier": "gold"}
            assert (await c.get("/v1/boxes", params={"label": "suite=other"})).json()["boxes"] == []

"""Secrets: a create request's spec (no server needed), and rotation against a real server."""

from __future__ import annotations

import pytest

import airlock


def test_secret_spec_and_repr() -> None:
    s = airlock.Secret(hosts=["api.example.com", "*.example.org"], value="sk-hidden")
    assert "sk-hidden" not in repr(s) and "api.example.com" in repr(s)
    box = airlock.SimpleBox(secrets={"TOKEN": s, "OTHER": {"value": "v2", "hosts": ("a.example",)}}, lease=0)
    assert box._spec["secrets"] == {
        "TOKEN": {"value": "sk-hidden", "hosts": ["api.example.com", "*.example.org"]},
        "OTHER": {"value": "v2", "hosts": ["a.example"]},
    }
    assert "secrets" not in airlock.SimpleBox(lease=0)._spec
    with pytest.raises(TypeError):
        airlock.SimpleBox(secrets={"X": "just-a-string"}, lease=0)  # type: ignore[dict-item]


@pytest.mark.asyncio(loop_scope="session")
async def test_set_secret_against_server(server_env: dict) -> None:
    """A box's secret is a placeholder in the box; set_secret rotates it,
    and refuses a secret the box lacks without echoing the value."""
    secret = airlock.Secret(hosts=["api.example.com"], value="sk-sdk-first")
    async with airlock.SimpleBox(secrets={"TOKEN": secret}) as box:
        r = await box.exec("sh", "-c", 'echo "$TOKEN"')
        assert r.stdout.startswith("airlock-secret-") and "sk-sdk" not in r.stdout
        await box.set_secret("TOKEN", "sk-sdk-rotated")
        with pytest.raises(airlock.AirlockError) as ei:
            await box.set_secret("OTHER", "sk-sdk-never-echoed")
        assert ei.value.status == 400 and "sk-sdk-never-echoed" not in str(ei.value)
        r2 = await box.exec("sh", "-c", 'echo "$TOKEN"')
        assert r2.stdout == r.stdout  # the placeholder stays

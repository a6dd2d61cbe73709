"""The SDK over TCP with a bearer token (AIRLOCK_URL / AIRLOCK_TOKEN)."""

from __future__ import annotations

import pytest

import airlock

from .conftest import TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_tcp_with_token(box: airlock.CodeBox, server_env: dict) -> None:
    url = server_env["AIRLOCK_TEST_URL"]
    client = airlock.Client(airlock.Endpoint(url=url, token=TOKEN))
    try:
        other = airlock.CodeBox.attach(box.id, client=client)
        r = await other.exec("sh", "-c", "echo tcp; exit 4")
        assert (r.exit_code, r.stdout) == (4, "tcp\n")
        async with other.stream("cat") as p:
            await p.write("over websocket\n")
            await p.close_stdin()
            chunks = [data async for _, data in p]
        assert (b"".join(chunks), p.exit_code) == (b"over websocket\n", 0)
    finally:
        await client.aclose()

    bad = airlock.Client(airlock.Endpoint(url=url, token="wrong"))
    try:
        with pytest.raises(airlock.AirlockError) as ei:
            await bad.request("GET", "/v1/boxes")
        assert ei.value.status == 401 and ei.value.code == "unauthorized"
    finally:
        await bad.aclose()

"""The SDK over TCP with a bearer token (AIRLOCK_URL / AIRLOCK_TOKEN)."""

from __future__ import annotations

from pathlib import Path

import pytest

import airlock

from .conftest import TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_tcp_with_token(box: airlock.CodeBox, server_env: dict, tmp_path: Path) -> None:
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
        # Files (httpx async) and tar streams (a blocking client in a thread) carry the token too.
        await other.write_file("/tmp/tcp/f.txt", "over tcp")
        assert await other.read_file("/tmp/tcp/f.txt") == b"over tcp"
        await other.copy_out("/tmp/tcp", tmp_path)
        assert (tmp_path / "tcp" / "f.txt").read_text() == "over tcp"
        await other.copy_in(tmp_path / "tcp" / "f.txt", "/tmp/tcp/g.txt")
        assert await other.read_file("/tmp/tcp/g.txt") == b"over tcp"
    finally:
        await client.aclose()

    bad = airlock.Client(airlock.Endpoint(url=url, token="wrong"))
    try:
        with pytest.raises(airlock.AirlockError) as ei:
            await bad.request("GET", "/v1/boxes")
        assert ei.value.status == 401 and ei.value.code == "unauthorized"
    finally:
        await bad.aclose()

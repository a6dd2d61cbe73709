"""The SDK against a real airlock serve and real boxes (see conftest.py)."""

from __future__ import annotations

import asyncio
import http.server
import io
import os
import socket
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import httpx
import pytest

import airlock

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_run_returns_stdout(box: airlock.CodeBox) -> None:
    assert await box.run("print('Hello from a microVM!')") == "Hello from a microVM!\n"
    # run() does not raise on a failure and returns stdout only (the seed's contract).
    assert await box.run("print('before'); raise ValueError('boom')") == "before\n"


async def test_exec_result(box: airlock.CodeBox) -> None:
    r = await box.exec("python3", "-c", "import sys; print('out'); sys.exit('bad')")
    assert (r.exit_code, r.stdout, r.stderr, r.error_message) == (1, "out\n", "bad\n", None)
    r = await box.exec("sh", "-c", 'echo "$A:$(pwd)"', env={"A": "x"}, cwd="/tmp")
    assert r.stdout == "x:/tmp\n"
    r = await box.exec("sh", "-c", r"printf '\377ok'")
    assert r.stdout_bytes == b"\xffok" and r.stdout == "\ufffdok"
    r = await box.exec("cat", stdin=b"\x00\x01data")
    assert r.stdout_bytes == b"\x00\x01data"


async def test_timeouts_enforced(box: airlock.CodeBox) -> None:
    t0 = time.monotonic()
    r = await box.exec("sleep", "30", timeout=0.5)
    assert r.timed_out and r.exit_code != 0 and r.error_message
    # Unlike the seed, run(timeout=) is enforced.
    out = await box.run("import time; print('start', flush=True); time.sleep(30)", timeout=0.5)
    assert out == "start\n"
    assert time.monotonic() - t0 < 20


async def test_context_keeps_state(box: airlock.CodeBox) -> None:
    async with await box.create_context() as ctx:
        r = await ctx.run("import math\nx = 41\nprint('hi')\nx + 1")
        assert (r.stdout, r.value, r.error) == ("hi\n", "42", None)
        r = await ctx.run("math.sqrt(x + 8)")
        assert r.value == "7.0"
        r = await ctx.run("x / 0")
        assert r.error is not None and r.error.name == "ZeroDivisionError"
        r = await ctx.run("while True: pass", timeout=0.5)
        assert r.timed_out
        assert (await ctx.run("x")).value == "41"


async def test_stream(box: airlock.CodeBox) -> None:
    async with box.stream("sh", "-c", "cat; echo err >&2; exit 5") as p:
        await p.write(b"streamed\n")
        await p.close_stdin()
        out, err = b"", b""
        async for fd, data in p:
            if fd == 1:
                out += data
            else:
                err += data
    assert (out, err, p.exit_code) == (b"streamed\n", b"err\n", 5)


def _wheel(name: str, version: str, module: str) -> bytes:
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": "VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return buf.getvalue()


async def test_install_package_from_local_index(server_env: dict) -> None:
    """install_package against a PEP 503 index on the host's loopback (the
    guest reaches it as 198.18.0.1 through the network helper's test-only
    internet mapping, see conftest), then run code that imports it."""
    whl_name = "airlock_demo_pkg-1.0-py3-none-any.whl"
    whl = _wheel("airlock_demo_pkg", "1.0", "airlock_demo_pkg")

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/simple/airlock-demo-pkg":
                body, ctype = f'<a href="/{whl_name}">{whl_name}</a>'.encode(), "text/html"
            elif self.path == "/" + whl_name:
                body, ctype = whl, "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://198.18.0.1:{srv.server_address[1]}/simple/"
        async with airlock.CodeBox(index_url=url) as cb:
            out = await cb.install_package("airlock-demo-pkg")
            assert "Successfully installed airlock-demo-pkg-1.0" in out or "Successfully installed airlock_demo_pkg-1.0" in out, out
            assert await cb.run("import airlock_demo_pkg; print(airlock_demo_pkg.VALUE)") == "42\n"
    finally:
        srv.shutdown()


async def test_startup_failure_is_runtime_error(server_env: dict) -> None:
    with pytest.raises(RuntimeError) as ei:
        async with airlock.CodeBox(image="localhost:1/no-such-image:latest") as cb:
            await cb.run("print(1)")
    assert isinstance(ei.value, airlock.AirlockError) and ei.value.code == "image_not_found"


async def test_concurrent_runs(box: airlock.CodeBox) -> None:
    outs = await asyncio.gather(*(box.run(f"print({i} * 2)") for i in range(8)))
    assert outs == [f"{i * 2}\n" for i in range(8)]


async def test_files(box: airlock.CodeBox) -> None:
    data = bytes(range(256)) * 100
    await box.write_file("/tmp/sdk/dir/blob.bin", data, mode=0o600)
    assert await box.read_file("/tmp/sdk/dir/blob.bin") == data
    r = await box.exec("stat", "-c", "%a %s", "/tmp/sdk/dir/blob.bin")
    assert r.stdout.strip() == f"600 {len(data)}"
    await box.write_file("/tmp/sdk/hello.py", "print('from a file')\n")
    assert await box.run("exec(open('/tmp/sdk/hello.py').read())") == "from a file\n"
    with pytest.raises(airlock.AirlockError):
        await box.read_file("/nonexistent")

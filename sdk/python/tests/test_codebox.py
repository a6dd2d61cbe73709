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
from .conftest import FAKE_DRIVER, needs_vm

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
    # 5 s: Python must start and print in the box first, which takes
    # seconds on a loaded machine under TCG.
    out = await box.run("import time; print('start', flush=True); time.sleep(30)", timeout=5)
    assert out == "start\n"
    assert time.monotonic() - t0 < 25


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


async def test_stream_tty_resize(box: airlock.CodeBox) -> None:
    out = b""
    async with box.stream("sh", "-c", "stty size; read x; stty size", tty=True, rows=30, cols=100) as p:
        resized = False
        async for fd, data in p:
            assert fd == 1
            out += data
            if not resized and b"30 100" in out:
                resized = True
                await p.resize(50, 132)
                await p.write(b"\n")
    assert b"30 100\r\n" in out and b"50 132\r\n" in out and p.exit_code == 0, out


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


@needs_vm("guest Python or network (pip would run on the host)")
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
    st = await box.stat("/tmp/sdk/dir/blob.bin")
    assert (st.type, st.size, st.mode, st.name) == ("file", len(data), 0o600, "blob.bin")
    await box.write_file("/tmp/sdk/hello.py", "print('from a file')\n")
    assert await box.run("exec(open('/tmp/sdk/hello.py').read())") == "from a file\n"
    assert [(e.name, e.type) for e in await box.list_dir("/tmp/sdk")] == [("dir", "dir"), ("hello.py", "file")]
    with pytest.raises(airlock.AirlockError) as ei:
        await box.read_file("/nonexistent")
    assert (ei.value.status, ei.value.code) == (404, "file_not_found")
    with pytest.raises(airlock.AirlockError) as ei:
        await box.read_file("/tmp/sdk")
    assert ei.value.code == "is_a_directory"
    with pytest.raises(airlock.AirlockError) as ei:
        await box.read_file("/tmp/sdk/dir/blob.bin", max_bytes=100)
    assert ei.value.code == "too_large"
    with pytest.raises(airlock.AirlockError) as ei:
        await box.write_file("/tmp/nodir/x", "x", parents=False)
    assert ei.value.code == "file_not_found"
    await box.mkdir("/tmp/sdk/a/b")
    assert (await box.stat("/tmp/sdk/a/b")).is_dir
    await box.remove("/tmp/sdk/a")
    assert not await box.exists("/tmp/sdk/a")


@needs_vm("files of its own (a fake box's /tmp is the host's, with what earlier runs left there)")
async def test_copy_in_out(box: airlock.CodeBox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "data.csv").write_text("a,b\n1,2\n")
    (src / "sub" / "big.bin").write_bytes(os.urandom(3 << 20))
    os.chmod(src / "data.csv", 0o640)
    (src / "link").symlink_to("data.csv")
    # Missing parents are made, as write_file makes them.
    await box.copy_in(src / "data.csv", "/tmp/cp-new/a/b/data.csv")
    assert await box.read_file("/tmp/cp-new/a/b/data.csv") == b"a,b\n1,2\n"
    # "dir/" names a directory: made, and the file goes into it (not a file named dir).
    await box.copy_in(src / "data.csv", "/tmp/cp-dir/x/")
    assert await box.read_file("/tmp/cp-dir/x/data.csv") == b"a,b\n1,2\n"
    # A directory to a missing path is created there (its parent too); a file into an existing directory keeps
    # its name.
    await box.copy_in(src, "/tmp/cp/tree")
    await box.copy_in(src / "data.csv", "/tmp/cp")
    r = await box.exec("sh", "-c", "cd /tmp/cp && stat -c '%n %a' tree/data.csv data.csv && readlink tree/link && sha256sum tree/sub/big.bin")
    assert r.stdout.splitlines()[:3] == ["tree/data.csv 640", "data.csv 640", "data.csv"], r.stdout + r.stderr
    out = tmp_path / "out"
    out.mkdir()
    await box.copy_out("/tmp/cp/tree", out)
    assert (out / "tree" / "data.csv").read_text() == "a,b\n1,2\n"
    assert (out / "tree" / "sub" / "big.bin").read_bytes() == (src / "sub" / "big.bin").read_bytes()
    assert os.readlink(out / "tree" / "link") == "data.csv"
    # To a missing host path: renamed, as docker cp does.
    await box.copy_out("/tmp/cp/data.csv", out / "renamed.csv")
    assert (out / "renamed.csv").read_text() == "a,b\n1,2\n"
    # A hostile tree in the box stays inside the destination.
    await box.exec("sh", "-c", "mkdir -p /tmp/evil && ln -sf /etc /tmp/evil/etc && ln -sf ../../.. /tmp/evil/up")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(Exception):
        await box.copy_out("/tmp/evil", dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "out", "src"]
    r = await box.exec("stat", "-c", "%u:%g", "/tmp/cp/data.csv")
    assert r.stdout.strip() == "0:0", "copied-in files belong to root, as with docker cp"
    with pytest.raises(airlock.AirlockError) as ei:
        await box.copy_out("/tmp/cp/tree", tmp_path / "bounded", max_bytes=1 << 20)
    assert ei.value.code == "too_large"
    with pytest.raises(airlock.AirlockError) as ei:
        await box.copy_out("/nonexistent", out)
    assert ei.value.code == "file_not_found"


async def test_host_volume_policy(server_env: dict, tmp_path: Path) -> None:
    # Outside the granted directory: 403, no box.
    with pytest.raises(airlock.AirlockError) as ei:
        await airlock.SimpleBox(network="none", volumes=[(str(tmp_path), "/data", "ro")]).start()
    assert (ei.value.status, ei.value.code) == (403, "policy_denied") and "--allow-volume" in ei.value.detail
    if FAKE_DRIVER:
        pytest.skip("the gateway's nodes run the fake VM driver, which attaches no volumes (TestKubeGatewaySDKSuite)")
    shared = Path(server_env["AIRLOCK_TEST_VOLUMES"]) / "share"
    shared.mkdir()
    (shared / "in.txt").write_text("from the host")
    async with airlock.SimpleBox(network="none", volumes=[f"{shared}:/data"]) as b:
        assert (await b.read_file("/data/in.txt")) == b"from the host"
        await b.write_file("/data/out.txt", "from the box")
    assert (shared / "out.txt").read_text() == "from the box"


@pytest.mark.asyncio(loop_scope="session")
async def test_events_ordered_and_resumable(server_env: dict) -> None:
    """Client.events: a box's transitions in order, numbered; since=SEQ
    resumes after it."""
    client = airlock.Client()
    sb = airlock.SimpleBox()
    await sb.start()
    r = await sb.exec("sh", "-c", "exit 3")
    assert r.exit_code == 3
    box_id = sb.id
    await sb.stop()

    async def of_box(since: int) -> list:
        out = []

        async def collect() -> None:
            async for ev in client.events(since=since):
                if ev.get("box_id") == box_id:
                    out.append(ev)
                    if ev["type"] == "box.removed":
                        return

        await asyncio.wait_for(collect(), 60)
        return out

    evs = await of_box(0)
    assert [e["type"] for e in evs] == ["box.created", "box.started", "exec.started", "exec.ended", "box.removed"]
    assert [e["seq"] for e in evs] == sorted(e["seq"] for e in evs) and len({e["seq"] for e in evs}) == 5
    assert evs[3]["exit_code"] == 3 and evs[2]["exec_id"] == evs[3]["exec_id"]
    assert [e["seq"] for e in await of_box(evs[1]["seq"])] == [e["seq"] for e in evs[2:]]

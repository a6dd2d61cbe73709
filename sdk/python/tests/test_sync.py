"""Blocking API and server autostart (no event loop in these tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import airlock

from .conftest import EXTERNAL, server_client


@pytest.mark.skipif(EXTERNAL, reason="a fork's children through airlock gateway have no code contexts (each is restored on the "
                    "parent's node from a snapshot, and that node keeps the contexts of the parent only); docs/kubernetes.md")
def test_sync_codebox(server_env: dict) -> None:
    with airlock.SyncCodeBox() as cb:
        assert cb.run("print(6 * 7)") == "42\n"
        assert cb.exec("sh", "-c", "exit 3").exit_code == 3
        ctx = cb.create_context()
        ctx.run("y = 2")
        assert ctx.run("y * 21").value == "42"
        cb.write_file("/tmp/s/x.txt", "sync")
        assert cb.read_file("/tmp/s/x.txt") == b"sync" and cb.stat("/tmp/s/x.txt").size == 4
        assert [e.name for e in cb.list_dir("/tmp/s")] == ["x.txt"]
        box_id = cb.id
        # A fork child is a SyncCodeBox with the context's twin and the file.
        (kid,) = cb.fork()
        with kid:
            assert type(kid) is airlock.SyncCodeBox and kid.id not in (None, box_id)
            twin = kid.context(ctx.id)
            assert twin.id == ctx.id and twin.run("y * 21").value == "42"
            twin.run("y = 0")
            assert kid.read_file("/tmp/s/x.txt") == b"sync"
            kid_id = kid.id
        assert ctx.run("y").value == "2", "the child's context is its own"
    with server_client() as c:
        assert c.get(f"/v1/boxes/{box_id}").status_code == 404, "box not removed on exit"
        assert c.get(f"/v1/boxes/{kid_id}").status_code == 404, "fork child not removed on exit"
    with airlock.SyncClient() as sc:
        with pytest.raises(airlock.AirlockError) as ei:
            sc.snapshot("no-such-snapshot")
        assert (ei.value.status, ei.value.code) == (404, "snapshot_not_found")
        assert "no-such-snapshot" not in [s.name for s in sc.snapshots()]


def test_autostart_and_idle_exit(server_env: dict, tmp_path: Path) -> None:
    """With no server on the socket, the SDK starts `airlock serve`, which
    exits by itself once idle."""
    sock = Path(f"/tmp/airlock-auto-{os.getpid()}.sock")  # short: unix socket paths are limited
    env = dict(server_env, AIRLOCK_SOCKET=str(sock), AIRLOCK_HOME=str(tmp_path / "home"), AIRLOCK_SERVE_IDLE_EXIT="1s")
    code = (
        "import asyncio, airlock\n"
        "async def main():\n"
        "    c = airlock.Client()\n"
        "    print((await c.request('GET', '/v1/version'))['api_version'])\n"
        "    await c.aclose()\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1.0.0"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(str(sock))
        except OSError:
            break
        finally:
            s.close()
        time.sleep(0.2)
    else:
        pytest.fail("server started by the SDK did not exit when idle")
    assert not sock.exists(), "socket left behind"


def test_lease_removes_box_of_crashed_process(server_env: dict) -> None:
    """A process that dies without closing its box leaves it behind only
    for its lease."""
    code = (
        "import asyncio, os, airlock\n"
        "async def main():\n"
        "    box = airlock.CodeBox(lease=1.5)\n"
        "    await box.start()\n"
        "    print(box.id, flush=True)\n"
        "    await asyncio.sleep(2.5)  # the renewer keeps it past its lease\n"
        "    r = await box.exec('true')\n"
        "    print(r.exit_code, flush=True)\n"
        "    os._exit(0)  # a crash: no stop(), no renewals from now on\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=server_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    box_id, code_line = out.stdout.split()
    assert code_line == "0", "box lapsed while its lease was being renewed"
    with server_client() as c:
        deadline = time.monotonic() + 15
        while c.get(f"/v1/boxes/{box_id}").status_code == 200:
            assert time.monotonic() < deadline, "box of a crashed process still there past its lease"
            time.sleep(0.2)

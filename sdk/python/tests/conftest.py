"""Fixtures: one real `airlock serve` (booting real boxes) and one shared
CodeBox for the whole session, to keep VM time small.

The airlock binary is $AIRLOCK_BIN, else built from this checkout with go
(with the guest agent beside it). Boxes use the image store of the user
($AIRLOCK_IMAGES, else ~/.airlock/images, filled by hack/setup.sh) and a
temporary airlock home.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio

import airlock

REPO = Path(__file__).resolve().parents[3]

#: The bearer token of the test server's TCP listener.
TOKEN = "test-token"

#: TestKubeGatewaySDKSuite: the server is an airlock gateway whose nodes run
#: the fake VM driver, whose boxes run the host's own commands: no guest
#: kernel, image files, volumes or guest network traffic.
FAKE_DRIVER = os.environ.get("AIRLOCK_TEST_FAKE_DRIVER") == "1"


def needs_vm(what: str) -> pytest.MarkDecorator:
    """Skips a test on the fake driver, naming what it lacks."""
    return pytest.mark.skipif(FAKE_DRIVER, reason=f"the gateway's nodes run the fake VM driver, which has no {what} "
                              "(TestKubeGatewaySDKSuite; with real VMs this test applies)")


#: The server is not one this suite started (AIRLOCK_TEST_EXTERNAL=1): there
#: is no unix socket or airlock home of its own.
EXTERNAL = os.environ.get("AIRLOCK_TEST_EXTERNAL") == "1"


def _build(tmp: Path) -> Path:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = dict(os.environ)
    subprocess.run([go, "build", "-o", str(tmp / "airlock"), "./cmd/airlock"], cwd=REPO, check=True, env=env)
    env["CGO_ENABLED"] = "0"
    subprocess.run([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp / "airlock-agent"), "./cmd/airlock-agent"],
                   cwd=REPO, check=True, env=env)
    # The network helper, beside airlock (where it looks first).
    subprocess.run([go, "build", "-o", str(tmp / "airlock-net"), "./cmd/airlock-net"], cwd=REPO, check=True, env=env)
    return tmp / "airlock"


@pytest.fixture(scope="session")
def airlock_bin() -> Iterator[Path]:
    if os.environ.get("AIRLOCK_BIN"):
        yield Path(os.environ["AIRLOCK_BIN"])
        return
    with tempfile.TemporaryDirectory(prefix="airlock-sdk-bin-") as d:
        yield _build(Path(d))


@pytest.fixture(scope="session")
def server_env(airlock_bin: Path) -> Iterator[dict]:
    """Starts `airlock serve` on a socket in a temporary home; sets
    AIRLOCK_SOCKET for the SDK (and for example subprocesses).

    With AIRLOCK_TEST_EXTERNAL=1, the tests use the server of AIRLOCK_URL
    and AIRLOCK_TOKEN instead (an airlock gateway: TestKubeGatewaySDKSuite),
    whose tenants' tokens are AIRLOCK_TEST_TENANT_ALICE and _BOB."""
    if os.environ.get("AIRLOCK_TEST_EXTERNAL") == "1":
        # Host volumes: the directory the nodes grant (AIRLOCK_TEST_VOLUMES).
        yield dict(os.environ, AIRLOCK_TEST_URL=os.environ["AIRLOCK_URL"], AIRLOCK_BIN=str(airlock_bin),
                   AIRLOCK_TEST_VOLUMES=os.environ.get("AIRLOCK_TEST_VOLUMES") or tempfile.mkdtemp(prefix="airlock-sdk-volumes-"))
        return
    tmp = Path(tempfile.mkdtemp(prefix="airlock-sdk-"))
    images = os.environ.get("AIRLOCK_IMAGES") or str(Path.home() / ".airlock" / "images")
    sock = tmp / "a.sock"
    # TEST-ONLY: boxes reach 198.18.0.N as the host's 127.0.0.N, standing in
    # for the internet (a box's network denies the host itself).
    env = dict(os.environ, AIRLOCK_HOME=str(tmp / "home"), AIRLOCK_IMAGES=images, AIRLOCK_SOCKET=str(sock),
               AIRLOCK_NET_TEST_INTERNET="198.18.0.0/24")
    env.pop("AIRLOCK_URL", None)
    log = open(tmp / "serve.log", "wb")
    # Host volumes only under tmp/volumes (the tests check both sides).
    (tmp / "volumes").mkdir()
    env["AIRLOCK_TEST_VOLUMES"] = str(tmp / "volumes")
    # Published ports only on free ports of 127.0.0.1 (host_port 0). Pulls
    # from loopback are granted: the start-failure test names an image on a
    # loopback registry that refuses the connection.
    # Two tenants (test_tenants): alice may keep one box, bob has no quota.
    tenants = tmp / "tenants.json"
    for name, quota in (("alice", ["--max-boxes", "1"]), ("bob", [])):
        out = subprocess.run([str(airlock_bin), "tenant", "add", name, "--file", str(tenants), *quota],
                             env=env, check=True, capture_output=True, text=True).stdout
        env["AIRLOCK_TEST_TENANT_" + name.upper()] = out.strip()
    proc = subprocess.Popen([str(airlock_bin), "serve", "--socket", str(sock), "--listen", "127.0.0.1:0",
                             "--token", TOKEN, "--allow-volume", str(tmp / "volumes"), "--allow-publish", "127.0.0.1:0",
                             "--allow-private-net", "--allow-import-state", "--tenants", str(tenants)],
                            env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://airlock") as c:
        while True:
            try:
                if c.get("/v1/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("airlock serve did not start: " + (tmp / "serve.log").read_text())
            time.sleep(0.05)
    m = re.search(r"tcp=(127\.0\.0\.1:\d+)", (tmp / "serve.log").read_text())
    assert m, "serve did not log its TCP address"
    env["AIRLOCK_TEST_URL"] = "http://" + m.group(1)
    old = {k: os.environ.get(k) for k in ("AIRLOCK_SOCKET", "AIRLOCK_HOME", "AIRLOCK_IMAGES", "AIRLOCK_URL")}
    os.environ.update(AIRLOCK_SOCKET=str(sock), AIRLOCK_HOME=env["AIRLOCK_HOME"], AIRLOCK_IMAGES=images)
    os.environ.pop("AIRLOCK_URL", None)
    env["AIRLOCK_BIN"] = str(airlock_bin)
    yield env
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    # Boxes a failed test left behind.
    subprocess.run([str(airlock_bin), "rm", "-f", *_ids(airlock_bin, env)], env=env, capture_output=True)
    shutil.rmtree(tmp, ignore_errors=True)


def server_client() -> httpx.Client:
    """A client of the test server's API: its unix socket, or (external)
    AIRLOCK_URL with AIRLOCK_TOKEN."""
    if EXTERNAL:
        return httpx.Client(base_url=os.environ["AIRLOCK_URL"],
                            headers={"Authorization": "Bearer " + os.environ["AIRLOCK_TOKEN"]})
    return httpx.Client(transport=httpx.HTTPTransport(uds=os.environ["AIRLOCK_SOCKET"]), base_url="http://airlock")


def _ids(airlock_bin: Path, env: dict) -> list:
    out = subprocess.run([str(airlock_bin), "ls", "-q"], env=env, capture_output=True, text=True).stdout
    return out.split()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def box(server_env: dict) -> AsyncIterator[airlock.CodeBox]:
    """One CodeBox shared by the tests that need a box but not their own. It
    publishes its port 8000 on a free port of the host's 127.0.0.1
    (test_ports)."""
    async with airlock.CodeBox(ports=[8000]) as cb:
        yield cb

"""BoxLite's Python API with BoxLite's spelling (``import airlock as
boxlite``) against the test server: the runtime (async and sync), box
options, the box handle and its executions, SimpleBox's BoxLite options and
the REST client options. Programs in BoxLite's published examples' style run
as scripts. The image is python:slim (the only image on this offline
machine; BoxLite's examples name alpine:latest and python:alpine)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import airlock as boxlite

from .conftest import EXTERNAL, FAKE_DRIVER, TOKEN

IMAGE = "python:slim"


def run_program(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


# --- No server needed: argument checks and what airlock lacks -------------


def test_box_info_idle_settings() -> None:
    """BoxInfo carries the box's idle settings from airlock's box JSON
    (idle_action absent means remove), and none without an idle timeout."""
    d = {"id": "abc", "state": "stopped", "suspended": True, "idle_timeout": 90.0, "idle_deadline": "2026-12-07T19:00:00Z"}
    info = boxlite.BoxInfo._of(d)
    assert (info.idle_timeout, info.idle_action, info.idle_deadline) == (90.0, "remove", "2026-12-07T19:00:00Z")
    info = boxlite.BoxInfo._of(dict(d, idle_action="suspend"))
    assert (info.idle_timeout, info.idle_action) == (90.0, "suspend")
    info = boxlite.BoxInfo._of({"id": "abc", "state": "running"})
    assert (info.idle_timeout, info.idle_action) == (None, None)



def test_box_options_map_to_airlock_spec() -> None:
    o = boxlite.BoxOptions(image=IMAGE, cpus=2, memory_mib=512, disk_size_gb=2, working_dir="/tmp",
                           env=[("USER", "alice"), ("PROJECT", "p")], volumes=[("/srv/data", "/data", True)],
                           ports=[(8080, 80), (0, 53, "udp", "127.0.0.1"), {"guest_port": 9000}],
                           network=boxlite.NetworkSpec("enabled", allow_net=["api.example.com"]), user="1000:1000")
    spec = o._spec("job")
    assert spec == {
        "image": IMAGE, "name": "job", "cpus": 2, "memory_mib": 512, "disk_size_mib": 2048, "working_dir": "/tmp",
        "user": "1000:1000", "env": ["USER=alice", "PROJECT=p"],
        "volumes": [{"source": "/srv/data", "target": "/data", "read_only": True}],
        "ports": [{"host_port": 8080, "guest_port": 80}, {"host_port": 0, "guest_port": 53, "protocol": "udp", "host_ip": "127.0.0.1"},
                  {"host_port": 0, "guest_port": 9000}],
        "network": "allowlist", "allow_net": ["api.example.com"], "auto_remove": True, "lease": boxlite.DEFAULT_LEASE,
    }
    # BoxLite's defaults: auto_remove, not detached; detach drops the lease.
    spec = boxlite.BoxOptions(env={"A": "1"}, auto_remove=False, detach=True, network=boxlite.NetworkSpec("disabled"))._spec(None)
    assert spec == {"image": "python:slim", "env": ["A=1"], "auto_remove": False, "network": "none"}
    assert boxlite.BoxOptions(network=boxlite.NetworkSpec("enabled"))._spec(None)["network"] == "public"


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"cpus": "2"}, TypeError, "cpus must be an int"),
    ({"cpus": 0}, ValueError, "cpus=0"),
    ({"memory_mib": True}, TypeError, "memory_mib must be an int"),
    ({"image": 3}, TypeError, "image must be a str"),
    ({"env": "USER=alice"}, TypeError, "env must be"),
    ({"env": [("USER", 1)]}, TypeError, "env[0]"),
    ({"env": [("A=B", "c")]}, ValueError, "env[0]"),
    ({"env": ["NOEQUALS"]}, ValueError, "env[0]"),
    ({"volumes": [("/a",)]}, ValueError, "volume"),
    ({"volumes": [42]}, TypeError, "volumes[0]"),
    ({"ports": [{"guest_port": "80"}]}, TypeError, "ports[0].guest_port"),
    ({"ports": [{"guest_port": 70000}]}, ValueError, "ports[0].guest_port"),
    ({"ports": [(80, 80, "sctp")]}, ValueError, "ports[0]: the protocol"),
    ({"network": "enabled"}, TypeError, "network must be a NetworkSpec"),
    ({"auto_remove": "yes"}, TypeError, "auto_remove must be a bool"),
    ({"entrypoint": "sh"}, TypeError, "entrypoint must be a list"),
])
def test_box_options_checked_before_sending(kwargs: dict, exc: type, words: str) -> None:
    with pytest.raises(exc) as ei:
        boxlite.BoxOptions(**kwargs)
    assert words in str(ei.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"rootfs_path": "/oci"}, "airlock image import"),
    ({"entrypoint": ["dockerd"]}, "box.exec"),
    ({"cmd": ["--flag"]}, "box.exec"),
    ({"secrets": [boxlite.Secret(name="openai", value="sk-x", hosts=["api.openai.com"])]}, 'secrets={"OPENAI_API_KEY"'),
    ({"advanced": object()}, "policy flags"),
])
def test_box_options_without_equivalent(kwargs: dict, words: str) -> None:
    with pytest.raises(NotImplementedError) as ei:
        boxlite.BoxOptions(image=IMAGE, **kwargs)._spec(None)
    assert "no equivalent in airlock" in str(ei.value) and words in str(ei.value)


# BoxLite's package exports (boxlite-ai/boxlite sdks/python/boxlite/__init__.py
# __all__, and boxlite.sync_api's): each name imports from airlock.
BOXLITE_NAMES = """AccessToken ApiKeyCredential Box BoxInfo Boxlite BoxliteRestOptions BoxMetrics BoxOptions BoxStateInfo
CloneOptions CopyOptions CopyOutOutcome CopyOutPair ExecStderr ExecStdout Execution ExportOptions HealthCheckOptions
ImageHandle ImageInfo ImagePullResult HealthState HealthStatus NetworkSpec ImageRegistry Options RuntimeMetrics Secret
SecurityOptions SnapshotHandle SnapshotInfo SnapshotOptions Credential SimpleBox CodeBox ExecResult BoxliteError ExecError
TimeoutError ParseError BrowserBox BrowserBoxOptions ComputerBox InteractiveBox SkillBox BoxRuntime ManagedBox BoxGroup
SyncBoxlite SyncBox SyncImageHandle SyncExecution SyncExecStdout SyncExecStderr SyncSimpleBox SyncCodeBox
SyncSkillBox""".split()

# Those airlock has no equivalent of: constructing one says what to use.
WITHOUT_EQUIVALENT = {
    "CloneOptions": "clone_box()", "CopyOutOutcome": "copy_out",
    "CopyOutPair": "copy_out", "ExportOptions": "airlock export", "HealthCheckOptions": "unhealthy",
    "ImageHandle": "airlock images", "ImageInfo": "airlock images", "ImagePullResult": "airlock pull",
    "HealthState": "unhealthy", "HealthStatus": "unhealthy", "SecurityOptions": "policy flags",
    "SnapshotHandle": "snapshot(name)", "SnapshotInfo": "airlock.Snapshot", "SnapshotOptions": "snapshot(name)",
    "BrowserBox": "SimpleBox", "BrowserBoxOptions": "SimpleBox", "ComputerBox": "SimpleBox",
    "InteractiveBox": "SimpleBox.stream", "SkillBox": "CodeBox", "BoxRuntime": "publish a port",
    "ManagedBox": "SimpleBox", "BoxGroup": "SimpleBox", "SyncImageHandle": "airlock images", "SyncSkillBox": "SyncCodeBox",
}


def test_boxlite_public_names() -> None:
    import airlock.sync_api as sync_api

    missing = [n for n in BOXLITE_NAMES if not hasattr(boxlite, n)]
    assert missing == [], f"BoxLite names airlock lacks: {missing}"
    for n in ("SyncBoxlite", "SyncBox", "SyncExecution", "SyncSimpleBox", "SyncCodeBox", "SyncImageHandle", "SyncSkillBox"):
        assert hasattr(sync_api, n), n
    for n, words in WITHOUT_EQUIVALENT.items():
        with pytest.raises(NotImplementedError) as ei:
            getattr(boxlite, n)()
        assert "no equivalent in airlock" in str(ei.value) and words in str(ei.value), (n, str(ei.value))
    # BoxLite's errors: BoxliteError subclasses, with BoxLite's fields.
    e = boxlite.ExecError("ls /nope", 2, "No such file")
    assert isinstance(e, boxlite.BoxliteError) and (e.command, e.exit_code, e.stderr) == ("ls /nope", 2, "No such file")
    assert "exit code 2" in str(e)
    for cls, code in ((boxlite.TimeoutError, "timeout"), (boxlite.ParseError, "parse_error")):
        assert issubclass(cls, boxlite.BoxliteError) and cls("x").code == code
    assert boxlite.TimeoutError is not TimeoutError  # Python's own is untouched
    # Credential: ApiKeyCredential is one, and the REST options take any.
    assert isinstance(boxlite.ApiKeyCredential("k"), boxlite.Credential)

    class Token(boxlite.Credential):
        def get_token(self) -> boxlite.AccessToken:
            return boxlite.AccessToken("t")

    assert boxlite.BoxliteRestOptions("http://127.0.0.1:1", credential=Token()).credential.get_token().token == "t"
    # airlock's secrets through BoxOptions: {NAME: Secret(hosts, value)}.
    spec = boxlite.BoxOptions(secrets={"API_KEY": boxlite.Secret(hosts=["api.example.com"], value="v")})._spec(None)
    assert spec["secrets"] == {"API_KEY": {"value": "v", "hosts": ["api.example.com"]}}
    with pytest.raises(NotImplementedError, match="OPENAI_API_KEY"):
        boxlite.SimpleBox(image=IMAGE, secrets=[boxlite.Secret(name="openai", value="v", hosts=["api.openai.com"])])


def test_simplebox_checks_and_unsupported() -> None:
    with pytest.raises(TypeError, match="memory_mib must be an int"):
        boxlite.SimpleBox(image=IMAGE, memory_mib="512")
    with pytest.raises(TypeError, match="reuse_existing must be a bool"):
        boxlite.SimpleBox(image=IMAGE, reuse_existing="yes")
    with pytest.raises(TypeError, match=r"env\[0\]"):
        boxlite.SimpleBox(image=IMAGE, env=[("USER", None)])
    with pytest.raises(NotImplementedError, match="rootfs_path"):
        boxlite.SimpleBox(rootfs_path="/oci")
    with pytest.raises(NotImplementedError, match="entrypoint"):
        boxlite.SimpleBox(image=IMAGE, entrypoint=["sh"])
    with pytest.raises(TypeError, match="runtime must be a Boxlite"):
        boxlite.SimpleBox(image=IMAGE, runtime=object())
    sb = boxlite.SimpleBox(image=IMAGE, env=[("USER", "alice")], network=boxlite.NetworkSpec("enabled", ["a.example"]),
                           volumes=[("/srv/d", "/d", True)], ports=[(0, 53, "udp")], disk_size_gb=2)
    assert {k: sb._spec[k] for k in ("env", "network", "allow_net", "volumes", "ports", "disk_size_mib")} == {
        "env": ["USER=alice"], "network": "allowlist", "allow_net": ["a.example"],
        "volumes": [{"source": "/srv/d", "target": "/d", "read_only": True}],
        "ports": [{"host_port": 0, "guest_port": 53, "protocol": "udp"}], "disk_size_mib": 2048}


def test_rest_options(monkeypatch: pytest.MonkeyPatch) -> None:
    assert boxlite.RestOptions is boxlite.BoxliteRestOptions
    monkeypatch.delenv("BOXLITE_REST_URL", raising=False)
    monkeypatch.delenv("AIRLOCK_URL", raising=False)
    with pytest.raises(ValueError, match="BOXLITE_REST_URL not set"):
        boxlite.RestOptions.from_env()
    monkeypatch.setenv("BOXLITE_REST_URL", "http://127.0.0.1:8100/")
    monkeypatch.setenv("BOXLITE_API_KEY", "k1")
    o = boxlite.RestOptions.from_env()
    assert o.url == "http://127.0.0.1:8100" and o.credential.get_token().token == "k1" and o.prefix is None
    assert "k1" not in repr(o) and "k1" not in repr(o.credential)
    with pytest.raises(ValueError, match="url="):
        boxlite.BoxliteRestOptions(url="localhost:8100")
    with pytest.raises(TypeError, match="credential must be an ApiKeyCredential"):
        boxlite.BoxliteRestOptions(url="http://h:1", credential="k")
    with pytest.raises(NotImplementedError, match="one airlock serve per tenant"):
        boxlite.Boxlite.rest(boxlite.BoxliteRestOptions(url="http://h:1", prefix="/v1/demo"))
    with pytest.raises(NotImplementedError, match="airlock login"):
        boxlite.Boxlite(boxlite.Options(image_registries=[boxlite.ImageRegistry("ghcr.io")]))
    with pytest.raises(TypeError, match="options must be an Options"):
        boxlite.Boxlite("opts")  # type: ignore[arg-type]
    for cls, words in ((boxlite.BrowserBox, "ports="), (boxlite.InteractiveBox, "tty=True"),
                       (boxlite.ComputerBox, "xdotool"), (boxlite.SkillBox, "CodeBox")):
        with pytest.raises(NotImplementedError, match=words):
            cls()


@pytest.mark.asyncio(loop_scope="session")
async def test_runtime_calls_without_equivalent(server_env: dict) -> None:
    rt = boxlite.Boxlite.default()
    assert rt is boxlite.Boxlite.default()
    with pytest.raises(NotImplementedError, match="airlock import FILE"):
        await rt.import_box("/tmp/x.boxlite")
    with pytest.raises(NotImplementedError, match="airlock images"):
        rt.images
    with pytest.raises(TypeError, match="options must be a BoxOptions"):
        await rt.create({"image": IMAGE})  # type: ignore[arg-type]


# --- Against the server ------------------------------------------------------


async def _lines(stream: "boxlite.ExecStdout") -> list:
    return [line async for line in stream]


@pytest.mark.asyncio(loop_scope="session")
async def test_runtime_box_and_executions(server_env: dict, tmp_path: Path) -> None:
    """runtime.create/get/get_info/list_info/remove/metrics, and the box
    handle: exec with args and env pairs, stdout()/stderr() streams, wait,
    kill, info, copy_in/copy_out, stop (kept with auto_remove=False) and a
    restart by exec, clone_box."""
    runtime = boxlite.Boxlite.default()
    name = "bl-runtime"
    box = await runtime.create(boxlite.BoxOptions(image=IMAGE, cpus=1, memory_mib=512, auto_remove=False,
                                                  working_dir="/tmp", env=[("USER", "alice"), ("PROJECT", "boxlite")]),
                               name=name)
    try:
        assert box.name == name and len(box.id) >= 12
        assert box.created is True, "runtime.create made this box"
        info = box.info()
        assert (info.id, info.name, info.image, info.cpus, info.memory_mib) == (box.id, name, IMAGE, 1, 512)
        assert info.state.status == "running" and info.state.running and info.created_at
        # Not detached: a lease the SDK renews, shown with its deadline; no ttl or idle timeout.
        assert info.lease_until and info.lease_until == info.raw["lease_until"], info.raw
        assert info.expires_at is None and info.idle_deadline is None
        assert (await box.info()).id == box.id  # awaitable too, as in BoxLite's clone example

        ex = await box.exec("sh", ["-c", "echo 'to stdout'; echo 'to stderr' >&2; echo 'more stdout'; pwd; "
                                         "echo $USER $PROJECT $CUSTOM"], [("CUSTOM", "value")])
        assert ex.id and ex.id() == str(ex.id)
        out = await _lines(ex.stdout())
        err = await _lines(ex.stderr())
        assert out == ["to stdout\n", "more stdout\n", "/tmp\n", "alice boxlite value\n"]
        assert err == ["to stderr\n"]
        assert (await ex.wait()).exit_code == 0
        with pytest.raises(RuntimeError, match="single use"):
            ex.stdout()

        ex = await box.exec("sh", ["-c", "exit 42"])
        r = await ex.wait()
        assert r.exit_code == 42 and r.error_message is None

        ex = await box.exec("sh", ["-c", "sleep 100; echo done"])
        await asyncio.sleep(0.3)
        await ex.kill()
        r = await asyncio.wait_for(ex.wait(), 20)
        assert r.exit_code in (128 + 15, 128 + 9) and await _lines(ex.stdout()) == [], "killed by a signal"

        # stdin, as BoxLite's Execution.stdin()
        ex = await box.exec("cat")
        stdin = ex.stdin()
        await stdin.send_input(b"piped\n")
        await stdin.close()
        assert await _lines(ex.stdout()) == ["piped\n"] and (await ex.wait()).exit_code == 0

        src = tmp_path / "in.txt"
        src.write_text("host data")
        await box.copy_in(str(src), "/root/in.txt")
        ex = await box.exec("cat", ["/root/in.txt"])
        assert await _lines(ex.stdout()) == ["host data"]
        await box.copy_out("/root/in.txt", str(tmp_path / "out.txt"))
        assert (tmp_path / "out.txt").read_text() == "host data"
        with pytest.raises(NotImplementedError, match="docker cp"):
            await box.copy_in(str(src), "/root/x", boxlite.CopyOptions(follow_symlinks=True))

        got = await runtime.get(name)
        assert got is not None and got.id == box.id and got.created is False
        again, made = await runtime.get_or_create(boxlite.BoxOptions(image=IMAGE), name=name)
        assert (again.id, made, again.created) == (box.id, False, False)
        assert await runtime.get("no-such-box") is None
        assert await runtime.get_info("no-such-box") is None
        assert box.id in [i.id for i in await runtime.list_info()]
        with pytest.raises(boxlite.BoxliteError) as ei:
            await runtime.remove(box.id, force=False)
        assert ei.value.status == 409, "a running box is not removed without force"

        # A box paused in memory refuses an exec at once, as a problem
        # (box_paused), not as the WebSocket library's refused upgrade.
        await box._client.request("POST", f"/v1/boxes/{box.id}/pause", json={})
        try:
            with pytest.raises(boxlite.BoxliteError) as ei:
                await asyncio.wait_for(box.exec("true"), 20)
            assert (ei.value.status, ei.value.code) == (409, "box_paused"), ei.value
        finally:
            await box._client.request("POST", f"/v1/boxes/{box.id}/resume")

        m = await runtime.metrics()
        assert m.num_running_boxes >= 1 and m.total_commands_executed >= 1 and m.boxes_created_total >= 1
        # box.metrics(): BoxLite's BoxMetrics, read on the server's host
        # (GET /v1/boxes/{id}/stats, what `airlock stats` shows).
        bm = await box.metrics()
        assert isinstance(bm, boxlite.BoxMetrics)
        assert bm.memory_limit_bytes == 512 << 20 and 0 < bm.memory_bytes and bm.cpu_percent >= 0, bm
        assert bm.cpu_seconds > 0 and bm.disk_bytes >= 0 and bm.paused is False and bm.raw["id"] == box.id, bm
        assert bm.network_bytes_sent is not None and bm.network_bytes_received is not None, "a public network counts"
        assert bm.commands_executed_total is None and bm.stage_box_spawn_ms is None, "no per-box counters: None, not 0"
        with pytest.raises(NotImplementedError, match="airlock export"):
            await box.export(dest=str(tmp_path))
        with pytest.raises(NotImplementedError, match="fork names no child"):
            await box.clone_box(name="copy")

        # clone_box: a running copy (airlock's fork), independent of the box.
        await (await box.exec("sh", ["-c", "echo source-data > /root/marker.txt"])).wait()
        clone = await box.clone_box()
        try:
            assert clone.id != box.id and clone.created is True
            ex = await clone.exec("cat", ["/root/marker.txt"])
            assert await _lines(ex.stdout()) == ["source-data\n"]
            await (await clone.exec("sh", ["-c", "echo clone-data > /root/marker.txt"])).wait()
            ex = await box.exec("cat", ["/root/marker.txt"])
            if not FAKE_DRIVER:  # the fake driver's boxes share the host's files
                assert await _lines(ex.stdout()) == ["source-data\n"]
        finally:
            await runtime.remove(clone.id, force=True)

        # stop keeps an auto_remove=False box; exec starts it again.
        await box.stop()
        assert (await runtime.get_info(box.id)).state.status == "stopped"
        again = await runtime.get(box.id)
        ex = await again.exec("cat", ["/root/in.txt"])
        assert await _lines(ex.stdout()) == ["host data"], "the writable layer survives a stop"
        assert (await ex.wait()).exit_code == 0
        assert again.info().state.running
    finally:
        await runtime.remove(box.id, force=True)
    assert await runtime.get_info(box.id) is None


@pytest.mark.asyncio(loop_scope="session")
async def test_auto_remove_default_and_context(server_env: dict) -> None:
    """BoxLite's default auto_remove: stop (here on leaving ``async with``)
    removes the box."""
    runtime = boxlite.Boxlite.default()
    async with await runtime.create(boxlite.BoxOptions(image=IMAGE)) as box:
        ex = await box.exec("echo", ["Hello from context manager"])
        assert await _lines(ex.stdout()) == ["Hello from context manager\n"]
        box_id = box.id
    assert await runtime.get_info(box_id) is None


@pytest.mark.asyncio(loop_scope="session")
async def test_simplebox_boxlite_options(server_env: dict) -> None:
    """SimpleBox(env=[pairs], working_dir), reuse_existing by name (created
    True then False, the same box), info(), auto_remove=False keeps the box
    on stop, and runtime= picks the server."""
    rt = boxlite.Boxlite.default()
    async with boxlite.SimpleBox(image=IMAGE, name="bl-reuse", reuse_existing=True, working_dir="/tmp",
                                 env=[("USER", "alice"), ("PROJECT", "data-pipeline")], auto_remove=False,
                                 runtime=rt) as box1:
        assert box1.created is True
        r = await box1.exec("sh", "-c", "pwd; echo $USER $PROJECT; echo hello > /tmp/marker")
        assert r.stdout == "/tmp\nalice data-pipeline\n" and r.exit_code == 0
        assert box1.info().name == "bl-reuse"
        m = await box1.metrics()
        assert isinstance(m, boxlite.BoxMetrics) and m.memory_bytes > 0 and m.raw["name"] == "bl-reuse", m
        async with boxlite.SimpleBox(image=IMAGE, name="bl-reuse", reuse_existing=True, auto_remove=False) as box2:
            assert box2.created is False and box2.id == box1.id
            assert (await box2.exec("cat", "/tmp/marker")).stdout == "hello\n"
        # box2's exit stopped the box and kept it (auto_remove=False)
        assert (await rt.get_info("bl-reuse")).state.status == "stopped"
    async with boxlite.SimpleBox(image=IMAGE, name="bl-reuse", reuse_existing=True) as box3:
        assert box3.created is False, "a stopped box is reused (and started)"
        assert (await box3.exec("cat", "/tmp/marker")).stdout == "hello\n"
    assert await rt.get_info("bl-reuse") is None, "auto_remove (the default) removes it on exit"


def test_rest_runtime(server_env: dict) -> None:
    """Boxlite.rest over the server's TCP listener with its token; a wrong
    token is refused."""
    url = server_env["AIRLOCK_TEST_URL"]

    async def main() -> None:
        rt = boxlite.Boxlite.rest(boxlite.BoxliteRestOptions(url=url, credential=boxlite.ApiKeyCredential(TOKEN)))
        box = await rt.create(boxlite.BoxOptions(image=IMAGE, auto_remove=False), name="bl-rest")
        try:
            await box.start()
            ex = await box.exec("sh", args=["-c", "echo GREETING=$GREETING"], env=[("GREETING", "hello-from-rest")])
            assert await _lines(ex.stdout()) == ["GREETING=hello-from-rest\n"]
            assert "bl-rest" in [i.name for i in await rt.list_info()]
        finally:
            await rt.remove(box.id, force=True)
        bad = boxlite.Boxlite.rest(boxlite.BoxliteRestOptions(url=url, credential=boxlite.ApiKeyCredential("wrong")))
        with pytest.raises(boxlite.BoxliteError) as ei:
            await bad.list_info()
        assert ei.value.status == 401

    asyncio.run(main())


def test_sync_runtime(server_env: dict) -> None:
    """SyncBoxlite with BoxLite's spelling: create, exec, iterate stdout and
    stderr, wait, kill, stop; start()/stop() without ``with``."""
    with boxlite.SyncBoxlite.default() as runtime:
        box = runtime.create(boxlite.BoxOptions(image=IMAGE, env=[("USER", "alice")]), name="bl-sync")
        ex = box.exec("sh", ["-c", "echo out; echo err >&2; echo $USER $FOO"], [("FOO", "bar")])
        assert list(ex.stdout()) == ["out\n", "alice bar\n"] and list(ex.stderr()) == ["err\n"]
        assert ex.wait().exit_code == 0
        ex = box.exec("sh", ["-c", "sleep 100"])
        ex.kill()
        assert ex.wait().exit_code in (128 + 15, 128 + 9)
        assert runtime.get_info("bl-sync").state.running
        assert runtime.metrics().total_commands_executed >= 1
        assert box.created is True and box.metrics().memory_bytes > 0
        box.stop()
        assert runtime.get_info("bl-sync") is None
    rt = boxlite.SyncBoxlite.default().start()
    try:
        assert isinstance(rt.list_info(), list)
    finally:
        rt.stop()
    from airlock.sync_api import SyncBoxlite
    assert SyncBoxlite is boxlite.SyncBoxlite


# --- Programs in the style of BoxLite's examples, run as scripts --------------

GETTING_STARTED = """
import asyncio
import airlock as boxlite

async def main():
    async with boxlite.SimpleBox(image="python:slim") as box:
        result = await box.exec("sh", "-c", 'echo "to stdout" && echo "to stderr" >&2')
        print(f"Exit code: {result.exit_code}")
        print(f"Stdout: '{result.stdout.strip()}'")
        print(f"Stderr: '{result.stderr.strip()}'")
        result = await box.exec("env", env={"FOO": "bar", "BAZ": "qux"})
        print(sorted(l for l in result.stdout.split("\\n") if l.startswith(("FOO=", "BAZ="))))
        result = await box.exec("false")
        print(f"false: {result.exit_code}")

    async with boxlite.SimpleBox(image="python:slim", working_dir="/tmp",
                                 env=[("USER", "alice"), ("PROJECT", "data-pipeline")]) as box:
        print((await box.exec("pwd")).stdout.strip())
        env = (await box.exec("env")).stdout.split("\\n")
        print(sorted(l for l in env if l.startswith(("USER=", "PROJECT="))))

    runtime = boxlite.Boxlite.default()
    box = await runtime.create(boxlite.BoxOptions(image="python:slim"), name="listed")
    boxes = await runtime.list_info()
    print([(b.name, b.state.status, b.image) for b in boxes if b.name == "listed"])
    await box.stop()
    print(await runtime.get_info("listed"))

asyncio.run(main())
"""


def test_getting_started_program(server_env: dict) -> None:
    out = run_program(GETTING_STARTED, server_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "Exit code: 0", "Stdout: 'to stdout'", "Stderr: 'to stderr'", "['BAZ=qux', 'FOO=bar']", "false: 1",
        "/tmp", "['PROJECT=data-pipeline', 'USER=alice']", "[('listed', 'running', 'python:slim')]", "None",
    ]


LIFECYCLE = """
import asyncio
import airlock as boxlite

async def main():
    runtime = boxlite.Boxlite.default()
    box = await runtime.create(boxlite.BoxOptions(image="python:slim", cpus=2, memory_mib=512, auto_remove=False))
    box_id = box.id
    execution = await box.exec("sh", ["-c", "echo 'persistent data' > /root/test.txt"])
    await execution.wait()
    print(f"before stop: {box.info().state}")
    await box.stop()
    info = await runtime.get_info(box_id)
    print(f"after stop: {info.state}")
    restarted = await runtime.get(box_id)
    execution = await restarted.exec("cat", ["/root/test.txt"])
    async for line in execution.stdout():
        print(f"  {line.strip()}")
    result = await execution.wait()
    print(f"exit code: {result.exit_code}")
    try:
        await runtime.remove(box_id, force=False)
        print("Unexpected: Remove succeeded")
    except Exception:
        print("remove refused: running")
    await runtime.remove(box_id, force=True)
    print(f"removed: {await runtime.get_info(box_id) is None}")
    try:
        await runtime.remove("non-existent-id", force=False)
    except Exception as e:
        print(f"error: {e.code}")
    print(f"get missing: {await runtime.get('non-existent-id')}")

asyncio.run(main())
"""


def test_lifecycle_program(server_env: dict) -> None:
    out = run_program(LIFECYCLE, server_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "before stop: running", "after stop: stopped", "  persistent data", "exit code: 0",
        "remove refused: running", "removed: True", "error: box_not_found", "get missing: None",
    ]


REST = """
import asyncio
from airlock import Boxlite, BoxOptions, RestOptions

async def main():
    rt = Boxlite.rest(RestOptions.from_env())
    box = await rt.create(BoxOptions(image="python:slim", auto_remove=False), name="exec-demo")
    await box.start()
    execution = await box.exec("sh", args=["-c", "for i in 1 2 3; do echo \\"line $i\\"; done"])
    count = 0
    async for line in execution.stdout():
        count += 1
        print(f"[{count}] {line.strip()}")
    await execution.wait()
    execution = await box.exec("sh", args=["-c", "exit 42"])
    result = await execution.wait()
    print(f"exit_code: {result.exit_code}")
    print(f"listed: {'exec-demo' in [b.name for b in await rt.list_info()]}")
    await rt.remove(box.id, force=True)

asyncio.run(main())
"""


def test_rest_program(server_env: dict) -> None:
    env = dict(server_env, BOXLITE_REST_URL=server_env["AIRLOCK_TEST_URL"], BOXLITE_API_KEY=TOKEN)
    out = run_program(REST, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[1] line 1", "[2] line 2", "[3] line 3", "exit_code: 42", "listed: True"]


SYNC = """
import airlock as boxlite
from airlock import SyncBoxlite

with SyncBoxlite.default() as runtime:
    box = runtime.create(boxlite.BoxOptions(image="python:slim"))
    execution = box.exec("echo", ["Hello from default runtime"])
    for line in execution.stdout():
        print(line.strip())
    print(f"exit: {execution.wait().exit_code}")
    box.stop()

with boxlite.SyncSimpleBox(image="python:slim", env=[("USER", "alice")]) as box:
    print(box.exec("sh", "-c", "echo $USER").stdout.strip())
"""


def test_sync_program(server_env: dict) -> None:
    out = run_program(SYNC, server_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["Hello from default runtime", "exit: 0", "alice"]


CUSTOM_HOME = """
import asyncio, sys
import airlock as boxlite

async def main():
    runtime = boxlite.Boxlite(boxlite.Options(home_dir=sys.argv[1]))
    box = await runtime.create(boxlite.BoxOptions(image="python:slim"), name="in-custom-home")
    execution = await box.exec("echo", ["Hello from a custom home"])
    async for line in execution.stdout():
        print(line.strip())
    print([i.name for i in await runtime.list_info()])
    await runtime.remove(box.id, force=True)

asyncio.run(main())
"""


@pytest.mark.skipif(EXTERNAL, reason="Boxlite(Options(home_dir=H)) starts a local airlock serve of home H on this host: "
                    "a test of the SDK's local server, not of the server under test")
def test_custom_home_runtime(server_env: dict) -> None:
    """Boxlite(Options(home_dir=H)) uses (here: starts) the server of home
    H, which has only its own boxes; it exits once idle."""
    home = Path(f"/tmp/airlock-bl-home-{os.getpid()}")  # short: unix socket paths are limited
    env = dict(server_env, AIRLOCK_SERVE_IDLE_EXIT="1s")
    box = boxlite.Boxlite.default()
    try:
        out = subprocess.run([sys.executable, "-c", CUSTOM_HOME, str(home)], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["Hello from a custom home", "['in-custom-home']"]
        assert (home / "serve.log").exists(), "the server was started with the custom home"
        assert "in-custom-home" not in [i.name for i in asyncio.run(box.list_info())], "created in the custom home only"
        sock = home / "airlock.sock"
        deadline = time.monotonic() + 20
        while sock.exists():
            assert time.monotonic() < deadline, "the server started for the custom home did not exit when idle"
            time.sleep(0.2)
    finally:
        shutil.rmtree(home, ignore_errors=True)

"""E2B's own SDKs (e2b, e2b-code-interpreter, unchanged) against
`airlock serve --e2b`: TestE2BSDK (e2b_vm_test.go) starts the server on
loopback, sets E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, and runs this
file with the Python of sdk/python/.venv.

One sandbox (a box) serves every test, in file order; the last kills it.
"""

from __future__ import annotations

import datetime
import os
import shlex
import time

import pytest
from e2b import (
    ALL_TRAFFIC,
    CommandExitException,
    NotFoundException,
    Sandbox as BaseSandbox,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b_code_interpreter import Sandbox

HAS_DATA = os.environ.get("AIRLOCK_E2B_DATA_IMAGE") == "1"
NODE_IMAGE = os.environ.get("AIRLOCK_E2B_NODE_IMAGE")  # an image with node
# HOST:PORT of a server on the host's loopback that boxes reach as an
# internet address (TestE2BSDK's stand-in; nothing leaves the host).
PROBE = os.environ["AIRLOCK_E2B_NET_PROBE"]
PROBE_HOST = PROBE.rsplit(":", 1)[0]
# A second such server, at another address of the stand-in internet.
PROBE2 = os.environ["AIRLOCK_E2B_NET_PROBE2"]
PROBE2_HOST = PROBE2.rsplit(":", 1)[0]
PROBE_PY = """import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
try:
    print(socket.create_connection((host, int(port)), timeout=20).recv(64).decode())
except OSError as e:
    print("denied:", type(e).__name__)
"""


@pytest.fixture(scope="module")
def sb():
    s = Sandbox.create(metadata={"suite": "e2b", "run": "1"}, timeout=300)
    yield s
    try:
        s.kill()
    except Exception:
        pass


# --- control plane -------------------------------------------------------


def test_info_and_list_by_metadata(sb):
    info = Sandbox.get_info(sb.sandbox_id)
    assert info.sandbox_id == sb.sandbox_id
    assert info.metadata == {"suite": "e2b", "run": "1"}
    assert info.template_id == "code-interpreter-v1"
    assert info.state == SandboxState.RUNNING

    ids = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b"})).next_items()]
    assert ids == [sb.sandbox_id]
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": "other"})).next_items() == []
    paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    assert sb.sandbox_id not in [s.sandbox_id for s in paused]


def test_set_timeout_moves_the_end(sb):
    sb.set_timeout(1200)
    end = Sandbox.get_info(sb.sandbox_id).end_at
    left = (end - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    assert 1100 < left <= 1200, left


def test_metrics(sb):
    (m,) = sb.get_metrics()
    assert m.cpu_count >= 1 and 0 <= m.cpu_used_pct <= 100
    assert 0 < m.mem_used < m.mem_total and 0 < m.disk_used < m.disk_total
    assert abs((m.timestamp - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) < 600


def test_connect(sb):
    again = Sandbox.connect(sb.sandbox_id)
    assert again.commands.run("echo connected").stdout == "connected\n"


def test_envd_needs_the_access_token(sb):
    import httpx

    # Every sandbox is secure (the SDKs no longer send secure): the SDK
    # sends the envdAccessToken of create and connect as X-Access-Token,
    # and envd refuses a request without it.
    url, envd = os.environ["E2B_SANDBOX_URL"], {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983"}
    assert sb._envd_access_token
    assert httpx.get(url + "/health", headers=envd).status_code == 401
    assert httpx.get(url + "/health", headers={**envd, "X-Access-Token": "e2b_" + "0" * 32}).status_code == 401
    assert httpx.get(url + "/health", headers={**envd, "X-Access-Token": sb._envd_access_token}).status_code == 204


def test_unknown_sandbox_is_not_found():
    with pytest.raises(NotFoundException):
        Sandbox.get_info("nosuchbox0000")


def test_wrong_key_is_refused():
    from e2b import AuthenticationException

    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_0000000000000000").next_items()


# --- network and lifecycle ----------------------------------------------


def reach(s, probe=PROBE):
    """What the probe's server answers the sandbox ("reachable"), or why not."""
    return s.commands.run(f"python3 -c {shlex.quote(PROBE_PY)} {probe}").stdout.strip()


def test_update_network(sb):
    sb.update_network({"deny_out": [ALL_TRAFFIC]})
    assert reach(sb).startswith("denied")
    assert Sandbox.get_info(sb.sandbox_id).network == {"deny_out": [ALL_TRAFFIC]}
    # allow_out takes precedence over deny_out, as in E2B.
    sb.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": [PROBE_HOST]})
    assert reach(sb) == "reachable"
    # An update replaces the rules: without any, the sandbox reaches the internet again.
    sb.update_network({})
    assert Sandbox.get_info(sb.sandbox_id).network is None
    assert reach(sb) == "reachable"


def test_deny_out_of_some_addresses(sb):
    # A denylist: the sandbox reaches everything but what deny_out lists,
    # and allow_out makes exceptions to it (IPs and CIDRs).
    sb.update_network({"deny_out": [PROBE2_HOST]})
    assert reach(sb, PROBE2).startswith("denied")
    assert reach(sb) == "reachable"
    assert Sandbox.get_info(sb.sandbox_id).network == {"deny_out": [PROBE2_HOST]}
    subnet = PROBE_HOST.rsplit(".", 1)[0] + ".0/24"  # both probes' /24
    sb.update_network({"deny_out": [subnet], "allow_out": [PROBE_HOST]})
    assert reach(sb) == "reachable"
    assert reach(sb, PROBE2).startswith("denied")
    with pytest.raises(Exception, match="domain"):
        sb.update_network({"deny_out": [subnet], "allow_out": ["example.com"]})
    sb.update_network({})
    assert reach(sb, PROBE2) == "reachable"
    # The same at create: the box's network starts with the denylist.
    with Sandbox.create("base", timeout=120, network={"deny_out": [PROBE2_HOST]}) as s:
        assert s.get_info().network == {"deny_out": [PROBE2_HOST]}
        assert reach(s, PROBE2).startswith("denied")
        assert reach(s) == "reachable"


def test_no_internet_and_auto_pause():
    # Another sandbox (the default template): no internet, and its timeout
    # pauses it instead of killing it (airlock's idle suspend).
    s = Sandbox.create("base", timeout=120, allow_internet_access=False, lifecycle={"on_timeout": "pause"}, metadata={"suite": "e2b-lifecycle"})
    try:
        info = s.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": False}
        assert info.allow_internet_access is False
        assert reach(s).startswith("denied")
        s.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": [PROBE_HOST]})
        assert reach(s) == "reachable"
        s.files.write("kept.txt", "through the pause")
        s.run_code("v = 7")
        s.set_timeout(1)  # paused once a second passes without a call
        deadline = time.monotonic() + 120
        while BaseSandbox.get_info(s.sandbox_id).state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "the sandbox was not paused at its timeout"
            time.sleep(0.5)
        # Not killed: without auto_resume a call does not wake it, connect does.
        with pytest.raises(Exception):
            s.commands.run("true")
        again = Sandbox.connect(s.sandbox_id, timeout=120)
        assert BaseSandbox.get_info(s.sandbox_id).state == SandboxState.RUNNING
        assert again.files.read("kept.txt") == "through the pause"
        assert again.run_code("v").text == "7"  # the interpreter too, unlike pause()
        assert again.get_info().network == {"allow_out": [PROBE_HOST], "deny_out": [ALL_TRAFFIC]}
    finally:
        s.kill()


# --- commands ------------------------------------------------------------


def test_run_foreground(sb):
    r = sb.commands.run("echo out; echo err >&2; id -un; pwd")
    assert r.exit_code == 0
    assert r.stdout == "out\nuser\n/home/user\n"
    assert r.stderr == "err\n"
    root = sb.commands.run("id -u; pwd", user="root")
    assert root.stdout == "0\n/root\n"


def test_run_envs_and_cwd(sb):
    r = sb.commands.run("echo $GREETING; pwd", envs={"GREETING": "hello"}, cwd="/tmp")
    assert r.stdout == "hello\n/tmp\n"


def test_run_nonzero_exit(sb):
    with pytest.raises(CommandExitException) as e:
        sb.commands.run("echo partial; echo bad >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "partial\n"
    assert e.value.stderr == "bad\n"


def test_run_streams_output(sb):
    seen = []
    sb.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", on_stdout=seen.append)
    assert "".join(seen) == "line1\nline2\nline3\n"


def test_run_timeout(sb):
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sb.commands.run("sleep 30", timeout=2)
    assert time.monotonic() - t0 < 20


def test_background_list_kill(sb):
    h = sb.commands.run("sleep 60", background=True)
    assert h.pid in [p.pid for p in sb.commands.list()]
    assert sb.commands.kill(h.pid)
    with pytest.raises(CommandExitException):
        h.wait()
    assert h.pid not in [p.pid for p in sb.commands.list()]


def test_stdin(sb):
    h = sb.commands.run("cat", background=True, stdin=True)
    sb.commands.send_stdin(h.pid, "to cat\n")
    sb.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "to cat\n"


def test_connect_to_a_process(sb):
    h = sb.commands.run("sleep 1; echo late", background=True)
    h.disconnect()
    again = sb.commands.connect(h.pid)
    assert again.wait().stdout == "late\n"


# --- files ---------------------------------------------------------------


def test_files_write_read_list(sb):
    info = sb.files.write("notes/a.txt", "alpha")
    assert info.path == "/home/user/notes/a.txt"
    assert sb.files.read("notes/a.txt") == "alpha"
    assert sb.files.read("/home/user/notes/a.txt", format="bytes") == bytearray(b"alpha")
    owner = sb.commands.run("stat -c %U /home/user/notes/a.txt").stdout.strip()
    assert owner == "user"
    sb.files.write_files([{"path": "notes/b.bin", "data": b"\x00\x01"}, {"path": "/tmp/c.txt", "data": "c"}])
    assert sb.files.read("notes/b.bin", format="bytes") == bytearray(b"\x00\x01")
    assert sb.files.read("/tmp/c.txt") == "c"
    names = sorted(e.name for e in sb.files.list("notes"))
    assert names == ["a.txt", "b.bin"]
    deep = sorted(e.path for e in sb.files.list("/home/user", depth=2) if e.path.startswith("/home/user/notes"))
    assert deep == ["/home/user/notes", "/home/user/notes/a.txt", "/home/user/notes/b.bin"]


def test_files_stat_dirs_rename_remove(sb):
    assert sb.files.make_dir("d1/d2")
    assert not sb.files.make_dir("d1/d2")
    info = sb.files.get_info("d1/d2")
    assert info.type.value == "dir"
    sb.files.write("d1/x.txt", "x")
    moved = sb.files.rename("d1/x.txt", "d1/y.txt")
    assert moved.path == "/home/user/d1/y.txt"
    assert not sb.files.exists("d1/x.txt")
    assert sb.files.exists("d1/y.txt")
    sb.files.remove("d1")
    assert not sb.files.exists("d1")
    with pytest.raises(NotFoundException):
        sb.files.read("d1/y.txt")


def test_signed_urls(sb):
    import httpx

    # The SDK signs with the sandbox's access token (every airlock
    # sandbox is secure); the URLs carry no token and no E2B headers.
    up = sb.upload_url("signed/up.txt", use_signature_expiration=600)
    r = httpx.post(up, files={"file": ("up.txt", b"through a signed url")})
    assert r.status_code == 200, r.text
    assert sb.files.read("signed/up.txt") == "through a signed url"
    down = sb.download_url("signed/up.txt")
    assert httpx.get(down).content == b"through a signed url"
    assert "through" in httpx.get(sb.download_url("signed/up.txt", use_signature_expiration=600)).text
    wrong = down.replace("signature=v1_", "signature=v1_x")
    assert httpx.get(wrong).status_code == 401
    assert httpx.post(down, files={"file": ("up.txt", b"x")}).status_code == 401  # a read's signature
    expired = httpx.get(sb.download_url("signed/up.txt", use_signature_expiration=-60))
    assert expired.status_code == 401 and "expired" in expired.text


def events_until(h, want, seconds=60):
    """Polls the watcher until every (type, name) of want came (bounded)."""
    got = set()
    deadline = time.monotonic() + seconds
    while not want <= got and time.monotonic() < deadline:
        got |= {(e.type.value, e.name) for e in h.get_new_events()}
        if not want <= got:
            time.sleep(0.1)
    assert want <= got, (want - got, got)
    return got


def test_watch_dir(sb):
    d = "/home/user/watched"
    sb.files.make_dir(d)
    h = sb.files.watch_dir(d, recursive=True)
    sb.files.write(d + "/a.txt", "one")
    sb.commands.run(f"echo two >> {d}/a.txt && mv {d}/a.txt {d}/b.txt && mkdir {d}/sub && rm {d}/b.txt")
    events_until(h, {("create", "a.txt"), ("write", "a.txt"), ("rename", "a.txt"), ("create", "b.txt"), ("remove", "b.txt"), ("create", "sub")})
    # Once its creation is reported, a new subdirectory is watched too.
    sb.files.write(d + "/sub/c.txt", "deep")
    events_until(h, {("create", "sub/c.txt")})
    h.stop()
    with pytest.raises(Exception):
        h.get_new_events()
    with pytest.raises(Exception):
        sb.files.watch_dir(d + "/nope")


# --- code interpreter ----------------------------------------------------


def test_run_code_keeps_state(sb):
    sb.run_code("x = 41")
    ex = sb.run_code("print('hi'); x + 1")
    assert ex.logs.stdout == ["hi\n"]
    assert ex.text == "42"
    assert ex.error is None


def test_run_code_error(sb):
    ex = sb.run_code("def f():\n    return 1/0\nf()")
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    assert "f()" in ex.error.traceback


def test_run_code_stdout_callback_and_envs(sb):
    got = []
    sb.run_code("import os; print(os.environ.get('ONLY_HERE'))", envs={"ONLY_HERE": "yes"}, on_stdout=lambda m: got.append(m.line))
    assert got == ["yes\n"]
    assert sb.run_code("import os; print(os.environ.get('ONLY_HERE'))").logs.stdout == ["None\n"]


# A cell waits for a file (up to 60 s) that the callbacks write once they
# have seen its first stdout and stderr lines: the cell ends only if they
# came while it ran. The results and the error come through theirs too.
STREAMING_CELL = """import os, sys, time
print("first")
print("oops", file=sys.stderr)
for _ in range(600):
    if os.path.exists("/tmp/e2b-stream-gate"): break
    time.sleep(0.1)
else:
    raise TimeoutError("the callbacks never saw the first lines")
print("second")
6 * 7
"""


def test_run_code_streams_to_callbacks(sb):
    seen, results, errors = {"out": [], "err": []}, [], []

    def saw(kind, m):
        seen[kind].append(m.line)
        if seen["out"][:1] == ["first\n"] and seen["err"][:1] == ["oops\n"] and not sb.files.exists("/tmp/e2b-stream-gate"):
            sb.files.write("/tmp/e2b-stream-gate", "")

    ex = sb.run_code(
        STREAMING_CELL,
        on_stdout=lambda m: saw("out", m),
        on_stderr=lambda m: saw("err", m),
        on_result=results.append,
        on_error=errors.append,
    )
    assert ex.error is None, ex.error
    assert "".join(ex.logs.stdout) == "first\nsecond\n" == "".join(seen["out"])
    assert ex.logs.stderr == ["oops\n"] == seen["err"]
    assert ex.text == "42" and [r.text for r in results] == ["42"]
    ex = sb.run_code("print('before'); raise ValueError('late')", on_error=errors.append)
    assert [e.name for e in errors] == ["ValueError"] and ex.logs.stdout == ["before\n"]


@pytest.mark.skipif(not HAS_DATA, reason="the image with matplotlib (airlock/python-data) is not in the store: run hack/setup.sh")
def test_run_code_chart_png(sb):
    # plt.show() sends the chart at once: the cell waits (up to 60 s) for a
    # file on_result writes when the chart comes.
    def on_result(r):
        if r.png and not sb.files.exists("/tmp/e2b-chart-gate"):
            sb.files.write("/tmp/e2b-chart-gate", "")

    ex = sb.run_code(
        "import os, time\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"
        "for _ in range(600):\n    if os.path.exists('/tmp/e2b-chart-gate'): break\n    time.sleep(0.1)\n"
        "else:\n    raise TimeoutError('the chart did not come while the cell ran')",
        on_result=on_result,
    )
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1
    import base64

    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG")
    # Beside the PNG, the chart's elements as E2B's code interpreter gives
    # them (e2b_charts): the SDK makes a LineChart of it.
    from e2b_code_interpreter.charts import ChartType, LineChart

    chart = ex.results[0].chart
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE, chart
    assert [(e.label, e.points) for e in chart.elements] == [("Line 0", [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)])]
    assert chart.x_scale == "linear" and all(isinstance(t, float) for t in chart.x_ticks)


@pytest.mark.skipif(not HAS_DATA, reason="the image with matplotlib (airlock/python-data) is not in the store: run hack/setup.sh")
def test_run_code_bar_chart_and_dataframe_data(sb):
    from e2b_code_interpreter.charts import BarChart, ChartType

    ex = sb.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure()\nplt.bar(['A', 'B', 'C'], [10, 20, 30], label='Sold')\n"
        "plt.title('Sales'); plt.xlabel('Author'); plt.ylabel('Books (k)')\n"
        "import pandas as pd\n"
        "pd.DataFrame({'a': [1, 2, None], 'b': ['x', 'y', 'z'], 't': pd.to_datetime(['2024-01-01', '2024-01-02', '2024-01-03'])})"
    )
    assert ex.error is None, ex.error
    charts = [r.chart for r in ex.results if r.chart]
    assert len(charts) == 1 and isinstance(charts[0], BarChart), ex.results
    bar = charts[0]
    assert bar.type == ChartType.BAR and bar.title == "Sales" and bar.x_label == "Author" and bar.y_unit == "k"
    assert [(e.label, e.group, e.value) for e in bar.elements] == [("A", "Sold", 10.0), ("B", "Sold", 20.0), ("C", "Sold", 30.0)]
    main = ex.results[-1]
    assert main.is_main_result and "<table" in main.html
    assert main.data == {"a": [1.0, 2.0, None], "b": ["x", "y", "z"], "t": ["2024-01-01T00:00:00", "2024-01-02T00:00:00", "2024-01-03T00:00:00"]}
    assert "data" in main.formats() and "chart" in [f for r in ex.results for f in r.formats()]


RICH_CELL = """class Md:
    def __repr__(self): return "Md()"
    def _repr_markdown_(self): return "**bold**"
    def _repr_json_(self): return {"k": [1]}
    def _repr_svg_(self): return "<svg/>"
display(Md())
"""


def test_run_code_display_rich(sb):
    shown = []
    cell = RICH_CELL + ("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndisplay(df)\ndf" if HAS_DATA else "Md()")
    ex = sb.run_code(cell, on_result=shown.append)
    assert ex.error is None, ex.error
    assert len(shown) == len(ex.results)
    md = ex.results[0]
    assert not md.is_main_result and md.text == "Md()" and md.markdown == "**bold**" and md.json == {"k": [1]} and md.svg == "<svg/>"
    main = ex.results[-1]
    assert main.is_main_result and main.text == ex.text
    if HAS_DATA:
        df = ex.results[1]
        assert not df.is_main_result and "<table" in df.html and "a" in df.text
        assert df.data == {"a": [1, 2]} and main.data == {"a": [1, 2]}
        assert "<table" in main.html
    else:
        assert main.markdown == "**bold**"


def test_contexts(sb):
    c = sb.create_code_context(cwd="/tmp")
    assert c.cwd == "/tmp"
    assert c.id in [x.id for x in sb.list_code_contexts()]
    ex = sb.run_code("import os; print(os.getcwd()); 'x' in globals()", context=c)
    assert ex.logs.stdout == ["/tmp\n"]
    assert ex.text == "False"
    sb.remove_code_context(c)
    assert c.id not in [x.id for x in sb.list_code_contexts()]


def test_bash_context(sb):
    c = sb.create_code_context(language="bash", cwd="/tmp")
    assert c.language == "bash"
    sb.run_code("X=5; cd /usr", context=c)
    out = []
    ex = sb.run_code('echo "$X $(pwd) $ONLY_HERE"; echo err >&2', context=c, envs={"ONLY_HERE": "y"}, on_stdout=lambda m: out.append(m.line))
    assert "".join(ex.logs.stdout) == "5 /usr y\n" == "".join(out)
    assert "".join(ex.logs.stderr) == "err\n" and ex.error is None
    assert sb.run_code('echo "[$ONLY_HERE]"', context=c).logs.stdout == ["[]\n"]
    ex = sb.run_code("ls /nope", context=c)
    assert ex.error.name == "ExitError" and ex.error.value == "exit status 2" and "/nope" in "".join(ex.logs.stderr)
    # language="bash" without a context: the sandbox's default bash context.
    assert "".join(sb.run_code("printf 'no newline'", language="bash").logs.stdout) == "no newline"
    with pytest.raises(Exception, match="python and bash"):
        sb.run_code("1", language="js")


@pytest.mark.skipif(not NODE_IMAGE, reason="the image with node (airlock/net-clients:1) is not in the store: run hack/setup.sh")
def test_javascript_context():
    # (Its sandbox also mounts a volume: the main one is paused, which a
    # sandbox with volumes cannot be.)
    with Sandbox.create(NODE_IMAGE, timeout=120, volume_mounts={"/mnt/data/": "e2b-vol"}) as js:
        assert js.get_info().volume_mounts == [{"name": "e2b-vol", "path": "/mnt/data"}]
        js.files.write("/mnt/data/kept.txt", "in the volume", user="root")
        mounts = js.commands.run("grep ' /mnt/data ' /proc/mounts").stdout
        assert mounts.strip(), "the volume is not mounted at /mnt/data"
        c = js.create_code_context(language="javascript", cwd="/tmp")
        assert c.language == "javascript"
        assert js.run_code("const xs = [1, 2, 3]; let total = 0", context=c).error is None
        out = []
        ex = js.run_code(
            "for (const x of xs) { total += x; console.log('x', x) }\nconsole.error(process.cwd())\ntotal * 2",
            context=c,
            on_stdout=lambda m: out.append(m.line),
        )
        assert ex.error is None, ex.error
        assert ex.text == "12" and ex.results[0].is_main_result
        assert "".join(ex.logs.stdout) == "x 1\nx 2\nx 3\n" == "".join(out)
        assert "".join(ex.logs.stderr) == "/tmp\n"
        assert js.run_code("Promise.resolve(total + 1)", context=c).text == "7"
        ex = js.run_code("process.env.ONLY_HERE", context=c, envs={"ONLY_HERE": "y"})
        assert ex.text == "y" and js.run_code("process.env.ONLY_HERE", context=c).text is None
        # language="js" without a context: the sandbox's default one.
        ex = js.run_code("null.boom", language="js")
        assert ex.error.name == "TypeError" and "null" in ex.error.value and "<cell-1>" in ex.error.traceback
        assert js.run_code("typeof xs", language="js").text == "undefined"


# --- terminals ---------------------------------------------------------


def test_pty(sb):
    from e2b import PtySize

    got = bytearray()
    h = sb.pty.create(PtySize(rows=24, cols=80))
    sb.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sb.pty.send_stdin(h.pid, b"stty size; exit 7\n")
    with pytest.raises(CommandExitException) as e:
        h.wait(on_pty=got.extend)
    assert e.value.exit_code == 7
    assert b"30 100" in bytes(got)


# --- ports ---------------------------------------------------------------


def test_port_through_get_host(sb):
    import httpx

    sb.files.write("site/index.html", "served from the box")
    server = sb.commands.run("cd site && exec python3 -m http.server 8000", background=True)
    url = os.environ["E2B_SANDBOX_URL"]
    token = {"E2B-Traffic-Access-Token": sb.traffic_access_token}
    host = sb.get_host(8000)
    assert host.startswith(f"8000-{sb.sandbox_id}.")
    deadline = time.monotonic() + 30
    while True:
        try:
            r = httpx.get(url + "/index.html", headers={"Host": host, **token}, timeout=10)
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the box's server did not answer through get_host"
        time.sleep(0.3)
    assert r.text == "served from the box"
    # The E2B headers name the port too; without the sandbox's token: 401.
    r = httpx.get(url + "/index.html", headers={"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "8000", **token})
    assert r.text == "served from the box"
    assert httpx.get(url + "/index.html", headers={"Host": host}).status_code == 401
    server.kill()


# --- fork and snapshots --------------------------------------------------


def test_fork_and_snapshot(sb):
    sb.files.write("forked.txt", "from the parent")
    sb.run_code("forked_var = 'kept'")
    (child,) = sb.fork(timeout=120)
    try:
        assert child.sandbox_id != sb.sandbox_id
        assert Sandbox.get_info(child.sandbox_id).metadata == {"suite": "e2b", "run": "1"}
        # Files and the Python interpreter's state as they were at the fork.
        assert child.files.read("forked.txt") == "from the parent"
        assert child.run_code("forked_var").text == "'kept'"
        child.files.write("forked.txt", "changed in the child")
        assert sb.files.read("forked.txt") == "from the parent"

        snap = child.create_snapshot()
        assert [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=child.sandbox_id).next_items()] == [snap.snapshot_id]
        restored = Sandbox.create(snap.snapshot_id, metadata={"suite": "e2b-restored"}, timeout=120)
        try:
            assert Sandbox.get_info(restored.sandbox_id).metadata == {"suite": "e2b-restored"}
            assert restored.files.read("forked.txt") == "changed in the child"
            assert restored.commands.run("id -un").stdout == "user\n"
        finally:
            restored.kill()
        assert Sandbox.delete_snapshot(snap.snapshot_id)
        assert not Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        child.kill()


# --- pause ---------------------------------------------------------------


def test_pause_and_connect(sb):
    sb.files.write("kept.txt", "still here")
    assert sb.pause()
    info = Sandbox.get_info(sb.sandbox_id)
    assert info.state == SandboxState.PAUSED
    assert [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()] == [sb.sandbox_id]
    again = Sandbox.connect(sb.sandbox_id)
    assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.RUNNING
    assert again.files.read("kept.txt") == "still here"
    assert again.run_code("6 * 7").text == "42"


# --- the end -------------------------------------------------------------


def test_kill(sb):
    assert sb.is_running()
    sb.kill()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sb.sandbox_id)
    assert BaseSandbox.list(query=SandboxQuery(metadata={"suite": "e2b"})).next_items() == []

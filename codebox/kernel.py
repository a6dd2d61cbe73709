# airlock codebox kernel: a long-lived Python interpreter driven over
# stdin/stdout, one JSON object per line in each direction.
#
# Request:  {"id": N, "code": "..."}
# Reply:    {"id": N, "stdout": "...", "stderr": "...", "value": "..." | null,
#            "error": {"name", "value", "traceback"} | null,
#            "images": [{"mime": "image/png", "data": "<base64>"}],
#            "truncated": bool, "stdout_dropped": N, "stderr_dropped": N}
# Ready:    {"ready": true, "python": "3.11.2", "pid": N} once at start.
# Stream:   a request with "stream": true gets the cell's output as it is
#           printed: {"id": N, "stream": "stdout"|"stderr", "text": "..."}
#           lines (at each newline, flush() or 64 Ki characters, each at most
#           STREAM_CHUNK characters), then its reply, whose "stdout" and
#           "stderr" are "" (the streamed text is the output: the first
#           LIMIT/2 characters live, then the drop note and the last LIMIT/2,
#           and the fd-level output, at the end of the cell). A figure the
#           cell shows (plt.show()) comes at once as {"id": N, "image":
#           {"mime", "data"}}, and is not in the reply's "images".
# Display:  display(obj, ...) (a builtin, and IPython.display.display when
#           IPython is installed) shows an object as a notebook does: its
#           MIME bundle {"text/plain": repr, "text/html": ..., ...} from the
#           object's _repr_*_ methods (_repr_mimebundle_, _repr_html_,
#           _repr_markdown_, _repr_svg_, _repr_png_, _repr_jpeg_, _repr_pdf_,
#           _repr_latex_, _repr_json_, _repr_javascript_; a matplotlib figure
#           as PNG). A streamed cell sends it at once as {"id": N, "display":
#           {...}}; else it is in the reply's "displays" (a list of
#           bundles). The reply's "value_data" is the bundle of the cell's
#           value, without text/plain (that is "value"), when it has more.
# Reseed:   {"id": N, "reseed": true} -> {"id": N}: fresh seeds for random and
#           tempfile's names, sent by the host to an interpreter that lived
#           through a snapshot (a fork child's, a warm pool box's); it runs as
#           a cell that is not counted (the user's next cell keeps its number).
#
# Cells share one globals dict. Like a notebook, every statement but the last
# is executed and the last one, when it is an expression, is evaluated and its
# repr returned. SIGINT interrupts the running cell (KeyboardInterrupt) and is
# ignored between cells. Output of the cell's subprocesses (file descriptors 1
# and 2) is captured too and appended to stdout/stderr. Matplotlib figures
# still open at the end of a cell come back as PNG and are closed.
import ast
import base64
import collections
import importlib.machinery
import io
import json
import linecache
import os
import signal
import sys
import tempfile
import threading
import traceback
import warnings

# Each of a cell's stdout and stderr keeps its first and last LIMIT/2
# characters; a reply line never exceeds MESSAGE_LIMIT bytes (the host drops
# longer lines and restarts the interpreter).
LIMIT = int(os.environ.get("AIRLOCK_KERNEL_OUTPUT_LIMIT", str(8 << 20)))
MESSAGE_LIMIT = int(os.environ.get("AIRLOCK_KERNEL_MESSAGE_LIMIT", str(32 << 20)))
TAIL = LIMIT // 2
HEAD = LIMIT - TAIL
# A streamed line carries at most STREAM_CHUNK characters (JSON escapes keep
# it far under MESSAGE_LIMIT); pending text is sent at STREAM_FLUSH.
STREAM_CHUNK = 1 << 20
STREAM_FLUSH = 64 << 10

# The protocol runs on private copies of fds 0 and 1; the cell sees
# /dev/null on stdin and temporary files on fds 1 and 2.
_proto_in = os.fdopen(os.dup(0), "r", encoding="utf-8", newline="\n")
_proto_out = os.fdopen(os.dup(1), "w", encoding="utf-8", newline="\n")
_devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(_devnull, 0)
_saved_err = os.dup(2)
sys.stdin = open(os.devnull, "r")

os.environ.setdefault("MPLBACKEND", "Agg")
warnings.filterwarnings("ignore", message=".*(non-interactive|non-GUI backend).*")

_running = False
# While the main thread writes a protocol line, SIGINT is held (a
# KeyboardInterrupt mid-write would leave half a line): _deferred records it
# and the write raises it once the line is out.
_writing = False
_deferred = False
_proto_lock = threading.Lock()


def _on_sigint(signum, frame):
    global _deferred
    if _running:
        if _writing:
            _deferred = True
            return
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)


class _Capture(io.TextIOBase):
    """A text stream that keeps the first HEAD and the last TAIL characters
    written to it and counts the ones dropped between."""

    def __init__(self, name, stream_id=None):
        self.name = name
        # stream_id set: text that enters the head is also streamed to the
        # host (pending until a newline, flush() or STREAM_FLUSH).
        self.stream_id = stream_id
        self.pending = []
        self.psize = 0
        self.head = []
        self.hsize = 0
        self.tail = collections.deque()
        self.tsize = 0
        self.dropped = 0

    @property
    def truncated(self):
        return self.dropped > 0

    def writable(self):
        return True

    def isatty(self):
        return False

    @property
    def encoding(self):
        return "utf-8"

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        n = len(s)
        room = HEAD - self.hsize
        if room > 0:
            part = s[:room]
            self.head.append(part)
            self.hsize += len(part)
            s = s[room:]
            if self.stream_id is not None:
                self.pending.append(part)
                self.psize += len(part)
                if "\n" in part or self.psize >= STREAM_FLUSH:
                    self.flush()
        if not s:
            return n
        if len(s) >= TAIL:
            self.dropped += self.tsize + len(s) - TAIL
            self.tail.clear()
            self.tsize = 0
            if TAIL:
                self.tail.append(s[len(s) - TAIL:])
                self.tsize = TAIL
            return n
        self.tail.append(s)
        self.tsize += len(s)
        while self.tsize > TAIL:
            extra = self.tsize - TAIL
            first = self.tail[0]
            if len(first) <= extra:
                self.tail.popleft()
                self.tsize -= len(first)
                self.dropped += len(first)
            else:
                self.tail[0] = first[extra:]
                self.tsize -= extra
                self.dropped += extra
        return n

    def flush(self):
        if self.pending:
            text = "".join(self.pending)
            self.pending, self.psize = [], 0
            _stream(self.stream_id, self.name.strip("<>"), text)

    def finish(self):
        """Stream mode, at the end of the cell: send what was not streamed
        (pending text, the drop note, the tail) and stop streaming."""
        if self.stream_id is None:
            return
        self.flush()
        rest = self.marked()[self.hsize:]
        if rest:
            _stream(self.stream_id, self.name.strip("<>"), rest)
        self.stream_id = None

    def getvalue(self):
        return "".join(self.head) + "".join(self.tail)

    def marked(self):
        """The kept text, with a line where characters were dropped."""
        if not self.dropped:
            return self.getvalue()
        note = "\n[airlock: %d characters of %s left out here]\n" % (self.dropped, self.name.strip("<>"))
        return "".join(self.head) + note + "".join(self.tail)

    def shrink(self, keep):
        """Keep at most keep characters (half head, half tail)."""
        v = self.getvalue()
        if len(v) <= keep:
            return
        tail = keep // 2
        head = keep - tail
        self.dropped += len(v) - keep
        self.head, self.hsize = [v[:head]], head
        self.tail, self.tsize = collections.deque([v[len(v) - tail:]] if tail else []), tail

    @property
    def buffer(self):
        return _BinaryCapture(self)


class _BinaryCapture(io.RawIOBase):
    """sys.stdout.buffer for a _Capture: bytes are decoded as UTF-8."""

    def __init__(self, text):
        self.text = text

    def writable(self):
        return True

    def write(self, b):
        self.text.write(bytes(b).decode("utf-8", "replace"))
        return len(b)


# Files that receive the cell's fd-level output (subprocesses, C code).
_fd_out = tempfile.TemporaryFile()
_fd_err = tempfile.TemporaryFile()


_globals = {"__name__": "__main__", "__builtins__": __builtins__}
_count = 0


def _kernel_frame(tb):
    return tb is not None and tb.tb_frame.f_code.co_filename == __file__


def _format_error(e):
    tb = e.__traceback__
    if isinstance(e, SyntaxError):
        tb = None  # compile errors: the kernel's and ast's frames say nothing
    while _kernel_frame(tb):
        tb = tb.tb_next
    lines = traceback.format_exception(type(e), e, tb)
    return {
        "name": type(e).__name__,
        "value": str(e),
        "traceback": "".join(lines),
    }


def _figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    images = []
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            images.append({"mime": "image/png", "data": base64.b64encode(buf.getvalue()).decode("ascii")})
        plt.close("all")
    except Exception as e:  # a broken figure must not take the kernel down
        sys.stderr.write("airlock: could not render a figure: %r\n" % (e,))
    return images


# The id of the streamed cell running now (plt.show() sends its figures
# at once), or None.
_stream_id = None

# The display() bundles of the cell running now (a cell that does not
# stream).
_displays = []

# _repr_*_ methods and the MIME types they give, as IPython names them.
_REPRS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)
_BINARY = ("image/png", "image/jpeg", "application/pdf")


def _mime_value(mime, v):
    """A representation as the protocol carries it: text; base64 for
    binary types; JSON text for application/json."""
    if isinstance(v, tuple):  # (data, metadata)
        v = v[0]
    if v is None:
        return None
    if mime == "application/json":
        return v if isinstance(v, str) else json.dumps(v)
    if isinstance(v, (bytes, bytearray)):
        if mime in _BINARY:
            return base64.b64encode(bytes(v)).decode("ascii")
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _lies(obj):
    """Whether obj answers any attribute (a __getattr__ that makes them
    up, as mocks do): its _repr_*_ are not asked, as IPython does not."""
    try:
        return getattr(obj, "_ipython_canary_method_should_not_exist_", None) is not None
    except Exception:
        return True


def _bundle(obj):
    """obj's MIME bundle, text/plain always in it; a broken _repr_*_ is
    left out."""
    data = {}
    fig = sys.modules.get("matplotlib.figure")
    if fig is not None and isinstance(obj, fig.Figure):
        try:
            buf = io.BytesIO()
            obj.savefig(buf, format="png", bbox_inches="tight")
            data["image/png"] = base64.b64encode(buf.getvalue()).decode("ascii")
        except Exception:
            pass
    elif not isinstance(obj, type) and not _lies(obj):
        m = getattr(obj, "_repr_mimebundle_", None)
        if callable(m):
            try:
                b = m(include=None, exclude=None)
                if isinstance(b, tuple):
                    b = b[0]
                for k, v in (b or {}).items():
                    v = _mime_value(k, v)
                    if v is not None:
                        data[k] = v
            except Exception:
                pass
        for meth, mime in _REPRS:
            if mime in data:
                continue
            m = getattr(obj, meth, None)
            if not callable(m):
                continue
            try:
                v = _mime_value(mime, m())
            except Exception:
                continue
            if v is not None:
                data[mime] = v
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<unprintable %s: %r>" % (type(obj).__name__, e)
    return data


def display(*objs, **kwargs):
    """Shows each object as a notebook's display() does: its rich
    representations come back to the host as a display result."""
    for obj in objs:
        b = _bundle(obj)
        if _stream_id is None:
            _displays.append(b)
            continue
        line = _encode({"id": _stream_id, "display": b})
        if len(line) > MESSAGE_LIMIT:
            _stream(_stream_id, "stderr", "airlock: a display() of %s dropped: over %d bytes\n" % (type(obj).__name__, MESSAGE_LIMIT))
            continue
        _write(line)


import builtins  # noqa: E402

builtins.display = display


def _patch_pyplot(plt):
    orig = plt.show

    def show(*args, **kwargs):
        if _stream_id is None:
            return orig(*args, **kwargs)
        for img in _figures():
            _write(_encode({"id": _stream_id, "image": img}))

    show.__doc__ = orig.__doc__
    plt.show = show


def _patch_ipython(mod):
    mod.display = display


_PATCHES = {"matplotlib.pyplot": lambda m: _patch_pyplot(m), "IPython.display": _patch_ipython}


class _PyplotHook:
    """Patches matplotlib.pyplot.show when pyplot is first imported, and
    IPython.display.display (to the kernel's display) when that is."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PyplotHook())


def _run_cell(code, reply):
    global _count, _running
    _count += 1
    filename = "<cell-%d>" % _count
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    expr = compile(last, filename, "eval") if last is not None else None
    _running = True
    try:
        exec(body, _globals)
        if expr is not None:
            value = eval(expr, _globals)
            if value is not None:
                _globals["_"] = value
                b = _bundle(value)
                reply["value"] = b.pop("text/plain")
                if b:
                    reply["value_data"] = b
    finally:
        _running = False


def _handle(req):
    global _running, _stream_id
    reply = {"id": req.get("id"), "stdout": "", "stderr": "", "value": None, "error": None, "images": [], "truncated": False}
    sid = req.get("id") if req.get("stream") else None
    _stream_id = sid
    del _displays[:]
    out, err = _Capture("<stdout>", sid), _Capture("<stderr>", sid)
    for f in (_fd_out, _fd_err):
        f.seek(0)
        f.truncate()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(_fd_out.fileno(), 1)
    os.dup2(_fd_err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    try:
        try:
            _run_cell(req.get("code", ""), reply)
        except BaseException as e:  # SystemExit and KeyboardInterrupt too
            _running = False
            reply["error"] = _format_error(e)
        try:
            reply["images"] = _figures()
        except BaseException as e:
            _running = False
            err.write("airlock: figures lost: %r\n" % (e,))
        if _displays:
            reply["displays"] = list(_displays)
            del _displays[:]
    finally:
        _running = False
        _stream_id = None
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        os.dup2(_devnull, 1)
        os.dup2(_saved_err, 2)
    for cap, f in ((out, _fd_out), (err, _fd_err)):
        # The file may be huge: read its head and its tail only.
        size = f.seek(0, 2)
        f.seek(0)
        if size <= LIMIT:
            cap.write(f.read().decode("utf-8", "replace"))
        else:
            cap.write(f.read(HEAD).decode("utf-8", "replace"))
            cap.dropped += size - LIMIT
            f.seek(size - TAIL)
            cap.write(f.read(TAIL).decode("utf-8", "replace"))
    if sid is not None:
        for cap in (out, err):
            cap.finish()  # SIGINT is ignored now: _running is False
        reply["streamed"] = True
        reply["stdout_dropped"], reply["stderr_dropped"] = out.dropped, err.dropped
        reply["truncated"] = out.truncated or err.truncated
        if reply["error"] is not None and reply["error"]["name"] == "KeyboardInterrupt":
            reply["error"]["value"] = reply["error"]["value"] or "interrupted"
        return reply
    reply["stdout"], reply["stderr"] = out.marked(), err.marked()
    reply["stdout_dropped"], reply["stderr_dropped"] = out.dropped, err.dropped
    reply["truncated"] = out.truncated or err.truncated
    reply["_caps"] = (out, err)
    if reply["error"] is not None and reply["error"]["name"] == "KeyboardInterrupt":
        reply["error"]["value"] = reply["error"]["value"] or "interrupted"
    return reply


def _encode(obj):
    # ASCII: lone surrogates a cell printed are escaped, not an error.
    return json.dumps(obj) + "\n"


def _write(line):
    """Writes one protocol line, holding SIGINT in the main thread until it
    is out (another thread's line waits for the lock)."""
    global _writing, _deferred
    main = threading.current_thread() is threading.main_thread()
    with _proto_lock:
        if main:
            _writing = True
        try:
            _proto_out.write(line)
            _proto_out.flush()
        finally:
            if main:
                _writing = False
    if main and _deferred:
        _deferred = False
        if _running:
            raise KeyboardInterrupt


def _stream(cell_id, name, text):
    for i in range(0, len(text), STREAM_CHUNK):
        _write(_encode({"id": cell_id, "stream": name, "text": text[i:i + STREAM_CHUNK]}))


def _send(obj):
    caps = obj.pop("_caps", None)
    line = _encode(obj)
    if len(line) > MESSAGE_LIMIT and obj.get("streamed") and (obj.get("images") or obj.get("value_data")):
        obj["images"] = []
        obj.pop("value_data", None)
        _stream(obj["id"], "stderr", "airlock: figures and rich value dropped: the reply would exceed %d bytes\n" % MESSAGE_LIMIT)
        line = _encode(obj)
    # JSON escapes can make a reply several times its text: shrink the
    # output (figures first) until the line fits MESSAGE_LIMIT.
    keep = LIMIT
    while len(line) > MESSAGE_LIMIT and caps is not None:
        if obj.get("images") or obj.get("displays") or obj.get("value_data"):
            obj["images"] = []
            obj.pop("displays", None)
            obj.pop("value_data", None)
            caps[1].write("airlock: figures, displays and rich value dropped: the reply would exceed %d bytes\n" % MESSAGE_LIMIT)
        else:
            keep //= 2
            for c in caps:
                c.shrink(keep)
        out, err = caps
        obj["stdout"], obj["stderr"] = out.marked(), err.marked()
        obj["stdout_dropped"], obj["stderr_dropped"] = out.dropped, err.dropped
        obj["truncated"] = out.truncated or err.truncated
        line = _encode(obj)
    _write(line)


def _reseed(req):
    # Like random's own os.register_at_fork hook: every copy of a
    # snapshotted interpreter would otherwise draw the same numbers. It runs
    # as a cell (so that a restored QEMU has translated the cell path before
    # the user's first cell, under TCG ~40 ms) that is not counted.
    global _count
    reply = _handle({"id": req.get("id"), "code": "__import__('random').seed()\n__import__('tempfile')._candidate_names = None"})
    linecache.cache.pop("<cell-%d>" % _count, None)
    _count -= 1
    return reply


def main():
    # sys.stdout is the real fd 1 until the first cell; point it at /dev/null
    # so stray writes between cells cannot corrupt the protocol.
    os.dup2(_devnull, 1)
    _send({"ready": True, "python": sys.version.split()[0], "pid": os.getpid()})
    while True:
        try:
            line = _proto_in.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            _send({"id": None, "error": {"name": "ProtocolError", "value": str(e), "traceback": ""}})
            continue
        if req.get("reseed"):
            _send(_reseed(req))
            continue
        _send(_handle(req))


if __name__ == "__main__":
    main()

# airlock codebox kernel: a long-lived Python interpreter driven over
# stdin/stdout, one JSON object per line in each direction.
#
# Request:  {"id": N, "code": "..."}
# Reply:    {"id": N, "stdout": "...", "stderr": "...", "value": "..." | null,
#            "error": {"name", "value", "traceback"} | null,
#            "images": [{"mime": "image/png", "data": "<base64>"}],
#            "truncated": bool}
# Ready:    {"ready": true, "python": "3.11.2", "pid": N} once at start.
#
# Cells share one globals dict. Like a notebook, every statement but the last
# is executed and the last one, when it is an expression, is evaluated and its
# repr returned. SIGINT interrupts the running cell (KeyboardInterrupt) and is
# ignored between cells. Output of the cell's subprocesses (file descriptors 1
# and 2) is captured too and appended to stdout/stderr. Matplotlib figures
# still open at the end of a cell come back as PNG and are closed.
import ast
import base64
import io
import json
import linecache
import os
import signal
import sys
import tempfile
import traceback
import warnings

LIMIT = int(os.environ.get("AIRLOCK_KERNEL_OUTPUT_LIMIT", str(8 << 20)))

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


def _on_sigint(signum, frame):
    if _running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)


class _Capture(io.TextIOBase):
    """A text stream that keeps at most LIMIT characters."""

    def __init__(self, name):
        self.name = name
        self.parts = []
        self.size = 0
        self.truncated = False

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
        room = LIMIT - self.size
        if len(s) > room:
            s = s[: max(room, 0)]
            self.truncated = True
        if s:
            self.parts.append(s)
            self.size += len(s)
        return len(s)

    def flush(self):
        pass

    def getvalue(self):
        return "".join(self.parts)

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
                reply["value"] = repr(value)
    finally:
        _running = False


def _handle(req):
    global _running
    reply = {"id": req.get("id"), "stdout": "", "stderr": "", "value": None, "error": None, "images": [], "truncated": False}
    out, err = _Capture("<stdout>"), _Capture("<stderr>")
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
    finally:
        _running = False
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        os.dup2(_devnull, 1)
        os.dup2(_saved_err, 2)
    for cap, f in ((out, _fd_out), (err, _fd_err)):
        f.seek(0)
        extra = f.read(LIMIT + 1).decode("utf-8", "replace")
        if extra:
            cap.write(extra)
    reply["stdout"], reply["stderr"] = out.getvalue(), err.getvalue()
    reply["truncated"] = out.truncated or err.truncated
    if reply["error"] is not None and reply["error"]["name"] == "KeyboardInterrupt":
        reply["error"]["value"] = reply["error"]["value"] or "interrupted"
    return reply


def _send(obj):
    _proto_out.write(json.dumps(obj) + "\n")
    _proto_out.flush()


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
        _send(_handle(req))


if __name__ == "__main__":
    main()

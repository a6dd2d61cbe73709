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
# Structured: a request with "structured": true adds E2B's structured
#           forms (see _structured below): "e2b/data" (a pandas DataFrame's
#           columns, JSON text) and "e2b/chart" (a matplotlib figure's
#           chart, JSON text) to bundles, and "chart" (an object) to a
#           figure's image.
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
            img = {"mime": "image/png", "data": base64.b64encode(buf.getvalue()).decode("ascii")}
            if _structured:
                chart = _chart_json(fig)
                if chart is not None:
                    img["chart"] = json.loads(chart)
            images.append(img)
        plt.close("all")
    except Exception as e:  # a broken figure must not take the kernel down
        sys.stderr.write("airlock: could not render a figure: %r\n" % (e,))
    return images


# Structured outputs (a request with "structured": true), the forms E2B's
# code interpreter gives besides the rendered ones: a pandas DataFrame's
# columns ("e2b/data" in its bundle) and a matplotlib figure's chart (its
# type, title, axis labels, ticks and elements: "e2b/chart" in a bundle,
# "chart" beside a figure's PNG). The chart extraction is a port of E2B's
# e2b_charts package (e2b-dev/code-interpreter, chart_data_extractor; MIT
# License, Copyright (c) 2025 FOUNDRYLABS, INC.) to plain dicts (no
# pydantic), with its output: the same keys, types and values.
_structured = False

# A DataFrame's data is given up to DATA_CELLS cells and DATA_BYTES bytes
# of JSON (E2B gives all of it; a bigger frame has html and text only).
DATA_CELLS = 200000
DATA_BYTES = 4 << 20


def _plain(v):
    """v as JSON can carry it: numpy scalars as Python numbers, NaN and
    infinities as None, dates as ISO text, other objects as str()."""
    import datetime
    import math

    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else float(v)
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item) and getattr(v, "shape", None) == ():
        try:
            x = item()
        except Exception:
            return str(v)
        if isinstance(x, (bool, int, float, str)) or x is None:
            return _plain(x)
        if isinstance(x, (datetime.date, datetime.time)):
            return x.isoformat()
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def _frame_data(obj):
    """A pandas DataFrame's columns ({column: [values]}) as JSON text, as
    E2B's data formatter gives them (to_dict(orient="list"), timestamps in
    ISO form); None for anything else or a frame over the bounds."""
    pandas = sys.modules.get("pandas")
    if pandas is None or not isinstance(obj, pandas.DataFrame):
        return None
    try:
        if obj.size > DATA_CELLS:
            return None
        d = {str(k): [_plain(v) for v in col] for k, col in obj.to_dict(orient="list").items()}
        s = json.dumps(d, allow_nan=False)
    except Exception:
        return None
    return s if len(s) <= DATA_BYTES else None


def _chart_json(fig):
    """fig's chart as JSON text, or None (no axes, no data, a figure the
    extraction does not read, or a chart over DATA_BYTES). Call it after
    the figure was drawn (savefig): tick labels are set at draw time."""
    try:
        c = _chart_of_figure(fig)
        s = json.dumps(c, allow_nan=False) if c else None
    except Exception:
        return None
    return s if s is None or len(s) <= DATA_BYTES else None


def _dynamic_round(number):
    import decimal

    d = decimal.Decimal(str(number))
    with decimal.localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())  # 8 significant digits
        return +d


def _is_grid_line(line):
    x, y = line.get_xdata(), line.get_ydata()
    if len(x) != 2 or len(y) != 2:
        return False
    return bool(x[0] == x[1] or y[0] == y[1])


def _none_if_empty(s):
    return None if s == "" else s


def _chart_base(ax, typ):
    return {"type": typ, "title": _none_if_empty(ax.get_title()), "elements": []}


def _chart_2d(ax, typ):
    import re

    c = _chart_base(ax, typ)
    c["x_label"] = _none_if_empty(ax.get_xlabel())
    c["y_label"] = _none_if_empty(ax.get_ylabel())
    c["x_unit"] = c["y_unit"] = None
    for label, unit in (("x_label", "x_unit"), ("y_label", "y_unit")):
        if c[label]:
            m = re.search(r"\s\((.*?)\)|\[(.*?)\]", c[label])
            if m:
                c[unit] = m.group(1) or m.group(2)
    return c


def _swap_axes(c):
    c["x_label"], c["y_label"] = c["y_label"], c["x_label"]
    c["x_unit"], c["y_unit"] = c["y_unit"], c["x_unit"]


def _converter(axis):
    get = getattr(axis, "get_converter", None)
    return get() if callable(get) else getattr(axis, "converter", None)


def _is_date_converter(conv):
    import matplotlib.dates as mdates

    kinds = tuple(k for k in (getattr(mdates, "_SwitchableDateConverter", None), mdates.DateConverter, getattr(mdates, "ConciseDateConverter", None)) if isinstance(k, type))
    return isinstance(conv, kinds)


def _ticks(conv, ticks):
    import matplotlib.dates as mdates

    if _is_date_converter(conv):
        return [mdates.num2date(t).isoformat() for t in ticks]
    return [_plain(float(t)) if isinstance(t, (int, float)) or hasattr(t, "item") else _plain(t) for t in ticks]


def _scale(conv, scale, ticks, labels):
    if _is_date_converter(conv):
        return "datetime"
    if scale != "linear":
        return scale
    for i, (tick, label) in enumerate(zip(ticks, labels)):
        if isinstance(tick, (int, float)) and tick == i and str(i) != label:
            continue
        return "linear"
    return "categorical"


def _point(v):
    import datetime

    if isinstance(v, datetime.date):
        return v.isoformat()
    if type(v).__name__ == "datetime64":
        return str(v.astype("datetime64[s]"))
    if isinstance(v, str):
        return v
    try:
        return _plain(float(v))
    except (TypeError, ValueError):
        return str(v)


def _point_chart(ax, typ):
    c = _chart_2d(ax, typ)
    for a, axis, ticks, scale in (("x", ax.xaxis, ax.get_xticks(), ax.get_xscale()), ("y", ax.yaxis, ax.get_yticks(), ax.get_yscale())):
        labels = [t.get_text() for t in (ax.get_xticklabels() if a == "x" else ax.get_yticklabels())]
        conv = _converter(axis)
        t = _ticks(conv, ticks)
        c[a + "_ticks"] = t
        c[a + "_tick_labels"] = labels
        c[a + "_scale"] = _scale(conv, scale, t, labels)
    return c


def _line_chart(ax):
    c = _point_chart(ax, "line")
    for line in ax.get_lines():
        if _is_grid_line(line):
            continue
        label = line.get_label()
        if label.startswith("_child"):
            label = "Line %d" % int(label[6:])
        c["elements"].append({"label": label, "points": [[_point(x), _point(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]})
    return c


def _scatter_chart(ax):
    c = _point_chart(ax, "scatter")
    for coll in ax.collections:
        c["elements"].append({"label": coll.get_label(), "points": [[_point(x), _point(y)] for x, y in coll.get_offsets()]})
    return c


def _bar_chart(ax):
    c = _chart_2d(ax, "bar")
    for container in ax.containers:
        group = container.get_label()
        if group.startswith("_container"):
            group = "Group %d" % int(group[10:])
        heights = [r.get_height() for r in container]
        if all(h == heights[0] for h in heights):
            # horizontal bars (barh): the categories are on the y axis
            _swap_axes(c)
            labels = [t.get_text() for t in ax.get_yticklabels()]
            values = [r.get_width() for r in container]
        else:
            labels = [t.get_text() for t in ax.get_xticklabels()]
            values = heights
        for label, value in zip(labels, values):
            c["elements"].append({"label": label, "group": group, "value": _plain(float(value))})
    return c


def _pie_chart(ax):
    import decimal

    c = _chart_base(ax, "pie")
    for w in ax.patches:
        angle = abs(_dynamic_round(decimal.Decimal(float(w.theta2)) - decimal.Decimal(float(w.theta1))))
        c["elements"].append({"label": w.get_label(), "angle": float(angle), "radius": _plain(float(w.r))})
    return c


def _box_chart(ax):
    c = _chart_2d(ax, "box_and_whisker")
    labels = [t.get_text() for t in ax.get_xticklabels()]
    boxes = []
    for label, box in zip(labels, ax.patches):
        v = box.get_path().vertices
        xs = [_dynamic_round(x) for x in v[:, 0]]
        ys = [_dynamic_round(y) for y in v[:, 1]]
        x, y = min(xs), min(ys)
        boxes.append({"x": x, "y": y, "label": label, "width": max(xs) - x, "height": max(ys) - y, "outliers": []})
    vertical = bool(boxes) and all(b["height"] == boxes[0]["height"] for b in boxes)
    if vertical:
        _swap_axes(c)
        for b in boxes:
            b["x"], b["y"] = b["y"], b["x"]
            b["width"], b["height"] = b["height"], b["width"]
    for line in ax.lines:
        xd = [_dynamic_round(x) for x in line.get_xdata()]
        yd = [_dynamic_round(y) for y in line.get_ydata()]
        if vertical:
            xd, yd = yd, xd
        if len(xd) == 1:
            for b in boxes:
                if b["x"] <= xd[0] <= b["x"] + b["width"]:
                    break
            else:
                continue
            b["outliers"].append(yd[0])
        if len(yd) != 2:
            continue
        for b in boxes:
            if b["x"] <= xd[0] <= xd[1] <= b["x"] + b["width"]:
                break
        else:
            continue
        if yd[0] == yd[1] and b["y"] <= yd[0] <= b["y"] + b["height"]:
            b["median"] = yd[0]
            continue
        lo, hi = min(yd), max(yd)
        if hi == b["y"]:
            b["whisker_lower"] = lo
        elif lo == b["y"] + b["height"]:
            b["whisker_upper"] = hi
    c["elements"] = [
        {
            "label": b["label"],
            "min": float(b["whisker_lower"]),
            "first_quartile": float(b["y"]),
            "median": float(b["median"]),
            "third_quartile": float(b["y"] + b["height"]),
            "max": float(b["whisker_upper"]),
            "outliers": [float(o) for o in b["outliers"]],
        }
        for b in boxes
    ]
    return c


def _chart_type(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    objs = [o for o in getattr(ax, "_children", ()) if not isinstance(o, Text)]
    if all(isinstance(o, Line2D) for o in objs):
        return "line"
    if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return "box_and_whisker"
    objs = [o for o in objs if not (isinstance(o, Line2D) and _is_grid_line(o))]
    if all(isinstance(o, PathCollection) for o in objs):
        return "scatter"
    if all(isinstance(o, Wedge) for o in objs):
        return "pie"
    if all(isinstance(o, Rectangle) for o in objs):
        return "bar"
    return "unknown"


_CHARTS = {"line": _line_chart, "scatter": _scatter_chart, "bar": _bar_chart, "pie": _pie_chart, "box_and_whisker": _box_chart}


def _chart_of_axes(ax):
    t = _chart_type(ax)
    f = _CHARTS.get(t)
    return f(ax) if f else _chart_base(ax, t)


def _chart_of_figure(fig):
    axes = fig.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    # Bound the work before any list is built: a chart of more points
    # than a DataFrame's data may hold is left out (its JSON would pass
    # DATA_BYTES anyway).
    points = 0
    for ax in axes:
        points += sum(len(line.get_xdata()) for line in ax.get_lines())
        points += sum(len(c.get_offsets()) for c in ax.collections)
    if points > DATA_CELLS:
        return None
    if len(axes) == 1:
        return _chart_of_axes(axes[0])
    sup = getattr(fig, "_suptitle", None)
    return {"type": "superchart", "title": sup.get_text() if sup is not None else "", "elements": [_chart_of_axes(ax) for ax in axes]}


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
            if _structured:
                chart = _chart_json(obj)
                if chart is not None:
                    data["e2b/chart"] = chart
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
        if _structured:
            v = _frame_data(obj)
            if v is not None:
                data["e2b/data"] = v
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
    global _running, _stream_id, _structured
    _structured = bool(req.get("structured"))
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

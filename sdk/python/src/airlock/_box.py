"""SimpleBox and CodeBox: boxes on an airlock server, BoxLite's Python API."""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote
from typing import Any, AsyncIterator, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import httpx

from ._bounds import BOUNDS
from ._client import AirlockError, Client, Endpoint, _raise_for_problem, decode_output, sync_client
from ._files import FilesMixin
from ._snapshots import Checkpoint, Snapshot

_B = TypeVar("_B", bound="SimpleBox")

#: Most children one :meth:`SimpleBox.fork` makes (the server's bound, from
#: the API's schema).
MAX_FORK = BOUNDS["ForkRequest"]["n"]["maximum"]

DEFAULT_IMAGE = "python:slim"

#: Default lease of SDK boxes, in seconds (see SimpleBox).
DEFAULT_LEASE = 30.0

_STDIN, _STDOUT, _STDERR = 0, 1, 2


@dataclass
class ExecResult:
    """The outcome of :meth:`SimpleBox.exec`. A non-zero ``exit_code`` does not
    raise: check it yourself.

    Attributes:
        exit_code: exit status; 128+N when killed by signal N; 127 when the
            command was not found.
        stdout, stderr: the output as text (invalid UTF-8 replaced; the exact
            bytes are in ``stdout_bytes`` / ``stderr_bytes``).
        error_message: set only when the process did not end normally (timed
            out, could not run, died with its VM).
        timed_out: the timeout killed the process tree.
        truncated: output was cut at the server's bound (``airlock serve
            --max-output``, 16 MiB a stream): the first and last half of a
            stream are kept, and ``stdout_dropped`` / ``stderr_dropped``
            bytes between them are left out.
    """

    exit_code: int
    stdout: str
    stderr: str
    error_message: Optional[str] = None
    timed_out: bool = False
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    truncated: bool = False
    stdout_dropped: int = 0
    stderr_dropped: int = 0


@dataclass
class CellError:
    """An exception raised by a context cell."""

    name: str
    value: str
    traceback: str


@dataclass
class CellResult:
    """The outcome of :meth:`Context.run`.

    Attributes:
        stdout, stderr: what the cell printed.
        value: ``repr()`` of the last expression when it is not None, else None.
        error: the exception the cell raised, if any.
        images: matplotlib figures left open, as PNG bytes.
        timed_out: the cell ran past its timeout and was interrupted.
        state_lost: the interpreter was restarted; earlier variables are gone.
    """

    stdout: str
    stderr: str
    value: Optional[str] = None
    error: Optional[CellError] = None
    images: List[bytes] = field(default_factory=list)
    timed_out: bool = False
    state_lost: bool = False


@dataclass(frozen=True)
class PortMapping:
    """A published port: connections to ``host_ip:host_port`` on the
    server's host reach ``guest_port`` in the box (``protocol`` ``"tcp"`` or
    ``"udp"``). From :meth:`SimpleBox.ports`, ``host_port`` is the port bound
    (the one picked when 0 was asked)."""

    host_port: int
    guest_port: int
    host_ip: str = "127.0.0.1"
    protocol: str = "tcp"


@dataclass(frozen=True, repr=False)
class Secret:
    """A value the box's code uses but never sees (an API key): in the box,
    the environment variable of the secret's name holds a placeholder,
    which the server's network helper replaces by ``value`` in the headers
    of HTTPS requests to ``hosts`` (``"api.example.com"``, or
    ``"*.example.com"``), and nowhere else. Its repr never shows the value.
    See docs/network.md#secrets."""

    hosts: Sequence[str]
    value: str
    #: BoxLite's spelling (``Secret(name=, value=, hosts=)``), accepted so
    #: that the object can be built; passing it in a list raises
    #: ``NotImplementedError`` naming airlock's form (see ``_secrets``).
    name: Optional[str] = None
    placeholder: Optional[str] = None

    def __repr__(self) -> str:
        n = f"name={self.name!r}, " if self.name is not None else ""
        return f"Secret({n}hosts={list(self.hosts)!r}, value=<hidden>)"


_SECRETS_INSTEAD = ("airlock puts a secret's placeholder in the box's environment variable of its name, not in "
                    "<BOXLITE_SECRET:name>: pass secrets={\"OPENAI_API_KEY\": Secret(hosts=[\"api.openai.com\"], "
                    "value=...)} and send os.environ[\"OPENAI_API_KEY\"] in the box")


def _secrets(secrets: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if not secrets:
        return None
    if not isinstance(secrets, Mapping):
        # BoxLite's secrets=[Secret(name=..., value=..., hosts=[...])].
        raise NotImplementedError(f"secrets=[Secret(name=...), ...] (BoxLite's form) has no equivalent in airlock: "
                                  f"{_SECRETS_INSTEAD}")
    out: Dict[str, Any] = {}
    for name, s in secrets.items():
        if isinstance(s, Secret):
            out[name] = {"value": s.value, "hosts": list(s.hosts)}
        elif isinstance(s, Mapping):
            out[name] = {"value": s["value"], "hosts": list(s["hosts"])}
        else:
            raise TypeError(f"secret {name}: want Secret(hosts=[...], value=...)")
    return out


VolumeArg = Union[str, Tuple[str, str], Tuple[str, str, str], Mapping[str, Any]]
PortArg = Union[int, str, Tuple[int, int], PortMapping, Mapping[str, Any]]


def _port(p: PortArg) -> Dict[str, Any]:
    """A published port as the API takes it, from a guest port (``8000``:
    a free host port), Docker's ``"[HOSTIP:]HOSTPORT:GUESTPORT[/tcp|udp]"``
    (or ``"GUESTPORT[/proto]"``), ``(host_port, guest_port)``, a
    :class:`PortMapping` or ``{"host_ip", "host_port", "guest_port",
    "protocol"}``."""
    if isinstance(p, PortMapping):
        return {"host_ip": p.host_ip, "host_port": p.host_port, "guest_port": p.guest_port, "protocol": p.protocol}
    if isinstance(p, Mapping):
        return dict(p)
    if isinstance(p, bool):
        raise TypeError(f"port {p!r}: want a guest port, \"HOST:GUEST\", (host, guest) or a PortMapping")
    if isinstance(p, int):
        return {"host_port": 0, "guest_port": p}
    if isinstance(p, tuple):
        if len(p) not in (2, 3, 4):
            raise ValueError(f"port {p!r}: want (host_port, guest_port[, protocol[, host_ip]])")
        d = {"host_port": int(p[0]), "guest_port": int(p[1])}
        if len(p) >= 3:
            if not isinstance(p[2], str) or p[2].lower() not in ("tcp", "udp"):
                raise ValueError(f"port {p!r}: the protocol must be \"tcp\" or \"udp\"")
            d["protocol"] = p[2].lower()
        if len(p) == 4 and p[3]:
            d["host_ip"] = p[3]
        return d
    if not isinstance(p, str):
        raise TypeError(f"port {p!r}: want a guest port, \"HOST:GUEST\", (host, guest) or a PortMapping")
    d: Dict[str, Any] = {}
    rest = p
    if "/" in rest:
        rest, d["protocol"] = rest.rsplit("/", 1)
    host_ip, host, guest = "", "0", rest
    if ":" in rest:
        head, guest = rest.rsplit(":", 1)
        host = head
        if ":" in head:
            host_ip, host = head.rsplit(":", 1)
            host_ip = host_ip.strip("[]")
    try:
        d["host_port"], d["guest_port"] = int(host), int(guest)
    except ValueError:
        raise ValueError(f"port {p!r}: want [HOSTIP:]HOSTPORT:GUESTPORT[/tcp|udp] (Docker's -p)") from None
    if host_ip:
        d["host_ip"] = host_ip
    return d


def _volume(v: VolumeArg) -> Dict[str, Any]:
    """A volume as the API takes it, from ``"SRC:DST[:ro]"``, ``(src, dst[,
    "ro"])`` or ``{"source", "target", "read_only"}``."""
    if isinstance(v, Mapping):
        d = dict(v)
    else:
        parts = v.split(":") if isinstance(v, str) else list(v)
        if len(parts) == 3 and isinstance(parts[2], bool):  # BoxLite's (host, guest, read_only)
            parts[2] = "ro" if parts[2] else "rw"
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise ValueError(f"volume {v!r}: want SOURCE:TARGET[:ro|rw] (SOURCE a host directory or a volume name)")
        d = {"source": parts[0], "target": parts[1], "read_only": len(parts) == 3 and parts[2] == "ro"}
    src = str(d["source"])
    if src.startswith(".") or src.startswith("~"):
        src = os.path.abspath(os.path.expanduser(src))
    d["source"] = src
    return d


def env_pairs(name: str, env: Any) -> Optional[List[str]]:
    """``env`` as the API takes it (``["K=V", ...]``), from a ``{key:
    value}`` mapping, BoxLite's list of ``(key, value)`` pairs, or
    ``["K=V", ...]``; TypeError/ValueError naming ``name`` otherwise."""
    if env is None:
        return None
    if isinstance(env, Mapping):
        items: List[Any] = list(env.items())
    elif isinstance(env, (str, bytes)) or not isinstance(env, Iterable):
        raise TypeError(f"{name} must be a dict, a list of (key, value) pairs or of \"KEY=value\", "
                        f"not {type(env).__name__}")
    else:
        items = list(env)
    mapping = isinstance(env, Mapping)
    out = []
    for i, it in enumerate(items):
        # A dict's entry is named by its key, a list's by its index.
        at = f"{name}[{it[0]!r}]" if mapping else f"{name}[{i}]"
        if isinstance(it, str):
            if "=" not in it or it.startswith("="):
                raise ValueError(f"{at}={it!r}: want \"KEY=value\" or a (key, value) pair")
            out.append(it)
            continue
        if not isinstance(it, (tuple, list)) or len(it) != 2:
            raise TypeError(f"{at} must be a (key, value) pair or \"KEY=value\", not {it!r}")
        k, v = it
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{at}: key and value must be str, not ({type(k).__name__}, {type(v).__name__})")
        if not k or "=" in k:
            raise ValueError(f"{at}: key {k!r} must be non-empty and have no '='")
        out.append(f"{k}={v}")
    return out


def _env_list(env: Any) -> Optional[List[str]]:
    return env_pairs("env", env)


def check_type(name: str, v: Any, want: Any, what: str) -> None:
    """TypeError naming ``name`` when ``v`` is neither None nor a ``want``
    (bool is not taken for int)."""
    if v is None:
        return
    if (isinstance(v, bool) and want is not bool and bool not in (want if isinstance(want, tuple) else (want,))) \
            or not isinstance(v, want):
        raise TypeError(f"{name} must be {what}, not {type(v).__name__}")


def check_number(name: str, v: Any) -> None:
    """TypeError/ValueError naming ``name`` unless ``v`` is None or a
    number of seconds >= 0."""
    check_type(name, v, (int, float), "a number of seconds")
    if v is not None and v < 0:
        raise ValueError(f"{name}={v}: must be >= 0")


def check_list(name: str, v: Any, want: Any, what: str) -> None:
    """TypeError naming ``name`` (or its item ``name[i]``) unless ``v`` is
    None or a list/tuple of ``want`` (a lone str is not a list of them)."""
    if v is None:
        return
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
        raise TypeError(f"{name} must be a list of {what}, not {type(v).__name__}")
    for i, it in enumerate(v):
        check_type(f"{name}[{i}]", it, want, what)


def check_cmd(cmd: Any, args: Sequence[Any]) -> None:
    """TypeError unless ``cmd`` is a non-empty str and each of ``args`` a str."""
    if not isinstance(cmd, str) or not cmd:
        raise TypeError(f"cmd must be a non-empty str, not {cmd!r}")
    for i, a in enumerate(args):
        if not isinstance(a, str):
            raise TypeError(f"args[{i}] must be a str, not {type(a).__name__}")


#: BoxLite box options airlock has no equivalent for, and what to use.
_BOXLITE_UNSUPPORTED = {
    "rootfs_path": "import the OCI layout as an image (airlock image import PATH --tag NAME) and pass image=NAME",
    "entrypoint": "airlock boxes run its agent as init, not the image's entrypoint; start the process with exec/stream",
    "cmd": "airlock boxes run its agent as init, not the image's CMD; start the process with exec/stream",
    "advanced": "every airlock box runs confined; set limits with airlock serve's policy flags",
    "detach": "use lease=0 (the box then lives until removed) or the default lease (removed soon after this process ends)",
}


class _LeaseRenewer:
    """A daemon thread renewing a box's lease every third of it, so that the
    lease runs out only when this process is gone (or stop() was called).
    It runs beside the event loop, so a busy loop or a sync caller that is
    not calling into the SDK does not let the lease lapse."""

    def __init__(self, endpoint: Endpoint, box_id: str, lease: float) -> None:
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(endpoint, box_id, lease), daemon=True,
                                   name=f"airlock-lease-{box_id}")
        self._t.start()

    def _run(self, endpoint: Endpoint, box_id: str, lease: float) -> None:
        import httpx

        with sync_client(endpoint) as c:
            while not self._stop.wait(lease / 3):
                try:
                    r = c.post(f"/v1/boxes/{box_id}/lease")
                    if r.status_code in (404, 409):
                        return  # the box is gone, or has no lease (409 no_lease: an attached box)
                except httpx.HTTPError:
                    pass  # try again at the next tick

    def stop(self) -> None:
        self._stop.set()


class SimpleBox(FilesMixin):
    """A box (a microVM made from an OCI image) on an airlock server.

    The box is created and booted on first use (or by :meth:`start`, or on
    entering ``async with``), and removed by :meth:`stop` or on leaving the
    ``async with`` block. Failures to start (image not found, no VM could
    boot, no server) raise ``RuntimeError`` (:class:`AirlockError` for
    errors the server reports).

    Args:
        image: image reference (default ``python:slim``).
        memory_mib: guest RAM in MiB (server default 512 when None).
        cpus: vCPUs (default 1 when None).
        name: optional unique box name.
        env: environment for every exec (dict or ``KEY=value`` list).
        working_dir, user: defaults for every exec.
        network: ``"public"`` (default: the internet; host and private ranges denied), ``"allowlist"`` (only
            ``allow_net``) or ``"none"`` (no interface); ``"enabled"``/``"disabled"`` are old names.
        allow_net: destinations of an allowlist network (names, ``*.example.com``, IPs, CIDRs, each with an
            optional ``:PORT``); implies ``network="allowlist"``.
        allow_host_ports: ports of the host's 127.0.0.1 the box may reach as ``host.airlock.internal:PORT``
            (the server must grant each: ``airlock serve --allow-host-port``).
        volumes: host directories and named volumes: ``["/host/dir:/data:ro", ("cache", "/root/.cache")]``.
            Host directories must be under one the server grants (``airlock serve --allow-volume DIR``);
            others are refused with AirlockError ``policy_denied`` (403).
        ports: published ports (Docker's ``-p``): ``[8000, "8080:80", "127.0.0.1:5353:53/udp", (9000, 90)]``
            (a bare guest port gets a free host port; the host address defaults to 127.0.0.1); the server
            must grant each (``airlock serve --allow-publish 127.0.0.1:8000-8099``, a range from 0 for free
            ports), else AirlockError ``policy_denied`` (403); a host port in use is ``port_in_use`` (409).
            :meth:`ports` returns them as bound.
        secrets: ``{"NAME": Secret(hosts=["api.example.com"], value=...)}``: the box's ``$NAME`` is a
            placeholder that the server replaces by the value in the headers of HTTPS requests to those
            hosts only (their port 443 is allowed under an allowlist); the value never enters the box and
            no call returns it.
        disk_size_mib: writable layer size.
        ttl: seconds after which the server removes the box, used or not.
        idle_timeout: seconds without an exec, file or code call after which
            the server takes ``idle_action`` on the box.
        idle_action: what ``idle_timeout`` does: ``"remove"`` (default),
            ``"stop"`` or ``"suspend"`` (scale to zero: the box is paused to
            disk and holds no host memory; the next call on it, or an inbound
            connection to a published port, resumes it first, with its
            processes and memory).
        lease: seconds (default 30) the box outlives this process if it
            crashes: a background thread renews the lease every third of
            that while the box is open; the server removes a box whose lease
            runs out. ``lease=0`` turns it off (the box then lives until
            removed).
        labels: key/value pairs stored with the box (``GET /v1/boxes?label=KEY=VALUE``
            and ``airlock ls --filter label=KEY=VALUE`` match them).
        client: a :class:`Client` to share between boxes (default: one per
            box, from the environment).
        from_snapshot: restore this memory snapshot (:meth:`snapshot`)
            instead of booting: the box runs on from the instant it was taken,
            with its processes and files. The image, ``cpus``, ``memory_mib``,
            ``disk_size_mib`` and ``network`` are the snapshot's (leave them
            out); ``env``, ``working_dir`` and ``user`` default to its box's;
            ``volumes``, ``ports``, ``allow_net`` and ``allow_host_ports`` are
            refused (AirlockError ``invalid_request``, 400). An unknown name
            is AirlockError ``snapshot_not_found`` (404).
    """

    def __init__(self, image: Optional[str] = None, memory_mib: Optional[int] = None, cpus: Optional[int] = None,
                 *, name: Optional[str] = None, env: Union[Mapping[str, str], Sequence[str], None] = None,
                 working_dir: Optional[str] = None, user: Optional[str] = None, network: Optional[str] = None,
                 disk_size_mib: Optional[int] = None, ttl: Optional[float] = None,
                 idle_timeout: Optional[float] = None, idle_action: Optional[str] = None,
                 lease: float = DEFAULT_LEASE,
                 volumes: Optional[Sequence[VolumeArg]] = None, allow_net: Optional[Sequence[str]] = None,
                 allow_host_ports: Optional[Sequence[int]] = None, ports: Optional[Sequence[PortArg]] = None,
                 client: Optional[Client] = None, from_snapshot: Optional[str] = None,
                 labels: Optional[Mapping[str, str]] = None,
                 secrets: Optional[Mapping[str, Secret]] = None, **kwargs: Any) -> None:
        if hasattr(network, "_fields"):  # BoxLite's NetworkSpec
            nf = network._fields()
            network = nf["network"]
            allow_net = nf.get("allow_net") or allow_net
        if "disk_size_gb" in kwargs:  # BoxLite's unit
            gb = kwargs.pop("disk_size_gb")
            check_type("disk_size_gb", gb, int, "an int")
            if gb is not None and disk_size_mib is None:
                disk_size_mib = gb * 1024
        for n, v, t, what in (("image", image, str, "a str"), ("memory_mib", memory_mib, int, "an int"),
                              ("cpus", cpus, int, "an int"), ("name", name, str, "a str"),
                              ("working_dir", working_dir, str, "a str"), ("user", user, str, "a str"),
                              ("network", network, str, "a str (public, allowlist, none) or a NetworkSpec"),
                              ("disk_size_mib", disk_size_mib, int, "an int"),
                              ("ttl", ttl, (int, float), "a number of seconds"),
                              ("idle_timeout", idle_timeout, (int, float), "a number of seconds"),
                              ("idle_action", idle_action, str, "a str (remove, stop, suspend)"),
                              ("lease", lease, (int, float), "a number of seconds"),
                              ("from_snapshot", from_snapshot, str, "a str")):
            check_type(n, v, t, what)
        for n, v in (("memory_mib", memory_mib), ("cpus", cpus), ("disk_size_mib", disk_size_mib)):
            if v is not None and v < 1:
                raise ValueError(f"{n}={v}: must be at least 1")
        for n, v in (("ttl", ttl), ("idle_timeout", idle_timeout), ("lease", lease)):
            check_number(n, v)
        check_list("allow_net", allow_net, str, "str")
        check_list("allow_host_ports", allow_host_ports, int, "int")
        if labels is not None:
            if not isinstance(labels, Mapping):
                raise TypeError(f"labels must be a dict of str to str, not {type(labels).__name__}")
            for k, v in labels.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise TypeError(f"labels[{k!r}]: key and value must be str, not "
                                    f"({type(k).__name__}, {type(v).__name__})")
        spec: Dict[str, Any] = {}
        if from_snapshot:
            spec["from_snapshot"] = from_snapshot
            if image is not None:
                spec["image"] = image
        else:
            spec["image"] = image or DEFAULT_IMAGE
        for k, v in (("memory_mib", memory_mib), ("cpus", cpus), ("name", name), ("env", _env_list(env)),
                     ("working_dir", working_dir), ("user", user), ("network", network),
                     ("disk_size_mib", disk_size_mib), ("ttl", ttl), ("idle_timeout", idle_timeout),
                     ("idle_action", idle_action),
                     ("lease", float(lease) if lease else None),
                     ("volumes", [_volume(v) for v in volumes] if volumes else None),
                     ("allow_net", list(allow_net) if allow_net else None),
                     ("allow_host_ports", list(allow_host_ports) if allow_host_ports else None),
                     ("ports", [_port(p) for p in ports] if ports else None),
                     ("labels", dict(labels) if labels else None),
                     ("secrets", _secrets(secrets))):
            if v is not None:
                spec[k] = v
        auto_remove = kwargs.pop("auto_remove", None)
        check_type("auto_remove", auto_remove, bool, "a bool")
        if auto_remove:
            spec["auto_remove"] = True
        # BoxLite's auto_remove=False: stop() shuts the box down and keeps it.
        self._keep = auto_remove is False
        reuse_existing = kwargs.pop("reuse_existing", False)
        check_type("reuse_existing", reuse_existing, bool, "a bool")
        self._reuse_existing = bool(reuse_existing)
        self._created: Optional[bool] = None
        runtime = kwargs.pop("runtime", None)
        if runtime is not None:
            rt = getattr(runtime, "_rt", runtime)  # SyncBoxlite wraps a Boxlite
            rc = getattr(rt, "_client", None)
            if not isinstance(rc, Client):
                raise TypeError(f"runtime must be a Boxlite or SyncBoxlite, not {type(runtime).__name__}")
            if client is None:
                client = Client(endpoint=rc.endpoint, autostart=rc.autostart)
        for k in sorted(kwargs):
            if k in _BOXLITE_UNSUPPORTED and kwargs[k] is not None and kwargs[k] != []:
                raise NotImplementedError(f"{type(self).__name__}({k}=...) has no equivalent in airlock: "
                                          f"{_BOXLITE_UNSUPPORTED[k]}")
        self._unsupported = sorted(k for k in kwargs if k not in _BOXLITE_UNSUPPORTED)
        self._spec = spec
        self._owns_client = client is None
        self._client = client or Client()
        self._id: Optional[str] = None
        self._lock = asyncio.Lock()
        self._renewer: Optional[_LeaseRenewer] = None

    @property
    def id(self) -> Optional[str]:
        """The box id once started, else None."""
        return self._id

    @property
    def created(self) -> Optional[bool]:
        """BoxLite's: True when :meth:`start` created the box, False when
        ``reuse_existing=True`` found the box called ``name`` and reused it;
        None before start."""
        return self._created

    def info(self) -> Any:
        """The box's info (BoxLite's ``BoxInfo``: id, name, state, image,
        cpus, memory_mib, created_at...; ``raw`` is airlock's box JSON). A
        blocking GET, also awaitable. RuntimeError before :meth:`start`."""
        from ._boxlite import BoxInfo

        if self._id is None:
            raise RuntimeError("box not started: use 'async with' or call start() first")
        with sync_client(self._client.endpoint) as c:
            r = c.get(f"/v1/boxes/{self._id}")
            _raise_for_problem(r)
            return BoxInfo._of(r.json())

    async def metrics(self) -> Any:
        """The box's CPU, memory, disk and network use now: an
        :class:`airlock.BoxMetrics`, as BoxLite's ``box.metrics()`` (``GET
        /v1/boxes/{id}/stats``, what ``airlock stats`` shows; about 0.5 s)."""
        from ._boxlite import BoxMetrics

        return BoxMetrics._of(await self._client.request("GET", f"/v1/boxes/{quote(await self._box(), safe='')}/stats"))

    async def shutdown(self) -> None:
        """BoxLite's alias of :meth:`stop`."""
        await self.stop()

    @classmethod
    def attach(cls, box_id: str, client: Optional[Client] = None, **kwargs: Any) -> Any:
        """A handle on an existing, running box (created by another call or
        process), by id or name. :meth:`stop` removes it."""
        b = cls(client=client, **kwargs)
        b._id = box_id
        return b

    async def start(self) -> "SimpleBox":
        """Creates and boots the box (a no-op when it is running)."""
        async with self._lock:
            if self._id is None:
                if self._unsupported:
                    raise TypeError(f"unsupported box options: {', '.join(self._unsupported)}")
                if self._reuse_existing and self._spec.get("name"):
                    try:
                        box = await self._client.request("GET", f"/v1/boxes/{self._spec['name']}")
                    except AirlockError as e:
                        if e.code != "box_not_found":
                            raise
                    else:
                        if box.get("state") != "running":
                            box = await self._client.request("POST", f"/v1/boxes/{box['id']}/start")
                        self._id = box["id"]
                        self._created = False
                        return self
                box = await self._client.request("POST", "/v1/boxes", json=self._spec)
                self._id = box["id"]
                self._created = True
                if self._spec.get("lease"):
                    self._renewer = _LeaseRenewer(self._client.endpoint, box["id"], self._spec["lease"])
        return self

    async def snapshot(self, name: str) -> Snapshot:
        """Saves the box's memory, device state and writable layer, taken at
        one paused instant, as the snapshot ``name`` (letters, digits, ``_ .
        -``; unique on the server); the box runs on. Start boxes from it with
        ``SimpleBox(from_snapshot=name)`` (or ``CodeBox(...)``); list and
        remove snapshots with :meth:`Client.snapshots` and
        :meth:`Client.remove_snapshot`. Starts the box when needed.

        Raises AirlockError ``snapshot_exists`` (409) when the name is
        taken, ``policy_denied`` (403) past the server's
        ``--max-snapshots``, ``not_supported`` (501) when the server's VM
        driver cannot snapshot; a box with volumes cannot be snapshotted.
        """
        box = await self._box()
        return Snapshot._of(await self._client.request("POST", f"/v1/boxes/{box}/snapshot", json={"name": name}))

    async def checkpoint(self, name: str) -> Checkpoint:
        """Saves the box's memory, devices and writable layer, at one paused
        instant, as its checkpoint ``name`` (1-64 letters, digits, ``_ .
        -``), kept with the box and removed with it; the box runs on. Its
        parent is the checkpoint the box was last checkpointed at or rolled
        back to. Starts the box when needed.

        Raises AirlockError ``checkpoint_exists`` (409) when the box has
        one of that name, ``not_supported`` (501) when the server's VM
        driver cannot snapshot; a box with volumes cannot be checkpointed.
        """
        box = await self._box()
        return Checkpoint._of(await self._client.request("POST", f"/v1/boxes/{box}/checkpoints", json={"name": name}))

    async def rollback(self, name: str) -> None:
        """Returns the box, in place, to its checkpoint ``name``: processes,
        files and memory as they were then (the clock stepped to now, the
        RNG reseeded); the box keeps its id, name, published ports, network
        policy and secrets. Execs running in it end (AirlockError
        ``rolled_back``, 409). A CodeBox's contexts keep their ids, their
        variables as at the checkpoint (``x = 1``, checkpoint, ``x = 2``,
        rollback: ``x`` is 1); one made after the checkpoint starts afresh.
        A checkpoint taken afterwards starts a branch.

        Raises AirlockError ``checkpoint_not_found`` (404).
        """
        box = await self._box()
        await self._client.request("POST", f"/v1/boxes/{box}/rollback", json={"name": name})

    async def checkpoints(self) -> List[Checkpoint]:
        """The box's checkpoints, oldest first; each names its parent."""
        box = await self._box()
        r = await self._client.request("GET", f"/v1/boxes/{box}/checkpoints")
        return [Checkpoint._of(d) for d in r.get("checkpoints") or []]

    async def remove_checkpoint(self, name: str) -> None:
        """Removes the box's checkpoint ``name``; those taken after it get
        its parent. AirlockError ``checkpoint_not_found`` (404)."""
        box = await self._box()
        await self._client.request("DELETE", f"/v1/boxes/{box}/checkpoints/{quote(name, safe='')}")

    async def export(self, path: Union[str, Path], checkpoints: bool = False) -> int:
        """Writes the box's archive to the host file ``path`` (as ``airlock
        export``): its configuration and writable layer (what it changed in
        its image; volumes are not part of it), and with
        ``checkpoints=True`` its checkpoints with their tree, so that
        :meth:`rollback` works on the box :meth:`import_box` makes of it. A
        running box is flushed and paused while its disk is copied. Streamed
        to a temporary file next to ``path``, renamed over it once whole;
        returns the archive's size in bytes.

        Raises AirlockError (``transfer_cut`` when the server cut the
        transfer: nothing is left at ``path``).
        """
        box = await self._box()
        dst = Path(path)
        tmp = dst.with_name(dst.name + ".part")
        http = await self._client._ensure()
        n = 0
        try:
            async with http.stream("GET", f"/v1/boxes/{box}/export",
                                   params={"checkpoints": "true" if checkpoints else "false"},
                                   timeout=httpx.Timeout(10.0, read=None)) as r:
                if r.status_code >= 400:
                    await r.aread()
                    _raise_for_problem(r)
                with open(tmp, "wb") as f:
                    async for c in r.aiter_bytes():
                        f.write(c)
                        n += len(c)
            os.replace(tmp, dst)
        except httpx.RemoteProtocolError as e:
            raise AirlockError(0, "transfer_cut", f"export {box}: the server cut the transfer ({e})") from e
        finally:
            if tmp.exists():
                tmp.unlink()
        return n

    @classmethod
    async def import_box(cls: type, path: Union[str, Path], name: Optional[str] = None,
                         client: Optional[Client] = None, start: bool = True, **kwargs: Any) -> Any:
        """Makes a box on the server of the archive at the host file
        ``path`` (:meth:`export`, ``airlock export``), streamed, and returns
        a handle on it (as :meth:`attach`), started unless ``start=False``.
        The box gets the archive's options and files, and its checkpoints
        when it carries them (the server takes those only with ``airlock
        serve --allow-import-state``: else AirlockError ``policy_denied``,
        403). The archive's image must be on the server. ``name`` names the
        new box. It keeps the archive's ``ttl``, ``idle_timeout`` and
        ``lease`` (no renewer runs for it: export boxes made with ``lease=0``
        to keep them). :meth:`stop` removes it, as for any attached box.

        Raises AirlockError ``invalid_request`` (400) for a file that is
        not a box archive or one with memory, ``image_not_found`` (404),
        ``name_in_use`` (409), ``body_too_large`` (413) past ``serve
        --max-upload``.
        """
        c = client or Client()
        src = Path(path)
        size = src.stat().st_size

        async def chunks() -> AsyncIterator[bytes]:
            with open(src, "rb") as f:
                while True:
                    b = await asyncio.to_thread(f.read, 1 << 20)
                    if not b:
                        return
                    yield b

        http = await c._ensure()
        params = {"name": name} if name else None
        r = await http.post("/v1/boxes/import", params=params, content=chunks(),
                            headers={"Content-Type": "application/x-tar", "Content-Length": str(size)},
                            timeout=httpx.Timeout(10.0, read=None, write=None))
        _raise_for_problem(r)
        info = r.json()
        if start:
            await c.request("POST", f"/v1/boxes/{info['id']}/start")
        return cls.attach(info["id"], client=c, **kwargs)

    async def pause(self, to_disk: bool = False) -> None:
        """Pauses the running box: its vCPUs stop (no guest CPU; its memory
        stays allocated; calls into it wait until :meth:`resume`). With
        ``to_disk=True`` the server saves its memory into the box's
        directory and ends its VM instead: no host memory or CPU is held
        until :meth:`resume` continues it as the same box (files, processes
        and their pids; the clock stepped to the host's). Pausing to disk
        ends a CodeBox's contexts and execs in progress (their processes run
        on in the box); calls in between raise AirlockError
        ``box_not_running`` (409).

        Raises AirlockError ``not_supported`` (501) when the server's VM
        driver cannot pause to disk; a box with volumes cannot be paused to
        disk.
        """
        box = await self._box()
        await self._client.request("POST", f"/v1/boxes/{box}/pause", json={"to_disk": bool(to_disk)})

    async def resume(self) -> None:
        """Lets a paused box run on, or continues one paused to disk
        (:meth:`pause`); a running box is left as it is."""
        box = await self._box()
        await self._client.request("POST", f"/v1/boxes/{box}/resume")

    async def fork(self: _B, n: int = 1, from_checkpoint: Optional[str] = None) -> List[_B]:
        """Forks the running box into ``n`` (1-64) children: each an
        independent, running box that starts from this instant, with the
        box's processes and files and its own writable layer (what one
        child writes, neither the box nor the other children see). The box
        is paused only briefly and runs on.

        The children are of this box's class (a CodeBox's children are
        CodeBoxes, with its ``index_url``) and are removed like any box this
        SDK made: :meth:`stop` each, or use it in ``async with``; the box's
        own :meth:`stop` does not remove them. They have the box's lease
        (renewed while they are open) and idle timeout, what is left of its
        ttl, and no published ports. A CodeBox's contexts are forked with
        it: ``child.context(ctx.id)`` is the twin of ``ctx`` on a child,
        its variables kept::

            async with CodeBox() as box:
                ctx = await box.create_context()
                await ctx.run("x = 41")
                for child in await box.fork(n=2):
                    async with child:
                        print((await child.context(ctx.id).run("x + 1")).value)  # "42"

        With ``from_checkpoint`` the children start from that checkpoint
        of the box (:meth:`checkpoint`) instead of from now; the box need
        not be running.

        Raises AirlockError ``policy_denied`` (403) when ``n`` more boxes
        would pass the server's ``--max-boxes``, ``checkpoint_not_found``
        (404) for an unknown checkpoint and ``not_supported`` (501) when
        its VM driver cannot fork; on an error no child is left.
        """
        if not 1 <= n <= MAX_FORK:
            raise ValueError(f"fork(n={n}): n must be 1 to {MAX_FORK}")
        if from_checkpoint is not None and (not isinstance(from_checkpoint, str) or not from_checkpoint):
            raise TypeError(f"fork(from_checkpoint={from_checkpoint!r}): a checkpoint name (str) is needed")
        box = await self._box()
        body: Dict[str, Any] = {"n": n}
        if from_checkpoint is not None:
            body["from_checkpoint"] = from_checkpoint
        r = await self._client.request("POST", f"/v1/boxes/{box}/fork", json=body)
        return [self._child(b["id"]) for b in r.get("boxes") or []]

    def _child(self: _B, box_id: str) -> _B:
        """A handle on fork child box_id: a copy of this box object (its
        class and options) bound to the child, with its own connection to
        the same server (unless the box was given a shared client) and its
        own lease renewer."""
        c = copy.copy(self)
        c._spec = dict(self._spec)
        c._id = box_id
        c._lock = asyncio.Lock()
        c._renewer = None
        if self._owns_client:
            c._client = Client(endpoint=self._client.endpoint, autostart=self._client.autostart)
        lease = self._spec.get("lease")
        if lease:
            c._renewer = _LeaseRenewer(c._client.endpoint, box_id, lease)
        return c

    async def ports(self) -> List[PortMapping]:
        """The box's published ports as bound on the server's host (a
        ``host_port`` of 0 replaced by the port picked), starting the box
        when needed::

            async with SimpleBox(ports=[8000]) as box:
                p = (await box.ports())[0]
                url = f"http://{p.host_ip}:{p.host_port}/"
        """
        box = await self._box()
        r = await self._client.request("GET", f"/v1/boxes/{box}")
        return [PortMapping(host_ip=p.get("host_ip") or "127.0.0.1", host_port=p.get("host_port") or 0, guest_port=p["guest_port"],
                            protocol=p.get("protocol") or "tcp") for p in (r.get("ports") or [])]

    async def set_secret(self, name: str, value: str) -> None:
        """Gives the box's secret ``name`` a new value (rotation): the server
        substitutes it in the box's requests from the next one on, and
        later starts keep it. The placeholder in the box stays. Raises
        AirlockError ``invalid_argument`` (400) for a secret the box was not
        created with or a bad value (the error never shows the value)."""
        box = await self._box()
        await self._client.request("PUT", f"/v1/boxes/{box}/secrets/{quote(name, safe='')}", json={"value": value})

    async def _box(self) -> str:
        if self._id is None:
            await self.start()
        assert self._id is not None
        return self._id

    async def stop(self) -> None:
        """Removes the box (its VM and writable layer). A no-op when it was
        never started or is already gone."""
        async with self._lock:
            if self._renewer is not None:
                self._renewer.stop()
                self._renewer = None
            if self._id is not None:
                try:
                    if self._keep:  # auto_remove=False: shut down, keep the box
                        await self._client.request("POST", f"/v1/boxes/{self._id}/stop")
                    else:
                        await self._client.request("DELETE", f"/v1/boxes/{self._id}", params={"force": "true"})
                except AirlockError as e:
                    if e.code != "box_not_found":
                        raise
                self._id = None
            if self._owns_client:
                await self._client.aclose()

    async def __aenter__(self) -> "SimpleBox":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def exec(self, cmd: str, *args: str, env: Union[Mapping[str, str], Sequence[str], None] = None,
                   user: Optional[str] = None, timeout: Optional[float] = None, cwd: Optional[str] = None,
                   stdin: Union[str, bytes, None] = None) -> ExecResult:
        """Runs ``cmd`` with ``args`` in the box and waits for it.

        ``timeout`` (seconds) is enforced: the process and everything it
        started are killed, ``timed_out`` is set. A non-zero exit is reported
        in the result, not raised.
        """
        check_cmd(cmd, args)
        check_number("timeout", timeout)
        check_type("user", user, str, "a str")
        check_type("cwd", cwd, str, "a str")
        check_type("stdin", stdin, (str, bytes), "str or bytes")
        body: Dict[str, Any] = {"cmd": [cmd, *args]}
        if env is not None:
            body["env"] = _env_list(env)
        if user:
            body["user"] = user
        if cwd:
            body["working_dir"] = cwd
        if timeout:
            body["timeout"] = float(timeout)
        if stdin is not None:
            if isinstance(stdin, str):
                stdin = stdin.encode()
            body["stdin"] = base64.b64encode(stdin).decode()
            body["stdin_encoding"] = "base64"
        box = await self._box()
        r = await self._client.request("POST", f"/v1/boxes/{box}/exec", json=body)
        out = decode_output(r["stdout"], r["stdout_encoding"])
        err = decode_output(r["stderr"], r["stderr_encoding"])
        msg = r.get("error_message") or None
        if r["timed_out"] and not msg:
            msg = f"timed out after {timeout} s; the process tree was killed"
        return ExecResult(exit_code=r["exit_code"], stdout=out.decode("utf-8", "replace"),
                          stderr=err.decode("utf-8", "replace"), error_message=msg, timed_out=r["timed_out"],
                          stdout_bytes=out, stderr_bytes=err, truncated=bool(r.get("truncated")),
                          stdout_dropped=int(r.get("stdout_dropped") or 0), stderr_dropped=int(r.get("stderr_dropped") or 0))

    def stream(self, cmd: str, *args: str, env: Union[Mapping[str, str], Sequence[str], None] = None,
               user: Optional[str] = None, timeout: Optional[float] = None, cwd: Optional[str] = None,
               tty: bool = False, rows: Optional[int] = None, cols: Optional[int] = None) -> "ExecStream":
        """Starts ``cmd`` over the server's WebSocket and streams its output::

            async with box.stream("sh", "-c", "cat; echo done >&2") as p:
                await p.write(b"hi\\n")
                await p.close_stdin()
                async for fd, data in p:   # fd 1 = stdout, 2 = stderr
                    ...
            print(p.exit_code)

        With ``tty=True`` the command runs on a terminal of ``rows`` x ``cols``
        (default 24 x 80; :meth:`ExecStream.resize` changes it): all output
        comes as fd 1, with CRLF line ends, and ``b"\\x03"`` on stdin is Ctrl-C.
        """
        check_cmd(cmd, args)
        check_number("timeout", timeout)
        check_type("user", user, str, "a str")
        check_type("cwd", cwd, str, "a str")
        check_type("tty", tty, bool, "a bool")
        check_type("rows", rows, int, "an int")
        check_type("cols", cols, int, "an int")
        req: Dict[str, Any] = {"cmd": [cmd, *args]}
        if env is not None:
            req["env"] = _env_list(env)
        if user:
            req["user"] = user
        if cwd:
            req["working_dir"] = cwd
        if timeout:
            req["timeout"] = float(timeout)
        if tty:
            req["tty"] = True
            if rows:
                req["rows"] = rows
            if cols:
                req["cols"] = cols
        return ExecStream(self, req)


class ExecStream:
    """A streaming exec (see :meth:`SimpleBox.stream`). After the output is
    exhausted, ``exit_code``, ``signal``, ``timed_out`` and ``error_message``
    hold the result."""

    def __init__(self, box: SimpleBox, req: Dict[str, Any]) -> None:
        self._box = box
        self._req = req
        self._ws: Any = None
        self.exit_code: Optional[int] = None
        self.signal = 0
        self.timed_out = False
        self.error_message: Optional[str] = None

    async def __aenter__(self) -> "ExecStream":
        box = await self._box._box()
        self._ws = await self._box._client.ws_connect(f"/v1/boxes/{box}/exec/ws")
        await self._ws.send(json.dumps(self._req))
        first = json.loads(await self._ws.recv())
        if first.get("type") == "error":
            self._fail(first)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._ws is not None:
            await self._ws.close()

    def _fail(self, msg: Dict[str, Any]) -> None:
        p = msg.get("problem") or {}
        raise AirlockError(p.get("status", 0), p.get("code", ""), p.get("detail", "exec failed"), p.get("cause", ""),
                           p.get("errors") if isinstance(p.get("errors"), list) else None)

    async def write(self, data: Union[bytes, str]) -> None:
        """Writes to the process's stdin."""
        if isinstance(data, str):
            data = data.encode()
        await self._ws.send(bytes([_STDIN]) + data)

    async def close_stdin(self) -> None:
        """Closes stdin (the process reads EOF)."""
        await self._ws.send(json.dumps({"type": "close_stdin"}))

    async def resize(self, rows: int, cols: int) -> None:
        """Sets a tty exec's terminal size (the process gets SIGWINCH)."""
        await self._ws.send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    async def send_signal(self, sig: Union[str, int]) -> None:
        """Sends a signal ("SIGINT", "TERM", 9) to the process."""
        await self._ws.send(json.dumps({"type": "signal", "signal": sig}))

    async def kill(self) -> None:
        """Kills the process tree."""
        await self._ws.send(json.dumps({"type": "kill"}))

    def __aiter__(self) -> AsyncIterator[Tuple[int, bytes]]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Tuple[int, bytes]]:
        from websockets.exceptions import ConnectionClosedOK

        while True:
            try:
                msg = await self._ws.recv()
            except ConnectionClosedOK:
                return
            if isinstance(msg, bytes):
                yield msg[0], msg[1:]
                continue
            m = json.loads(msg)
            if m.get("type") == "exit":
                self.exit_code = m["exit_code"]
                self.signal = m.get("signal", 0)
                self.timed_out = m.get("timed_out", False)
                self.error_message = m.get("error_message") or None
                return
            if m.get("type") == "error":
                self._fail(m)

    async def wait(self) -> int:
        """Drains the output and returns the exit code."""
        async for _ in self:
            pass
        assert self.exit_code is not None
        return self.exit_code


class CodeBox(SimpleBox):
    """A box with Python (default image ``python:slim``): BoxLite's CodeBox.

    ``async with CodeBox() as box: print(await box.run("print(1)"))``

    Differences from BoxLite: ``run(code, timeout=...)`` *is* enforced (the
    Python process tree is killed past it); the box also starts lazily on
    first use, so calling ``run`` outside ``async with`` works (call
    :meth:`stop` to remove the box then).

    Args:
        index_url: pip ``--index-url`` for :meth:`install_package` (default
            PyPI).
        Other arguments: see :class:`SimpleBox`.
    """

    def __init__(self, image: Optional[str] = None, memory_mib: Optional[int] = None, cpus: Optional[int] = None,
                 *, index_url: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(image, memory_mib, cpus, **kwargs)
        self._index_url = index_url

    async def run(self, code: str, timeout: Optional[float] = None) -> str:
        """Runs ``code`` with ``python -c`` in a fresh interpreter and returns
        its stdout. A non-zero exit does not raise (use :meth:`exec` for
        stderr and the exit code). ``timeout`` (seconds) is enforced."""
        check_type("code", code, str, "a str")
        check_number("timeout", timeout)
        box = await self._box()
        body: Dict[str, Any] = {"code": code}
        if timeout:
            body["timeout"] = float(timeout)
        r = await self._client.request("POST", f"/v1/boxes/{box}/code/run", json=body)
        return str(r["stdout"])

    async def run_script(self, script_path: Union[str, Path], timeout: Optional[float] = None) -> str:
        """Reads a ``.py`` file on the host and runs it as :meth:`run` does."""
        return await self.run(Path(script_path).read_text(), timeout=timeout)

    async def install_package(self, package: str) -> str:
        """``pip install package`` in the box; returns pip's stdout + stderr."""
        return await self.install_packages(package)

    async def install_packages(self, *packages: str) -> str:
        """Installs several packages in one pip run; returns stdout + stderr."""
        check_list("packages", packages, str, "str")
        box = await self._box()
        body: Dict[str, Any] = {"packages": list(packages)}
        if self._index_url:
            body["index_url"] = self._index_url
        r = await self._client.request("POST", f"/v1/boxes/{box}/code/install", json=body)
        return str(r["output"])

    async def create_context(self) -> "Context":
        """Starts a stateful interpreter: variables, imports and functions
        persist between :meth:`Context.run` calls."""
        box = await self._box()
        r = await self._client.request("POST", f"/v1/boxes/{box}/contexts")
        return Context(self, r["id"])

    def context(self, ctx_id: str) -> "Context":
        """A handle on the existing context ``ctx_id`` of this box (no
        request is sent): after :meth:`fork`, ``child.context(ctx.id)`` is
        the child's twin of ``ctx``, with the variables ``ctx`` had then. A
        context that does not exist fails on first use with AirlockError
        ``context_not_found`` (404)."""
        return Context(self, ctx_id)


class Context:
    """A stateful Python interpreter in a :class:`CodeBox` (``box``); ``id``
    names it on the server, and on every fork child of the box
    (:meth:`CodeBox.context`)."""

    def __init__(self, box: CodeBox, ctx_id: str) -> None:
        self._box = box
        self.id = ctx_id

    @property
    def box(self) -> CodeBox:
        """The CodeBox the context runs in."""
        return self._box

    async def run(self, code: str, timeout: Optional[float] = None) -> CellResult:
        """Runs a cell; returns its output, last value, exception and images.
        ``timeout`` (seconds) interrupts the cell (KeyboardInterrupt), and
        restarts the interpreter if it does not stop."""
        check_type("code", code, str, "a str")
        check_number("timeout", timeout)
        box = await self._box._box()
        body: Dict[str, Any] = {"code": code}
        if timeout:
            body["timeout"] = float(timeout)
        r = await self._box._client.request("POST", f"/v1/boxes/{box}/contexts/{self.id}/run", json=body)
        err = r.get("error")
        return CellResult(
            stdout=r["stdout"], stderr=r["stderr"], value=r.get("value") or None,
            error=CellError(err["name"], err["value"], err["traceback"]) if err else None,
            images=[base64.b64decode(im["data"]) for im in r.get("images") or []],
            timed_out=r["timed_out"], state_lost=r["state_lost"],
        )

    async def close(self) -> None:
        """Ends the interpreter."""
        box = await self._box._box()
        await self._box._client.request("DELETE", f"/v1/boxes/{box}/contexts/{self.id}")

    async def __aenter__(self) -> "Context":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

"""BoxLite's runtime API (``boxlite.Boxlite``, ``BoxOptions``, ``Box``,
``Execution``, the REST options) on an airlock server, so that
``import airlock as boxlite`` runs BoxLite programs.

Every BoxLite name here does what BoxLite documents, on ``airlock serve``;
where airlock has no equivalent the call raises ``NotImplementedError``
naming what to use instead (the README's table lists each name). Arguments
are checked before anything is sent: a wrong type raises ``TypeError`` and a
bad value ``ValueError``, naming the parameter.
"""

from __future__ import annotations

import abc
import asyncio
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._box import _SECRETS_INSTEAD, DEFAULT_IMAGE, _secrets, DEFAULT_LEASE, _LeaseRenewer, _port, _volume, env_pairs
from ._client import AirlockError, Client, Endpoint, _raise_for_problem, sync_client
from ._files import FilesMixin

#: Most bytes of one stream of an :class:`Execution` held for a reader that
#: has not read them yet; past it output is dropped and a marker line says
#: how much (the box chooses how much it prints).
MAX_PENDING_OUTPUT = 16 << 20


def _unsupported(what: str, instead: str) -> NotImplementedError:
    return NotImplementedError(f"{what} has no equivalent in airlock: {instead}")


# ---------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------


def _opt_str(name: str, v: Any) -> Optional[str]:
    if v is not None and not isinstance(v, str):
        raise TypeError(f"{name} must be a str, not {type(v).__name__}")
    return v


def _opt_int(name: str, v: Any, lo: int, hi: int) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name}={v}: must be {lo} to {hi}")
    return v


def _opt_bool(name: str, v: Any) -> Optional[bool]:
    if v is not None and not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, not {type(v).__name__}")
    return v


def _str_list(name: str, v: Any) -> Optional[List[str]]:
    if v is None:
        return None
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
        raise TypeError(f"{name} must be a list of str, not {type(v).__name__}")
    out = list(v)
    for i, s in enumerate(out):
        if not isinstance(s, str):
            raise TypeError(f"{name}[{i}] must be a str, not {type(s).__name__}")
    return out


def _boxlite_volume(i: int, v: Any) -> Dict[str, Any]:
    """A BoxLite volume: ``(host, guest[, read_only])`` or ``{host|host_path,
    guest|guest_path, read_only|ro}`` (airlock's ``"SRC:DST[:ro]"`` too)."""
    if isinstance(v, tuple) and len(v) == 3 and isinstance(v[2], bool):
        return _volume((v[0], v[1], "ro" if v[2] else "rw"))
    if isinstance(v, Mapping) and "source" not in v:
        host = v.get("host", v.get("host_path"))
        guest = v.get("guest", v.get("guest_path"))
        if host is None or guest is None:
            raise ValueError(f"volumes[{i}]: a dict needs host (or host_path) and guest (or guest_path)")
        return _volume({"source": host, "target": guest, "read_only": bool(v.get("read_only", v.get("ro", False)))})
    if not isinstance(v, (str, tuple, list, Mapping)):
        raise TypeError(f"volumes[{i}] must be a (host, guest[, read_only]) tuple or a dict, not {type(v).__name__}")
    return _volume(v)


def _boxlite_port(i: int, p: Any) -> Dict[str, Any]:
    """A BoxLite port: ``(host, guest[, protocol[, host_ip]])`` or
    ``{guest_port|guest, host_port|host, protocol, host_ip}``."""
    if isinstance(p, tuple) and len(p) in (3, 4):
        if not isinstance(p[2], str) or p[2].lower() not in ("tcp", "udp"):
            raise ValueError(f"ports[{i}]: the protocol must be \"tcp\" or \"udp\", not {p[2]!r}")
        d: Dict[str, Any] = {"host_port": p[0], "guest_port": p[1], "protocol": p[2].lower()}
        if len(p) == 4 and p[3]:
            d["host_ip"] = p[3]
        p = d
    elif isinstance(p, Mapping):
        d = {"guest_port": p.get("guest_port", p.get("guest")), "host_port": p.get("host_port", p.get("host", 0)) or 0}
        if d["guest_port"] is None:
            raise ValueError(f"ports[{i}]: a dict needs guest_port")
        for k in ("protocol", "host_ip"):
            if p.get(k):
                d[k] = p[k]
        p = d
    if isinstance(p, Mapping):
        for k in ("host_port", "guest_port"):
            if isinstance(p[k], bool) or not isinstance(p[k], int):
                raise TypeError(f"ports[{i}].{k} must be an int, not {type(p[k]).__name__}")
            if not (0 if k == "host_port" else 1) <= p[k] <= 65535:
                raise ValueError(f"ports[{i}].{k}={p[k]}: must be a port number")
        return dict(p)
    return _port(p)


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


class ImageRegistry:
    """BoxLite's registry login for a local runtime. airlock pulls with the
    logins of ``airlock login`` (Docker's config), so passing one in
    :class:`Options` raises ``NotImplementedError``."""

    def __init__(self, host: str, transport: str = "https", skip_verify: bool = False, search: bool = False,
                 username: Optional[str] = None, password: Optional[str] = None,
                 bearer_token: Optional[str] = None) -> None:
        self.host = _opt_str("host", host)
        self.transport = transport
        self.skip_verify = skip_verify
        self.search = search
        self.username = username
        self.password = password
        self.bearer_token = bearer_token

    def __repr__(self) -> str:
        return f"ImageRegistry(host={self.host!r}, transport={self.transport!r})"


class Options:
    """BoxLite's local runtime options.

    ``home_dir``: the airlock home of the server the runtime talks to: the
    runtime uses the server on ``home_dir/airlock.sock``, starting one with
    that home when none answers (as the SDK does for the default home). An
    airlock home keeps its own boxes; its images are ``$AIRLOCK_IMAGES`` when
    set, else ``home_dir/images``.

    ``image_registries``: not supported (``NotImplementedError`` when not
    empty): log in with ``airlock login`` instead.
    """

    def __init__(self, home_dir: Optional[str] = None, image_registries: Optional[Sequence[ImageRegistry]] = None) -> None:
        self.home_dir = _opt_str("home_dir", os.fspath(home_dir) if isinstance(home_dir, os.PathLike) else home_dir)
        self.image_registries = list(image_registries or [])

    def __repr__(self) -> str:
        return f"Options(home_dir={self.home_dir!r}, image_registries={self.image_registries!r})"


@dataclass
class AccessToken:
    """A bearer token (an API key never expires: ``expires_at`` None)."""

    token: str
    expires_at: Optional[float] = None

    def __repr__(self) -> str:
        return f"AccessToken(token='***', expires_at={self.expires_at!r})"


class Credential(abc.ABC):
    """BoxLite's credential interface: ``get_token()`` returns the
    :class:`AccessToken` sent as ``Authorization: Bearer TOKEN`` (airlock's
    ``serve --token``). :class:`ApiKeyCredential` is one."""

    @abc.abstractmethod
    def get_token(self) -> AccessToken:
        """The token to send."""


class ApiKeyCredential(Credential):
    """An API key, sent as ``Authorization: Bearer KEY``: airlock's
    ``serve --token`` (or ``$AIRLOCK_TOKEN``)."""

    def __init__(self, key: str) -> None:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        self._key = key

    @staticmethod
    def from_env() -> Optional["ApiKeyCredential"]:
        """From ``BOXLITE_API_KEY``, else ``AIRLOCK_TOKEN``; None when both
        are unset or empty."""
        k = os.environ.get("BOXLITE_API_KEY") or os.environ.get("AIRLOCK_TOKEN")
        return ApiKeyCredential(k) if k else None

    def get_token(self) -> AccessToken:
        return AccessToken(self._key)

    def __repr__(self) -> str:
        return "ApiKeyCredential(***)"


class BoxliteRestOptions:
    """Where an ``airlock serve`` listens on TCP (``--listen``): ``url`` such
    as ``http://127.0.0.1:8100``, ``credential`` its ``--token``. ``prefix``
    (BoxLite's tenant path) has no equivalent: airlock serves one home per
    server, so a prefix raises ``NotImplementedError`` (start one server per
    home instead)."""

    def __init__(self, url: str, credential: Optional[Credential] = None, prefix: Optional[str] = None) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        if not re.match(r"^https?://[^/]", url):
            raise ValueError(f"url={url!r}: want http://HOST:PORT or https://HOST:PORT (airlock serve --listen)")
        if credential is not None and not isinstance(credential, Credential):
            raise TypeError(f"credential must be an ApiKeyCredential (a Credential), not {type(credential).__name__}")
        self.url = url.rstrip("/")
        self.credential = credential
        self.prefix = _opt_str("prefix", prefix)

    @staticmethod
    def from_env() -> "BoxliteRestOptions":
        """From ``BOXLITE_REST_URL`` (else ``AIRLOCK_URL``; required),
        ``BOXLITE_API_KEY`` (else ``AIRLOCK_TOKEN``) and
        ``BOXLITE_REST_PREFIX``. Raises ``ValueError`` naming the variable
        when no URL is set."""
        url = os.environ.get("BOXLITE_REST_URL") or os.environ.get("AIRLOCK_URL")
        if not url:
            raise ValueError("BOXLITE_REST_URL not set (the URL of airlock serve --listen, e.g. http://127.0.0.1:8100)")
        return BoxliteRestOptions(url, ApiKeyCredential.from_env(), os.environ.get("BOXLITE_REST_PREFIX") or None)

    def __repr__(self) -> str:
        cred = type(self.credential).__name__ + "(***)" if self.credential else "None"
        return f"BoxliteRestOptions(url={self.url!r}, credential={cred}, prefix={self.prefix!r})"


#: BoxLite's other name of :class:`BoxliteRestOptions`.
RestOptions = BoxliteRestOptions


class NetworkSpec:
    """BoxLite's network: ``mode`` ``"enabled"`` (airlock's ``public``: the
    internet; the host and private ranges denied) or ``"disabled"``
    (``none``: no interface); ``allow_net`` with ``"enabled"`` is airlock's
    ``allowlist``: only those destinations."""

    def __init__(self, mode: str, allow_net: Optional[Sequence[str]] = None) -> None:
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a str, not {type(mode).__name__}")
        if mode not in ("enabled", "disabled"):
            raise ValueError(f"mode={mode!r}: want 'enabled' or 'disabled'")
        self.mode = mode
        self.allow_net = _str_list("allow_net", allow_net) or []
        if mode == "disabled" and self.allow_net:
            raise ValueError("allow_net needs mode='enabled' (a disabled network has no interface)")

    def _fields(self) -> Dict[str, Any]:
        if self.mode == "disabled":
            return {"network": "none"}
        if self.allow_net:
            return {"network": "allowlist", "allow_net": list(self.allow_net)}
        return {"network": "public"}

    def __repr__(self) -> str:
        return f"NetworkSpec(mode={self.mode!r}, allow_net={self.allow_net!r})"


class CopyOptions:
    """BoxLite's copy options. airlock copies as ``docker cp`` does, which is
    BoxLite's default (recursive, overwrite, symlinks kept, the source's
    own name kept); other values raise ``NotImplementedError``."""

    def __init__(self, recursive: bool = True, overwrite: bool = True, follow_symlinks: bool = False,
                 include_parent: bool = True) -> None:
        for n, v in (("recursive", recursive), ("overwrite", overwrite), ("follow_symlinks", follow_symlinks),
                     ("include_parent", include_parent)):
            _opt_bool(n, v)
        self.recursive, self.overwrite = recursive, overwrite
        self.follow_symlinks, self.include_parent = follow_symlinks, include_parent

    def _check(self) -> None:
        if not (self.recursive and self.overwrite and not self.follow_symlinks and self.include_parent):
            raise _unsupported("CopyOptions other than the defaults",
                               "airlock copies as docker cp (recursive, overwriting, symlinks copied as links); "
                               "use box.exec with tar or cp in the box for other behaviour")


class BoxOptions:
    """BoxLite's box options, sent as airlock's box spec.

    Mapped: ``image`` (default ``python:slim``), ``cpus``, ``memory_mib``,
    ``disk_size_gb`` (as ``disk_size_mib``), ``working_dir``, ``env``
    (``(key, value)`` pairs or a dict), ``volumes`` (``(host, guest[,
    read_only])`` or a dict; host directories must be granted by ``airlock
    serve --allow-volume``), ``ports`` (``(host, guest[, protocol[,
    host_ip]])`` or a dict; granted by ``--allow-publish``), ``network``
    (:class:`NetworkSpec`), ``auto_remove`` (default True, as BoxLite: a
    stopped box is removed), ``detach`` (default False, as BoxLite: the box
    is removed soon after this process ends, by a lease the SDK renews;
    True: it lives until removed), ``user``, ``name`` (as ``create``'s).

    ``secrets``: airlock's ``{"NAME": Secret(hosts=[...], value=...)}``
    (the box's ``$NAME`` holds the placeholder).

    Not supported (``NotImplementedError`` at ``create``): ``rootfs_path``,
    ``entrypoint``, ``cmd``, ``advanced`` and BoxLite's list of
    ``Secret(name=...)`` (see the README).
    """

    def __init__(self, image: Optional[str] = None, rootfs_path: Optional[str] = None, cpus: Optional[int] = None,
                 memory_mib: Optional[int] = None, disk_size_gb: Optional[int] = None,
                 working_dir: Optional[str] = None, env: Any = None, volumes: Optional[Sequence[Any]] = None,
                 network: Optional[NetworkSpec] = None, ports: Optional[Sequence[Any]] = None,
                 auto_remove: Optional[bool] = None, detach: Optional[bool] = None,
                 entrypoint: Optional[Sequence[str]] = None, cmd: Optional[Sequence[str]] = None,
                 user: Optional[str] = None, advanced: Any = None, secrets: Optional[Sequence[Any]] = None,
                 name: Optional[str] = None) -> None:
        self.image = _opt_str("image", image)
        self.rootfs_path = _opt_str("rootfs_path", rootfs_path)
        self.cpus = _opt_int("cpus", cpus, 1, 64)
        self.memory_mib = _opt_int("memory_mib", memory_mib, 128, 262144)
        self.disk_size_gb = _opt_int("disk_size_gb", disk_size_gb, 1, 1024)
        self.working_dir = _opt_str("working_dir", working_dir)
        self._env = env_pairs("env", env)
        self.env = env
        if volumes is not None and (isinstance(volumes, (str, bytes)) or not isinstance(volumes, Iterable)):
            raise TypeError(f"volumes must be a list, not {type(volumes).__name__}")
        self.volumes = list(volumes or [])
        self._volumes = [_boxlite_volume(i, v) for i, v in enumerate(self.volumes)]
        if network is not None and not isinstance(network, NetworkSpec):
            raise TypeError(f"network must be a NetworkSpec, not {type(network).__name__}")
        self.network = network
        if ports is not None and (isinstance(ports, (str, bytes)) or not isinstance(ports, Iterable)):
            raise TypeError(f"ports must be a list, not {type(ports).__name__}")
        self.ports = list(ports or [])
        self._ports = [_boxlite_port(i, p) for i, p in enumerate(self.ports)]
        self.auto_remove = _opt_bool("auto_remove", auto_remove)
        self.detach = _opt_bool("detach", detach)
        self.entrypoint = _str_list("entrypoint", entrypoint)
        self.cmd = _str_list("cmd", cmd)
        self.user = _opt_str("user", user)
        self.advanced = advanced
        # airlock's {NAME: Secret(hosts=[...], value=...)}, or BoxLite's
        # list (refused at create, naming airlock's form).
        self.secrets = dict(secrets) if isinstance(secrets, Mapping) else list(secrets or [])
        self.name = _opt_str("name", name)

    def _spec(self, name: Optional[str]) -> Dict[str, Any]:
        """The create request; NotImplementedError for what airlock lacks."""
        if self.rootfs_path:
            raise _unsupported("BoxOptions(rootfs_path=...)",
                               "import the OCI layout as an image (airlock image import PATH --tag NAME) and pass image=NAME")
        if self.entrypoint is not None or self.cmd is not None:
            raise _unsupported("BoxOptions(entrypoint=..., cmd=...)",
                               "airlock boxes run its agent as init, not the image's entrypoint; start the process with "
                               "box.exec(...) after create (or SimpleBox.stream for a long-running one)")
        if self.advanced is not None:
            raise _unsupported("BoxOptions(advanced=...)",
                               "every airlock box runs confined (seccomp, no capabilities, its own uid); set limits with "
                               "airlock serve's policy flags")
        if self.secrets and not isinstance(self.secrets, dict):
            raise _unsupported("BoxOptions(secrets=[Secret(name=...), ...])", _SECRETS_INSTEAD)
        spec: Dict[str, Any] = {"image": self.image or DEFAULT_IMAGE}
        n = name if name is not None else self.name
        for k, v in (("name", n), ("cpus", self.cpus), ("memory_mib", self.memory_mib),
                     ("disk_size_mib", self.disk_size_gb * 1024 if self.disk_size_gb else None),
                     ("working_dir", self.working_dir), ("user", self.user), ("env", self._env),
                     ("volumes", self._volumes or None), ("ports", self._ports or None)):
            if v is not None:
                spec[k] = v
        if self.secrets:
            spec["secrets"] = _secrets(self.secrets)
        if self.network is not None:
            spec.update(self.network._fields())
        spec["auto_remove"] = True if self.auto_remove is None else self.auto_remove
        if not self.detach:
            spec["lease"] = DEFAULT_LEASE
        return spec

    def __repr__(self) -> str:
        return (f"BoxOptions(image={self.image!r}, cpus={self.cpus!r}, memory_mib={self.memory_mib!r}, "
                f"auto_remove={self.auto_remove!r}, detach={self.detach!r})")


# ---------------------------------------------------------------------------
# Info and metrics
# ---------------------------------------------------------------------------


class _Awaitable:
    """Lets ``await x`` give x: BoxLite's examples both call ``box.info()``
    and await it."""

    def __await__(self) -> Any:
        if False:
            yield None
        return self


@dataclass
class BoxStateInfo:
    """A box's state: ``status`` ``"configured"`` (created, never started:
    airlock boots at create, so not seen), ``"running"`` or ``"stopped"``;
    ``pid`` is None (airlock does not show the VM's pid)."""

    status: str
    running: bool
    pid: Optional[int] = None

    def __str__(self) -> str:
        return self.status


@dataclass
class PublishedPort:
    guest_port: int
    host_ip: str
    host_port: int
    protocol: str


@dataclass
class NetworkDirectionInfo:
    mode: str
    allow_net: List[str] = field(default_factory=list)


@dataclass
class NetworkInfo:
    """``outbound``: BoxLite's mode (``enabled``/``disabled``) and
    allow-list; ``airlock_mode`` is airlock's (public, allowlist, none).
    ``inbound``: ``enabled`` when ports are published."""

    outbound: NetworkDirectionInfo
    inbound: NetworkDirectionInfo
    published_ports: Optional[List[PublishedPort]]
    airlock_mode: str = ""

    @property
    def mode(self) -> str:
        return self.outbound.mode

    @property
    def allow_net(self) -> List[str]:
        return self.outbound.allow_net


@dataclass
class BoxInfo(_Awaitable):
    """A box as BoxLite's ``BoxInfo`` (from GET /v1/boxes/{id}); ``raw`` is
    airlock's whole box JSON (ttl, lease and idle deadlines, paused...)."""

    id: str
    name: Optional[str]
    state: BoxStateInfo
    created_at: str
    started_at: Optional[str]
    image: str
    cpus: int
    memory_mib: int
    network: Optional[NetworkInfo]
    auto_remove: bool
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    #: airlock's lifetimes (RFC 3339 times, None when not set): when the
    #: box's ttl ends, when its lease runs out unless renewed (the SDK
    #: renews it while this process lives, unless ``detach``), and when it
    #: is removed unless used (``idle_timeout``).
    expires_at: Optional[str] = None
    lease_until: Optional[str] = None
    idle_deadline: Optional[str] = None
    #: the box's idle settings: seconds unused before ``idle_action``
    #: (``"remove"``, ``"stop"`` or ``"suspend"``) is taken; None without
    #: an idle timeout.
    idle_timeout: Optional[float] = None
    idle_action: Optional[str] = None

    @classmethod
    def _of(cls, d: Dict[str, Any]) -> "BoxInfo":
        st = d.get("state") or "unknown"
        status = {"created": "configured"}.get(st, st)
        mode = d.get("network") or ""
        ports = [PublishedPort(p["guest_port"], p.get("host_ip") or "127.0.0.1", p.get("host_port") or 0,
                               p.get("protocol") or "tcp") for p in d.get("ports") or []]
        net = NetworkInfo(
            outbound=NetworkDirectionInfo("disabled" if mode in ("none", "disabled") else "enabled", list(d.get("allow_net") or [])),
            inbound=NetworkDirectionInfo("enabled" if ports else "disabled"),
            published_ports=ports, airlock_mode=mode)
        return cls(id=d["id"], name=d.get("name") or None, state=BoxStateInfo(status, st == "running"),
                   created_at=d.get("created") or "", started_at=d.get("started") or None, image=d.get("image") or "",
                   cpus=d.get("cpus") or 0, memory_mib=d.get("memory_mib") or 0, network=net,
                   auto_remove=bool(d.get("auto_remove")), raw=d, expires_at=d.get("expires_at") or None,
                   lease_until=d.get("lease_until") or None, idle_deadline=d.get("idle_deadline") or None,
                   idle_timeout=d.get("idle_timeout") or None,
                   idle_action=(d.get("idle_action") or "remove") if d.get("idle_timeout") else None)


@dataclass
class RuntimeMetrics(_Awaitable):
    """Server-wide counters, from the server's Prometheus ``/metrics``
    since it started (BoxLite counts per runtime process):
    ``boxes_created_total`` counts successful boots (a restart counts),
    ``boxes_failed_total`` failed boots, ``num_running_boxes`` boxes
    running now, ``total_commands_executed`` execs that ended,
    ``total_exec_errors`` execs that could not be carried out (a non-zero
    exit is not an error). BoxLite's image-disk eviction counters have no
    equivalent: None."""

    boxes_created_total: int
    boxes_failed_total: int
    num_running_boxes: int
    total_commands_executed: int
    total_exec_errors: int
    image_disks_evicted_total: Optional[int] = None
    image_disk_bytes_reclaimed_total: Optional[int] = None


@dataclass
class BoxMetrics:
    """One box's use of the host now (``box.metrics()``), from the
    server's ``GET /v1/boxes/{id}/stats``: what ``airlock stats`` shows.

    BoxLite's fields: ``cpu_percent`` (percent of one host CPU the box's VM
    used over a sample of about 0.5 s: the call takes that long),
    ``memory_bytes`` (the VM process's resident memory),
    ``network_bytes_sent`` / ``network_bytes_received`` (what the box sent
    out / received through its network; None for network ``none``).
    airlock keeps no per-box exec or stdio counters and no boot-stage
    timings: ``commands_executed_total``, ``exec_errors_total``,
    ``bytes_sent_total``, ``bytes_received_total``,
    ``total_create_duration_ms``, ``guest_boot_duration_ms``,
    ``network_tcp_connections``, ``network_tcp_errors`` and the
    ``stage_*_ms`` fields are None (server-wide exec counts:
    ``runtime.metrics()``).

    airlock's own: ``memory_limit_bytes`` (the box's guest memory),
    ``disk_bytes`` (its writable layer on the host's disk), ``cpu_seconds``
    (host CPU its VM used since it started), ``network_connections_total``
    (TCP connections and UDP flows opened), ``paused`` (paused in memory:
    the figures are read on the host, its CPU stands still) and ``raw``
    (the server's JSON). A stopped box raises AirlockError
    ``box_not_running`` (409)."""

    cpu_percent: Optional[float]
    memory_bytes: Optional[int]
    network_bytes_sent: Optional[int]
    network_bytes_received: Optional[int]
    memory_limit_bytes: int
    disk_bytes: int
    cpu_seconds: float
    network_connections_total: Optional[int]
    paused: bool
    raw: Dict[str, Any]
    commands_executed_total: Optional[int] = None
    exec_errors_total: Optional[int] = None
    bytes_sent_total: Optional[int] = None
    bytes_received_total: Optional[int] = None
    total_create_duration_ms: Optional[int] = None
    guest_boot_duration_ms: Optional[int] = None
    network_tcp_connections: Optional[int] = None
    network_tcp_errors: Optional[int] = None
    stage_filesystem_setup_ms: Optional[int] = None
    stage_image_prepare_ms: Optional[int] = None
    stage_guest_rootfs_ms: Optional[int] = None
    stage_box_config_ms: Optional[int] = None
    stage_box_spawn_ms: Optional[int] = None
    stage_container_init_ms: Optional[int] = None

    @staticmethod
    def _of(d: Dict[str, Any]) -> "BoxMetrics":
        net = d.get("network") or None
        return BoxMetrics(cpu_percent=float(d.get("cpu_percent") or 0.0), memory_bytes=int(d.get("memory_bytes") or 0),
                          network_bytes_sent=int(net.get("bytes_out") or 0) if net else None,
                          network_bytes_received=int(net.get("bytes_in") or 0) if net else None,
                          memory_limit_bytes=int(d.get("memory_limit_bytes") or 0), disk_bytes=int(d.get("disk_bytes") or 0),
                          cpu_seconds=float(d.get("cpu_seconds") or 0.0),
                          network_connections_total=int(net.get("connections") or 0) if net else None,
                          paused=bool(d.get("paused")), raw=d)


_PROM = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def _prom_sum(text: str, metric: str, label: str = "") -> int:
    n = 0.0
    for line in text.splitlines():
        m = _PROM.match(line)
        if m and m.group(1) == metric and (not label or label in (m.group(2) or "")):
            try:
                n += float(m.group(3))
            except ValueError:
                pass
    return int(n)


@dataclass
class ExecWaitResult:
    """What :meth:`Execution.wait` returns: ``exit_code`` (128+N when killed
    by signal N), ``error_message`` (set only when the process did not end
    normally), ``timed_out``."""

    exit_code: int
    error_message: Optional[str] = None
    timed_out: bool = False


# ---------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------


class _Lines:
    """One output stream of an execution, as lines (``"text\\n"``; the last
    may lack the newline), decoded as UTF-8 with replacement."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._q: "asyncio.Queue[Optional[str]]" = asyncio.Queue()
        self._partial = b""
        self._pending = 0
        self._dropped = 0

    def feed(self, data: bytes) -> None:
        if self._pending + len(data) > MAX_PENDING_OUTPUT:
            self._dropped += len(data)
            return
        self._flush_drop()
        buf = self._partial + data
        *lines, self._partial = buf.split(b"\n")
        for ln in lines:
            self._put(ln.decode("utf-8", "replace") + "\n")

    def _put(self, s: str) -> None:
        self._pending += len(s)
        self._q.put_nowait(s)

    def _flush_drop(self) -> None:
        if self._dropped:
            self._put(f"[airlock: {self._dropped} bytes of {self._name} dropped: more than "
                      f"{MAX_PENDING_OUTPUT} bytes were waiting to be read]\n")
            self._dropped = 0

    def close(self) -> None:
        if self._partial:
            self._put(self._partial.decode("utf-8", "replace"))
            self._partial = b""
        self._flush_drop()
        self._q.put_nowait(None)

    async def next(self) -> Optional[str]:
        s = await self._q.get()
        if s is None:
            self._q.put_nowait(None)  # stays at the end
            return None
        self._pending -= len(s)
        return s


class ExecStdout:
    """An async iterator over an execution's output lines (single use)."""

    def __init__(self, lines: _Lines) -> None:
        self._lines = lines

    def __aiter__(self) -> "ExecStdout":
        return self

    async def __anext__(self) -> str:
        s = await self._lines.next()
        if s is None:
            raise StopAsyncIteration
        return s


class ExecStderr(ExecStdout):
    """An async iterator over an execution's stderr lines (single use)."""


class ExecStdin:
    """An execution's stdin."""

    def __init__(self, ex: "Execution") -> None:
        self._ex = ex
        self._closed = False

    async def send_input(self, data: Union[bytes, str]) -> None:
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"data must be bytes or str, not {type(data).__name__}")
        if self._closed:
            raise RuntimeError("stdin is closed")
        await self._ex._ws.send(b"\x00" + bytes(data))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                await self._ex._ws.send(json.dumps({"type": "close_stdin"}))
            except Exception:  # the process ended: its stdin is gone anyway
                pass

    async def is_closed(self) -> bool:
        return self._closed


class _ExecID(str):
    """An exec id that is also callable: BoxLite's ``Execution.id()`` is a
    method, its examples read ``execution.id``."""

    def __call__(self) -> str:
        return str(self)


class Execution:
    """A process started by :meth:`Box.exec`, streamed over the server's
    WebSocket. Read ``stdout()`` and ``stderr()`` in any order (each is
    buffered, at most :data:`MAX_PENDING_OUTPUT` bytes unread, past which a
    marker line says what was dropped); ``wait()`` returns the exit."""

    def __init__(self) -> None:
        self._ws: Any = None
        self._out = _Lines("stdout")
        self._err = _Lines("stderr")
        self._result: Optional[ExecWaitResult] = None
        self._error: Optional[BaseException] = None
        self._pump_task: Optional["asyncio.Task[None]"] = None
        self._id = _ExecID("")
        self._stdin: Optional[ExecStdin] = None
        self._taken: set = set()

    @classmethod
    async def _start(cls, client: Client, box_id: str, req: Dict[str, Any]) -> "Execution":
        ex = cls()
        await client._ensure()
        ex._ws = await client.ws_connect(f"/v1/boxes/{box_id}/exec/ws")
        try:
            await ex._ws.send(json.dumps(req))
            first = json.loads(await ex._ws.recv())
        except BaseException:
            await ex._ws.close()
            raise
        if first.get("type") == "error":
            await ex._ws.close()
            raise _problem(first)
        ex._id = _ExecID(first.get("exec_id") or "")
        ex._pump_task = asyncio.ensure_future(ex._pump())
        return ex

    async def _pump(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                try:
                    msg = await self._ws.recv()
                except ConnectionClosed as e:
                    if self._result is None:
                        self._error = AirlockError(0, "exec_lost", f"the exec's connection closed before its exit ({e})")
                    return
                if isinstance(msg, bytes):
                    (self._out if msg[:1] == b"\x01" else self._err).feed(msg[1:])
                    continue
                m = json.loads(msg)
                if m.get("type") == "exit":
                    self._result = ExecWaitResult(m.get("exit_code", -1), m.get("error_message") or None,
                                                  bool(m.get("timed_out")))
                    return
                if m.get("type") == "error":
                    self._error = _problem(m)
                    return
        except Exception as e:  # surfaced by wait()
            self._error = e
        finally:
            self._out.close()
            self._err.close()
            try:
                await self._ws.close()
            except Exception:
                pass

    @property
    def id(self) -> _ExecID:
        """The exec id (``execution.id`` or ``execution.id()``)."""
        return self._id

    def _take(self, which: str) -> None:
        if which in self._taken:
            raise RuntimeError(f"{which} stream not available: it was already taken (streams are single use)")
        self._taken.add(which)

    def stdout(self) -> ExecStdout:
        self._take("stdout")
        return ExecStdout(self._out)

    def stderr(self) -> ExecStderr:
        self._take("stderr")
        return ExecStderr(self._err)

    def stdin(self) -> ExecStdin:
        self._take("stdin")
        self._stdin = ExecStdin(self)
        return self._stdin

    async def wait(self) -> ExecWaitResult:
        """Waits for the process to end (output not read is kept, up to the
        bound) and returns its exit."""
        assert self._pump_task is not None
        await asyncio.shield(self._pump_task)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    async def kill(self) -> None:
        """Ends the process tree (SIGTERM, then SIGKILL if it lingers: the
        exit code is 143 or 137; BoxLite sends SIGKILL). A no-op once it
        ended."""
        if self._pump_task is not None and not self._pump_task.done():
            try:
                await self._ws.send(json.dumps({"type": "kill"}))
            except Exception:
                pass

    async def resize_tty(self, rows: int, cols: int) -> None:
        _opt_int("rows", rows, 1, 1000)
        _opt_int("cols", cols, 1, 1000)
        await self._ws.send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    def __repr__(self) -> str:
        return f"Execution(id={str(self._id)!r})"


def _problem(msg: Dict[str, Any]) -> AirlockError:
    p = msg.get("problem") or {}
    return AirlockError(p.get("status", 0), p.get("code", ""), p.get("detail", "exec failed"), p.get("cause", ""),
                        p.get("errors") if isinstance(p.get("errors"), list) else None)


# ---------------------------------------------------------------------------
# Box
# ---------------------------------------------------------------------------


class Box(FilesMixin):
    """BoxLite's box handle (``runtime.create``, ``runtime.get``) on an
    airlock box. The box boots at ``create`` (BoxLite boots at the first
    ``start``/``exec``); ``exec`` on a stopped box starts it again, as
    BoxLite's does. ``stop()`` shuts it down, and removes it when it was
    created with ``auto_remove`` (BoxLite's default). airlock's file calls
    (``read_file``, ``write_file``, ``stat``...) work on it too."""

    def __init__(self, runtime: "Boxlite", info: Dict[str, Any], created: bool = False) -> None:
        self._rt = runtime
        self._client = runtime._client
        self._id = info["id"]
        self._name = info.get("name") or None
        self._created = created

    @property
    def id(self) -> str:
        return self._id  # type: ignore[no-any-return]

    @property
    def name(self) -> Optional[str]:
        return self._name

    @property
    def created(self) -> bool:
        """BoxLite's ``SimpleBox.created``, on this handle: True when the
        call that returned it created the box (``runtime.create``, a new box
        of ``get_or_create``, ``clone_box``), False when it found an existing
        one (``runtime.get``, ``get_or_create`` reusing a box). When the box
        was made: ``info().created_at``."""
        return self._created

    async def _box(self) -> str:
        return self._id  # type: ignore[no-any-return]

    def info(self) -> BoxInfo:
        """The box's info now (a blocking GET; also awaitable)."""
        with sync_client(self._client.endpoint) as c:
            r = c.get(f"/v1/boxes/{self._id}")
            _raise_for_problem(r)
            return BoxInfo._of(r.json())

    async def start(self) -> None:
        """Boots the box if it is stopped (a no-op when running)."""
        await self._client.request("POST", f"/v1/boxes/{self._id}/start")

    async def stop(self) -> None:
        """Shuts the box down; an ``auto_remove`` box is then removed. A
        box already gone is not an error."""
        try:
            await self._client.request("POST", f"/v1/boxes/{self._id}/stop")
        except AirlockError as e:
            if e.code != "box_not_found":
                raise

    async def exec(self, command: str, args: Optional[Sequence[str]] = None, env: Any = None, tty: bool = False,
                   *, user: Optional[str] = None, timeout_secs: Optional[float] = None,
                   cwd: Optional[str] = None) -> Execution:
        """Starts ``command`` with ``args`` and returns its
        :class:`Execution` (``env``: ``(key, value)`` pairs or a dict, added
        to the box's). A stopped box is started first."""
        if not isinstance(command, str) or not command:
            raise TypeError(f"command must be a non-empty str, not {command!r}")
        req: Dict[str, Any] = {"cmd": [command, *(_str_list("args", args) or [])]}
        e = env_pairs("env", env)
        if e is not None:
            req["env"] = e
        if _opt_bool("tty", tty):
            req["tty"] = True
        if _opt_str("user", user):
            req["user"] = user
        if _opt_str("cwd", cwd):
            req["working_dir"] = cwd
        if timeout_secs is not None:
            if isinstance(timeout_secs, bool) or not isinstance(timeout_secs, (int, float)):
                raise TypeError(f"timeout_secs must be a number, not {type(timeout_secs).__name__}")
            if timeout_secs < 0:
                raise ValueError(f"timeout_secs={timeout_secs}: must be >= 0 (0: no timeout)")
            if timeout_secs:
                req["timeout"] = float(timeout_secs)
        try:
            return await Execution._start(self._client, self._id, req)
        except AirlockError as err:
            if err.code != "box_not_running":
                raise
        await self.start()
        return await Execution._start(self._client, self._id, req)

    async def metrics(self) -> BoxMetrics:
        """The box's CPU, memory, disk and network use now (see
        :class:`BoxMetrics`; ``GET /v1/boxes/{id}/stats``, about 0.5 s)."""
        return BoxMetrics._of(await self._client.request("GET", f"/v1/boxes/{self._id}/stats"))

    async def copy_in(self, host_path: Union[str, Path], container_dest: str,  # type: ignore[override]
                      copy_options: Optional[CopyOptions] = None) -> None:
        """Copies a host file or directory into the box (as ``docker cp``)."""
        if copy_options is not None:
            copy_options._check()
        await FilesMixin.copy_in(self, host_path, container_dest)

    async def copy_out(self, container_src: str, host_dest: Union[str, Path],  # type: ignore[override]
                       copy_options: Optional[CopyOptions] = None) -> None:
        """Copies a file or directory of the box to the host (as ``docker
        cp``)."""
        if copy_options is not None:
            copy_options._check()
        await FilesMixin.copy_out(self, container_src, host_dest)

    async def clone_box(self, *, options: Any = None, name: Optional[str] = None) -> "Box":
        """A copy of this box: airlock forks it (its disk *and* memory: the
        copy is running, with the processes the box had; BoxLite's clone is
        stopped, disk only). A stopped box is started for the fork and
        stopped again. ``name`` and ``options`` are not supported (a fork
        child gets an id only): ``NotImplementedError``."""
        if name is not None or options is not None:
            raise _unsupported("clone_box(name=..., options=...)",
                               "call clone_box() with no arguments and use the returned box's id "
                               "(airlock's fork names no child)")
        was_stopped = not self.info().state.running
        if was_stopped:
            await self.start()
        try:
            r = await self._client.request("POST", f"/v1/boxes/{self._id}/fork", json={"n": 1})
        finally:
            if was_stopped:
                await self.stop()
        child = r["boxes"][0]
        self._rt._track(child["id"], lease=self._rt._lease_of(self._id))
        return Box(self._rt, child, created=True)

    async def export(self, *, dest: str, options: Any = None) -> str:
        raise _unsupported("Box.export()",
                           "use airlock's SimpleBox.attach(box.id).export(path, checkpoints=True) "
                           "(or `airlock export BOX -o FILE` on the server's host)")

    @property
    def snapshot(self) -> Any:
        raise _unsupported("Box.snapshot (disk snapshots)",
                           "airlock snapshots memory and disk of a running box: SimpleBox.attach(box.id).snapshot(name), "
                           "then SimpleBox(from_snapshot=name)")

    async def __aenter__(self) -> "Box":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"Box(id={self._id!r})"


# ---------------------------------------------------------------------------
# Runtime
# ---------------------------------------------------------------------------


class Boxlite:
    """BoxLite's runtime, on an airlock server: ``Boxlite.default()`` is the
    server the SDK finds as :class:`airlock.Client` does (``AIRLOCK_URL``,
    else ``AIRLOCK_SOCKET`` or the home's socket, started on demand);
    ``Boxlite(Options(home_dir=D))`` the server of airlock home ``D``;
    ``Boxlite.rest(BoxliteRestOptions(url, ApiKeyCredential(token)))`` an
    ``airlock serve --listen ... --token ...``."""

    _default: Optional["Boxlite"] = None

    def __init__(self, options: Optional[Options] = None, *, _endpoint: Optional[Endpoint] = None) -> None:
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"options must be an Options, not {type(options).__name__}")
        if _endpoint is None:
            _endpoint = Endpoint.from_env()
            if options is not None:
                if options.image_registries:
                    raise _unsupported("Options(image_registries=...)",
                                       "log in with `airlock login REGISTRY` (Docker's credential config) on the server's host")
                if options.home_dir:
                    home = Path(options.home_dir).expanduser().resolve()
                    _endpoint = Endpoint(socket=home / "airlock.sock", home=home)
        self._client = Client(_endpoint)
        self._leases: Dict[str, _LeaseRenewer] = {}
        self._lease_secs: Dict[str, float] = {}

    @staticmethod
    def default() -> "Boxlite":
        """The process's default runtime (one object, made on first use)."""
        if Boxlite._default is None:
            Boxlite._default = Boxlite()
        return Boxlite._default

    @staticmethod
    def init_default(options: Options) -> None:
        """Makes ``Boxlite(options)`` the default runtime (before any
        ``default()`` call)."""
        if Boxlite._default is not None:
            raise RuntimeError("the default runtime is already in use: call init_default before Boxlite.default()")
        Boxlite._default = Boxlite(options)

    @staticmethod
    def rest(options: BoxliteRestOptions) -> "Boxlite":
        """A runtime on ``airlock serve --listen ADDR --token TOKEN``."""
        if not isinstance(options, BoxliteRestOptions):
            raise TypeError(f"options must be a BoxliteRestOptions, not {type(options).__name__}")
        if options.prefix:
            raise _unsupported("BoxliteRestOptions(prefix=...)",
                               "an airlock server serves one home at /v1: run one airlock serve per tenant and point url at it")
        token = options.credential.get_token().token if options.credential else None
        return Boxlite(_endpoint=Endpoint(url=options.url, token=token))

    def _track(self, box_id: str, lease: Optional[float]) -> None:
        if lease:
            self._lease_secs[box_id] = lease
            self._leases[box_id] = _LeaseRenewer(self._client.endpoint, box_id, lease)

    def _lease_of(self, box_id: str) -> Optional[float]:
        return self._lease_secs.get(box_id)

    def _untrack(self, box_id: str) -> None:
        r = self._leases.pop(box_id, None)
        self._lease_secs.pop(box_id, None)
        if r is not None:
            r.stop()

    async def create(self, options: BoxOptions, name: Optional[str] = None) -> Box:
        """Creates and boots a box (``name``: unique; else ``options.name``)."""
        if not isinstance(options, BoxOptions):
            raise TypeError(f"options must be a BoxOptions, not {type(options).__name__}")
        spec = options._spec(_opt_str("name", name))
        d = await self._client.request("POST", "/v1/boxes", json=spec)
        self._track(d["id"], spec.get("lease"))
        return Box(self, d, created=True)

    async def get(self, id_or_name: str) -> Optional[Box]:
        """A handle on a box (id, id prefix or name), or None when there is
        none."""
        _opt_str("id_or_name", id_or_name)
        try:
            d = await self._client.request("GET", f"/v1/boxes/{_q(id_or_name)}")
        except AirlockError as e:
            if e.code == "box_not_found":
                return None
            raise
        return Box(self, d)

    async def get_or_create(self, options: BoxOptions, name: Optional[str] = None) -> Tuple[Box, bool]:
        """The box called ``name`` if it exists (started when stopped), else
        a new one; and whether it was created."""
        n = name if name is not None else getattr(options, "name", None)
        if n:
            b = await self.get(n)
            if b is not None:
                return b, False
        return await self.create(options, name=name), True

    async def get_info(self, id_or_name: str) -> Optional[BoxInfo]:
        """The box's info, or None when there is no such box."""
        _opt_str("id_or_name", id_or_name)
        try:
            return BoxInfo._of(await self._client.request("GET", f"/v1/boxes/{_q(id_or_name)}"))
        except AirlockError as e:
            if e.code == "box_not_found":
                return None
            raise

    async def list_info(self, _state: Optional[str] = None) -> List[BoxInfo]:
        """Every box of the server, oldest first."""
        r = await self._client.request("GET", "/v1/boxes")
        return [BoxInfo._of(d) for d in r.get("boxes") or []]

    async def remove(self, id_or_name: str, force: bool = False) -> None:
        """Removes a box; a running box needs ``force=True`` (else
        AirlockError ``box_running``, 409, as BoxLite refuses it)."""
        _opt_str("id_or_name", id_or_name)
        _opt_bool("force", force)
        d = await self._client.request("GET", f"/v1/boxes/{_q(id_or_name)}")
        await self._client.request("DELETE", f"/v1/boxes/{_q(d['id'])}", params={"force": "true"} if force else None)
        self._untrack(d["id"])

    async def metrics(self) -> RuntimeMetrics:
        """Server-wide counters (see :class:`RuntimeMetrics`)."""
        text = (await self._client.request_raw("GET", "/metrics", max_bytes=8 << 20)).decode("utf-8", "replace")
        boxes = await self.list_info()
        return RuntimeMetrics(
            boxes_created_total=_prom_sum(text, "airlock_box_starts_total", 'result="ok"'),
            boxes_failed_total=_prom_sum(text, "airlock_box_starts_total", 'result="error"'),
            num_running_boxes=sum(1 for b in boxes if b.state.running),
            total_commands_executed=_prom_sum(text, "airlock_execs_total"),
            total_exec_errors=_prom_sum(text, "airlock_execs_total", 'result="error"'),
        )

    async def shutdown(self, timeout: Optional[int] = None) -> None:
        """Stops every box this runtime object created that still exists
        (BoxLite: every box of the runtime; airlock's server keeps serving
        other clients' boxes)."""
        for box_id in list(self._leases):
            try:
                await self._client.request("POST", f"/v1/boxes/{box_id}/stop")
            except AirlockError as e:
                if e.code != "box_not_found":
                    raise

    async def import_box(self, archive_path: str, name: Optional[str] = None, *, untrusted: bool = False) -> Box:
        raise _unsupported("Boxlite.import_box()",
                           "the REST API has no import: run `airlock import FILE` on the server's host, then runtime.get(id)")

    @property
    def images(self) -> Any:
        raise _unsupported("Boxlite.images", "list with GET /v1/images or `airlock images`; pull with `airlock pull IMAGE`")

    @property
    def volumes(self) -> Any:
        raise _unsupported("Boxlite.volumes", "name a volume in BoxOptions(volumes=[(\"NAME\", \"/path\")]) (created on "
                                              "first use) and manage them with `airlock volume`")

    @property
    def registries(self) -> Any:
        raise _unsupported("Boxlite.registries", "log in with `airlock login REGISTRY` on the server's host")

    def close(self) -> None:
        """Stops renewing the leases of the boxes this runtime created (they
        are removed within their lease unless ``detach=True``)."""
        for box_id in list(self._leases):
            self._leases.pop(box_id).stop()

    def __enter__(self) -> "Boxlite":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Boxlite(server={self._client._where()!r})"


def _q(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _missing_box(name: str, instead: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise _unsupported(name, instead)

    return type(name, (), {"__init__": __init__, "__doc__": f"BoxLite's {name}: not provided ({instead})."})


BrowserBox = _missing_box("BrowserBox", "run a browser image with SimpleBox(image=..., ports=[9222]) and connect to the "
                                        "published port")
ComputerBox = _missing_box("ComputerBox", "run a desktop image with SimpleBox(image=..., ports=[...]) and drive it "
                                          "with exec (xdotool)")
InteractiveBox = _missing_box("InteractiveBox", "use SimpleBox.stream(cmd, tty=True) or `airlock run -it IMAGE`")
SkillBox = _missing_box("SkillBox", "use CodeBox or SimpleBox and exec the agent's CLI")


def _missing_type(name: str, instead: str) -> type:
    """BoxLite's type ``name``, which airlock has no equivalent of:
    constructing it raises ``NotImplementedError`` naming what to use."""
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise _unsupported(name, instead)

    return type(name, (), {"__init__": __init__, "__doc__": f"BoxLite's {name}: not provided ({instead})."})


BrowserBoxOptions = _missing_type("BrowserBoxOptions", "run a browser image with SimpleBox(image=..., ports=[9222])")
BoxRuntime = _missing_type("BoxRuntime", "airlock boxes have no guest-to-guest messaging: publish a port "
                                         "(ports=[...]) and connect through the host, or share a named volume")
ManagedBox = _missing_type("ManagedBox", "use SimpleBox or CodeBox; boxes talk through published ports or a named volume")
BoxGroup = _missing_type("BoxGroup", "create the boxes with SimpleBox and stop them together (asyncio.gather)")
CloneOptions = _missing_type("CloneOptions", "box.clone_box() forks a running copy with the box's disk and memory; "
                                             "it takes no options")
ExportOptions = _missing_type("ExportOptions", "`airlock export BOX -o FILE` on the server's host")
SnapshotOptions = _missing_type("SnapshotOptions", "SimpleBox.attach(id).snapshot(name) (airlock's snapshots hold "
                                                   "memory too); SimpleBox(from_snapshot=name) starts from one")
SnapshotHandle = _missing_type("SnapshotHandle", "SimpleBox.snapshot(name) returns an airlock.Snapshot")
SnapshotInfo = _missing_type("SnapshotInfo", "airlock.Snapshot (Client.snapshots() lists them)")
CopyOutPair = _missing_type("CopyOutPair", "call box.copy_out(src, host_dest) once per path")
CopyOutOutcome = _missing_type("CopyOutOutcome", "box.copy_out(src, host_dest) raises AirlockError on failure")
HealthCheckOptions = _missing_type("HealthCheckOptions", "airlock checks its agent itself; the box JSON's 'unhealthy' "
                                                         "(box.info().raw) says why when it is not")
HealthState = _missing_type("HealthState", "box.info().raw.get('unhealthy') (absent when healthy)")
HealthStatus = _missing_type("HealthStatus", "box.info().raw.get('unhealthy') (absent when healthy)")
SecurityOptions = _missing_type("SecurityOptions", "every airlock box runs confined (seccomp, no capabilities, its own "
                                                   "uid); set limits with airlock serve's policy flags")
ImageHandle = _missing_type("ImageHandle", "GET /v1/images (`airlock images`), `airlock pull IMAGE`")
ImageInfo = _missing_type("ImageInfo", "GET /v1/images (`airlock images`)")
SyncImageHandle = _missing_type("SyncImageHandle", "GET /v1/images (`airlock images`), `airlock pull IMAGE`")
SyncSkillBox = _missing_type("SyncSkillBox", "use SyncCodeBox or SyncSimpleBox and exec the agent's CLI")
ImagePullResult = _missing_type("ImagePullResult", "`airlock pull IMAGE` (a box's image is pulled at create)")


class ExecError(AirlockError):
    """BoxLite's ``ExecError(command, exit_code, stderr)``, an
    :class:`AirlockError` (``BoxliteError``) with ``code`` ``exec_failed``.
    airlock's ``exec`` calls return the exit code (``ExecResult``) rather
    than raise this; it is here for code that raises or catches it."""

    def __init__(self, command: str, exit_code: int, stderr: str) -> None:
        super().__init__(0, "exec_failed", f"Command '{command}' failed with exit code {exit_code}: {stderr}")
        self.command = command
        self.exit_code = exit_code
        self.stderr = stderr


class BoxliteTimeoutError(AirlockError):
    """BoxLite's ``TimeoutError`` (``airlock.TimeoutError``; another name
    here, so as not to hide Python's own in this module), an :class:`AirlockError` with ``code``
    ``timeout``. airlock reports an exec's timeout in its result
    (``ExecResult.timed_out``, ``ExecWaitResult.timed_out``); a server call
    that times out raises ``AirlockError`` with code ``timeout``."""

    def __init__(self, message: str = "timed out") -> None:
        super().__init__(0, "timeout", message)


class ParseError(AirlockError):
    """BoxLite's ``ParseError``, an :class:`AirlockError` with ``code``
    ``parse_error``; airlock raises it nowhere (its results are parsed by
    the server)."""

    def __init__(self, message: str = "parse error") -> None:
        super().__init__(0, "parse_error", message)

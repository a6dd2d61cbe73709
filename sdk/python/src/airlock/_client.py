"""Connection to an ``airlock serve`` server (unix socket or TCP)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Optional
from urllib.parse import quote

import httpx

from ._snapshots import Snapshot

#: How long a server started by the SDK keeps running with no request and no
#: running box before it exits by itself (``airlock serve --idle-exit``).
#: Override with ``AIRLOCK_SERVE_IDLE_EXIT`` (a Go duration, e.g. ``"10m"``).
DEFAULT_IDLE_EXIT = "5m"

#: How long the SDK waits for a server it started to answer.
SERVER_START_TIMEOUT = 30.0


class AirlockError(RuntimeError):
    """An error reported by the airlock server (an RFC 9457 problem).

    It is a ``RuntimeError``, so the seed documents' ``except RuntimeError``
    catches startup failures (image not found, no VM could boot).

    Attributes:
        status: HTTP status (404, 409, 502, ...).
        code: stable machine-readable code (``box_not_found``,
            ``image_not_found``, ``box_died``, ``too_many_execs``, ...).
        detail: what happened, and what to do.
        cause: for ``box_died``, why the VM ended.
        errors: for ``invalid_request`` (400), each bad field of the
            request as the server named it: a dict with ``pointer`` (an
            RFC 6901 JSON pointer into the body, ``/memory_mib``,
            ``/env/0``) or ``parameter`` (a query or path parameter's
            name), ``location`` (``body.env[0]``, ``query.label``) and
            ``message``. Empty for other errors.
        fields: the pointers and parameter names of ``errors``, in order
            (``["/memory_mib", "/env/0"]``).
    """

    def __init__(self, status: int, code: str, detail: str, cause: str = "",
                 errors: Optional[List[Dict[str, Any]]] = None) -> None:
        super().__init__(f"{detail} ({code})" if code else detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.cause = cause
        self.errors: List[Dict[str, Any]] = list(errors or [])
        self.fields: List[str] = [_where(e) for e in self.errors if _where(e)]


def _where(e: Dict[str, Any]) -> str:
    """Where a problem's field error is: its pointer, else its parameter,
    else its location."""
    return str(e.get("pointer") or e.get("parameter") or e.get("location") or "")


def default_home() -> Path:
    """``$AIRLOCK_HOME``, else ``~/.airlock`` (as the Go library)."""
    h = os.environ.get("AIRLOCK_HOME")
    return Path(h) if h else Path.home() / ".airlock"


def default_socket() -> Path:
    """``$AIRLOCK_SOCKET``, else ``airlock.sock`` in the airlock home."""
    s = os.environ.get("AIRLOCK_SOCKET")
    return Path(s) if s else default_home() / "airlock.sock"


@dataclass
class Endpoint:
    """Where the server is: a unix socket, or a URL with a bearer token."""

    socket: Optional[Path] = None
    url: Optional[str] = None
    token: Optional[str] = None
    #: The airlock home of a server the SDK starts on ``socket`` (its
    #: ``AIRLOCK_HOME``); None: the environment's.
    home: Optional[Path] = None

    @classmethod
    def from_env(cls) -> "Endpoint":
        url = os.environ.get("AIRLOCK_URL")
        if url:
            return cls(url=url.rstrip("/"), token=os.environ.get("AIRLOCK_TOKEN"))
        return cls(socket=default_socket())


def sync_client(endpoint: Endpoint, timeout: Any = 10.0) -> httpx.Client:
    """A blocking httpx client for endpoint."""
    if endpoint.url:
        headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
        return httpx.Client(base_url=endpoint.url, headers=headers, timeout=timeout)
    return httpx.Client(base_url="http://airlock", transport=httpx.HTTPTransport(uds=str(endpoint.socket)),
                        timeout=timeout)


def _raise_for_problem(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        p = resp.json()
    except ValueError:
        p = {"detail": resp.text}
    if not isinstance(p, dict):
        p = {"detail": resp.text}
    detail = str(p.get("detail") or resp.reason_phrase)
    errs = p.get("errors")
    errs = [e for e in errs if isinstance(e, dict)] if isinstance(errs, list) else []
    # Validation errors: where and what (the server never echoes the value),
    # added to the message where the server's detail does not say it.
    parts = [f"{_where(e)}: {e.get('message', '')}".strip(": ") for e in errs[:8]
             if not _where(e) or _where(e) not in detail]
    if parts:
        detail = f"{detail} ({'; '.join(parts)})"
    raise AirlockError(resp.status_code, p.get("code", ""), detail, p.get("cause", ""), errs)


def decode_output(text: str, encoding: str) -> bytes:
    """Bytes of an output field: base64 when the server said so."""
    if encoding == "base64":
        return base64.b64decode(text)
    return text.encode("utf-8")


class Client:
    """An HTTP client for one airlock server.

    With no arguments it reads ``AIRLOCK_URL`` and ``AIRLOCK_TOKEN`` (TCP), or
    ``AIRLOCK_SOCKET`` (default: the airlock home's ``airlock.sock``). When
    nothing answers on the default socket it starts ``airlock serve`` (the
    ``airlock`` binary on ``PATH``, or ``$AIRLOCK_BIN``) for the user; that
    server exits after :data:`DEFAULT_IDLE_EXIT` with no request and no
    running box.
    """

    def __init__(self, endpoint: Optional[Endpoint] = None, autostart: bool = True) -> None:
        self.endpoint = endpoint or Endpoint.from_env()
        self.autostart = autostart and self.endpoint.url is None
        self._http: Optional[httpx.AsyncClient] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._checked = False

    def _make_http(self) -> httpx.AsyncClient:
        # Execs may run long: the server bounds them with their timeouts.
        timeout = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
        if self.endpoint.url:
            headers = {}
            if self.endpoint.token:
                headers["Authorization"] = f"Bearer {self.endpoint.token}"
            return httpx.AsyncClient(base_url=self.endpoint.url, headers=headers, timeout=timeout)
        transport = httpx.AsyncHTTPTransport(uds=str(self.endpoint.socket))
        return httpx.AsyncClient(base_url="http://airlock", transport=transport, timeout=timeout)

    async def _ensure(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is not None and self._loop is not loop:
            # Used from another event loop (a second asyncio.run): the old
            # connections belong to the old loop.
            self._http = None
        self._loop = loop
        if self._http is None:
            self._http = self._make_http()
        if not self._checked:
            try:
                r = await self._http.get("/v1/health")
                _raise_for_problem(r)
            except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError, ConnectionRefusedError) as e:
                if not self.autostart:
                    raise RuntimeError(f"no airlock server at {self._where()}: {e} (start one with `airlock serve`)") from e
                await self._start_server()
            self._checked = True
        return self._http

    def _where(self) -> str:
        return self.endpoint.url or str(self.endpoint.socket)

    async def _start_server(self) -> None:
        binary = os.environ.get("AIRLOCK_BIN") or shutil.which("airlock")
        if not binary:
            raise RuntimeError(
                f"no airlock server at {self._where()} and no `airlock` binary on PATH to start one "
                "(install airlock, or set AIRLOCK_BIN / AIRLOCK_URL)"
            )
        sock = self.endpoint.socket
        assert sock is not None
        sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = open(sock.parent / "serve.log", "ab")
        idle = os.environ.get("AIRLOCK_SERVE_IDLE_EXIT", DEFAULT_IDLE_EXIT)
        env = None
        if self.endpoint.home is not None:
            env = dict(os.environ, AIRLOCK_HOME=str(self.endpoint.home))
        subprocess.Popen(
            [binary, "serve", "--socket", str(sock), "--idle-exit", idle],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env,
        )
        log.close()
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        assert self._http is not None
        while True:
            try:
                r = await self._http.get("/v1/health")
                if r.status_code == 200:
                    return
            except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError, ConnectionRefusedError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"started `{binary} serve` but it did not answer on {sock} within "
                                   f"{SERVER_START_TIMEOUT:.0f} s; see {sock.parent / 'serve.log'}")
            await asyncio.sleep(0.05)

    async def request(self, method: str, path: str, json: Optional[Dict[str, Any]] = None,
                      params: Optional[Dict[str, Any]] = None) -> Any:
        """Sends a request; returns the decoded JSON body (None for 204).
        Raises AirlockError for a problem response."""
        http = await self._ensure()
        r = await http.request(method, path, json=json, params=params)
        _raise_for_problem(r)
        if r.status_code == 204 or not r.content:
            return None
        return r.json()

    async def request_raw(self, method: str, path: str, params: Optional[Dict[str, Any]] = None,
                          content: Optional[bytes] = None, max_bytes: Optional[int] = None) -> bytes:
        """Sends a request with a raw body (file uploads) and returns the
        response body (file downloads), at most ``max_bytes`` of it (a box
        chooses what it sends). Raises AirlockError for a problem response,
        a transfer the server cut, or a body over ``max_bytes``."""
        http = await self._ensure()
        try:
            async with http.stream(method, path, params=params, content=content) as r:
                if r.status_code >= 400:
                    await r.aread()
                    _raise_for_problem(r)
                size = r.headers.get("content-length")
                if max_bytes is not None and size is not None and int(size) > max_bytes:
                    raise AirlockError(0, "too_large", f"{method} {path}: {size} bytes, over the limit of {max_bytes} "
                                                       "(pass a larger max_bytes, or use copy_out)")
                chunks = []
                n = 0
                async for c in r.aiter_bytes():
                    n += len(c)
                    if max_bytes is not None and n > max_bytes:
                        raise AirlockError(0, "too_large", f"{method} {path}: more than {max_bytes} bytes")
                    chunks.append(c)
                return b"".join(chunks)
        except httpx.RemoteProtocolError as e:
            raise AirlockError(0, "transfer_cut", f"{method} {path}: the server cut the transfer ({e})") from e

    async def sync_http(self) -> httpx.Client:
        """A blocking client for the same server (for transfers run in a
        worker thread: tar streams). Close it when done."""
        await self._ensure()
        return sync_client(self.endpoint, timeout=httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None))

    async def ws_connect(self, path: str) -> Any:
        """A websockets connection to path. A refused upgrade (a paused or
        missing box, a full server) raises AirlockError with the server's
        problem (code, detail), as the REST calls do."""
        from websockets.asyncio.client import connect, unix_connect
        from websockets.exceptions import InvalidStatus

        try:
            if self.endpoint.url:
                url = self.endpoint.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + path
                headers = {"Authorization": f"Bearer {self.endpoint.token}"} if self.endpoint.token else None
                return await connect(url, additional_headers=headers, max_size=None)
            return await unix_connect(str(self.endpoint.socket), "ws://airlock" + path, max_size=None)
        except InvalidStatus as e:
            r = e.response
            resp = httpx.Response(r.status_code, headers=list(r.headers.raw_items()), content=bytes(r.body or b""))
            _raise_for_problem(resp)
            raise

    async def events(self, since: Optional[int] = None) -> AsyncIterator[Dict[str, Any]]:
        """The server's events (``GET /v1/events``) in order, as they happen:
        every box transition and exec start and end, each a dict with its
        ``seq`` (1, 2, 3... in the server's life) and ``type``. ``since``
        resumes after that seq (the server keeps the last 1024 events; 0:
        all it holds); left out, only new events come. Where events were
        lost to this stream (older than the backlog, a reader more than 1024
        behind, a restarted server) an ``events.dropped`` event says how many
        (``dropped``, up to ``seq``): nothing is lost unmarked. Reconnect
        with the last ``seq`` seen to go on."""
        http = await self._ensure()
        params = {"since": str(max(0, int(since)))} if since is not None else None
        async with http.stream("GET", "/v1/events", params=params, timeout=httpx.Timeout(10.0, read=None)) as r:
            if r.status_code >= 400:
                await r.aread()
                _raise_for_problem(r)
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                try:
                    ev = json.loads(line[6:])
                except ValueError:
                    continue
                if ev.get("type") == "stream.open":
                    continue
                yield ev

    async def snapshots(self) -> List[Snapshot]:
        """The memory snapshots on the server, oldest first (see
        :meth:`SimpleBox.snapshot`)."""
        r = await self.request("GET", "/v1/snapshots")
        return [Snapshot._of(d) for d in r.get("snapshots") or []]

    async def snapshot(self, name: str) -> Snapshot:
        """The snapshot called ``name``; AirlockError ``snapshot_not_found``
        (404) when there is none."""
        return Snapshot._of(await self.request("GET", f"/v1/snapshots/{quote(name, safe='')}"))

    async def remove_snapshot(self, name: str) -> None:
        """Removes the snapshot ``name`` from the server's disk (boxes
        restored from it run on); AirlockError ``snapshot_not_found`` (404)
        when there is none."""
        await self.request("DELETE", f"/v1/snapshots/{quote(name, safe='')}")

    async def aclose(self) -> None:
        """Closes the connections (a later call opens new ones)."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
            self._checked = False

"""Files in a box: the server's files API (stat, list, read, write, tar
streams), as methods of SimpleBox."""

from __future__ import annotations

import asyncio
import os
import posixpath
import stat
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Union

import httpx

from ._client import AirlockError, Client, _raise_for_problem

#: Chunk size of tar streams.
_CHUNK = 256 << 10

#: Default bound of :meth:`SimpleBox.read_file` (1 GiB, the Go library's
#: MaxReadFile): the box chooses what it sends.
MAX_READ_FILE = 1 << 30


@dataclass
class FileInfo:
    """A file in a box (:meth:`SimpleBox.stat`, :meth:`SimpleBox.list_dir`).

    Attributes:
        name: base name.
        type: ``"file"``, ``"dir"``, ``"symlink"`` (list_dir only: stat
            follows links) or ``"other"``.
        size: bytes.
        mode: permission bits (``0o644``), with setuid/setgid/sticky.
        mod_time: modification time (an ISO 8601 string from the server).
        uid, gid: owner.
        link: a symlink's target.
    """

    name: str
    type: str
    size: int
    mode: int
    mod_time: str
    uid: int = 0
    gid: int = 0
    link: str = ""

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def _of(cls, d: dict) -> "FileInfo":
        return cls(name=d["name"], type=d["type"], size=d["size"], mode=d["mode"], mod_time=d["mod_time"],
                   uid=d.get("uid", 0), gid=d.get("gid", 0), link=d.get("link") or "")


class _Pipe:
    """A byte pipe from a writer thread (tarfile) to an iterator (the
    request body), with a bounded queue: backpressure, not buffering."""

    def __init__(self) -> None:
        r, self._w = os.pipe()
        self._r = os.fdopen(r, "rb", buffering=0)

    def writer(self) -> Any:
        return os.fdopen(self._w, "wb", buffering=_CHUNK)

    def chunks(self) -> Iterator[bytes]:
        while True:
            b = self._r.read(_CHUNK)
            if not b:
                return
            yield b

    def close(self) -> None:
        """Closes the reading end: a writer still writing gets EPIPE (the
        server answered before reading the whole body)."""
        self._r.close()


class _RawStream:
    """A file-like reader over a streamed response, for tarfile's 'r|'."""

    def __init__(self, resp: httpx.Response, max_bytes: Optional[int]) -> None:
        self._it = resp.iter_bytes(_CHUNK)
        self._buf = b""
        self._n = 0
        self._max = max_bytes

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                c = next(self._it)
            except StopIteration:
                break
            self._n += len(c)
            if self._max is not None and self._n > self._max:
                raise AirlockError(0, "too_large", f"copy_out: the archive is larger than max_bytes={self._max}")
            self._buf += c
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _root_owned(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    # As docker cp: files copied in belong to root in the box.
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def _copy_in(http: httpx.Client, box: str, host_path: Path, box_dir: str, arcname: str) -> None:
    pipe = _Pipe()
    err: List[BaseException] = []

    def produce() -> None:
        try:
            with pipe.writer() as w, tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as tf:
                tf.add(str(host_path), arcname=arcname, filter=_root_owned)
        except BaseException as e:  # the upload then ends short: the server abandons it
            err.append(e)

    t = threading.Thread(target=produce, daemon=True, name="airlock-copy-in")
    t.start()
    try:
        with http.stream("PUT", f"/v1/boxes/{box}/archive", params={"path": box_dir},
                         content=pipe.chunks(), headers={"Content-Type": "application/x-tar"}) as r:
            r.read()
            _raise_for_problem(r)
    finally:
        pipe.close()
        t.join()
    if err and not isinstance(err[0], BrokenPipeError):
        raise err[0]


def _top_name(box_path: str) -> str:
    """The name of the top entry of the box's archive of ``box_path``: its
    base name, ``.`` for the root (the agent names entries so)."""
    name = posixpath.basename(posixpath.normpath("/" + box_path))
    return name or "."


def _refuse(entry: str, why: str) -> AirlockError:
    return AirlockError(0, "unsafe_archive", f"copy_out: entry {entry!r} {why}: refused, the copy is aborted")


def _under(name: str, top: str) -> bool:
    return top == "." or name == top or name.startswith(top + "/")


def _clean(entry: str, name: str) -> str:
    """``name`` of an archive entry, normalized; absolute names, ``..`` and
    NUL bytes refused."""
    if "\x00" in name:
        raise _refuse(entry, "has a NUL byte")
    if name.startswith("/"):
        raise _refuse(entry, "is absolute")
    if ".." in name.split("/"):
        raise _refuse(entry, "has a '..' component")
    return posixpath.normpath(name)


def _extract(fileobj: Any, dest_dir: Path, top: str, rename: Optional[str]) -> None:
    """Extracts the tar stream ``fileobj`` (the box's archive of a path whose
    top entry is ``top``) into ``dest_dir``, ``top`` renamed to ``rename``
    (when given). The box chooses every byte of the stream, so each entry is
    checked before anything of it is written:

    - it is ``top`` or under ``top/`` (no other name: ``.bashrc`` next to
      ``out/x`` would land beside the destination);
    - no symlink is followed while writing: not one from this archive, not
      one already on the host below ``dest_dir`` (an entry that would go
      through one is refused);
    - a symlink's target stays inside the copy (relative, lexically under
      the top), a hard link's target is a regular file this archive wrote
      earlier;
    - tarfile's ``data`` filter then refuses device files and links leading
      out, and clears setuid bits (PEP 706).

    An existing regular file is replaced, never written in place (it may
    have other hard links). The first refused entry raises AirlockError
    (``unsafe_archive``) naming it and ends the copy: what was written until
    then stays, all of it inside the destination.
    """
    base = os.path.realpath(dest_dir)
    new_top = rename if rename else top
    links: set = set()  # symlinks this archive made (renamed names)
    files: set = set()  # regular files this archive made (renamed names)

    def ren(name: str) -> str:
        if top == ".":
            return posixpath.normpath(posixpath.join(new_top, name))
        if name == top:
            return new_top
        return posixpath.join(new_top, name[len(top) + 1:])

    def check_path(entry: str, name: str, m: tarfile.TarInfo) -> None:
        parts = name.split("/") if name != "." else []
        cur = base
        for i, part in enumerate(parts):
            cur = os.path.join(cur, part)
            rel = "/".join(parts[:i + 1])
            last = i == len(parts) - 1
            if rel in links and not (last and m.issym()):
                raise _refuse(entry, f"goes through the symlink {rel!r} it made")
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                return
            if stat.S_ISLNK(st.st_mode) and not (last and m.issym()):
                raise _refuse(entry, f"goes through the host symlink {cur!r}")
            if last and (m.isreg() or m.islnk()) and not stat.S_ISDIR(st.st_mode):
                os.unlink(cur)  # replaced, not written through other hard links

    def filt(m: tarfile.TarInfo, dest: str) -> Optional[tarfile.TarInfo]:
        entry = m.name
        name = _clean(entry, m.name)
        if not _under(name, top):
            raise _refuse(entry, f"is outside {top!r}, the path copied")
        name = ren(name)
        linkname = m.linkname
        if m.issym():
            if linkname.startswith("/") or "\x00" in linkname:
                raise _refuse(entry, f"is a symlink to {linkname!r}, outside the copy")
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), linkname))
            if target.startswith("../") or target == ".." or not _under(target, new_top):
                raise _refuse(entry, f"is a symlink to {linkname!r}, outside the copy")
        elif m.islnk():
            target = _clean(entry, linkname)
            if not _under(target, top) or ren(target) not in files:
                raise _refuse(entry, f"is a hard link to {linkname!r}, not a file this copy wrote")
            linkname = ren(target)
        m = tarfile.data_filter(m.replace(name=name, linkname=linkname, deep=False), dest)
        check_path(entry, name, m)
        if m.issym():
            links.add(name)
        elif m.isreg() or m.islnk():
            files.add(name)
        return m

    with tarfile.open(fileobj=fileobj, mode="r|") as tf:  # type: ignore[call-overload]
        tf.extractall(base, filter=filt)


def _copy_out(http: httpx.Client, box: str, box_path: str, dest_dir: Path, rename: Optional[str],
              max_bytes: Optional[int]) -> None:
    try:
        with http.stream("GET", f"/v1/boxes/{box}/archive", params={"path": box_path}) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for_problem(r)
            _extract(_RawStream(r, max_bytes), dest_dir, _top_name(box_path), rename)
    except httpx.RemoteProtocolError as e:
        raise AirlockError(0, "transfer_cut", f"copy out {box_path}: the server cut the transfer ({e})") from e


class FilesMixin:
    """The files methods of :class:`SimpleBox`."""

    _client: Client
    _box: Callable[[], Any]

    async def write_file(self, path: str, data: Union[str, bytes], mode: Optional[int] = None,
                         parents: bool = True) -> None:
        """Writes ``data`` to ``path`` in the box, atomically (readers see the
        old file or the new one), creating missing parent directories unless
        ``parents=False``. ``mode``: permission bits (default ``0o644``).
        Raises AirlockError (``code`` ``file_not_found``, ``permission_denied``,
        ``no_space``, ``body_too_large`` past ``serve --max-upload``, ...)."""
        box = await self._box()
        if isinstance(data, str):
            data = data.encode()
        params = {"path": path}
        if mode is not None:
            params["mode"] = f"{mode:o}"
        if parents:
            params["parents"] = "true"
        await self._client.request_raw("PUT", f"/v1/boxes/{box}/files", params=params, content=data)

    async def read_file(self, path: str, max_bytes: int = MAX_READ_FILE) -> bytes:
        """Returns the bytes of the regular file ``path`` in the box (held in
        memory, at most ``max_bytes``; use :meth:`copy_out` for large files).
        Raises AirlockError (``file_not_found``, ``is_a_directory``,
        ``too_large``, ...)."""
        box = await self._box()
        return await self._client.request_raw("GET", f"/v1/boxes/{box}/files", params={"path": path},
                                              max_bytes=max_bytes)

    async def stat(self, path: str) -> FileInfo:
        """Information on ``path`` in the box (symlinks followed, inside the
        box). Raises AirlockError with ``code == "file_not_found"`` when it is
        missing."""
        box = await self._box()
        return FileInfo._of(await self._client.request("GET", f"/v1/boxes/{box}/files/stat", params={"path": path}))

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists in the box."""
        try:
            await self.stat(path)
            return True
        except AirlockError as e:
            if e.code == "file_not_found":
                return False
            raise

    async def list_dir(self, path: str) -> List[FileInfo]:
        """The entries of directory ``path``, sorted by name (symlinks not
        followed)."""
        box = await self._box()
        r = await self._client.request("GET", f"/v1/boxes/{box}/files/list", params={"path": path})
        return [FileInfo._of(e) for e in r["entries"]]

    async def mkdir(self, path: str, mode: int = 0o755) -> None:
        """Creates directory ``path`` and its missing parents (an existing
        directory is fine)."""
        box = await self._box()
        await self._client.request("POST", f"/v1/boxes/{box}/files/mkdir", json={"path": path, "mode": mode})

    async def remove(self, path: str) -> None:
        """Removes ``path`` in the box; a directory goes with everything in
        it. Raises AirlockError (``file_not_found``) when it is missing."""
        box = await self._box()
        await self._client.request("DELETE", f"/v1/boxes/{box}/files", params={"path": path})

    async def copy_in(self, host_path: Union[str, Path], box_path: str) -> None:
        """Copies a host file or directory tree into the box, as ``docker cp``:
        into ``box_path`` when it is an existing directory or ends in ``/``
        (then made), else to ``box_path`` itself (missing parent directories
        are created, as ``write_file`` does). Streamed as tar (modes,
        times and symlinks kept), never held in memory; each file lands
        atomically."""
        box = await self._box()
        src = Path(host_path)
        if not src.exists() and not src.is_symlink():
            raise FileNotFoundError(f"copy_in: {src}: no such file or directory")
        clean = posixpath.normpath(box_path)
        try:
            into_dir = (await self.stat(clean)).is_dir
        except AirlockError as e:
            if e.code != "file_not_found":
                raise
            into_dir = False
        if not into_dir and box_path.endswith("/"):
            # "dir/" names a directory: made, with its parents, and the
            # copy goes into it (never a file named dir).
            await self.mkdir(clean)
            into_dir = True
        if into_dir:
            box_dir, arcname = clean, src.name or src.resolve().name
        else:
            box_dir, arcname = posixpath.dirname(clean) or "/", posixpath.basename(clean)
            if box_dir != "/":
                # A missing parent is made, as write_file does (docker cp
                # would refuse).
                await self.mkdir(box_dir)
        http = await self._client.sync_http()
        try:
            await asyncio.to_thread(_copy_in, http, box, src, box_dir, arcname)
        finally:
            http.close()

    async def copy_out(self, box_path: str, host_path: Union[str, Path], max_bytes: Optional[int] = None) -> None:
        """Copies a file or directory tree of the box to the host, as ``docker
        cp``: into ``host_path`` when it is an existing directory, else to
        ``host_path`` itself. Nothing is written outside the destination:
        an entry not under the copied path's name, an absolute or ``..``
        name, a write through any symlink, a link leading out of the copy
        and a device file are refused with AirlockError (``unsafe_archive``,
        naming the entry), which ends the copy; setuid bits are cleared.
        ``max_bytes`` bounds the archive (the box chooses its size; default:
        no bound)."""
        box = await self._box()
        dst = Path(host_path)
        if dst.is_dir():
            dest_dir, rename = dst, None
        else:
            dest_dir, rename = dst.parent, dst.name
            if not dest_dir.is_dir():
                raise FileNotFoundError(f"copy_out: {dest_dir}: no such directory")
        http = await self._client.sync_http()
        try:
            await asyncio.to_thread(_copy_out, http, box, box_path, dest_dir, rename, max_bytes)
        finally:
            http.close()


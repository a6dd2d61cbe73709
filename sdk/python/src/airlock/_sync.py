"""Blocking variants of SimpleBox and CodeBox, for code without asyncio."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Coroutine, List, Optional, TypeVar, Union

from ._box import CellResult, CodeBox, Context, ExecResult, PortMapping, SimpleBox
from ._client import Client, Endpoint
from ._files import FileInfo
from ._snapshots import Checkpoint, Snapshot

T = TypeVar("T")
S = TypeVar("S", bound="SyncSimpleBox")


class _Loop:
    """A private event loop the sync objects run their calls on. They must
    not be used from inside a running event loop (use the async classes)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()


class SyncSimpleBox:
    """:class:`airlock.SimpleBox` with blocking methods::

        with SyncSimpleBox("python:slim") as box:
            print(box.exec("echo", "hi").stdout)
    """

    _cls: Any = SimpleBox

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = _Loop()
        self._box = self._cls(*args, **kwargs)

    @property
    def id(self) -> Optional[str]:
        return self._box.id  # type: ignore[no-any-return]

    @property
    def created(self) -> Optional[bool]:
        """See :attr:`airlock.SimpleBox.created` (``reuse_existing``)."""
        return self._box.created  # type: ignore[no-any-return]

    def info(self) -> Any:
        """See :meth:`airlock.SimpleBox.info`."""
        return self._box.info()

    def metrics(self) -> Any:
        """See :meth:`airlock.SimpleBox.metrics`."""
        return self._loop.run(self._box.metrics())

    def shutdown(self) -> None:
        """BoxLite's alias of :meth:`stop`."""
        self.stop()

    def start(self) -> "SyncSimpleBox":
        self._loop.run(self._box.start())
        return self

    def stop(self) -> None:
        """Removes the box and closes the private event loop."""
        try:
            self._loop.run(self._box.stop())
        finally:
            self._loop.close()

    def __enter__(self) -> "SyncSimpleBox":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def exec(self, cmd: str, *args: str, **kwargs: Any) -> ExecResult:
        """See :meth:`airlock.SimpleBox.exec`."""
        return self._loop.run(self._box.exec(cmd, *args, **kwargs))  # type: ignore[no-any-return]

    def ports(self) -> List[PortMapping]:
        """See :meth:`airlock.SimpleBox.ports`."""
        return self._loop.run(self._box.ports())  # type: ignore[no-any-return]

    def snapshot(self, name: str) -> Snapshot:
        """See :meth:`airlock.SimpleBox.snapshot`."""
        return self._loop.run(self._box.snapshot(name))  # type: ignore[no-any-return]

    def checkpoint(self, name: str) -> Checkpoint:
        """See :meth:`airlock.SimpleBox.checkpoint`."""
        return self._loop.run(self._box.checkpoint(name))  # type: ignore[no-any-return]

    def rollback(self, name: str) -> None:
        """See :meth:`airlock.SimpleBox.rollback`."""
        self._loop.run(self._box.rollback(name))

    def checkpoints(self) -> List[Checkpoint]:
        """See :meth:`airlock.SimpleBox.checkpoints`."""
        return self._loop.run(self._box.checkpoints())  # type: ignore[no-any-return]

    def remove_checkpoint(self, name: str) -> None:
        """See :meth:`airlock.SimpleBox.remove_checkpoint`."""
        self._loop.run(self._box.remove_checkpoint(name))

    def export(self, path: Union[str, Path], checkpoints: bool = False) -> int:
        """See :meth:`airlock.SimpleBox.export`."""
        return self._loop.run(self._box.export(path, checkpoints=checkpoints))  # type: ignore[no-any-return]

    def pause(self, to_disk: bool = False) -> None:
        """See :meth:`airlock.SimpleBox.pause`."""
        self._loop.run(self._box.pause(to_disk))

    def resume(self) -> None:
        """See :meth:`airlock.SimpleBox.resume`."""
        self._loop.run(self._box.resume())

    def set_secret(self, name: str, value: str) -> None:
        """See :meth:`airlock.SimpleBox.set_secret`."""
        self._loop.run(self._box.set_secret(name, value))

    def fork(self: S, n: int = 1, from_checkpoint: Optional[str] = None) -> List[S]:
        """See :meth:`airlock.SimpleBox.fork`: the children are of this
        class (a SyncCodeBox's are SyncCodeBoxes), each with its own event
        loop; ``stop()`` each, or use it in ``with``."""
        kids = self._loop.run(self._box.fork(n, from_checkpoint=from_checkpoint))
        out: List[S] = []
        for k in kids:
            c = type(self).__new__(type(self))
            c._loop = _Loop()
            c._box = k
            out.append(c)
        return out

    def write_file(self, path: str, data: Union[str, bytes], mode: Optional[int] = None, parents: bool = True) -> None:
        """See :meth:`airlock.SimpleBox.write_file`."""
        self._loop.run(self._box.write_file(path, data, mode=mode, parents=parents))

    def read_file(self, path: str, max_bytes: int = 1 << 30) -> bytes:
        """See :meth:`airlock.SimpleBox.read_file`."""
        return self._loop.run(self._box.read_file(path, max_bytes=max_bytes))  # type: ignore[no-any-return]

    def stat(self, path: str) -> FileInfo:
        """See :meth:`airlock.SimpleBox.stat`."""
        return self._loop.run(self._box.stat(path))  # type: ignore[no-any-return]

    def exists(self, path: str) -> bool:
        """See :meth:`airlock.SimpleBox.exists`."""
        return self._loop.run(self._box.exists(path))  # type: ignore[no-any-return]

    def list_dir(self, path: str) -> List[FileInfo]:
        """See :meth:`airlock.SimpleBox.list_dir`."""
        return self._loop.run(self._box.list_dir(path))  # type: ignore[no-any-return]

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        """See :meth:`airlock.SimpleBox.mkdir`."""
        self._loop.run(self._box.mkdir(path, mode=mode))

    def remove(self, path: str) -> None:
        """See :meth:`airlock.SimpleBox.remove`."""
        self._loop.run(self._box.remove(path))

    def copy_in(self, host_path: Union[str, Path], box_path: str) -> None:
        """See :meth:`airlock.SimpleBox.copy_in`."""
        self._loop.run(self._box.copy_in(host_path, box_path))

    def copy_out(self, box_path: str, host_path: Union[str, Path], max_bytes: Optional[int] = None) -> None:
        """See :meth:`airlock.SimpleBox.copy_out`."""
        self._loop.run(self._box.copy_out(box_path, host_path, max_bytes=max_bytes))


class SyncContext:
    """A blocking :class:`airlock.Context`."""

    def __init__(self, loop: _Loop, ctx: Context) -> None:
        self._loop = loop
        self._ctx = ctx

    @property
    def id(self) -> str:
        """The context id (the same on the box's fork children)."""
        return self._ctx.id

    def run(self, code: str, timeout: Optional[float] = None) -> CellResult:
        return self._loop.run(self._ctx.run(code, timeout=timeout))

    def close(self) -> None:
        self._loop.run(self._ctx.close())


class SyncCodeBox(SyncSimpleBox):
    """:class:`airlock.CodeBox` with blocking methods::

        with SyncCodeBox() as box:
            print(box.run("print(6 * 7)"))
    """

    _cls = CodeBox

    def run(self, code: str, timeout: Optional[float] = None) -> str:
        return self._loop.run(self._box.run(code, timeout=timeout))  # type: ignore[no-any-return]

    def run_script(self, script_path: Union[str, Path], timeout: Optional[float] = None) -> str:
        return self._loop.run(self._box.run_script(script_path, timeout=timeout))  # type: ignore[no-any-return]

    def install_package(self, package: str) -> str:
        return self._loop.run(self._box.install_package(package))  # type: ignore[no-any-return]

    def install_packages(self, *packages: str) -> str:
        return self._loop.run(self._box.install_packages(*packages))  # type: ignore[no-any-return]

    def create_context(self) -> SyncContext:
        return SyncContext(self._loop, self._loop.run(self._box.create_context()))

    def context(self, ctx_id: str) -> SyncContext:
        """See :meth:`airlock.CodeBox.context`: after ``fork``,
        ``child.context(ctx.id)`` is the child's twin of ``ctx``."""
        return SyncContext(self._loop, self._box.context(ctx_id))


class SyncClient:
    """:class:`airlock.Client` with blocking snapshot calls::

        with SyncClient() as c:
            for s in c.snapshots():
                print(s.name, s.state_bytes)
    """

    def __init__(self, endpoint: Optional[Endpoint] = None, autostart: bool = True) -> None:
        self._loop = _Loop()
        self._client = Client(endpoint, autostart=autostart)

    def snapshots(self) -> List[Snapshot]:
        """See :meth:`airlock.Client.snapshots`."""
        return self._loop.run(self._client.snapshots())

    def snapshot(self, name: str) -> Snapshot:
        """See :meth:`airlock.Client.snapshot`."""
        return self._loop.run(self._client.snapshot(name))

    def remove_snapshot(self, name: str) -> None:
        """See :meth:`airlock.Client.remove_snapshot`."""
        self._loop.run(self._client.remove_snapshot(name))

    def close(self) -> None:
        """Closes the connections and the private event loop."""
        try:
            self._loop.run(self._client.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

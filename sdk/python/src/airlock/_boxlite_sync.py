"""BoxLite's sync runtime API (``SyncBoxlite``, ``SyncBox``,
``SyncExecution``) on an airlock server: the async objects of
:mod:`airlock._boxlite` run on a private event loop per ``SyncBoxlite``.
Not for use inside a running event loop (use the async classes there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

from ._boxlite import (Box, BoxInfo, BoxMetrics, Boxlite, BoxliteRestOptions, BoxOptions, CopyOptions, Execution, ExecWaitResult,
                       Options, RuntimeMetrics, _Lines)
from ._sync import _Loop


class SyncExecStdout:
    """A blocking iterator over an execution's output lines (single use)."""

    def __init__(self, loop: _Loop, lines: _Lines) -> None:
        self._loop = loop
        self._lines = lines

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        s = self._loop.run(self._lines.next())
        if s is None:
            raise StopIteration
        return s


class SyncExecStderr(SyncExecStdout):
    """A blocking iterator over an execution's stderr lines."""


class SyncExecution:
    """A blocking :class:`airlock.Execution`."""

    def __init__(self, loop: _Loop, ex: Execution) -> None:
        self._loop = loop
        self._ex = ex

    @property
    def id(self) -> Any:
        return self._ex.id

    def stdout(self) -> SyncExecStdout:
        self._ex._take("stdout")
        return SyncExecStdout(self._loop, self._ex._out)

    def stderr(self) -> SyncExecStderr:
        self._ex._take("stderr")
        return SyncExecStderr(self._loop, self._ex._err)

    def wait(self) -> ExecWaitResult:
        return self._loop.run(self._ex.wait())

    def kill(self) -> None:
        self._loop.run(self._ex.kill())


class SyncBox:
    """A blocking :class:`airlock.Box` (from :meth:`SyncBoxlite.create`)."""

    def __init__(self, loop: _Loop, box: Box) -> None:
        self._loop = loop
        self._box = box

    @property
    def id(self) -> str:
        return self._box.id

    @property
    def name(self) -> Optional[str]:
        return self._box.name

    @property
    def created(self) -> bool:
        """See :attr:`airlock.Box.created`."""
        return self._box.created

    def info(self) -> BoxInfo:
        return self._box.info()

    def start(self) -> None:
        self._loop.run(self._box.start())

    def stop(self) -> None:
        self._loop.run(self._box.stop())

    def exec(self, command: str, args: Optional[Sequence[str]] = None, env: Any = None, tty: bool = False,
             **kwargs: Any) -> SyncExecution:
        return SyncExecution(self._loop, self._loop.run(self._box.exec(command, args, env, tty, **kwargs)))

    def metrics(self) -> BoxMetrics:
        """See :meth:`airlock.Box.metrics`."""
        return self._loop.run(self._box.metrics())

    def copy_in(self, host_path: Union[str, Path], container_dest: str, copy_options: Optional[CopyOptions] = None) -> None:
        self._loop.run(self._box.copy_in(host_path, container_dest, copy_options))

    def copy_out(self, container_src: str, host_dest: Union[str, Path], copy_options: Optional[CopyOptions] = None) -> None:
        self._loop.run(self._box.copy_out(container_src, host_dest, copy_options))

    def clone_box(self, *, options: Any = None, name: Optional[str] = None) -> "SyncBox":
        return SyncBox(self._loop, self._loop.run(self._box.clone_box(options=options, name=name)))

    def export(self, *, dest: str, options: Any = None) -> str:
        return self._loop.run(self._box.export(dest=dest, options=options))

    def __enter__(self) -> "SyncBox":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SyncBox(id={self.id!r})"


class SyncBoxlite:
    """A blocking :class:`airlock.Boxlite`: ``with SyncBoxlite.default() as
    rt: box = rt.create(BoxOptions(...))``, or ``rt = SyncBoxlite.default()
    .start()`` ... ``rt.stop()``. Each object has its own connection and
    event loop."""

    def __init__(self, options: Optional[Options] = None, *, _rt: Optional[Boxlite] = None) -> None:
        self._rt = _rt if _rt is not None else Boxlite(options)
        self._loop: Optional[_Loop] = None

    @staticmethod
    def default() -> "SyncBoxlite":
        """A sync runtime on the default runtime's server."""
        return SyncBoxlite(_rt=Boxlite(_endpoint=Boxlite.default()._client.endpoint))

    @staticmethod
    def rest(options: BoxliteRestOptions) -> "SyncBoxlite":
        return SyncBoxlite(_rt=Boxlite.rest(options))

    def start(self) -> "SyncBoxlite":
        """Opens the runtime's event loop (done by the first call too)."""
        if self._loop is None:
            self._loop = _Loop()
        return self

    def stop(self) -> None:
        """Closes the runtime's connections and event loop; the boxes it
        created without ``detach=True`` are removed within their lease."""
        if self._loop is not None:
            try:
                self._loop.run(self._rt._client.aclose())
            finally:
                self._loop.close()
                self._loop = None
        self._rt.close()

    def _run(self, coro: Any) -> Any:
        self.start()
        assert self._loop is not None
        return self._loop.run(coro)

    def create(self, options: BoxOptions, name: Optional[str] = None) -> SyncBox:
        return SyncBox(self.start()._loop, self._run(self._rt.create(options, name=name)))  # type: ignore[arg-type]

    def get(self, id_or_name: str) -> Optional[SyncBox]:
        b = self._run(self._rt.get(id_or_name))
        return SyncBox(self._loop, b) if b is not None else None  # type: ignore[arg-type]

    def get_or_create(self, options: BoxOptions, name: Optional[str] = None) -> Tuple[SyncBox, bool]:
        b, created = self._run(self._rt.get_or_create(options, name=name))
        return SyncBox(self._loop, b), created  # type: ignore[arg-type]

    def get_info(self, id_or_name: str) -> Optional[BoxInfo]:
        return self._run(self._rt.get_info(id_or_name))  # type: ignore[no-any-return]

    def list_info(self) -> List[BoxInfo]:
        return self._run(self._rt.list_info())  # type: ignore[no-any-return]

    def remove(self, id_or_name: str, force: bool = False) -> None:
        self._run(self._rt.remove(id_or_name, force=force))

    def metrics(self) -> RuntimeMetrics:
        return self._run(self._rt.metrics())  # type: ignore[no-any-return]

    def shutdown(self, timeout: Optional[int] = None) -> None:
        self._run(self._rt.shutdown(timeout))

    def import_box(self, archive_path: str, name: Optional[str] = None, *, untrusted: bool = False) -> SyncBox:
        return self._run(self._rt.import_box(archive_path, name, untrusted=untrusted))  # type: ignore[no-any-return]

    def __enter__(self) -> "SyncBoxlite":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SyncBoxlite(server={self._rt._client._where()!r})"

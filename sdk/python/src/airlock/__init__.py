"""airlock: run untrusted, model-written code in QEMU microVMs.

The seed documents' API::

    import asyncio
    from airlock import CodeBox

    async def main():
        async with CodeBox() as box:
            print(await box.run("print('Hello from a microVM!')"))

    asyncio.run(main())

The SDK talks to ``airlock serve`` over its unix socket (``AIRLOCK_SOCKET``,
default ``~/.airlock/airlock.sock``) or over TCP (``AIRLOCK_URL`` and
``AIRLOCK_TOKEN``). With neither running it starts ``airlock serve`` itself
(``airlock`` must be on PATH); that server exits after 5 minutes with no
request and no running box.
"""

from ._box import (DEFAULT_IMAGE, DEFAULT_LEASE, CellError, CellResult, CodeBox, Context, ExecResult, ExecStream, PortMapping,
                   Secret, SimpleBox)
from ._files import FileInfo
from ._client import AirlockError, Client, Endpoint, default_socket
from ._snapshots import Checkpoint, Snapshot
from ._sync import SyncClient, SyncCodeBox, SyncContext, SyncSimpleBox
from ._boxlite import (AccessToken, ApiKeyCredential, Box, BrowserBox, ComputerBox, InteractiveBox, SkillBox, BoxInfo, Boxlite, BoxliteRestOptions, BoxOptions, BoxStateInfo,
                       CopyOptions, ExecStderr, ExecStdin, ExecStdout, Execution, ExecWaitResult, ImageRegistry,
                       NetworkInfo, NetworkSpec, Options, PublishedPort, RestOptions, RuntimeMetrics)
# BoxLite's other public names: errors for its spelling, and types airlock
# has no equivalent of (constructing one raises NotImplementedError naming
# what to use; see the README's table).
from ._boxlite import (BoxGroup, BoxliteTimeoutError, BoxMetrics, BoxRuntime, BrowserBoxOptions, CloneOptions,
                       CopyOutOutcome, CopyOutPair, Credential, ExecError, ExportOptions, HealthCheckOptions,
                       HealthState, HealthStatus, ImageHandle, ImageInfo, ImagePullResult, ManagedBox, ParseError,
                       SecurityOptions, SnapshotHandle, SnapshotInfo, SnapshotOptions, SyncImageHandle, SyncSkillBox)
from ._boxlite_sync import SyncBox, SyncBoxlite, SyncExecStderr, SyncExecStdout, SyncExecution
from . import sync_api  # noqa: F401  (BoxLite's ``from boxlite.sync_api import SyncBoxlite``)

#: BoxLite's base error: airlock's server errors are AirlockError.
BoxliteError = AirlockError
#: BoxLite's ``TimeoutError`` (an AirlockError; not Python's builtin).
TimeoutError = BoxliteTimeoutError  # noqa: A001

__all__ = [
    "AccessToken",
    "AirlockError",
    "ApiKeyCredential",
    "Box",
    "BrowserBox",
    "ComputerBox",
    "InteractiveBox",
    "SkillBox",
    "BoxInfo",
    "Boxlite",
    "BoxliteError",
    "BoxliteRestOptions",
    "BoxOptions",
    "BoxStateInfo",
    "CopyOptions",
    "ExecStderr",
    "ExecStdin",
    "ExecStdout",
    "Execution",
    "ExecWaitResult",
    "ImageRegistry",
    "NetworkInfo",
    "NetworkSpec",
    "Options",
    "PublishedPort",
    "RestOptions",
    "RuntimeMetrics",
    "SyncBox",
    "SyncBoxlite",
    "SyncExecStderr",
    "SyncExecStdout",
    "SyncExecution",
    "CellError",
    "CellResult",
    "Client",
    "CodeBox",
    "Context",
    "DEFAULT_IMAGE",
    "DEFAULT_LEASE",
    "Endpoint",
    "ExecResult",
    "ExecStream",
    "FileInfo",
    "PortMapping",
    "Secret",
    "SimpleBox",
    "Snapshot",
    "Checkpoint",
    "SyncClient",
    "SyncCodeBox",
    "SyncContext",
    "SyncSimpleBox",
    "default_socket",
    "BoxGroup",
    "BoxMetrics",
    "BoxRuntime",
    "BrowserBoxOptions",
    "CloneOptions",
    "CopyOutOutcome",
    "CopyOutPair",
    "Credential",
    "ExecError",
    "ExportOptions",
    "HealthCheckOptions",
    "HealthState",
    "HealthStatus",
    "ImageHandle",
    "ImageInfo",
    "ImagePullResult",
    "ManagedBox",
    "ParseError",
    "SecurityOptions",
    "SnapshotHandle",
    "SnapshotInfo",
    "SnapshotOptions",
    "SyncImageHandle",
    "SyncSkillBox",
    "TimeoutError",
]

__version__ = "0.1.0"

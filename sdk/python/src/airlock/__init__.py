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
from ._boxlite_sync import SyncBox, SyncBoxlite, SyncExecStderr, SyncExecStdout, SyncExecution
from . import sync_api  # noqa: F401  (BoxLite's ``from boxlite.sync_api import SyncBoxlite``)

#: BoxLite's base error: airlock's server errors are AirlockError.
BoxliteError = AirlockError

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
]

__version__ = "0.1.0"

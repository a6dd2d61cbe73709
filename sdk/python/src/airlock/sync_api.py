"""BoxLite's ``boxlite.sync_api`` module: the blocking classes."""

from ._boxlite_sync import SyncBox, SyncBoxlite, SyncExecStderr, SyncExecStdout, SyncExecution
from ._boxlite import SyncImageHandle, SyncSkillBox
from ._sync import SyncCodeBox, SyncSimpleBox

__all__ = ["SyncBox", "SyncBoxlite", "SyncCodeBox", "SyncExecStderr", "SyncExecStdout", "SyncExecution", "SyncImageHandle",
           "SyncSimpleBox", "SyncSkillBox"]

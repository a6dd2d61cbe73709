"""Memory snapshots as the SDK shows them (``POST /v1/boxes/{id}/snapshot``,
``GET /v1/snapshots``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Snapshot:
    """A memory snapshot of a box: its RAM, device state and writable layer
    at one paused instant (:meth:`SimpleBox.snapshot`, :meth:`Client.snapshots`).
    ``SimpleBox(from_snapshot=snap.name)`` / ``CodeBox(from_snapshot=...)``
    starts a box from it.

    Attributes:
        name: the snapshot's name (unique on the server).
        box: id of the box it was taken of (``box_name``: its name, if any).
        image, image_digest: the box's image.
        cpus, memory_mib, disk_size_mib, network: the box's machine, which a
            box restored from the snapshot has too.
        created: when it was taken (an ISO 8601 string from the server).
        state_bytes: memory and device state on the server's disk, bytes.
        disk_bytes: the writable layer's copy, bytes allocated.
        paused_ms: how long the box was stopped while it was taken, ms.
    """

    name: str
    box: str
    image: str
    image_digest: str
    cpus: int
    memory_mib: int
    disk_size_mib: int
    network: str
    created: str
    state_bytes: int
    disk_bytes: int
    paused_ms: float
    box_name: str = ""

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "Snapshot":
        return cls(name=d["name"], box=d["box"], image=d["image"], image_digest=d.get("image_digest") or "",
                   cpus=d["cpus"], memory_mib=d["memory_mib"], disk_size_mib=d["disk_size_mib"], network=d["network"],
                   created=d["created"], state_bytes=d.get("state_bytes", 0), disk_bytes=d.get("disk_bytes", 0),
                   paused_ms=float(d.get("paused_ms", 0)), box_name=d.get("box_name") or "")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint of a box: its memory, devices and writable layer at one
    paused instant, kept with the box (:meth:`SimpleBox.checkpoint`);
    :meth:`SimpleBox.rollback` returns the box to it in place.

    Attributes:
        name: the checkpoint's name (unique in the box).
        parent: the checkpoint the box was at when this one was taken (the
            last one taken or rolled back to); "" for a root.
        current: the box was last checkpointed at or rolled back to it.
        created: when it was taken (an ISO 8601 string from the server).
        state_bytes, disk_bytes, paused_ms: as for :class:`Snapshot`.
    """

    name: str
    created: str
    parent: str = ""
    current: bool = False
    state_bytes: int = 0
    disk_bytes: int = 0
    paused_ms: float = 0.0

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "Checkpoint":
        return cls(name=d["name"], created=d["created"], parent=d.get("parent") or "", current=bool(d.get("current")),
                   state_bytes=d.get("state_bytes", 0), disk_bytes=d.get("disk_bytes", 0),
                   paused_ms=float(d.get("paused_ms", 0)))

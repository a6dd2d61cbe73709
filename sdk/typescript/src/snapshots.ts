// Memory snapshots as the SDK shows them (`POST /v1/boxes/{id}/snapshot`,
// `GET /v1/snapshots`).

import type { components } from "./openapi.js";

/**
 * A memory snapshot of a box: its RAM, device state and writable layer at
 * one paused instant ({@link SimpleBox.snapshot}, {@link Client.snapshots}).
 * `new CodeBox({ fromSnapshot: snap.name })` starts a box from it.
 */
export interface Snapshot {
  /** The snapshot's name (unique on the server). */
  name: string;
  /** Id of the box it was taken of. */
  box: string;
  /** Name of that box, when it had one. */
  boxName?: string;
  /** The box's image reference and digest. */
  image: string;
  imageDigest: string;
  /** The box's machine and network, which a box restored from it has too. */
  cpus: number;
  memoryMib: number;
  diskSizeMib: number;
  network: string;
  /** When it was taken. */
  created: Date;
  /** Memory and device state on the server's disk, bytes. */
  stateBytes: number;
  /** The writable layer's copy, bytes allocated. */
  diskBytes: number;
  /** How long the box was stopped while it was taken, ms. */
  pausedMs: number;
}

/** @internal The SDK's Snapshot of the API's. */
export function snapshotOf(s: components["schemas"]["Snapshot"]): Snapshot {
  const out: Snapshot = {
    name: s.name, box: s.box, image: s.image, imageDigest: s.image_digest ?? "", cpus: s.cpus, memoryMib: s.memory_mib,
    diskSizeMib: s.disk_size_mib, network: s.network, created: new Date(s.created), stateBytes: s.state_bytes,
    diskBytes: s.disk_bytes, pausedMs: s.paused_ms,
  };
  if (s.box_name) out.boxName = s.box_name;
  return out;
}

/**
 * A checkpoint of a box: its memory, devices and writable layer at one paused
 * instant, kept with the box ({@link SimpleBox.checkpoint});
 * {@link SimpleBox.rollback} returns the box to it in place.
 */
export interface Checkpoint {
  /** The checkpoint's name (unique in the box). */
  name: string;
  /** The checkpoint the box was at when this one was taken (the last one taken or rolled back to); "" for a root. */
  parent: string;
  /** The box was last checkpointed at or rolled back to it. */
  current: boolean;
  /** When it was taken. */
  created: Date;
  /** Memory and device state on the server's disk, bytes. */
  stateBytes: number;
  /** The writable layer's copy, bytes allocated. */
  diskBytes: number;
  /** How long the box was stopped while it was taken, ms. */
  pausedMs: number;
}

/** @internal The SDK's Checkpoint of the API's. */
export function checkpointOf(c: components["schemas"]["Checkpoint"]): Checkpoint {
  return {
    name: c.name, parent: c.parent ?? "", current: c.current ?? false, created: new Date(c.created),
    stateBytes: c.state_bytes, diskBytes: c.disk_bytes, pausedMs: c.paused_ms,
  };
}

// SimpleBox and CodeBox: boxes on an airlock server, with BoxLite's Node API.

import { createReadStream, createWriteStream } from "node:fs";
import { readFile, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import type WebSocket from "ws";

import { BOUNDS } from "./bounds.js";
import { checkArray, checkBool, checkInt, checkSeconds, checkString, checkStringMap, envList } from "./check.js";
import { AirlockError, Client, problemError } from "./client.js";
import { Files, type FileInfo } from "./files.js";
import type { components } from "./openapi.js";
import { NotImplementedError, networkOf, volumesOf } from "./boxlite.js";
import { checkpointOf, snapshotOf, type Checkpoint, type Snapshot } from "./snapshots.js";

type Schemas = components["schemas"];
// image is left out of a restore (from_snapshot): the snapshot names it.
type BoxSpec = Omit<Schemas["BoxSpec"], "image"> & { image?: string };
type ExecRequest = Schemas["ExecRequest"];

/** Most children one {@link SimpleBox.fork} makes (the server's bound, from the API's schema). */
export const MAX_FORK: number = BOUNDS.ForkRequest.n.maximum;

/** The image a CodeBox uses when none is given. */
export const DEFAULT_IMAGE = "python:slim";

const STDIN = 0;
const STDOUT = 1;
const STDERR = 2;

/** A box's description on the server (`GET /v1/boxes/{id}`). */
export type BoxInfo = Schemas["Box"];

/** Environment: an object or `KEY=value` strings. */
/**
 * An environment: `{KEY: "value"}`, `["KEY=value", ...]`, or BoxLite's
 * `[[key, value], ...]` and `[{key, value}, ...]`.
 */
export type Env = Record<string, string> | string[] | [string, string][] | { key: string; value: string }[];

/** What a box is made of. Unset fields take the server's defaults. */
export interface BoxOptions {
  /** Image reference (default `python:slim`). */
  image?: string;
  /** Guest RAM in MiB (server default 512). */
  memoryMib?: number;
  /** vCPUs (server default 1). */
  cpus?: number;
  /** Optional unique box name, usable wherever an id is. */
  name?: string;
  /** Environment of every exec. */
  env?: Env;
  /** Working directory of every exec (default: the image's). */
  workingDir?: string;
  /** User of every exec: name, uid, name:group or uid:gid. */
  user?: string;
  /**
   * `"public"` (default: the internet; host and private ranges denied), `"allowlist"` (only `allowNet`) or `"none"`
   * (no interface); `"enabled"`/`"disabled"` are old names. BoxLite's `{ mode, allowNet }` (or
   * `{ outbound: { mode, allowNet } }`) works too: `enabled` with names is an allowlist.
   */
  network?: "public" | "allowlist" | "none" | "enabled" | "disabled" | { mode?: "enabled" | "disabled"; allowNet?: string[]; outbound?: { mode: "enabled" | "disabled"; allowNet?: string[] } };
  /** Destinations of an allowlist network: names (`*.example.com`), IPs, CIDRs, each with an optional `:PORT`. */
  allowNet?: string[];
  /** Host ports (of the host's 127.0.0.1) the box may reach as `host.airlock.internal:PORT`; each must be granted by `airlock serve --allow-host-port`. */
  allowHostPorts?: number[];
  /**
   * Volumes: `"SRC:DST[:ro]"` strings or `{ source, target, readOnly }`. A host directory must be under one
   * the server grants (`airlock serve --allow-volume DIR`), else the start rejects with `policy_denied` (403).
   */
  volumes?: (string | { source: string; target: string; readOnly?: boolean } | { hostPath: string; guestPath: string; readOnly?: boolean })[];
  /**
   * Published ports (Docker's `-p`): a guest port (`8000`: a free host port), `"[HOSTIP:]HOSTPORT:GUESTPORT[/tcp|udp]"`
   * (`"8080:80"`, `"127.0.0.1:5353:53/udp"`) or a {@link PortMapping}; the host address defaults to 127.0.0.1. The
   * server must grant each (`airlock serve --allow-publish 127.0.0.1:8000-8099`, a range from 0 for free ports), else
   * the start rejects with `policy_denied` (403); a host port in use is `port_in_use` (409). {@link SimpleBox.ports}
   * returns them as bound.
   */
  ports?: (number | string | PortMapping)[];
  /**
   * Secrets the box uses but never sees, by environment variable name: in the box `$NAME` is a placeholder that the
   * server replaces by `value` in the headers of HTTPS requests to `hosts` (`"api.example.com"`, `"*.example.com"`)
   * only; their port 443 is allowed under an allowlist. No call returns a value.
   */
  secrets?: Record<string, Secret>;
  /** Writable layer size in MiB (server default 4096). */
  diskSizeMib?: number;
  /** BoxLite's size in GB (× 1024 MiB); give this or `diskSizeMib`. */
  diskSizeGb?: number;
  /**
   * Remove the box when it stops. Left out, {@link SimpleBox.stop} removes it all the same; `false` (BoxLite's
   * spelling of a kept box) makes `stop()` shut it down and keep it, to be found again by `name`
   * ({@link reuseExisting}).
   */
  autoRemove?: boolean;
  /**
   * BoxLite's: with `name`, take the box of that name when it exists (started when stopped; {@link SimpleBox.created}
   * is then false), else create it (true).
   */
  reuseExisting?: boolean;
  /** BoxLite's runtime ({@link JsBoxlite}): its server is the one used (as `client`). */
  runtime?: { readonly client: Client };
  /** BoxLite's: accepted as `true` (an airlock box lives until removed); `false` is the default here too only for BoxLite's own runtime boxes. */
  detach?: boolean;
  /** Not supported (NotImplementedError at start): `airlock image import PATH --tag NAME`, then `image`. */
  rootfsPath?: string;
  /** Not supported (NotImplementedError at start): airlock's agent is init; start processes with `exec`/`stream`. */
  entrypoint?: string[];
  /** Not supported, as `entrypoint`. */
  cmd?: string[];
  /** Not supported (NotImplementedError at start): every box runs confined; `airlock serve`'s policy flags set limits. */
  security?: unknown;
  /** Not supported, as `security`. */
  advanced?: unknown;
  /** Labels (key → value) stored with the box: `GET /v1/boxes?label=KEY=VALUE` and `airlock ls --filter label=KEY=VALUE` match them. */
  labels?: Record<string, string>;
  /**
   * Restore this memory snapshot ({@link SimpleBox.snapshot}) instead of booting: the box runs on from the
   * instant it was taken, with its processes and files. The image, `cpus`, `memoryMib`, `diskSizeMib` and
   * `network` are the snapshot's (leave them out); `env`, `workingDir` and `user` default to its box's;
   * `volumes`, `ports`, `allowNet` and `allowHostPorts` are refused (`invalid_request`, 400). An unknown name
   * rejects with `snapshot_not_found` (404).
   */
  fromSnapshot?: string;
  /**
   * Seconds without an exec, file or code call (nor, for `idleAction` `"stop"` and `"suspend"`, traffic on its
   * network) after which the server takes `idleAction` on the box.
   */
  idleTimeout?: number;
  /**
   * What `idleTimeout` does: `"remove"` (default), `"stop"` or `"suspend"` (scale to zero: the box is paused to
   * disk and holds no host memory; the next call on it, or an inbound connection to a published port, resumes
   * it first, with its processes and memory). Needs `idleTimeout`.
   */
  idleAction?: "remove" | "stop" | "suspend";
  /** The server connection (default: one per process, from the environment). */
  client?: Client;
}

/** A secret of {@link BoxOptions.secrets}: the hosts it is sent to and its value. */
export interface Secret {
  hosts: string[];
  value: string;
}

/** A published port: connections to `hostIp:hostPort` on the server's host reach `guestPort` in the box. */
export interface PortMapping {
  /** Host address to listen on (default 127.0.0.1; `0.0.0.0` or `::` for every interface). */
  hostIp?: string;
  /** Host port; 0 (the default) picks a free one at each start. */
  hostPort?: number;
  /** Port in the box (1-65535). */
  guestPort: number;
  /** `"tcp"` (default) or `"udp"`. */
  protocol?: "tcp" | "udp";
}

/** A published port as bound on the server's host ({@link SimpleBox.ports}): `hostPort` is the port picked when 0 was asked. */
export type PublishedPort = Required<PortMapping>;

/** Options of {@link CodeBox}. */
export interface CodeBoxOptions extends BoxOptions {
  /** pip `--index-url` for {@link CodeBox.installPackage} (default PyPI). */
  indexUrl?: string;
}

/** Options of {@link SimpleBox.exec} and {@link SimpleBox.stream}. */
export interface ExecOptions {
  /** Environment added for this exec only. */
  env?: Env;
  /** User to run as. */
  user?: string;
  /** Seconds; enforced: the process tree is killed past it. */
  timeout?: number;
  /** Working directory. */
  cwd?: string;
  /** Standard input (buffered exec only); the process reads EOF after it. */
  stdin?: string | Uint8Array;
  /**
   * Run on a terminal (PTY) in the box: all output comes as stdout, with CRLF line ends, and a 0x03 byte
   * on stdin is Ctrl-C. Resize a streaming one with {@link ExecStream.resize}.
   */
  tty?: boolean;
  /** Terminal rows and columns of a tty exec (default 24 x 80). */
  rows?: number;
  cols?: number;
}

/** Options of {@link CodeBox.run} and {@link Context.run}. */
export interface RunOptions {
  /** Seconds; enforced: the Python process tree (or the cell) is interrupted past it. */
  timeout?: number;
}

/**
 * The outcome of {@link SimpleBox.exec}. A non-zero `exitCode` does not
 * throw: check it yourself.
 */
export interface ExecResult {
  /** Exit status; 128+N when killed by signal N; 127 when the command was not found. */
  exitCode: number;
  /** Standard output as text (invalid UTF-8 replaced; the bytes are in `stdoutBytes`). */
  stdout: string;
  /** Standard error as text. */
  stderr: string;
  /** Set only when the process did not end normally (timed out, could not run, died with its VM). */
  errorMessage?: string;
  /** The timeout killed the process tree. */
  timedOut: boolean;
  /** The signal that killed the process, 0 otherwise. */
  signal: number;
  /** Standard output, exactly. */
  stdoutBytes: Buffer;
  /** Standard error, exactly. */
  stderrBytes: Buffer;
  /** Output was cut at the server's bound (`airlock serve --max-output`, 16 MiB a stream): the first and last half of
   * a stream are kept, and `stdoutDropped` / `stderrDropped` bytes between them are left out. */
  truncated: boolean;
  /** Bytes of stdout left out (0 unless `truncated`). */
  stdoutDropped: number;
  /** Bytes of stderr left out (0 unless `truncated`). */
  stderrDropped: number;
}

/**
 * Thrown by {@link CodeBox.run} when the Python code exits with a non-zero
 * status (an uncaught exception: the traceback is in `stderr`) or runs past
 * its timeout.
 */
export class ExecError extends Error {
  /** Exit status of the Python process (1 for an uncaught exception). */
  readonly exitCode: number;
  /** What the code printed before it failed. */
  readonly stdout: string;
  /** The traceback (and whatever else the code wrote to stderr). */
  readonly stderr: string;
  /** The run was killed by its timeout. */
  readonly timedOut: boolean;

  constructor(message: string, exitCode: number, stdout: string, stderr: string, timedOut = false) {
    super(message);
    this.name = "ExecError";
    this.exitCode = exitCode;
    this.stdout = stdout;
    this.stderr = stderr;
    this.timedOut = timedOut;
  }
}

/** An exception raised by a context cell. */
export interface CellError {
  /** Exception class name (`ZeroDivisionError`). */
  name: string;
  /** `str()` of the exception. */
  value: string;
  /** The formatted traceback. */
  traceback: string;
}

/** The outcome of {@link Context.run}. */
export interface CellResult {
  stdout: string;
  stderr: string;
  /** `repr()` of the last expression when it is not None. */
  value?: string;
  /** The exception the cell raised, if any. */
  error?: CellError;
  /** matplotlib figures left open, as PNG bytes. */
  images: Buffer[];
  /** The cell ran past its timeout and was interrupted. */
  timedOut: boolean;
  /** The interpreter was restarted: earlier variables are gone. */
  stateLost: boolean;
  /** Output was cut at the server's bound. */
  truncated: boolean;
}

/** One piece of a streaming exec's output. */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: Buffer;
}

function volumeSpec(v: string | { source: string; target: string; readOnly?: boolean }): Schemas["VolumeSpec"] {
  if (typeof v !== "string") return { source: v.source, target: v.target, read_only: v.readOnly ?? false };
  const parts = v.split(":");
  if ((parts.length !== 2 && parts.length !== 3) || (parts.length === 3 && parts[2] !== "ro" && parts[2] !== "rw")) {
    throw new TypeError(`volume ${JSON.stringify(v)}: want SOURCE:TARGET[:ro|rw] (SOURCE a host directory or a volume name)`);
  }
  const source = parts[0].startsWith(".") ? path.resolve(parts[0]) : parts[0];
  return { source, target: parts[1], read_only: parts[2] === "ro" };
}

export function portSpec(p: number | string | PortMapping): Schemas["PortSpec"] {
  const bad = (): TypeError =>
    new TypeError(`port ${JSON.stringify(p)}: want a guest port, "[HOSTIP:]HOSTPORT:GUESTPORT[/tcp|udp]" or { guestPort, hostPort?, hostIp?, protocol? }`);
  if (typeof p === "number") {
    if (!Number.isInteger(p)) throw bad();
    return { host_port: 0, guest_port: p, protocol: "tcp" };
  }
  if (typeof p === "object" && p !== null && !Array.isArray(p)) {
    if (!Number.isInteger(p.guestPort)) throw bad();
    const spec: Schemas["PortSpec"] = { host_port: p.hostPort ?? 0, guest_port: p.guestPort, protocol: p.protocol ?? "tcp" };
    if (p.hostIp) spec.host_ip = p.hostIp;
    return spec;
  }
  if (typeof p !== "string") throw bad();
  let rest = p;
  let protocol = "tcp";
  const slash = rest.lastIndexOf("/");
  if (slash >= 0) {
    protocol = rest.slice(slash + 1);
    rest = rest.slice(0, slash);
  }
  let hostIp = "";
  let host = "0";
  let guest = rest;
  const c = rest.lastIndexOf(":");
  if (c >= 0) {
    guest = rest.slice(c + 1);
    host = rest.slice(0, c);
    const c2 = host.lastIndexOf(":");
    if (c2 >= 0) {
      hostIp = host.slice(0, c2).replace(/^\[|\]$/g, "");
      host = host.slice(c2 + 1);
    }
  }
  if (!/^\d+$/.test(host) || !/^\d+$/.test(guest) || (protocol !== "tcp" && protocol !== "udp")) throw bad();
  const spec: Schemas["PortSpec"] = { host_port: Number(host), guest_port: Number(guest), protocol };
  if (hostIp) spec.host_ip = hostIp;
  return spec;
}

function decode(text: string, encoding: string): Buffer {
  return encoding === "base64" ? Buffer.from(text, "base64") : Buffer.from(text, "utf8");
}

function isOptions(x: unknown): x is ExecOptions {
  return typeof x === "object" && x !== null && !Array.isArray(x) && !(x instanceof Uint8Array);
}

function splitArgs(rest: (string | ExecOptions)[]): [string[], ExecOptions] {
  const last = rest[rest.length - 1];
  const opts = isOptions(last) ? last : {};
  const args = (isOptions(last) ? rest.slice(0, -1) : rest) as unknown[];
  args.forEach((a, i) => {
    if (typeof a !== "string") throw new TypeError(`args[${i}] must be a string, got ${typeof a}`);
  });
  return [args as string[], opts];
}

function execRequest(cmd: string, args: string[], o: ExecOptions): ExecRequest {
  if (typeof cmd !== "string" || !cmd) throw new TypeError(`cmd must be a non-empty string, got ${JSON.stringify(cmd)}`);
  checkString("user", o.user);
  checkString("cwd", o.cwd);
  checkSeconds("timeout", o.timeout);
  checkBool("tty", o.tty);
  checkInt("rows", o.rows, 1);
  checkInt("cols", o.cols, 1);
  if (o.stdin !== undefined && typeof o.stdin !== "string" && !(o.stdin instanceof Uint8Array)) {
    throw new TypeError(`stdin must be a string or a Uint8Array, got ${typeof o.stdin}`);
  }
  const req: ExecRequest = { cmd: [cmd, ...args] };
  if (o.env !== undefined) req.env = envList("env", o.env);
  if (o.user) req.user = o.user;
  if (o.cwd) req.working_dir = o.cwd;
  if (o.timeout) req.timeout = o.timeout;
  if (o.tty) req.tty = true;
  if (o.rows) req.rows = o.rows;
  if (o.cols) req.cols = o.cols;
  return req;
}

function checkCode(code: unknown): void {
  if (typeof code !== "string") throw new TypeError(`code must be a string, got ${code === null ? "null" : typeof code}`);
}

// checkBoxOptions type-checks a box's options before anything is sent,
// naming the option (TypeError; RangeError for a value out of range).
function checkBoxOptions(o: BoxOptions): void {
  if (o === null || typeof o !== "object") throw new TypeError(`options must be an object, got ${o === null ? "null" : typeof o}`);
  for (const k of ["image", "name", "workingDir", "user", "fromSnapshot", "idleAction"] as const) checkString(k, o[k]);
  for (const k of ["memoryMib", "cpus", "diskSizeMib"] as const) checkInt(k, o[k], 1);
  checkSeconds("idleTimeout", o.idleTimeout);
  checkBool("autoRemove", o.autoRemove);
  checkArray("allowNet", o.allowNet, "string");
  checkArray("allowHostPorts", o.allowHostPorts, "integer");
  checkStringMap("labels", o.labels);
  if (o.volumes !== undefined && !Array.isArray(o.volumes)) throw new TypeError(`volumes must be an array, got ${typeof o.volumes}`);
  if (o.ports !== undefined && !Array.isArray(o.ports)) throw new TypeError(`ports must be an array, got ${typeof o.ports}`);
  if (o.network !== undefined && typeof o.network !== "string" && (o.network === null || typeof o.network !== "object")) {
    throw new TypeError(`network must be "public", "allowlist", "none" or a NetworkSpec, got ${typeof o.network}`);
  }
}

const KNOWN_OPTIONS = new Set([
  "image", "memoryMib", "cpus", "name", "env", "workingDir", "user", "network", "diskSizeMib", "autoRemove",
  "allowNet", "allowHostPorts", "volumes", "ports", "fromSnapshot", "labels", "secrets", "idleTimeout", "idleAction",
  "client", "indexUrl", "diskSizeGb", "reuseExisting", "detach", "rootfsPath", "entrypoint", "cmd", "security", "advanced",
  "runtime", // BoxLite's runtime handle (JsBoxlite): its server is used
]);

// What to do, where the server's detail does not say it already (for
// image_not_found it does: pull, import or build-debian).
function startHint(code: string): string {
  switch (code) {
    case "box_died":
      return "; the VM did not come up: `airlock doctor` says what is missing (QEMU, kernel, KVM or TCG)";
    default:
      return "";
  }
}

/**
 * A box (a microVM made from an OCI image) on an airlock server.
 *
 * The box is created and booted lazily by the first call that needs it (or
 * by {@link start}), and removed by {@link stop} or when an `await using`
 * block ends. A failure to start rejects with an {@link AirlockError} (a
 * plain `Error`) whose message says what to do; any call after `stop()`
 * rejects with an `Error` saying the box was stopped.
 */
export class SimpleBox implements AsyncDisposable {
  protected readonly client: Client;
  /** The options it was made with (a fork child is made with them too). */
  protected readonly options: CodeBoxOptions;
  private readonly files: Files;
  private readonly spec: BoxSpec;
  private readonly unsupported: string[];
  private boxId?: string;
  private starting?: Promise<string>;
  private stopped = false;
  private wasCreated: boolean | null = null;

  constructor(options: BoxOptions = {}) {
    this.options = options;
    checkBoxOptions(options);
    this.client = options.client ?? options.runtime?.client ?? Client.default();
    const spec: BoxSpec = {};
    if (options.fromSnapshot) {
      spec.from_snapshot = options.fromSnapshot;
      if (options.image !== undefined) spec.image = options.image;
    } else {
      spec.image = options.image ?? DEFAULT_IMAGE;
    }
    if (options.memoryMib !== undefined) spec.memory_mib = options.memoryMib;
    if (options.cpus !== undefined) spec.cpus = options.cpus;
    if (options.name !== undefined) spec.name = options.name;
    if (options.env !== undefined) spec.env = envList("env", options.env);
    if (options.workingDir !== undefined) spec.working_dir = options.workingDir;
    if (options.user !== undefined) spec.user = options.user;
    if (typeof options.network === "string") spec.network = options.network;
    else if (options.network !== undefined) Object.assign(spec, networkOf(options.network));
    if (options.diskSizeMib !== undefined) spec.disk_size_mib = options.diskSizeMib;
    if (options.diskSizeGb !== undefined) {
      if (!Number.isInteger(options.diskSizeGb) || options.diskSizeGb < 1) throw new TypeError(`diskSizeGb must be a whole number of GB >= 1, got ${options.diskSizeGb}`);
      spec.disk_size_mib = options.diskSizeGb * 1024;
    }
    if (options.autoRemove) spec.auto_remove = true;
    if (options.allowNet?.length) spec.allow_net = [...options.allowNet];
    if (options.allowHostPorts?.length) spec.allow_host_ports = [...options.allowHostPorts];
    if (options.volumes?.length) {
      spec.volumes = options.volumes.map((v) => (typeof v === "object" && v !== null && "hostPath" in v ? volumesOf([v])![0] : volumeSpec(v as string)));
    }
    if (options.ports?.length) spec.ports = options.ports.map(portSpec);
    if (options.labels && Object.keys(options.labels).length) spec.labels = { ...options.labels };
    if (options.idleTimeout !== undefined) spec.idle_timeout = options.idleTimeout;
    if (options.idleAction !== undefined) spec.idle_action = options.idleAction;
    if (options.secrets && Object.keys(options.secrets).length) {
      spec.secrets = Object.fromEntries(
        Object.entries(options.secrets).map(([k, s]) => [k, { value: s.value, hosts: [...s.hosts] }]),
      );
    }
    this.spec = spec;
    this.files = new Files(this.client, () => this.box());
    this.unsupported = Object.keys(options).filter((k) => !KNOWN_OPTIONS.has(k)).sort();
  }

  /** A handle on an existing, running box, by id or name. {@link stop} removes it. */
  static attach<T extends SimpleBox>(this: new (o?: CodeBoxOptions) => T, id: string, options: CodeBoxOptions = {}): T {
    const b = new this(options);
    b.bind(id);
    return b;
  }

  private bind(id: string): void {
    this.boxId = id;
    this.starting = Promise.resolve(id);
  }

  /** The box id once started, else undefined. */
  get id(): string | undefined {
    return this.boxId;
  }

  /** The image reference the box is made from (for a restore: the one given, else "": see {@link info}). */
  get image(): string {
    return this.spec.image ?? (this.spec.from_snapshot ? "" : DEFAULT_IMAGE);
  }

  /**
   * Creates and boots the box; a no-op when it is running. Concurrent first
   * calls share one box. Rejects with an {@link AirlockError} saying what to
   * do when the box cannot start (image not found, no VM could boot, no
   * server); a later call tries again.
   */
  async start(): Promise<this> {
    await this.box();
    return this;
  }

  /** The box id, starting the box when needed. */
  protected box(): Promise<string> {
    if (this.stopped) {
      return Promise.reject(new Error(
        this.options.autoRemove === false
          ? `this ${this.constructor.name} was stopped (its box kept: a new ${this.constructor.name} with reuseExisting and its name takes it again)`
          : `this ${this.constructor.name} was stopped and its box removed; create a new ${this.constructor.name} to run more code`));
    }
    if (!this.starting) {
      this.starting = this.create().catch((e) => {
        this.starting = undefined;
        throw e;
      });
    }
    return this.starting;
  }

  private async create(): Promise<string> {
    if (this.unsupported.length) {
      throw new TypeError(`unsupported box options: ${this.unsupported.join(", ")}`);
    }
    const o = this.options;
    if (o.rootfsPath) throw new NotImplementedError("rootfsPath", "import the OCI layout as an image (airlock image import PATH --tag NAME) and pass image: NAME");
    if (o.entrypoint !== undefined || o.cmd !== undefined) {
      throw new NotImplementedError("entrypoint/cmd", "airlock boxes run its agent as init, not the image's entrypoint; start processes with exec() or stream()");
    }
    if (o.security !== undefined || o.advanced !== undefined) {
      throw new NotImplementedError("security/advanced", "every airlock box runs confined (seccomp, no capabilities, its own uid); set limits with airlock serve's policy flags");
    }
    if (o.reuseExisting) {
      if (!this.spec.name) throw new TypeError("reuseExisting needs a name (the box to take when it exists)");
      const found = await this.reuse(this.spec.name);
      if (found) return found;
    }
    let info: BoxInfo;
    try {
      info = await this.client.request<BoxInfo>("POST", "/v1/boxes", this.spec);
    } catch (e) {
      if (!(e instanceof AirlockError)) throw e;
      if (o.reuseExisting && e.code === "name_in_use") {
        const found = await this.reuse(this.spec.name!); // made by another caller meanwhile
        if (found) return found;
      }
      const what = this.spec.from_snapshot ? `restore snapshot ${this.spec.from_snapshot}` : `start a box from ${this.image}`;
      throw new AirlockError(e.status, e.code, `could not ${what}: ${e.message}${startHint(e.code)}`, e.problem, { cause: e });
    }
    this.boxId = info.id;
    this.wasCreated = true;
    return info.id;
  }

  /** The id of the box called name, started when stopped; undefined when there is none. */
  private async reuse(name: string): Promise<string | undefined> {
    let info: BoxInfo;
    try {
      info = await this.client.request<BoxInfo>("GET", `/v1/boxes/${encodeURIComponent(name)}`);
    } catch (e) {
      if (e instanceof AirlockError && e.code === "box_not_found") return undefined;
      throw e;
    }
    if (info.state !== "running") await this.client.request("POST", `/v1/boxes/${encodeURIComponent(info.id)}/start`);
    this.boxId = info.id;
    this.wasCreated = false;
    return info.id;
  }

  /** BoxLite's: whether the box was created (true) or an existing one reused (false); null before it starts. */
  get created(): boolean | null {
    return this.wasCreated;
  }

  /** The box name it was given, if any. */
  get name(): string | undefined {
    return this.spec.name ?? undefined;
  }

  /** BoxLite's: the box id, starting the box when needed. */
  async getId(): Promise<string> {
    return this.box();
  }

  /** BoxLite's: {@link info}, starting the box when needed. */
  async getInfo(): Promise<BoxInfo> {
    return this.info();
  }

  /** The box's description on the server. */
  async info(): Promise<BoxInfo> {
    const id = await this.box();
    return this.client.request<BoxInfo>("GET", `/v1/boxes/${encodeURIComponent(id)}`);
  }

  /**
   * Saves the box's memory, device state and writable layer, taken at one paused instant, as the snapshot
   * `name` (letters, digits, `_ . -`; unique on the server); the box runs on. Start boxes from it with
   * `new CodeBox({ fromSnapshot: name })`; list and remove snapshots with {@link Client.snapshots} and
   * {@link Client.removeSnapshot}. Starts the box when needed. Rejects with {@link AirlockError}
   * `snapshot_exists` (409) when the name is taken, `policy_denied` (403) past the server's
   * `--max-snapshots`, `not_supported` (501) when its VM driver cannot snapshot; a box with volumes cannot be
   * snapshotted.
   */
  async snapshot(name: string): Promise<Snapshot> {
    const id = await this.box();
    const body: Schemas["SnapshotRequest"] = { name };
    return snapshotOf(await this.client.request<Schemas["Snapshot"]>("POST", `/v1/boxes/${encodeURIComponent(id)}/snapshot`, body));
  }

  /**
   * Saves the box's memory, devices and writable layer, at one paused instant, as its checkpoint `name` (1-64
   * letters, digits, `_ . -`), kept with the box and removed with it; the box runs on. Its parent is the
   * checkpoint the box was last checkpointed at or rolled back to. Starts the box when needed. Rejects with
   * {@link AirlockError} `checkpoint_exists` (409) when the box has one of that name, `not_supported` (501) when
   * the server's VM driver cannot snapshot; a box with volumes cannot be checkpointed.
   */
  async checkpoint(name: string): Promise<Checkpoint> {
    const id = await this.box();
    const body: Schemas["CheckpointRequest"] = { name };
    return checkpointOf(await this.client.request<Schemas["Checkpoint"]>("POST", `/v1/boxes/${encodeURIComponent(id)}/checkpoints`, body));
  }

  /**
   * Returns the box, in place, to its checkpoint `name`: processes, files and memory as they were then (the clock
   * stepped to now, the RNG reseeded); the box keeps its id, name, published ports, network policy and secrets.
   * Execs running in it end ({@link AirlockError} `rolled_back`, 409). A CodeBox's contexts keep their ids, their
   * variables as at the checkpoint; one made after the checkpoint starts afresh. A checkpoint taken afterwards
   * starts a branch. Rejects with `checkpoint_not_found` (404).
   */
  async rollback(name: string): Promise<void> {
    const id = await this.box();
    const body: Schemas["CheckpointRequest"] = { name };
    await this.client.request("POST", `/v1/boxes/${encodeURIComponent(id)}/rollback`, body);
  }

  /** The box's checkpoints, oldest first; each names its parent. */
  async checkpoints(): Promise<Checkpoint[]> {
    const id = await this.box();
    const r = await this.client.request<Schemas["CheckpointList"]>("GET", `/v1/boxes/${encodeURIComponent(id)}/checkpoints`);
    return (r.checkpoints ?? []).map(checkpointOf);
  }

  /**
   * Writes the box's archive to the host file `hostPath` (as `airlock export`): its configuration and writable
   * layer (what it changed in its image; volumes are not part of it), and with `checkpoints: true` its
   * checkpoints with their tree, so that {@link rollback} works on the box {@link SimpleBox.importBox} makes of
   * it. A running box is flushed and paused while its disk is copied. Streamed to `hostPath + ".part"`, renamed
   * over `hostPath` once whole; resolves to the archive's size in bytes. Rejects with {@link AirlockError}
   * `transfer_cut` when the server cut the transfer (nothing is left at `hostPath`).
   */
  async export(hostPath: string, options: { checkpoints?: boolean } = {}): Promise<number> {
    const id = await this.box();
    const q = new URLSearchParams({ checkpoints: options.checkpoints ? "true" : "false" });
    const res = await this.client.transfer("GET", `/v1/boxes/${encodeURIComponent(id)}/export?${q}`);
    const tmp = hostPath + ".part";
    let n = 0;
    res.on("data", (c: Buffer) => {
      n += c.length;
    });
    try {
      try {
        await pipeline(res, createWriteStream(tmp, { mode: 0o600 }));
      } catch (e) {
        throw new AirlockError(0, "transfer_cut", `export ${id}: the server cut the transfer (${(e as Error).message})`, undefined, { cause: e });
      }
      if (!res.complete) throw new AirlockError(0, "transfer_cut", `export ${id}: the server cut the transfer after ${n} bytes`);
      await rename(tmp, hostPath);
    } finally {
      await rm(tmp, { force: true });
    }
    return n;
  }

  /**
   * Makes a box on the server of the archive at the host file `hostPath` ({@link export}, `airlock export`),
   * streamed, and resolves to a handle on it (as {@link attach}), started unless `start: false`. The box gets the
   * archive's options and files, and its checkpoints when it carries them (the server takes those only with
   * `airlock serve --allow-import-state`: else {@link AirlockError} `policy_denied`, 403). The archive's image
   * must be on the server. `name` names the new box. It keeps the archive's ttl, idle timeout and lease (no renewer runs
   * for it). {@link stop} removes it. Rejects with
   * `invalid_request` (400) for a file that is not a box archive or one with memory, `image_not_found` (404),
   * `name_in_use` (409), `body_too_large` (413) past `serve --max-upload`.
   */
  static async importBox<T extends SimpleBox>(this: new (o?: CodeBoxOptions) => T, hostPath: string,
    options: CodeBoxOptions & { name?: string; start?: boolean } = {}): Promise<T> {
    const { name, start, ...rest } = options;
    const b = new this(rest);
    await stat(hostPath);
    const q = name ? `?${new URLSearchParams({ name })}` : "";
    const res = await b.client.transfer("POST", `/v1/boxes/import${q}`, createReadStream(hostPath), "application/x-tar");
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    const info = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Schemas["Box"];
    if (start ?? true) await b.client.request("POST", `/v1/boxes/${encodeURIComponent(info.id)}/start`);
    b.bind(info.id);
    return b;
  }

  /** Removes the box's checkpoint `name`; those taken after it get its parent. Rejects with `checkpoint_not_found` (404). */
  async removeCheckpoint(name: string): Promise<void> {
    const id = await this.box();
    await this.client.request("DELETE", `/v1/boxes/${encodeURIComponent(id)}/checkpoints/${encodeURIComponent(name)}`);
  }

  /**
   * Pauses the running box: its vCPUs stop (no guest CPU; its memory stays allocated; calls into it wait until
   * {@link resume}). With `toDisk: true` the server saves its memory into the box's directory and ends its VM
   * instead: no host memory or CPU is held until {@link resume} continues it as the same box (files, processes
   * and their pids; the clock stepped to the host's). Pausing to disk ends a CodeBox's contexts and execs in
   * progress (their processes run on in the box); calls in between reject with {@link AirlockError}
   * `box_not_running` (409). Rejects with `not_supported` (501) when the server's VM driver cannot pause to
   * disk; a box with volumes cannot be paused to disk.
   */
  async pause(options: { toDisk?: boolean } = {}): Promise<void> {
    const id = await this.box();
    const body: Schemas["PauseRequest"] = { to_disk: options.toDisk ?? false };
    await this.client.request("POST", `/v1/boxes/${encodeURIComponent(id)}/pause`, body);
  }

  /**
   * Gives the box's secret `name` a new value (rotation): the server substitutes it in the box's requests from
   * the next one on, and later starts keep it. The placeholder in the box stays. Rejects with `invalid_argument`
   * (400) for a secret the box was not created with or a bad value (the error never shows the value).
   */
  async setSecret(name: string, value: string): Promise<void> {
    const id = await this.box();
    await this.client.request("PUT", `/v1/boxes/${encodeURIComponent(id)}/secrets/${encodeURIComponent(name)}`, { value });
  }

  /** Lets a paused box run on, or continues one paused to disk ({@link pause}); a running box is left as it is. */
  async resume(): Promise<void> {
    const id = await this.box();
    await this.client.request("POST", `/v1/boxes/${encodeURIComponent(id)}/resume`);
  }

  /**
   * Forks the running box into `n` (1-64, default 1) children: each an independent, running box that starts
   * from this instant, with the box's processes and files and its own writable layer (what one child writes,
   * neither the box nor the other children see). The box is paused only briefly and runs on.
   *
   * The children are of this box's class, made with its options (a CodeBox's are CodeBoxes), and are removed
   * like any box: {@link stop} each, or `await using`; the box's own `stop()` does not remove them. They have
   * the box's idle timeout, what is left of its ttl, and no published ports. A CodeBox's contexts are forked
   * with it: `child.context(ctx.id)` is the twin of `ctx` on a child, its variables kept:
   *
   *     const ctx = await box.createContext();
   *     await ctx.run("x = 41");
   *     for (const child of await box.fork(2)) {
   *       await using c = child;
   *       console.log((await c.context(ctx.id).run("x + 1")).value); // "42"
   *     }
   *
   * With `opts.fromCheckpoint` the children start from that checkpoint of the box ({@link checkpoint}) instead
   * of from now; the box need not be running.
   *
   * Rejects with {@link AirlockError} `policy_denied` (403) when `n` more boxes would pass the server's
   * `--max-boxes`, `checkpoint_not_found` (404) for an unknown checkpoint, `not_supported` (501) when its VM
   * driver cannot fork; on an error no child is left.
   */
  async fork(n = 1, opts: { fromCheckpoint?: string } = {}): Promise<this[]> {
    if (!Number.isInteger(n) || n < 1 || n > MAX_FORK) throw new RangeError(`fork(${n}): n must be an integer from 1 to ${MAX_FORK}`);
    if (opts.fromCheckpoint !== undefined && (typeof opts.fromCheckpoint !== "string" || opts.fromCheckpoint === "")) {
      throw new TypeError(`fork: fromCheckpoint must be a checkpoint name (a non-empty string)`);
    }
    const id = await this.box();
    const body: Schemas["ForkRequest"] = { n };
    if (opts.fromCheckpoint !== undefined) body.from_checkpoint = opts.fromCheckpoint;
    const r = await this.client.request<Schemas["ForkResult"]>("POST", `/v1/boxes/${encodeURIComponent(id)}/fork`, body);
    const ctor = this.constructor as new (o: CodeBoxOptions) => this;
    return (r.boxes ?? []).map((b) => {
      const c = new ctor({ ...this.options, client: this.client });
      c.bind(b.id);
      return c;
    });
  }

  /**
   * The box's published ports as bound on the server's host (a `hostPort` of 0 replaced by the port picked),
   * starting the box when needed:
   *
   *     const [p] = await box.ports();
   *     await fetch(`http://${p.hostIp}:${p.hostPort}/`);
   */
  async ports(): Promise<PublishedPort[]> {
    const info = await this.info();
    return (info.ports ?? []).map((p) => ({
      hostIp: p.host_ip || "127.0.0.1", hostPort: p.host_port ?? 0, guestPort: p.guest_port, protocol: p.protocol ?? "tcp",
    }));
  }

  /**
   * Removes the box (its VM and writable layer). A no-op when it was never
   * started or is already gone; idempotent. Later calls on this object
   * reject.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    const starting = this.starting;
    this.starting = undefined;
    if (!starting) return;
    let id: string;
    try {
      id = await starting;
    } catch {
      return; // it never started
    }
    this.boxId = undefined;
    try {
      if (this.options.autoRemove === false) await this.client.request("POST", `/v1/boxes/${encodeURIComponent(id)}/stop`);
      else await this.client.request("DELETE", `/v1/boxes/${encodeURIComponent(id)}?force=true`);
    } catch (e) {
      if (!(e instanceof AirlockError && e.code === "box_not_found")) throw e;
    }
  }

  /** `await using box = new CodeBox()` removes the box when the block ends. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }

  /**
   * Runs `cmd` with `args` in the box and waits for it; a trailing object is
   * {@link ExecOptions}. `timeout` (seconds) is enforced: the process and
   * everything it started are killed and `timedOut` is set. A non-zero exit
   * is reported in the result, not thrown.
   *
   *     const r = await box.exec("python3", "-c", "print(1)", { timeout: 10 });
   */
  async exec(cmd: string, ...rest: [...args: string[], options: ExecOptions] | string[]): Promise<ExecResult>;
  /** BoxLite's form: `exec(cmd, args, env?, { cwd, user, timeoutSecs })`. */
  async exec(cmd: string, args: string[], env?: Record<string, string> | null, options?: { cwd?: string; user?: string; timeoutSecs?: number }): Promise<ExecResult>;
  async exec(cmd: string, ...rest: unknown[]): Promise<ExecResult> {
    let args: string[];
    let o: ExecOptions;
    if (Array.isArray(rest[0])) {
      // BoxLite's exec(cmd, args[], env?, { cwd, user, timeoutSecs })
      const [a, env, bo] = rest as [string[], Record<string, string> | null | undefined, { cwd?: string; user?: string; timeoutSecs?: number } | undefined];
      [args] = splitArgs(a);
      o = { env: env ?? undefined, cwd: bo?.cwd, user: bo?.user, timeout: bo?.timeoutSecs };
    } else {
      [args, o] = splitArgs(rest as (string | ExecOptions)[]);
    }
    const req = execRequest(cmd, args, o); // checked before the box is made
    const id = await this.box();
    if (o.stdin !== undefined) {
      req.stdin = Buffer.from(o.stdin).toString("base64");
      req.stdin_encoding = "base64";
    }
    const r = await this.client.request<Schemas["ExecResult"]>("POST", `/v1/boxes/${encodeURIComponent(id)}/exec`, req, o.timeout);
    const out = decode(r.stdout, r.stdout_encoding);
    const err = decode(r.stderr, r.stderr_encoding);
    let msg = r.error_message || undefined;
    if (r.timed_out && !msg) msg = `timed out after ${o.timeout} s; the process tree was killed`;
    return {
      exitCode: r.exit_code, stdout: out.toString("utf8"), stderr: err.toString("utf8"), errorMessage: msg,
      timedOut: r.timed_out, signal: r.signal ?? 0, stdoutBytes: out, stderrBytes: err,
      truncated: r.truncated ?? false, stdoutDropped: r.stdout_dropped ?? 0, stderrDropped: r.stderr_dropped ?? 0,
    };
  }

  /**
   * Writes `data` to `path` in the box, atomically (readers see the old file or the new one), creating
   * missing parent directories unless `parents: false`; `mode` defaults to 0o644. Rejects with
   * {@link AirlockError} (`file_not_found`, `permission_denied`, `no_space`, `body_too_large`, ...).
   */
  async writeFile(path: string, data: string | Uint8Array, options: { mode?: number; parents?: boolean } = {}): Promise<void> {
    return this.files.writeFile(path, data, options);
  }

  /**
   * The bytes of the regular file `path` in the box, at most `maxBytes` (default 1 GiB; the box chooses what
   * it sends): `file_not_found`, `is_a_directory`, `too_large`, ...
   */
  async readFile(path: string, options: { maxBytes?: number } = {}): Promise<Buffer> {
    return this.files.readFile(path, options.maxBytes);
  }

  /** Information on `path` in the box (symlinks followed inside the box); `file_not_found` when missing. */
  async stat(path: string): Promise<FileInfo> {
    return this.files.stat(path);
  }

  /** The entries of directory `path`, sorted by name (symlinks not followed). */
  async listDir(path: string): Promise<FileInfo[]> {
    return this.files.listDir(path);
  }

  /** Creates directory `path` with its missing parents (an existing one is fine). */
  async mkdir(path: string, mode = 0o755): Promise<void> {
    return this.files.mkdir(path, mode);
  }

  /** Removes `path` in the box; a directory goes with everything in it. */
  async remove(path: string): Promise<void> {
    return this.files.remove(path);
  }

  /**
   * Copies a host file or directory tree into the box, as `docker cp`: into `boxPath` when it is an
   * existing directory, else to `boxPath` itself (missing parent directories are created, as `writeFile` does). Streamed as tar (modes, times,
   * symlinks kept); each file lands atomically.
   */
  async copyIn(hostPath: string, boxPath: string): Promise<void> {
    return this.files.copyIn(hostPath, boxPath);
  }

  /**
   * Copies a file or directory tree of the box to the host, as `docker cp`: into `hostPath` when it is an
   * existing directory, else to `hostPath` itself. Nothing is written outside the destination: entries not
   * under the copied path's name, absolute and `..` names, symlinks leading out of the copy, hard links and
   * devices are refused with AirlockError `unsafe_archive` (naming the entry, ending the copy); no symlink is
   * followed.
   * `maxBytes` bounds the archive (default: no bound).
   */
  async copyOut(boxPath: string, hostPath: string, options: { maxBytes?: number } = {}): Promise<void> {
    return this.files.copyOut(boxPath, hostPath, options.maxBytes);
  }

  /**
   * Starts `cmd` over the server's exec WebSocket and streams its output as
   * it comes; a trailing object is {@link ExecOptions} (`stdin` is written
   * with {@link ExecStream.write} instead):
   *
   *     const p = box.stream("sh", "-c", "cat; echo done >&2");
   *     await p.write("hi\n");
   *     await p.closeStdin();
   *     for await (const { stream, data } of p) process.stdout.write(data);
   *     console.log(p.exitCode);
   */
  stream(cmd: string, ...rest: [...args: string[], options: ExecOptions] | string[]): ExecStream {
    const [args, o] = splitArgs(rest);
    const req = execRequest(cmd, args, o);
    return new ExecStream(this.client, () => this.box(), req);
  }
}

/** Bytes of output a stream buffers before it pauses the socket (and so the guest process). */
const STREAM_HIGH_WATER = 1 << 20;

type Pending = { resolve: (v: IteratorResult<OutputChunk>) => void; reject: (e: unknown) => void };

/**
 * A streaming exec (see {@link SimpleBox.stream}): an async iterator of
 * {@link OutputChunk}s. After the output is exhausted `exitCode`, `signal`,
 * `timedOut` and `errorMessage` hold the result. The connection opens on
 * first use; closing it early (`close()`, `break` out of `for await`) kills
 * the process tree.
 */
export class ExecStream implements AsyncIterable<OutputChunk>, AsyncDisposable {
  /** Exit status, once the process has ended. */
  exitCode?: number;
  /** The signal that killed the process, 0 otherwise. */
  signal = 0;
  /** The timeout killed the process tree. */
  timedOut = false;
  /** Set when the process did not end normally. */
  errorMessage?: string;
  /** The server's id of the exec (`GET /v1/boxes/{id}/execs`), once it has started. */
  execId?: string;

  private ws?: Promise<WebSocket>;
  private queue: OutputChunk[] = [];
  private queued = 0;
  private paused = false;
  private done = false;
  private failure?: unknown;
  private waiter?: Pending;

  /** @internal */
  constructor(
    private readonly client: Client,
    private readonly boxId: () => Promise<string>,
    private readonly req: ExecRequest,
  ) {}

  private connect(): Promise<WebSocket> {
    if (!this.ws) this.ws = this.open();
    return this.ws;
  }

  private async open(): Promise<WebSocket> {
    const id = await this.boxId();
    const ws = await this.client.websocket(`/v1/boxes/${encodeURIComponent(id)}/exec/ws`);
    // One set of listeners from the start: frames that follow "started" in
    // the same read are emitted synchronously and must not be lost.
    let started = false;
    let settle: { resolve: () => void; reject: (e: unknown) => void } | undefined;
    const startedP = new Promise<void>((resolve, reject) => (settle = { resolve, reject }));
    const fail = (e: unknown) => {
      if (started) this.finish(e);
      else settle!.reject(e);
    };
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      if (started) {
        this.onMessage(data, isBinary);
        return;
      }
      let m: { type?: string; exec_id?: string; problem?: { status?: number } } | undefined;
      try {
        m = isBinary ? undefined : JSON.parse(data.toString());
      } catch {
        m = undefined;
      }
      if (m?.type === "started") {
        started = true;
        this.execId = m.exec_id;
        settle!.resolve();
      } else if (m?.type === "error") {
        settle!.reject(problemError({ status: m.problem?.status ?? 0, body: m.problem }));
      } else {
        settle!.reject(new AirlockError(0, "protocol", `exec WebSocket: unexpected first message ${data.toString().slice(0, 200)}`));
      }
    });
    ws.on("error", fail);
    ws.on("close", () => fail(new AirlockError(0, "protocol",
      started ? "exec WebSocket closed before the exit message" : "exec WebSocket closed before the process started")));
    ws.send(JSON.stringify(this.req));
    try {
      await startedP;
    } catch (e) {
      ws.terminate();
      throw e;
    }
    return ws;
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (isBinary) {
      if (data.length < 1) return;
      const fd = data[0];
      if (fd !== STDOUT && fd !== STDERR) return;
      this.push({ stream: fd === STDOUT ? "stdout" : "stderr", data: data.subarray(1) });
      return;
    }
    let m: { type?: string; exit_code?: number; signal?: number; timed_out?: boolean; error_message?: string; problem?: { status?: number } };
    try {
      m = JSON.parse(data.toString());
    } catch {
      return;
    }
    if (m.type === "exit") {
      this.exitCode = m.exit_code ?? 0;
      this.signal = m.signal ?? 0;
      this.timedOut = m.timed_out ?? false;
      this.errorMessage = m.error_message || undefined;
      this.finish();
    } else if (m.type === "error") {
      this.finish(problemError({ status: m.problem?.status ?? 0, body: m.problem }));
    }
  }

  private push(c: OutputChunk): void {
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = undefined;
      w.resolve({ value: c, done: false });
      return;
    }
    this.queue.push(c);
    this.queued += c.data.length;
    if (this.queued > STREAM_HIGH_WATER && !this.paused) {
      this.paused = true;
      void this.ws?.then((ws) => ws.pause());
    }
  }

  private finish(err?: unknown): void {
    if (this.done) return;
    this.done = true;
    if (err && this.exitCode === undefined) this.failure = err;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = undefined;
      if (this.failure) w.reject(this.failure);
      else w.resolve({ value: undefined, done: true });
    }
  }

  private async next(): Promise<IteratorResult<OutputChunk>> {
    await this.connect();
    const c = this.queue.shift();
    if (c) {
      this.queued -= c.data.length;
      if (this.paused && this.queued < STREAM_HIGH_WATER / 2) {
        this.paused = false;
        (await this.ws!).resume();
      }
      return { value: c, done: false };
    }
    if (this.done) {
      if (this.failure) throw this.failure;
      return { value: undefined, done: true };
    }
    return new Promise((resolve, reject) => (this.waiter = { resolve, reject }));
  }

  [Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    return {
      next: () => this.next(),
      return: async () => {
        await this.close();
        return { value: undefined, done: true };
      },
    };
  }

  private async send(data: string | Buffer): Promise<void> {
    const ws = await this.connect();
    await new Promise<void>((resolve, reject) => ws.send(data, (e) => (e ? reject(e) : resolve())));
  }

  /** Writes to the process's stdin. */
  async write(data: string | Uint8Array): Promise<void> {
    await this.send(Buffer.concat([Buffer.from([STDIN]), Buffer.from(data)]));
  }

  /** Closes stdin (the process reads EOF). */
  async closeStdin(): Promise<void> {
    await this.send(JSON.stringify({ type: "close_stdin" }));
  }

  /** Sets a tty exec's terminal size (the process gets SIGWINCH); ignored for a pipe exec. */
  async resize(rows: number, cols: number): Promise<void> {
    await this.send(JSON.stringify({ type: "resize", rows, cols }));
  }

  /** Sends a signal (`"SIGINT"`, `"TERM"`, 9) to the process. */
  async sendSignal(sig: string | number): Promise<void> {
    await this.send(JSON.stringify({ type: "signal", signal: sig }));
  }

  /** Opens the connection and resolves once the process has started (rejects as a start that failed). */
  async started(): Promise<void> {
    await this.connect();
  }

  /** Kills the process tree. */
  async kill(): Promise<void> {
    await this.send(JSON.stringify({ type: "kill" }));
  }

  /** Drains the output and resolves to the exit code. */
  async wait(): Promise<number> {
    for await (const _ of this) {
      // discard
    }
    return this.exitCode!;
  }

  /** Closes the connection; a process still running is killed. */
  async close(): Promise<void> {
    if (!this.ws) return;
    let ws: WebSocket;
    try {
      ws = await this.ws;
    } catch {
      return;
    }
    if (ws.readyState === ws.OPEN) ws.close(1000);
    this.finish();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * A box with Python (default image `python:slim`): BoxLite's Node CodeBox.
 *
 *     const cb = new CodeBox();
 *     try {
 *       console.log(await cb.run("print('hi')"));
 *     } finally {
 *       await cb.stop();
 *     }
 *
 * The box starts on the first call. `run` throws {@link ExecError} when the
 * code fails; its `timeout` is enforced.
 */
export class CodeBox extends SimpleBox {
  private readonly indexUrl?: string;

  constructor(options: CodeBoxOptions = {}) {
    super(options);
    this.indexUrl = options.indexUrl;
  }

  /**
   * Runs `code` with `python -c` in a fresh interpreter and resolves to its
   * stdout. Rejects with {@link ExecError} (`exitCode`, `stdout`, `stderr`
   * with the traceback) when the code exits non-zero or runs past `timeout`
   * seconds (the Python process tree is killed then).
   */
  async run(code: string, options: RunOptions = {}): Promise<string> {
    checkCode(code);
    checkSeconds("timeout", options.timeout);
    const id = await this.box();
    const body: Schemas["RunRequest"] = { code };
    if (options.timeout) body.timeout = options.timeout;
    const r = await this.client.request<Schemas["RunResult"]>("POST", `/v1/boxes/${encodeURIComponent(id)}/code/run`, body, options.timeout);
    if (r.exit_code !== 0 || r.timed_out) {
      const msg = r.error || (r.timed_out ? `python timed out after ${options.timeout} s` : `python exited with code ${r.exit_code}`);
      throw new ExecError(msg, r.exit_code, r.stdout, r.stderr, r.timed_out);
    }
    return r.stdout;
  }

  /** Reads a `.py` file on the host and runs it as {@link run} does. */
  async runScript(scriptPath: string, options: RunOptions = {}): Promise<string> {
    return this.run(await readFile(scriptPath, "utf8"), options);
  }

  /** `pip install pkg` in the box; resolves to pip's stdout + stderr. */
  async installPackage(pkg: string): Promise<string> {
    return this.installPackages(pkg);
  }

  /**
   * Installs several packages in one pip run; resolves to pip's stdout +
   * stderr. Rejects with {@link ExecError} when pip fails (`stdout` holds
   * its output).
   */
  async installPackages(...packages: string[]): Promise<string> {
    checkArray("packages", packages, "string");
    const id = await this.box();
    const body: Schemas["InstallRequest"] = { packages };
    if (this.indexUrl) body.index_url = this.indexUrl;
    const r = await this.client.request<Schemas["InstallResult"]>("POST", `/v1/boxes/${encodeURIComponent(id)}/code/install`, body);
    if (r.exit_code !== 0) {
      throw new ExecError(`pip install ${packages.join(" ")} exited with code ${r.exit_code}`, r.exit_code, r.output, "");
    }
    return r.output;
  }

  /**
   * Starts a stateful interpreter: variables, imports and functions persist
   * between {@link Context.run} calls. `await using ctx = await cb.createContext()`
   * ends it with the block.
   */
  async createContext(): Promise<Context> {
    const id = await this.box();
    const r = await this.client.request<Schemas["ContextInfo"]>("POST", `/v1/boxes/${encodeURIComponent(id)}/contexts`);
    return new Context(this.client, id, r.id);
  }

  /**
   * A handle on the existing context `id` of this (started) box; no request is sent. After {@link fork},
   * `child.context(ctx.id)` is the child's twin of `ctx`, with the variables `ctx` had then. A context that
   * does not exist rejects on first use with {@link AirlockError} `context_not_found` (404).
   */
  context(id: string): Context {
    if (this.id === undefined) {
      throw new Error(`context(${JSON.stringify(id)}): this ${this.constructor.name} is not started: start() it, or use createContext()`);
    }
    return new Context(this.client, this.id, id);
  }
}

/** A stateful Python interpreter in a {@link CodeBox}. */
export class Context implements AsyncDisposable {
  /** @internal */
  constructor(
    private readonly client: Client,
    /** The box the context runs in. */
    readonly boxId: string,
    /** The context id. */
    readonly id: string,
  ) {}

  private get path(): string {
    return `/v1/boxes/${encodeURIComponent(this.boxId)}/contexts/${encodeURIComponent(this.id)}`;
  }

  /**
   * Runs a cell; resolves to its output, last value, exception and images.
   * An exception in the cell is reported in `error`, not thrown. `timeout`
   * (seconds) interrupts the cell (KeyboardInterrupt), and restarts the
   * interpreter if it does not stop (`stateLost`).
   */
  async run(code: string, options: RunOptions = {}): Promise<CellResult> {
    checkCode(code);
    checkSeconds("timeout", options.timeout);
    const body: Schemas["RunRequest"] = { code };
    if (options.timeout) body.timeout = options.timeout;
    const r = await this.client.request<Schemas["CellResult"]>("POST", `${this.path}/run`, body, options.timeout);
    return {
      stdout: r.stdout, stderr: r.stderr, value: r.value || undefined,
      error: r.error ? { name: r.error.name, value: r.error.value, traceback: r.error.traceback } : undefined,
      images: (r.images ?? []).map((im) => Buffer.from(im.data, "base64")),
      timedOut: r.timed_out, stateLost: r.state_lost, truncated: r.truncated,
    };
  }

  /** Ends the interpreter. */
  async close(): Promise<void> {
    try {
      await this.client.request("DELETE", this.path);
    } catch (e) {
      if (!(e instanceof AirlockError && (e.code === "context_not_found" || e.code === "box_not_found"))) throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

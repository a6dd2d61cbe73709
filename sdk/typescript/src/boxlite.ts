// BoxLite's Node API (`@boxlite-ai/boxlite` 0.10) on an airlock server: the
// runtime (`JsBoxlite`), its box handles and executions, the REST options.
// SimpleBox and CodeBox (box.ts) take BoxLite's options too. Where airlock
// has no equivalent a call throws NotImplementedError naming what to use.

import { AirlockError, Client, defaultHome, endpointFromEnv, type Endpoint } from "./client.js";
import { DEFAULT_IMAGE, ExecStream, portSpec, type BoxInfo as AirlockBoxInfo } from "./box.js";
import { Files } from "./files.js";
import type { components } from "./openapi.js";
import path from "node:path";

type Schemas = components["schemas"];

/** BoxLite's error class: airlock's {@link AirlockError} (`status`, `code`, `message`). */
export const BoxliteError = AirlockError;
/** BoxLite's error class: airlock's {@link AirlockError}. */
export type BoxliteError = AirlockError;

/** Thrown for a BoxLite call airlock has no equivalent of; the message names what to use instead. */
export class NotImplementedError extends Error {
  constructor(what: string, instead: string) {
    super(`${what} is not supported by airlock: ${instead}`);
    this.name = "NotImplementedError";
  }
}

/** Lease of a box that does not outlive this process (BoxLite's `detach: false`), in seconds. */
const DEFAULT_LEASE = 30;

/** A bearer token and its expiry (`null`: none). */
export interface AccessToken {
  token: string;
  expiresAt: number | null;
}

/** BoxLite's API-key credential: the bearer token of `airlock serve --token KEY`. */
export class ApiKeyCredential {
  readonly #key: string;

  constructor(key: string) {
    if (typeof key !== "string" || !key) throw new TypeError("ApiKeyCredential: key must be a non-empty string");
    this.#key = key;
  }

  /** From `BOXLITE_API_KEY`, else `AIRLOCK_TOKEN`; `null` when neither is set. */
  static fromEnv(): ApiKeyCredential | null {
    const k = process.env.BOXLITE_API_KEY || process.env.AIRLOCK_TOKEN;
    return k ? new ApiKeyCredential(k) : null;
  }

  getToken(): AccessToken {
    return { token: this.#key, expiresAt: null };
  }

  toString(): string {
    return "ApiKeyCredential(***)";
  }
}

/** BoxLite's REST options: `url` of `airlock serve --listen ADDR`, its token as `credential`. */
export class BoxliteRestOptions {
  readonly url: string;
  readonly credential?: Credential;
  readonly pathPrefix?: string;

  constructor(options: { url: string; credential?: Credential | null; pathPrefix?: string }) {
    if (typeof options?.url !== "string" || !/^https?:\/\//.test(options.url)) {
      throw new TypeError(`BoxliteRestOptions.url must be an http(s) URL, got ${JSON.stringify(options?.url)}`);
    }
    this.url = options.url.replace(/\/+$/, "");
    this.credential = options.credential ?? undefined;
    this.pathPrefix = options.pathPrefix;
  }

  /** `BOXLITE_REST_URL` (else `AIRLOCK_URL`), `BOXLITE_API_KEY` (else `AIRLOCK_TOKEN`), `BOXLITE_REST_PREFIX`. */
  static fromEnv(): BoxliteRestOptions {
    const url = process.env.BOXLITE_REST_URL || process.env.AIRLOCK_URL;
    if (!url) throw new Error("BoxliteRestOptions.fromEnv: set BOXLITE_REST_URL (or AIRLOCK_URL) to the server's URL");
    return new BoxliteRestOptions({ url, credential: ApiKeyCredential.fromEnv(), pathPrefix: process.env.BOXLITE_REST_PREFIX || undefined });
  }
}

/** BoxLite's runtime options. */
export interface JsOptions {
  /** An airlock home: its server's socket is `homeDir/airlock.sock` (started on demand with `AIRLOCK_HOME=homeDir`). */
  homeDir?: string;
  /** Not supported: `airlock login REGISTRY` on the server's host. */
  imageRegistries?: unknown[];
}

/** BoxLite's box options (`runtime.create`). */
export interface JsBoxOptions {
  image?: string;
  rootfsPath?: string;
  cpus?: number;
  memoryMib?: number;
  diskSizeGb?: number;
  workingDir?: string;
  /** `[{key, value}]`, `[[key, value]]` or `{KEY: value}`. */
  env?: { key: string; value: string }[] | [string, string][] | Record<string, string>;
  volumes?: { hostPath: string; guestPath: string; readOnly?: boolean }[];
  network?: { mode: "enabled" | "disabled"; allowNet?: string[] } | { outbound?: { mode: "enabled" | "disabled"; allowNet?: string[] }; inbound?: unknown };
  ports?: { hostPort?: number; guestPort: number; protocol?: string; hostIp?: string }[];
  /** Default true: a stopped box is removed. */
  autoRemove?: boolean;
  /** Default false: the box is removed soon after this process ends (a lease the SDK renews); true: it lives until removed. */
  detach?: boolean;
  entrypoint?: string[];
  cmd?: string[];
  user?: string;
  security?: unknown;
  healthCheck?: unknown;
  advanced?: unknown;
  secrets?: unknown[];
}

/** BoxLite's box info. */
export interface JsBoxInfo {
  id: string;
  name?: string;
  state: { status: string; running: boolean; pid?: number };
  createdAt: string;
  startedAt?: string;
  image: string;
  cpus: number;
  memoryMib: number;
  /** airlock's box JSON (ttl, lease and idle deadlines, ports...). */
  raw: AirlockBoxInfo;
  /** When the box's ttl ends (RFC 3339; absent: no ttl). */
  expiresAt?: string;
  /** When the box is removed unless its lease is renewed (the runtime renews it unless `detach`). */
  leaseUntil?: string;
  /** When the box is removed unless used (its `idle_timeout`). */
  idleDeadline?: string;
  /** Seconds unused before `idleAction` is taken (absent: no idle timeout). */
  idleTimeout?: number;
  /** What the idle timeout does: "remove", "stop" or "suspend" (absent: no idle timeout). */
  idleAction?: string;
}

/** BoxLite's runtime counters, from the server's `/metrics` since it started. */
export interface JsRuntimeMetrics {
  boxesCreatedTotal: number;
  boxesFailedTotal: number;
  numRunningBoxes: number;
  totalCommandsExecuted: number;
  totalExecErrors: number;
}

/**
 * BoxLite's box metrics (`box.metrics()`), from the server's `GET /v1/boxes/{id}/stats`: what `airlock stats` shows.
 * BoxLite's fields airlock fills: `cpuPercent` (percent of one host CPU the box's VM used over a sample of about
 * 0.5 s: the call takes that long), `memoryBytes` (the VM process's resident memory), `networkBytesSent` /
 * `networkBytesReceived` (what the box sent out / received through its network; undefined for network none).
 * airlock keeps no per-box exec or stdio counters and no boot-stage timings: those fields are undefined
 * (server-wide exec counts: `runtime.metrics()`). airlock's own: `memoryLimitBytes`, `diskBytes` (the writable layer on
 * the host's disk), `cpuSeconds` (host CPU since the VM started), `networkConnectionsTotal`, `paused` (paused in
 * memory: read on the host, its CPU stands still) and `raw` (the server's JSON). A stopped box rejects with
 * BoxliteError `box_not_running` (409).
 */
export interface JsBoxMetrics {
  cpuPercent: number;
  memoryBytes: number;
  networkBytesSent?: number;
  networkBytesReceived?: number;
  memoryLimitBytes: number;
  diskBytes: number;
  cpuSeconds: number;
  networkConnectionsTotal?: number;
  paused: boolean;
  raw: Schemas["BoxStats"];
  commandsExecutedTotal?: number;
  execErrorsTotal?: number;
  bytesSentTotal?: number;
  bytesReceivedTotal?: number;
  totalCreateDurationMs?: number;
  guestBootDurationMs?: number;
  networkTcpConnections?: number;
  networkTcpErrors?: number;
  stageFilesystemSetupMs?: number;
  stageImagePrepareMs?: number;
  stageGuestRootfsMs?: number;
  stageBoxConfigMs?: number;
  stageBoxSpawnMs?: number;
  stageContainerInitMs?: number;
}

function checkString(name: string, v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw new TypeError(`${name} must be a string, got ${typeof v}`);
  return v;
}

function checkInt(name: string, v: unknown, lo: number, hi: number): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v)) throw new TypeError(`${name} must be an integer, got ${JSON.stringify(v)}`);
  if (v < lo || v > hi) throw new RangeError(`${name} = ${v}: want ${lo}..${hi}`);
  return v;
}

function envOf(name: string, env: JsBoxOptions["env"] | undefined): string[] | undefined {
  if (env === undefined || env === null) return undefined;
  const pairs: [string, string][] = [];
  if (Array.isArray(env)) {
    for (const e of env as unknown[]) {
      if (Array.isArray(e) && e.length === 2) pairs.push([String(e[0]), String(e[1])]);
      else if (e && typeof e === "object" && "key" in e) pairs.push([String((e as { key: string }).key), String((e as unknown as { value: string }).value)]);
      else throw new TypeError(`${name}: want [{key, value}], [[key, value]] or {KEY: value}, got ${JSON.stringify(e)}`);
    }
  } else if (typeof env === "object") {
    pairs.push(...Object.entries(env).map(([k, v]) => [k, String(v)] as [string, string]));
  } else {
    throw new TypeError(`${name}: want [{key, value}], [[key, value]] or {KEY: value}, got ${typeof env}`);
  }
  for (const [k] of pairs) {
    if (!k || k.includes("=")) throw new TypeError(`${name}: bad variable name ${JSON.stringify(k)}`);
  }
  return pairs.map(([k, v]) => `${k}=${v}`);
}

/** The network fields of a box spec for BoxLite's NetworkSpec (legacy `{mode, allowNet}` or `{outbound}`). */
export function networkOf(n: unknown): Pick<Schemas["BoxSpec"], "network" | "allow_net"> {
  if (n === undefined || n === null) return {};
  if (typeof n === "string") return { network: n as Schemas["BoxSpec"]["network"] };
  if (typeof n !== "object" || Array.isArray(n)) throw new TypeError("network must be an object: { mode, allowNet } or { outbound: { mode, allowNet } }");
  const o = n as { mode?: unknown; allowNet?: unknown; outbound?: { mode?: unknown; allowNet?: unknown }; inbound?: { mode?: unknown } };
  if (o.inbound !== undefined && o.inbound?.mode !== "disabled") {
    throw new NotImplementedError("network.inbound", "publish ports with ports: [{ guestPort, hostPort }] (granted by airlock serve --allow-publish)");
  }
  const dir = o.outbound ?? o;
  if (dir.mode === undefined && o.outbound === undefined) return {};
  if (dir.mode !== "enabled" && dir.mode !== "disabled") throw new TypeError(`network mode must be "enabled" or "disabled", got ${JSON.stringify(dir.mode)}`);
  if (dir.mode === "disabled") return { network: "none" };
  if (dir.allowNet !== undefined && !Array.isArray(dir.allowNet)) throw new TypeError("network.allowNet must be an array of strings");
  const allow = (dir.allowNet as string[] | undefined) ?? [];
  return allow.length ? { network: "allowlist", allow_net: [...allow] } : { network: "public" };
}

/** The volumes of a box spec for BoxLite's `{hostPath, guestPath, readOnly}`. */
export function volumesOf(vs: unknown): Schemas["VolumeSpec"][] | undefined {
  if (vs === undefined || vs === null) return undefined;
  if (!Array.isArray(vs)) throw new TypeError("volumes must be an array");
  return vs.map((v, i) => {
    if (typeof v === "string") {
      const [source, target, mode] = v.split(":");
      if (!source || !target) throw new TypeError(`volumes[${i}]: want "SOURCE:TARGET[:ro]"`);
      return { source: source.startsWith(".") ? path.resolve(source) : source, target, read_only: mode === "ro" };
    }
    const o = v as { hostPath?: string; guestPath?: string; source?: string; target?: string; readOnly?: boolean; managedVolume?: string };
    const source = o.hostPath ?? o.managedVolume ?? o.source;
    const target = o.guestPath ?? o.target;
    if (typeof source !== "string" || typeof target !== "string") {
      throw new TypeError(`volumes[${i}]: want { hostPath, guestPath, readOnly? } (or a named volume as managedVolume)`);
    }
    return { source, target, read_only: o.readOnly ?? false };
  });
}

/** The box spec for BoxLite's options, or NotImplementedError for what airlock lacks. */
function specOf(o: JsBoxOptions, name: string | undefined): Schemas["BoxSpec"] {
  if (o === null || typeof o !== "object") throw new TypeError("options must be a JsBoxOptions object");
  if (o.rootfsPath) {
    throw new NotImplementedError("rootfsPath", "import the OCI layout as an image (airlock image import PATH --tag NAME) and pass image: NAME");
  }
  if (o.entrypoint !== undefined || o.cmd !== undefined) {
    throw new NotImplementedError("entrypoint/cmd", "airlock boxes run its agent as init, not the image's entrypoint; start the process with box.exec(...) after create");
  }
  if (o.security !== undefined || o.advanced !== undefined || o.healthCheck !== undefined) {
    throw new NotImplementedError("security/advanced/healthCheck", "every airlock box runs confined (seccomp, no capabilities, its own uid); set limits with airlock serve's policy flags");
  }
  if (o.secrets?.length) {
    throw new NotImplementedError("BoxLite's secrets list", "use SimpleBox's secrets: { NAME: { value, hosts } } (the box sees $NAME as a placeholder)");
  }
  const spec: Schemas["BoxSpec"] = { image: checkString("image", o.image) ?? DEFAULT_IMAGE };
  const n = checkString("name", name);
  if (n) spec.name = n;
  const cpus = checkInt("cpus", o.cpus, 1, 64);
  if (cpus !== undefined) spec.cpus = cpus;
  const mem = checkInt("memoryMib", o.memoryMib, 128, 262144);
  if (mem !== undefined) spec.memory_mib = mem;
  const disk = checkInt("diskSizeGb", o.diskSizeGb, 1, 1024);
  if (disk !== undefined) spec.disk_size_mib = disk * 1024;
  if (checkString("workingDir", o.workingDir)) spec.working_dir = o.workingDir;
  if (checkString("user", o.user)) spec.user = o.user;
  const env = envOf("env", o.env);
  if (env) spec.env = env;
  const vols = volumesOf(o.volumes);
  if (vols?.length) spec.volumes = vols;
  if (o.ports !== undefined) {
    if (!Array.isArray(o.ports)) throw new TypeError("ports must be an array of { guestPort, hostPort?, protocol?, hostIp? }");
    if (o.ports.length) spec.ports = o.ports.map((p) => portSpec({ ...p, protocol: (p.protocol ?? "tcp") as "tcp" | "udp" }));
  }
  Object.assign(spec, networkOf(o.network));
  spec.auto_remove = o.autoRemove ?? true;
  if (!o.detach) spec.lease = DEFAULT_LEASE;
  return spec;
}

function infoOf(d: AirlockBoxInfo): JsBoxInfo {
  return {
    id: d.id, name: d.name || undefined, state: { status: d.state, running: d.state === "running" },
    createdAt: d.created, startedAt: d.started || undefined, image: d.image, cpus: d.cpus, memoryMib: d.memory_mib, raw: d,
    expiresAt: d.expires_at || undefined, leaseUntil: d.lease_until || undefined, idleDeadline: d.idle_deadline || undefined,
    idleTimeout: d.idle_timeout || undefined, idleAction: d.idle_timeout ? d.idle_action || "remove" : undefined,
  };
}

/** Most bytes of one stream an {@link Execution} keeps unread; past it a marker line says how many were dropped. */
export const EXECUTION_MAX_UNREAD = 16 << 20;

/** One stream of an {@link Execution}, as lines ("text\n"; the last may lack its newline). */
class Lines implements AsyncIterable<string> {
  private readonly decoder = new TextDecoder();
  private partial = "";
  private readonly lines: string[] = [];
  private unread = 0;
  private dropped = 0;
  private done = false;
  private waiter?: (v: string | null) => void;

  constructor(private readonly name: string) {}

  feed(data: Uint8Array): void {
    const text = this.partial + this.decoder.decode(data, { stream: true });
    const parts = text.split("\n");
    this.partial = parts.pop()!;
    for (const p of parts) this.put(p + "\n");
  }

  end(): void {
    const rest = this.partial + this.decoder.decode();
    this.partial = "";
    if (rest) this.put(rest);
    this.flushDropped();
    this.done = true;
    this.wake(null);
  }

  private put(line: string): void {
    if (this.unread + line.length > EXECUTION_MAX_UNREAD) {
      this.dropped += Buffer.byteLength(line);
      return;
    }
    this.flushDropped();
    this.lines.push(line);
    this.unread += line.length;
    this.wake();
  }

  private flushDropped(): void {
    if (!this.dropped) return;
    const n = this.dropped;
    this.dropped = 0;
    this.lines.push(`[airlock: ${n} bytes of ${this.name} dropped: more than ${EXECUTION_MAX_UNREAD} bytes were unread]\n`);
    this.wake();
  }

  private wake(v?: string | null): void {
    const w = this.waiter;
    if (!w) return;
    const line = this.lines.shift();
    if (line !== undefined) {
      this.unread -= line.length;
      this.waiter = undefined;
      w(line);
    } else if (v === null) {
      this.waiter = undefined;
      w(null);
    }
  }

  /** The next line, or null at the end. */
  next(): Promise<string | null> {
    const line = this.lines.shift();
    if (line !== undefined) {
      this.unread -= line.length;
      return Promise.resolve(line);
    }
    if (this.done) return Promise.resolve(null);
    if (this.waiter) return Promise.reject(new Error(`${this.name}: another next() is waiting`));
    return new Promise((r) => (this.waiter = r));
  }

  async *[Symbol.asyncIterator](): AsyncIterator<string> {
    for (let l = await this.next(); l !== null; l = await this.next()) yield l;
  }
}

/** BoxLite's stdout/stderr handle: `next()` gives the next line, null at the end; also `for await`. */
export type ExecOutput = Pick<Lines, "next"> & AsyncIterable<string>;

/** BoxLite's stdin handle. */
export interface ExecStdin {
  write(data: Uint8Array): Promise<void>;
  writeString(text: string): Promise<void>;
  close(): Promise<void>;
}

/** BoxLite's `wait()` result. `exitCode` is 128+N after signal N. */
export interface ExecWaitResult {
  exitCode: number;
  errorMessage?: string;
  timedOut: boolean;
}

/**
 * A process started by {@link Box.exec}, over the server's exec WebSocket.
 * Its output is read as it comes; `stdout()`/`stderr()` give its lines, in
 * any order, each once.
 */
export class Execution {
  private readonly out = new Lines("stdout");
  private readonly err = new Lines("stderr");
  private readonly taken = new Set<string>();
  private readonly pump: Promise<void>;
  private stdinClosed = false;

  /** @internal */
  constructor(private readonly stream: ExecStream) {
    this.pump = (async () => {
      try {
        for await (const c of stream) (c.stream === "stdout" ? this.out : this.err).feed(c.data);
      } finally {
        this.out.end();
        this.err.end();
      }
    })();
    this.pump.catch(() => undefined); // wait() reports it
  }

  /** The exec id on the server. */
  async id(): Promise<string> {
    return this.stream.execId ?? "";
  }

  private take(which: string): void {
    if (this.taken.has(which)) throw new Error(`Execution.${which}() was already called: each stream is read once`);
    this.taken.add(which);
  }

  async stdout(): Promise<ExecOutput> {
    this.take("stdout");
    return this.out;
  }

  async stderr(): Promise<ExecOutput> {
    this.take("stderr");
    return this.err;
  }

  async stdin(): Promise<ExecStdin> {
    return {
      write: (d) => this.stream.write(d),
      writeString: (t) => this.stream.write(t),
      close: async () => {
        if (this.stdinClosed) return;
        this.stdinClosed = true;
        await this.stream.closeStdin();
      },
    };
  }

  /** Waits for the process to end (its output keeps being read meanwhile). */
  async wait(): Promise<ExecWaitResult> {
    await this.pump;
    return { exitCode: this.stream.exitCode ?? -1, errorMessage: this.stream.errorMessage, timedOut: this.stream.timedOut };
  }

  /** Ends the process tree (SIGTERM, then SIGKILL; BoxLite sends SIGKILL). */
  async kill(): Promise<void> {
    await this.stream.kill();
  }

  async resizeTty(rows: number, cols: number): Promise<void> {
    await this.stream.resize(rows, cols);
  }

  /** Sends signal number (or name) `sig` to the process. */
  async signal(sig: number | string): Promise<void> {
    await this.stream.sendSignal(sig);
  }
}

/** BoxLite's box handle (`runtime.create`, `runtime.get`) on an airlock box. */
export class Box {
  readonly id: string;
  readonly name: string | null;
  /**
   * BoxLite's `SimpleBox.created`, on this handle: true when the call that returned it created the box
   * (`runtime.create`, a new box of `getOrCreate`, `cloneBox`), false when it found an existing one
   * (`runtime.get`, `getOrCreate` reusing a box). When the box was made: `(await info()).createdAt`.
   */
  readonly created: boolean;
  private readonly files: Files;

  /** @internal */
  constructor(private readonly rt: JsBoxlite, d: AirlockBoxInfo, created = false) {
    this.id = d.id;
    this.name = d.name || null;
    this.created = created;
    this.files = new Files(rt.client, async () => this.id);
  }

  private get path(): string {
    return `/v1/boxes/${encodeURIComponent(this.id)}`;
  }

  /** The box's info now (a GET: BoxLite's is synchronous, airlock's a promise). */
  async info(): Promise<JsBoxInfo> {
    return infoOf(await this.rt.client.request<AirlockBoxInfo>("GET", this.path));
  }

  /**
   * Starts `command` with `args` (BoxLite's positional form: env as `[[key, value]]` or an object, tty, user,
   * timeoutSecs, workingDir). A stopped box is started first, as BoxLite's is.
   */
  async exec(command: string, args?: string[] | null, env?: [string, string][] | Record<string, string> | null, tty?: boolean | null,
    user?: string | null, timeoutSecs?: number | null, workingDir?: string | null): Promise<Execution> {
    if (typeof command !== "string" || !command) throw new TypeError("command must be a non-empty string");
    if (args != null && (!Array.isArray(args) || args.some((a) => typeof a !== "string"))) throw new TypeError("args must be an array of strings");
    const req: Schemas["ExecRequest"] = { cmd: [command, ...(args ?? [])] };
    const e = envOf("env", env ?? undefined);
    if (e) req.env = e;
    if (tty) req.tty = true;
    if (checkString("user", user)) req.user = user!;
    if (checkString("workingDir", workingDir)) req.working_dir = workingDir!;
    if (timeoutSecs != null) {
      if (typeof timeoutSecs !== "number" || timeoutSecs < 0) throw new TypeError("timeoutSecs must be a number >= 0 (0: none)");
      if (timeoutSecs) req.timeout = timeoutSecs;
    }
    const start = async (): Promise<Execution> => {
      const s = new ExecStream(this.rt.client, async () => this.id, req);
      await s.started();
      return new Execution(s);
    };
    try {
      return await start();
    } catch (err) {
      if (!(err instanceof AirlockError && err.code === "box_not_running")) throw err;
    }
    await this.start();
    return start();
  }

  /** Boots the box if it is stopped (a no-op when running). */
  async start(): Promise<void> {
    await this.rt.client.request("POST", `${this.path}/start`);
  }

  /** Shuts the box down; an `autoRemove` box (BoxLite's default) is then removed. A box already gone is not an error. */
  async stop(): Promise<void> {
    try {
      await this.rt.client.request("POST", `${this.path}/stop`);
    } catch (e) {
      if (!(e instanceof AirlockError && e.code === "box_not_found")) throw e;
    }
    this.rt.untrack(this.id);
  }

  /** Copies a host file or directory into the box (as `docker cp`); `options` other than BoxLite's defaults are not supported. */
  async copyIn(hostPath: string, containerDest: string, options?: CopyOptions | null): Promise<void> {
    checkCopy(options);
    await this.files.copyIn(hostPath, containerDest);
  }

  /** Copies a file or directory of the box to the host (as `docker cp`). */
  async copyOut(containerSrc: string, hostDest: string, options?: CopyOptions | null): Promise<void> {
    checkCopy(options);
    await this.files.copyOut(containerSrc, hostDest);
  }

  /** The box's CPU, memory, disk and network use now (see {@link JsBoxMetrics}; `GET /v1/boxes/{id}/stats`, about 0.5 s). */
  async metrics(): Promise<JsBoxMetrics> {
    const d = await this.rt.client.request<Schemas["BoxStats"]>("GET", `${this.path}/stats`);
    return {
      cpuPercent: d.cpu_percent, memoryBytes: d.memory_bytes, networkBytesSent: d.network?.bytes_out,
      networkBytesReceived: d.network?.bytes_in, memoryLimitBytes: d.memory_limit_bytes, diskBytes: d.disk_bytes,
      cpuSeconds: d.cpu_seconds, networkConnectionsTotal: d.network?.connections, paused: !!d.paused, raw: d,
    };
  }

  /**
   * A copy of this box: airlock forks it (disk *and* memory: the copy is running, with the box's processes;
   * BoxLite's clone is stopped, disk only). A stopped box is started for the fork and stopped again.
   */
  async cloneBox(options?: unknown, name?: string | null): Promise<Box> {
    if ((options !== undefined && options !== null) || name) {
      throw new NotImplementedError("cloneBox(options, name)", "call cloneBox() with no arguments and use the returned box's id (airlock's fork names no child)");
    }
    const stopped = !(await this.info()).state.running;
    if (stopped) await this.start();
    let r: Schemas["ForkResult"];
    try {
      r = await this.rt.client.request<Schemas["ForkResult"]>("POST", `${this.path}/fork`, { n: 1 });
    } finally {
      if (stopped) await this.stop();
    }
    const child = r.boxes![0];
    this.rt.track(child.id, this.rt.leaseOf(this.id));
    return new Box(this.rt, child, true);
  }

  /** Not supported here: `airlock export BOX -o FILE` on the server's host. */
  async export(_dest: string, _options?: unknown): Promise<never> {
    throw new NotImplementedError("Box.export()", "run `airlock export BOX -o FILE` on the server's host");
  }

  /** BoxLite's snapshot handle: airlock's snapshots hold memory too and restore into new boxes. */
  get snapshot(): never {
    throw new NotImplementedError("Box.snapshot", "use SimpleBox.attach(id).snapshot(name), and new SimpleBox({ fromSnapshot: name }) to start boxes from it");
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** BoxLite's copy options: only the defaults are supported (docker cp rules). */
export interface CopyOptions {
  recursive?: boolean;
  overwrite?: boolean;
  followSymlinks?: boolean;
  includeParent?: boolean;
}

function checkCopy(o: CopyOptions | null | undefined): void {
  if (!o) return;
  if (o.recursive === false || o.overwrite === false || o.followSymlinks === true || o.includeParent === false) {
    throw new NotImplementedError("CopyOptions other than the defaults", "airlock copies as docker cp does (recursive, overwriting, symlinks kept, the parent included)");
  }
}

function sumMetric(text: string, metric: string, label = ""): number {
  let n = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(metric) || line.startsWith("#")) continue;
    const rest = line.slice(metric.length);
    if (rest[0] !== "{" && rest[0] !== " ") continue;
    if (label && !rest.includes(label)) continue;
    const v = Number(line.slice(line.lastIndexOf(" ") + 1));
    if (Number.isFinite(v)) n += v;
  }
  return n;
}

/**
 * BoxLite's runtime (`JsBoxlite`) on an airlock server: `JsBoxlite.withDefaultConfig()` is the server the SDK finds
 * as {@link Client} does (`AIRLOCK_URL`, else `AIRLOCK_SOCKET` or the home's socket, started on demand);
 * `new JsBoxlite({ homeDir })` the server of that airlock home; `JsBoxlite.rest(url, new ApiKeyCredential(token))`
 * an `airlock serve --listen ADDR --token TOKEN`.
 */
export class JsBoxlite {
  /** @internal */
  readonly client: Client;
  private readonly leases = new Map<string, { secs: number; timer: NodeJS.Timeout }>();
  private static defaultRt?: JsBoxlite;

  constructor(options: JsOptions = {}, endpoint?: Endpoint) {
    if (options.imageRegistries?.length) {
      throw new NotImplementedError("imageRegistries", "log in with `airlock login REGISTRY` on the server's host");
    }
    let ep = endpoint ?? endpointFromEnv();
    if (!endpoint && options.homeDir) {
      const home = path.resolve(options.homeDir.replace(/^~(?=$|\/)/, process.env.HOME ?? defaultHome()));
      ep = { socket: path.join(home, "airlock.sock") };
      // A server started on demand serves that home.
      process.env.AIRLOCK_HOME ??= home;
    }
    this.client = new Client({ endpoint: ep });
  }

  /** The process's default runtime (one object, made on first use). */
  static withDefaultConfig(): JsBoxlite {
    JsBoxlite.defaultRt ??= new JsBoxlite();
    return JsBoxlite.defaultRt;
  }

  /** Makes `new JsBoxlite(options)` the default runtime (before the first `withDefaultConfig()`). */
  static initDefault(options: JsOptions): void {
    if (JsBoxlite.defaultRt) throw new Error("the default runtime is already in use: call initDefault before withDefaultConfig()");
    JsBoxlite.defaultRt = new JsBoxlite(options);
  }

  /** A runtime on `airlock serve --listen ADDR --token KEY`: `rest(url, credential?)` or `rest(new BoxliteRestOptions({...}))`. */
  static rest(urlOrOptions: string | BoxliteRestOptions, credential?: Credential | null, prefix?: string | null): JsBoxlite {
    const o = typeof urlOrOptions === "string" ? new BoxliteRestOptions({ url: urlOrOptions, credential, pathPrefix: prefix ?? undefined }) : urlOrOptions;
    if (!(o instanceof BoxliteRestOptions)) throw new TypeError("rest: want a URL string or a BoxliteRestOptions");
    if (o.pathPrefix) {
      throw new NotImplementedError("a REST path prefix", "an airlock server serves one home at /v1: run one airlock serve per tenant and point url at it");
    }
    return new JsBoxlite({}, { url: o.url, token: o.credential?.getToken().token });
  }

  /** @internal */
  track(id: string, lease: number | undefined): void {
    if (!lease) return;
    const timer = setInterval(() => {
      this.client.request("POST", `/v1/boxes/${encodeURIComponent(id)}/lease`).catch(() => undefined);
    }, (lease * 1000) / 3);
    timer.unref(); // the lease lapses when this process is gone
    this.leases.set(id, { secs: lease, timer });
  }

  /** @internal */
  leaseOf(id: string): number | undefined {
    return this.leases.get(id)?.secs;
  }

  /** @internal */
  untrack(id: string): void {
    const l = this.leases.get(id);
    if (l) clearInterval(l.timer);
    this.leases.delete(id);
  }

  /** Creates and boots a box (airlock boots at create; BoxLite at the first start/exec). */
  async create(options: JsBoxOptions = {}, name?: string | null): Promise<Box> {
    const spec = specOf(options, name ?? undefined);
    const d = await this.client.request<AirlockBoxInfo>("POST", "/v1/boxes", spec);
    this.track(d.id, spec.lease ?? undefined);
    return new Box(this, d, true);
  }

  /** The box called `name` if it exists (started when stopped), else a new one; and whether it was created. */
  async getOrCreate(options: JsBoxOptions = {}, name?: string | null): Promise<{ created: boolean; box: Box }> {
    if (name) {
      const b = await this.get(name);
      if (b) {
        if (!(await b.info()).state.running) await b.start();
        return { created: false, box: b };
      }
    }
    try {
      return { created: true, box: await this.create(options, name) };
    } catch (e) {
      // Created by another caller meanwhile.
      if (name && e instanceof AirlockError && e.code === "name_in_use") {
        const b = await this.get(name);
        if (b) return { created: false, box: b };
      }
      throw e;
    }
  }

  /** A handle on a box (id, id prefix or name), or null when there is none. */
  async get(idOrName: string): Promise<Box | null> {
    const d = await this.find(idOrName);
    return d ? new Box(this, d) : null;
  }

  /** The box's info, or null when there is no such box. */
  async getInfo(idOrName: string): Promise<JsBoxInfo | null> {
    const d = await this.find(idOrName);
    return d ? infoOf(d) : null;
  }

  private async find(idOrName: string): Promise<AirlockBoxInfo | null> {
    if (typeof idOrName !== "string" || !idOrName) throw new TypeError("idOrName must be a non-empty string");
    try {
      return await this.client.request<AirlockBoxInfo>("GET", `/v1/boxes/${encodeURIComponent(idOrName)}`);
    } catch (e) {
      if (e instanceof AirlockError && e.code === "box_not_found") return null;
      throw e;
    }
  }

  /** Every box of the server, oldest first. */
  async listInfo(): Promise<JsBoxInfo[]> {
    const r = await this.client.request<{ boxes: AirlockBoxInfo[] | null }>("GET", "/v1/boxes");
    return (r.boxes ?? []).map(infoOf);
  }

  /** Removes a box; a running box needs `force` (else BoxliteError `box_running`, 409, as BoxLite refuses it). */
  async remove(idOrName: string, force = false): Promise<void> {
    const d = await this.client.request<AirlockBoxInfo>("GET", `/v1/boxes/${encodeURIComponent(idOrName)}`);
    await this.client.request("DELETE", `/v1/boxes/${encodeURIComponent(d.id)}${force ? "?force=true" : ""}`);
    this.untrack(d.id);
  }

  /** Server-wide counters from `GET /metrics` since the server started (BoxLite: per runtime process). */
  async metrics(): Promise<JsRuntimeMetrics> {
    const res = await this.client.transfer("GET", "/metrics");
    const chunks: Buffer[] = [];
    let n = 0;
    for await (const c of res) {
      n += (c as Buffer).length;
      if (n > 8 << 20) throw new Error("GET /metrics: more than 8 MiB");
      chunks.push(c as Buffer);
    }
    const text = Buffer.concat(chunks).toString("utf8");
    const boxes = await this.listInfo();
    return {
      boxesCreatedTotal: sumMetric(text, "airlock_box_starts_total", 'result="ok"'),
      boxesFailedTotal: sumMetric(text, "airlock_box_starts_total", 'result="error"'),
      numRunningBoxes: boxes.filter((b) => b.state.running).length,
      totalCommandsExecuted: sumMetric(text, "airlock_execs_total"),
      totalExecErrors: sumMetric(text, "airlock_execs_total", 'result="error"'),
    };
  }

  /** Not supported here: `airlock images` and `airlock pull` (or GET /v1/images). */
  get images(): never {
    throw new NotImplementedError("runtime.images", "use `airlock images` / `airlock pull` on the server's host, or GET /v1/images");
  }

  /** Not supported here: `airlock import FILE` on the server's host. */
  async importBox(_archivePath: string, _name?: string | null): Promise<never> {
    throw new NotImplementedError("runtime.importBox()", "run `airlock import FILE` on the server's host");
  }

  /** Stops the lease renewals of this runtime's boxes (they end within their lease unless `detach` was set). */
  close(): void {
    for (const id of [...this.leases.keys()]) this.untrack(id);
  }

  /** Stops every box this runtime object created that still exists (the server's other boxes are other clients'). */
  async shutdown(_timeout?: number | null): Promise<void> {
    for (const id of [...this.leases.keys()]) {
      try {
        await this.client.request("POST", `/v1/boxes/${encodeURIComponent(id)}/stop`);
      } catch (e) {
        if (!(e instanceof AirlockError && e.code === "box_not_found")) throw e;
      }
      this.untrack(id);
    }
  }
}

/** BoxLite's runtime under its Python name. */
export const Boxlite = JsBoxlite;
/** BoxLite's runtime under its Python name. */
export type Boxlite = JsBoxlite;

/** BoxLite's `TimeoutError`: an {@link AirlockError} with code `timeout`. airlock reports an exec's timeout in its
 * result (`timedOut`) rather than throw this; it is here for code that throws or catches it. */
export class TimeoutError extends AirlockError {
  constructor(message: string) {
    super(0, "timeout", message);
    this.name = "TimeoutError";
  }
}

/** BoxLite's `ParseError`: an {@link AirlockError} with code `parse_error`; airlock throws it nowhere (the server
 * parses what it returns). */
export class ParseError extends AirlockError {
  constructor(message: string) {
    super(0, "parse_error", message);
    this.name = "ParseError";
  }
}

function missingBox(name: string, instead: string): new (...args: unknown[]) => never {
  return class {
    constructor(..._args: unknown[]) {
      throw new NotImplementedError(`new ${name}()`, instead);
    }
  } as unknown as new (...args: unknown[]) => never;
}

/** BoxLite's `BrowserBox`: constructing it throws {@link NotImplementedError} naming what to use. */
export const BrowserBox = missingBox("BrowserBox", "run a browser image with new SimpleBox({ image, ports: [9222] }) and connect to the published port");
/** BoxLite's `ComputerBox`: constructing it throws {@link NotImplementedError} naming what to use. */
export const ComputerBox = missingBox("ComputerBox", "run a desktop image with new SimpleBox({ image, ports: [...] }) and drive it with exec (xdotool)");
/** BoxLite's `InteractiveBox`: constructing it throws {@link NotImplementedError} naming what to use. */
export const InteractiveBox = missingBox("InteractiveBox", "use SimpleBox.stream(cmd, { tty: true }) or `airlock run -it IMAGE`");
/** BoxLite's `SkillBox`: constructing it throws {@link NotImplementedError} naming what to use. */
export const SkillBox = missingBox("SkillBox", "use CodeBox or SimpleBox and exec the agent's CLI");

/** BoxLite's loader of its runtime class: here {@link JsBoxlite}. */
export function getJsBoxlite(): typeof JsBoxlite {
  return JsBoxlite;
}

/** BoxLite's native module: airlock has none (the SDK talks to `airlock serve`); throws {@link NotImplementedError}. */
export function getNativeModule(): never {
  throw new NotImplementedError("getNativeModule()", "airlock has no native module: use JsBoxlite, SimpleBox or CodeBox, which talk to airlock serve");
}

// BoxLite's constants (its specialized boxes' defaults), for code that names
// them; DEFAULT_CPUS and DEFAULT_MEMORY_MIB are airlock's box defaults too.
export const COMPUTERBOX_IMAGE = "lscr.io/linuxserver/webtop:ubuntu-xfce";
export const COMPUTERBOX_CPUS = 2;
export const COMPUTERBOX_MEMORY_MIB = 2048;
export const COMPUTERBOX_DISPLAY_NUMBER = ":1";
export const COMPUTERBOX_DISPLAY_WIDTH = 1024;
export const COMPUTERBOX_DISPLAY_HEIGHT = 768;
export const COMPUTERBOX_GUI_HTTP_PORT = 3000;
export const COMPUTERBOX_GUI_HTTPS_PORT = 3001;
export const DESKTOP_READY_TIMEOUT = 60;
export const DESKTOP_READY_RETRY_DELAY = 2;
export const BROWSERBOX_IMAGE_CHROMIUM = "browserless/chrome:latest";
export const BROWSERBOX_IMAGE_FIREFOX = "browserless/firefox:latest";
export const BROWSERBOX_IMAGE_WEBKIT = "browserless/webkit:latest";
export const BROWSERBOX_PORT_CHROMIUM = 9222;
export const BROWSERBOX_PORT_FIREFOX = 9223;
export const BROWSERBOX_PORT_WEBKIT = 9224;
export const DEFAULT_CPUS = 1;
export const DEFAULT_MEMORY_MIB = 512;

/** BoxLite's credential interface: `getToken()` gives the bearer token ({@link ApiKeyCredential} is one). */
export interface Credential {
  getToken(): AccessToken;
}
/** BoxLite's `SimpleBoxOptions`: airlock's box options (`BoxOptions` of `SimpleBox`/`CodeBox`). */
export type SimpleBoxOptions = import("./box.js").BoxOptions;
/** BoxLite's network spec: `{ mode: "enabled" | "disabled", allowNet? }` (see {@link JsBoxOptions}). */
export type NetworkSpec = { mode: "enabled" | "disabled"; allowNet?: string[] };
/** BoxLite's security options: not supported (`NotImplementedError` at create; boxes always run confined). */
export type SecurityOptions = Record<string, unknown>;
/** Options of BoxLite's specialized boxes, which airlock does not provide (their constructors throw). */
export type BrowserBoxOptions = Record<string, unknown>;
/** BoxLite's browser kinds (`BrowserBox`, not provided). */
export type BrowserType = "chromium" | "firefox" | "webkit";
/** Options of BoxLite's `ComputerBox` (not provided). */
export type ComputerBoxOptions = Record<string, unknown>;
/** BoxLite's `ComputerBox` screenshot (not provided). */
export type Screenshot = { data: string; width: number; height: number; format: string };
/** Options of BoxLite's `InteractiveBox` (not provided). */
export type InteractiveBoxOptions = Record<string, unknown>;
/** Options of BoxLite's `SkillBox` (not provided). */
export type SkillBoxOptions = Record<string, unknown>;
/** BoxLite's image handle (`rt.images`): not provided; `airlock images` / GET /v1/images. */
export type ImageHandle = never;
/** BoxLite's image info: GET /v1/images gives airlock's. */
export type ImageInfo = Record<string, unknown>;
/** BoxLite's pull result: `airlock pull IMAGE` on the server's host. */
export type ImagePullResult = Record<string, unknown>;
/** BoxLite's registry options: not supported (`NotImplementedError`: `airlock login REGISTRY`). */
export type JsImageRegistry = Record<string, unknown>;
/** BoxLite's registry credentials: not supported (`airlock login REGISTRY`). */
export type JsImageRegistryAuth = Record<string, unknown>;

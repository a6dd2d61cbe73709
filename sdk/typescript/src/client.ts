// Connection to an `airlock serve` server: HTTP over its unix socket (the
// default) or over TCP with a bearer token, and its exec WebSocket.

import { spawn } from "node:child_process";
import { existsSync, mkdirSync, openSync, closeSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import os from "node:os";
import path from "node:path";
import type { Readable } from "node:stream";
import WebSocket from "ws";

import type { components } from "./openapi.js";
import { snapshotOf, type Snapshot } from "./snapshots.js";

/** The server's problem document (RFC 9457) with airlock's stable `code`. */
export type Problem = components["schemas"]["Problem"];

/**
 * How long a server started by the SDK keeps running with no request and no
 * running box before it exits by itself (`airlock serve --idle-exit`).
 * Override with `AIRLOCK_SERVE_IDLE_EXIT` (a Go duration, e.g. `"10m"`).
 */
export const DEFAULT_IDLE_EXIT = "5m";

/** How long (ms) the SDK waits for a server it started to answer. */
export const SERVER_START_TIMEOUT_MS = 30_000;

/** How long (ms) a health check may take. */
const HEALTH_TIMEOUT_MS = 10_000;

/**
 * Grace (ms) past a call's own timeout before the SDK gives up on the
 * server: the server enforces the timeout; this only bounds a server that
 * stopped answering.
 */
const TIMEOUT_GRACE_MS = 60_000;

/** Bound on a response body the SDK reads (bytes): 64 MiB. */
const MAX_RESPONSE_BYTES = 64 << 20;

/**
 * An error the airlock server reported (an RFC 9457 problem), or a failure
 * to reach or start a server. It is a plain `Error` subclass: the seed's
 * `catch (err) { ... }` branch for "failed to start" catches it.
 */
export class AirlockError extends Error {
  /** HTTP status (404, 409, 502, ...); 0 when no server answered. */
  readonly status: number;
  /**
   * Stable machine-readable code: `box_not_found`, `image_not_found`,
   * `box_died`, `too_many_execs`, ...; `no_server` when no server could be
   * reached or started.
   */
  readonly code: string;
  /** What happened, and what to do (the server's `detail`). */
  readonly detail: string;
  /** The whole problem document, when the server sent one. */
  readonly problem?: Problem;
  /**
   * For `invalid_request` (400): each bad field of the request as the
   * server named it: `pointer` (an RFC 6901 JSON pointer into the body,
   * `/memory_mib`, `/env/0`) or `parameter` (a query or path parameter's
   * name), `location` (`body.env[0]`, `query.label`) and `message`. Empty
   * for other errors.
   */
  readonly errors: FieldError[];
  /** The pointers and parameter names of {@link errors}, in order (`["/memory_mib", "/env/0"]`). */
  readonly fields: string[];

  constructor(status: number, code: string, message: string, problem?: Problem, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "AirlockError";
    this.status = status;
    this.code = code;
    this.detail = problem?.detail ?? message;
    this.problem = problem;
    this.errors = Array.isArray(problem?.errors) ? problem.errors.filter((e) => e !== null && typeof e === "object") : [];
    this.fields = this.errors.map(fieldOf).filter((f) => f !== "");
  }
}

/** One bad field of a refused request (a problem's `errors`). */
export type FieldError = components["schemas"]["FieldError"];

/** Where a field error is: its pointer, else its parameter, else its location. */
function fieldOf(e: FieldError): string {
  return e.pointer || e.parameter || e.location || "";
}

/** `$AIRLOCK_HOME`, else `~/.airlock` (as the Go library resolves it). */
export function defaultHome(): string {
  return process.env.AIRLOCK_HOME || path.join(os.homedir(), ".airlock");
}

/** `$AIRLOCK_SOCKET`, else `airlock.sock` in the airlock home. */
export function defaultSocket(): string {
  return process.env.AIRLOCK_SOCKET || path.join(defaultHome(), "airlock.sock");
}

/** Where the server is: a unix socket, or a URL with an optional bearer token. */
export interface Endpoint {
  /** Path of the server's unix socket. */
  socket?: string;
  /** Base URL (`http://127.0.0.1:8100`) of a TCP listener. */
  url?: string;
  /** Bearer token for `url`. */
  token?: string;
}

/**
 * The endpoint from the environment: `AIRLOCK_URL` (+ `AIRLOCK_TOKEN`) for
 * TCP, else `AIRLOCK_SOCKET`, else `~/.airlock/airlock.sock`.
 */
export function endpointFromEnv(): Endpoint {
  const url = process.env.AIRLOCK_URL;
  if (url) return { url: url.replace(/\/+$/, ""), token: process.env.AIRLOCK_TOKEN || undefined };
  return { socket: defaultSocket() };
}

/** Options of {@link Client}. */
export interface ClientOptions {
  /** Where the server is (default: {@link endpointFromEnv}). */
  endpoint?: Endpoint;
  /**
   * Start `airlock serve` when nothing answers on the unix socket (default
   * true; never for a URL). The binary is `$AIRLOCK_BIN`, else `airlock` on
   * PATH.
   */
  autostart?: boolean;
}

/** A response: status and decoded JSON body (undefined for 204). */
interface Response {
  status: number;
  body: unknown;
}

function isConnectError(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException | undefined)?.code;
  return code === "ENOENT" || code === "ECONNREFUSED" || code === "ECONNRESET" || code === "EPIPE";
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function findOnPath(name: string): string | undefined {
  for (const dir of (process.env.PATH || "").split(path.delimiter)) {
    if (!dir) continue;
    const p = path.join(dir, name);
    if (existsSync(p)) return p;
  }
  return undefined;
}

/**
 * An HTTP client for one airlock server, with keep-alive connections.
 *
 * With no options it reads `AIRLOCK_URL` and `AIRLOCK_TOKEN` (TCP), or
 * `AIRLOCK_SOCKET` (default: the airlock home's `airlock.sock`). When nothing
 * answers on the socket it starts `airlock serve --idle-exit 5m` for the user
 * (log in `serve.log` beside the socket); that server exits after 5 minutes
 * with no request and no running box.
 */
export class Client {
  readonly endpoint: Endpoint;
  private readonly autostart: boolean;
  private readonly agent: http.Agent;
  private ready?: Promise<void>;

  constructor(options: ClientOptions = {}) {
    this.endpoint = options.endpoint ?? endpointFromEnv();
    this.autostart = (options.autostart ?? true) && !this.endpoint.url;
    const agentOpts: http.AgentOptions = { keepAlive: true, maxSockets: 64 };
    this.agent = this.endpoint.url?.startsWith("https:") ? new https.Agent(agentOpts) : new http.Agent(agentOpts);
  }

  private static shared?: Client;

  /** The process-wide client from the environment, made on first use. */
  static default(): Client {
    if (!Client.shared) Client.shared = new Client();
    return Client.shared;
  }

  /** Where the server is, in words (a socket path or a URL). */
  where(): string {
    return this.endpoint.url ?? this.endpoint.socket ?? "";
  }

  private raw(method: string, urlPath: string, body?: unknown, timeoutMs?: number, retry = true): Promise<Response> {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers: Record<string, string | number> = { Accept: "application/json" };
    if (data) {
      headers["Content-Type"] = "application/json";
      headers["Content-Length"] = data.length;
    }
    let opts: http.RequestOptions;
    let mod: typeof http | typeof https = http;
    if (this.endpoint.url) {
      const u = new URL(this.endpoint.url + urlPath);
      if (u.protocol === "https:") mod = https;
      if (this.endpoint.token) headers.Authorization = `Bearer ${this.endpoint.token}`;
      opts = { method, hostname: u.hostname, port: u.port, path: u.pathname + u.search, headers, agent: this.agent };
    } else {
      opts = { method, socketPath: this.endpoint.socket, path: urlPath, headers: { ...headers, Host: "airlock" }, agent: this.agent };
    }
    return new Promise<Response>((resolve, reject) => {
      const req = mod.request(opts, (res) => {
        const chunks: Buffer[] = [];
        let n = 0;
        res.on("data", (c: Buffer) => {
          n += c.length;
          if (n > MAX_RESPONSE_BYTES) {
            req.destroy(new Error(`response from airlock server larger than ${MAX_RESPONSE_BYTES} bytes`));
            return;
          }
          chunks.push(c);
        });
        res.on("error", reject);
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let parsed: unknown;
          if (text) {
            try {
              parsed = JSON.parse(text);
            } catch {
              parsed = { detail: text || res.statusMessage };
            }
          }
          resolve({ status: res.statusCode ?? 0, body: parsed });
        });
      });
      req.on("error", (e: NodeJS.ErrnoException) => {
        // A kept-alive connection the server closed just as it was reused:
        // the request never reached the server, send it again (Node's advice).
        if (retry && req.reusedSocket && e.code === "ECONNRESET") {
          this.raw(method, urlPath, body, timeoutMs, false).then(resolve, reject);
          return;
        }
        reject(e);
      });
      if (timeoutMs) {
        req.setTimeout(timeoutMs, () =>
          req.destroy(new AirlockError(0, "timeout", `airlock server at ${this.where()} did not answer ${method} ${urlPath} within ${timeoutMs / 1000} s`)));
      }
      req.end(data);
    });
  }

  /** Connects (and starts a server when allowed) once; later calls reuse it. */
  private ensure(): Promise<void> {
    if (!this.ready) {
      this.ready = this.connect().catch((e) => {
        this.ready = undefined; // let a later call try again
        throw e;
      });
    }
    return this.ready;
  }

  private async connect(): Promise<void> {
    try {
      const r = await this.raw("GET", "/v1/health", undefined, HEALTH_TIMEOUT_MS);
      if (r.status === 200) return;
      throw problemError(r);
    } catch (e) {
      if (e instanceof AirlockError) throw e;
      if (!this.autostart || !isConnectError(e)) {
        throw new AirlockError(0, "no_server",
          `no airlock server at ${this.where()}: ${(e as Error).message} (start one with \`airlock serve\`, or set AIRLOCK_URL/AIRLOCK_SOCKET)`,
          undefined, { cause: e });
      }
    }
    await this.startServer();
  }

  private async startServer(): Promise<void> {
    const bin = process.env.AIRLOCK_BIN || findOnPath("airlock");
    if (!bin) {
      throw new AirlockError(0, "no_server",
        `no airlock server at ${this.where()} and no \`airlock\` binary on PATH to start one (install airlock, or set AIRLOCK_BIN / AIRLOCK_URL)`);
    }
    const sock = this.endpoint.socket!;
    const dir = path.dirname(sock);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const logPath = path.join(dir, "serve.log");
    const log = openSync(logPath, "a", 0o600);
    const idle = process.env.AIRLOCK_SERVE_IDLE_EXIT || DEFAULT_IDLE_EXIT;
    let spawnErr: Error | undefined;
    try {
      const child = spawn(bin, ["serve", "--socket", sock, "--idle-exit", idle], {
        detached: true,
        stdio: ["ignore", log, log],
      });
      child.on("error", (e) => (spawnErr = e));
      child.unref();
    } finally {
      closeSync(log);
    }
    const deadline = Date.now() + SERVER_START_TIMEOUT_MS;
    for (;;) {
      if (spawnErr) {
        throw new AirlockError(0, "no_server", `could not start \`${bin} serve\`: ${spawnErr.message} (set AIRLOCK_BIN to the airlock binary)`);
      }
      try {
        const r = await this.raw("GET", "/v1/health", undefined, HEALTH_TIMEOUT_MS);
        if (r.status === 200) return;
      } catch (e) {
        if (!isConnectError(e)) throw e;
      }
      if (Date.now() > deadline) {
        throw new AirlockError(0, "no_server",
          `started \`${bin} serve\` but it did not answer on ${sock} within ${SERVER_START_TIMEOUT_MS / 1000} s; see ${logPath}`);
      }
      await sleep(50);
    }
  }

  /**
   * Sends a request with a JSON body; resolves to the decoded JSON response
   * (undefined for 204). Rejects with {@link AirlockError} for a problem
   * response or when no server can be reached. With `timeoutSeconds` (the
   * call's own timeout, which the server enforces) it also gives up when
   * no answer comes within that plus a minute.
   */
  async request<T>(method: string, urlPath: string, body?: unknown, timeoutSeconds?: number): Promise<T> {
    await this.ensure();
    const timeoutMs = timeoutSeconds ? timeoutSeconds * 1000 + TIMEOUT_GRACE_MS : undefined;
    let r: Response;
    try {
      try {
        r = await this.raw(method, urlPath, body, timeoutMs);
      } catch (e) {
        // Nothing accepts on the socket any more (a server the SDK started
        // exits when idle): the request was never delivered, so check (and
        // start) the server again and send it once more.
        const code = (e as NodeJS.ErrnoException).code;
        if (!this.autostart || (code !== "ECONNREFUSED" && code !== "ENOENT")) throw e;
        this.ready = undefined;
        await this.ensure();
        r = await this.raw(method, urlPath, body, timeoutMs);
      }
    } catch (e) {
      if (e instanceof AirlockError) throw e;
      this.ready = undefined; // the server may have gone: check (and restart) next time
      throw new AirlockError(0, "no_server", `airlock server at ${this.where()} did not answer ${method} ${urlPath}: ${(e as Error).message}`,
        undefined, { cause: e });
    }
    if (r.status >= 400) throw problemError(r);
    return r.body as T;
  }

  /**
   * Sends a request with a raw body (a Buffer, or a stream piped with
   * backpressure) and resolves to the response as a stream, for the files
   * API's uploads and downloads. Rejects with {@link AirlockError} for a
   * problem response (its body read and decoded) or an unreachable server.
   */
  async transfer(method: string, urlPath: string, body?: Buffer | Readable, contentType = "application/octet-stream"): Promise<http.IncomingMessage> {
    await this.ensure();
    const headers: Record<string, string | number> = {};
    if (body !== undefined) {
      headers["Content-Type"] = contentType;
      if (Buffer.isBuffer(body)) headers["Content-Length"] = body.length;
    }
    let opts: http.RequestOptions;
    let mod: typeof http | typeof https = http;
    if (this.endpoint.url) {
      const u = new URL(this.endpoint.url + urlPath);
      if (u.protocol === "https:") mod = https;
      if (this.endpoint.token) headers.Authorization = `Bearer ${this.endpoint.token}`;
      opts = { method, hostname: u.hostname, port: u.port, path: u.pathname + u.search, headers, agent: this.agent };
    } else {
      opts = { method, socketPath: this.endpoint.socket, path: urlPath, headers: { ...headers, Host: "airlock" }, agent: this.agent };
    }
    let req: http.ClientRequest | undefined;
    const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      req = mod.request(opts, resolve);
      req.on("error", (e) => reject(e instanceof AirlockError ? e :
        new AirlockError(0, "no_server", `airlock server at ${this.where()}: ${method} ${urlPath}: ${e.message}`, undefined, { cause: e })));
      const r = req;
      if (body === undefined || Buffer.isBuffer(body)) {
        r.end(body);
      } else {
        body.on("error", (e) => r.destroy(e));
        body.pipe(r);
      }
    });
    if ((res.statusCode ?? 0) >= 400) {
      const chunks: Buffer[] = [];
      let n = 0;
      for await (const c of res) {
        n += (c as Buffer).length;
        if (n <= 1 << 20) chunks.push(c as Buffer);
      }
      let parsed: unknown;
      try {
        parsed = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        parsed = { detail: res.statusMessage };
      }
      if (body !== undefined && !Buffer.isBuffer(body)) {
        // The server answered before reading the whole upload: stop it.
        body.unpipe(req);
        body.destroy();
        req?.destroy();
      }
      throw problemError({ status: res.statusCode ?? 0, body: parsed });
    }
    return res;
  }

  /** Opens the WebSocket at urlPath (after making sure a server is up). */
  async websocket(urlPath: string): Promise<WebSocket> {
    await this.ensure();
    let url: string;
    const headers: Record<string, string> = {};
    if (this.endpoint.url) {
      url = this.endpoint.url.replace(/^http/, "ws") + urlPath;
      if (this.endpoint.token) headers.Authorization = `Bearer ${this.endpoint.token}`;
    } else {
      url = `ws+unix:${this.endpoint.socket}:${urlPath}`;
    }
    const ws = new WebSocket(url, { headers, maxPayload: 16 << 20, perMessageDeflate: false });
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => {
        ws.off("error", reject);
        resolve();
      });
      ws.once("error", reject);
      ws.once("unexpected-response", (_req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          let body: unknown;
          try {
            body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
          } catch {
            body = undefined;
          }
          reject(problemError({ status: res.statusCode ?? 0, body }));
        });
      });
    });
    return ws;
  }

  /**
   * The server's events (`GET /v1/events`), in order, as they happen: every box transition and exec start and end,
   * each with its `seq` (1, 2, 3... in the server's life). `since` resumes after that seq (the server keeps the last
   * 1024 events; 0: all it holds); left out, only new events come. Where events were lost to this stream (older than
   * the backlog, a reader more than 1024 behind, a restarted server) an `events.dropped` event says how many
   * (`dropped`, up to `seq`): nothing is lost unmarked. Reconnect with the last `seq` seen to go on. Ends when the
   * server closes the stream; `break` (or `return()`) closes it.
   */
  async *events(options: { since?: number } = {}): AsyncGenerator<components["schemas"]["Event"]> {
    const q = options.since === undefined ? "" : `?since=${Math.max(0, Math.floor(options.since))}`;
    const res = await this.transfer("GET", `/v1/events${q}`);
    let buf = "";
    try {
      for await (const c of res) {
        buf += (c as Buffer).toString("utf8");
        if (buf.length > 1 << 20) throw new AirlockError(0, "protocol", "GET /v1/events: an event line over 1 MiB");
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line.startsWith("data: ")) continue;
          let ev: components["schemas"]["Event"];
          try {
            ev = JSON.parse(line.slice(6)) as components["schemas"]["Event"];
          } catch {
            continue;
          }
          if (ev.type === "stream.open") continue;
          yield ev;
        }
      }
    } finally {
      res.destroy();
    }
  }

  /** The memory snapshots on the server, oldest first (see {@link SimpleBox.snapshot}). */
  async snapshots(): Promise<Snapshot[]> {
    const r = await this.request<components["schemas"]["SnapshotList"]>("GET", "/v1/snapshots");
    return (r.snapshots ?? []).map(snapshotOf);
  }

  /** The snapshot called `name`; rejects with {@link AirlockError} `snapshot_not_found` (404) when there is none. */
  async snapshot(name: string): Promise<Snapshot> {
    return snapshotOf(await this.request<components["schemas"]["Snapshot"]>("GET", `/v1/snapshots/${encodeURIComponent(name)}`));
  }

  /**
   * Removes the snapshot `name` from the server's disk (boxes restored from it run on); rejects with
   * {@link AirlockError} `snapshot_not_found` (404) when there is none.
   */
  async removeSnapshot(name: string): Promise<void> {
    await this.request("DELETE", `/v1/snapshots/${encodeURIComponent(name)}`);
  }

  /** Closes idle kept-alive connections. */
  close(): void {
    this.agent.destroy();
  }
}

/** The AirlockError for a problem response. */
export function problemError(r: Response): AirlockError {
  const p = (r.body && typeof r.body === "object" ? r.body : { detail: String(r.body ?? "") }) as Partial<Problem>;
  let detail = p.detail || p.title || `HTTP ${r.status}`;
  // Validation errors: where and what (the server never echoes the value),
  // added to the message where the server's detail does not say it.
  const errs = Array.isArray(p.errors) ? p.errors.filter((e) => e !== null && typeof e === "object") : [];
  const parts = errs.slice(0, 8).filter((e) => !fieldOf(e) || !detail.includes(fieldOf(e)))
    .map((e) => (fieldOf(e) ? `${fieldOf(e)}: ${e.message ?? ""}` : String(e.message ?? "")));
  if (parts.length) detail = `${detail} (${parts.join("; ")})`;
  return new AirlockError(r.status || p.status || 0, p.code || "", p.code ? `${detail} (${p.code})` : detail, p.code ? (p as Problem) : undefined);
}

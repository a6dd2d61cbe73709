// Test helpers: the airlock binary and one real `airlock serve` (booting
// real boxes) for a test file.
//
// The binary is $AIRLOCK_BIN, else built from this checkout with go (with
// the guest agent beside it). Boxes use the user's image store
// ($AIRLOCK_IMAGES, else ~/.airlock/images, filled by hack/setup.sh) and a
// temporary airlock home.

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The package folder (sdk/typescript). */
export const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
/** The repository root. */
export const REPO = path.resolve(PKG, "../..");

function goBinary(): string {
  for (const p of ["go", "/usr/local/go/bin/go"]) {
    try {
      execFileSync(p, ["version"], { stdio: "ignore" });
      return p;
    } catch {
      // next
    }
  }
  throw new Error("go not found: set AIRLOCK_BIN to an airlock binary, or install Go");
}

/** $AIRLOCK_BIN, else airlock, airlock-agent and airlock-net built into dir. */
export function airlockBin(dir: string): string {
  if (process.env.AIRLOCK_BIN) return process.env.AIRLOCK_BIN;
  const go = goBinary();
  execFileSync(go, ["build", "-o", path.join(dir, "airlock"), "./cmd/airlock"], { cwd: REPO, stdio: "inherit" });
  execFileSync(go, ["build", "-trimpath", "-ldflags=-s -w", "-o", path.join(dir, "airlock-agent"), "./cmd/airlock-agent"],
    { cwd: REPO, stdio: "inherit", env: { ...process.env, CGO_ENABLED: "0" } });
  // The network helper, beside airlock (where it looks first); static, as
  // it must be to give up root (confinement).
  execFileSync(go, ["build", "-o", path.join(dir, "airlock-net"), "./cmd/airlock-net"],
    { cwd: REPO, stdio: "inherit", env: { ...process.env, CGO_ENABLED: "0" } });
  return path.join(dir, "airlock");
}

/** A free TCP port on loopback. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** GET /v1/health on a unix socket: true when it answers 200. */
export function healthy(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const req = http.get({ socketPath: socket, path: "/v1/health", agent: false }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on("error", () => resolve(false));
    req.setTimeout(2000, () => req.destroy());
  });
}

/** Whether something accepts connections on a unix socket (no request sent). */
export function accepting(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect(socket, () => {
      c.destroy();
      resolve(true);
    });
    c.on("error", () => resolve(false));
  });
}

/** Polls until cond() or the deadline; returns whether cond held. */
export async function waitFor(cond: () => Promise<boolean>, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await cond()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return cond();
}

/** A running `airlock serve` on a socket and on a loopback TCP port. */
export interface TestServer {
  bin: string;
  tmp: string;
  socket: string;
  url: string;
  token: string;
  /** The directory the server grants host volumes under (--allow-volume). */
  volumes: string;
  /** Environment for the SDK and example subprocesses (AIRLOCK_SOCKET, ...). */
  env: NodeJS.ProcessEnv;
  proc: ChildProcess;
  stop(): Promise<void>;
}

/** Starts `airlock serve` in a temporary home; sets AIRLOCK_SOCKET (and the home) in process.env. */
export async function startServer(): Promise<TestServer> {
  const tmp = mkdtempSync(path.join(os.tmpdir(), "airlock-ts-"));
  const bin = airlockBin(tmp);
  const socket = path.join(tmp, "a.sock");
  const port = await freePort();
  const token = randomBytes(16).toString("hex");
  const images = process.env.AIRLOCK_IMAGES || path.join(os.homedir(), ".airlock", "images");
  const env: NodeJS.ProcessEnv = {
    ...process.env, AIRLOCK_HOME: path.join(tmp, "home"), AIRLOCK_IMAGES: images, AIRLOCK_SOCKET: socket, AIRLOCK_BIN: bin,
    // TEST-ONLY: boxes reach 198.18.0.N as the host's 127.0.0.N, standing
    // in for the internet (a box's network denies the host itself).
    AIRLOCK_NET_TEST_INTERNET: "198.18.0.0/24",
  };
  delete env.AIRLOCK_URL;
  delete env.AIRLOCK_TOKEN;
  const logPath = path.join(tmp, "serve.log");
  const log = openSync(logPath, "a");
  // Host volumes only under tmp/volumes (TestServer.volumes).
  const volumes = path.join(tmp, "volumes");
  mkdirSync(volumes);
  // Published ports only on free ports of 127.0.0.1 (host_port 0). Pulls
  // from loopback are granted: the start-failure tests name an image on a
  // loopback registry that refuses the connection.
  const proc = spawn(bin, ["serve", "--socket", socket, "--listen", `127.0.0.1:${port}`, "--token", token, "--allow-volume", volumes,
    "--allow-publish", "127.0.0.1:0", "--allow-private-net", "--allow-import-state"], { env, stdio: ["ignore", log, log] });
  const up = await waitFor(async () => proc.exitCode === null && (await healthy(socket)), 30_000);
  if (!up) {
    proc.kill("SIGKILL");
    throw new Error(`airlock serve did not start: ${readFileSync(logPath, "utf8")}`);
  }
  Object.assign(process.env, { AIRLOCK_HOME: env.AIRLOCK_HOME, AIRLOCK_IMAGES: images, AIRLOCK_SOCKET: socket });
  delete process.env.AIRLOCK_URL;
  delete process.env.AIRLOCK_TOKEN;
  const stop = async (): Promise<void> => {
    if (proc.exitCode === null) {
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 40_000);
      await exited;
      clearTimeout(t);
    }
    // Boxes a failed test left behind.
    try {
      const ids = execFileSync(bin, ["ls", "-q"], { env, encoding: "utf8" }).split(/\s+/).filter(Boolean);
      if (ids.length) execFileSync(bin, ["rm", "-f", ...ids], { env, stdio: "ignore" });
    } catch {
      // nothing to clean
    }
    if (existsSync(tmp)) rmSync(tmp, { recursive: true, force: true });
  };
  return { bin, tmp, socket, url: `http://127.0.0.1:${port}`, token, volumes, env, proc, stop };
}

// Files in a box over the server's files API, and the small tar reader and
// writer copyIn/copyOut stream through (ustar with PAX names; regular
// files, directories and symlinks).

import { constants as fsc, createReadStream, promises as fsp } from "node:fs";
import type http from "node:http";
import path from "node:path";
import { Readable } from "node:stream";

import { AirlockError, type Client } from "./client.js";
import type { components } from "./openapi.js";

/** A file in a box (`stat`, `listDir`). */
export type FileInfo = components["schemas"]["FileInfo"];

const BLOCK = 512;

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let len = Buffer.byteLength(body) + 1;
  while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
  return `${len}${body}`;
}

function header(name: string, type: string, size: number, mode: number, mtime: number, linkname = ""): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(name.slice(0, 100), 0, "utf8");
  h.write(octal(mode & 0o7777, 8), 100);
  h.write(octal(0, 8), 108);
  h.write(octal(0, 8), 116);
  h.write(octal(size, 12), 124);
  h.write(octal(Math.floor(mtime), 12), 136);
  h.write("        ", 148);
  h.write(type, 156);
  h.write(linkname.slice(0, 100), 157, "utf8");
  h.write("ustar\0" + "00", 257);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + " ", 148);
  return h;
}

function pad(n: number): Buffer {
  return Buffer.alloc((BLOCK - (n % BLOCK)) % BLOCK);
}

/** Entry headers for name (a PAX header first when a name does not fit). */
function entry(name: string, type: string, size: number, mode: number, mtime: number, linkname = ""): Buffer[] {
  const out: Buffer[] = [];
  if (Buffer.byteLength(name) > 99 || Buffer.byteLength(linkname) > 99) {
    const pax = Buffer.from(paxRecord("path", name) + (linkname ? paxRecord("linkpath", linkname) : ""));
    out.push(header("PaxHeader", "x", pax.length, 0o644, mtime), pax, pad(pax.length));
  }
  out.push(header(name, type, size, mode, mtime, linkname));
  return out;
}

/** A tar stream of hostPath, its top entry named arcname. */
export async function* tarOf(hostPath: string, arcname: string): AsyncGenerator<Buffer> {
  async function* walk(p: string, name: string): AsyncGenerator<Buffer> {
    const st = await fsp.lstat(p);
    const mtime = st.mtimeMs / 1000;
    if (st.isDirectory()) {
      yield* entry(name + "/", "5", 0, st.mode, mtime);
      for (const child of (await fsp.readdir(p)).sort()) yield* walk(path.join(p, child), `${name}/${child}`);
    } else if (st.isSymbolicLink()) {
      yield* entry(name, "2", 0, st.mode, mtime, await fsp.readlink(p));
    } else if (st.isFile()) {
      yield* entry(name, "0", st.size, st.mode, mtime);
      let n = 0;
      for await (const c of createReadStream(p)) {
        n += (c as Buffer).length;
        if (n > st.size) throw new Error(`copyIn: ${p} grew while being copied`);
        yield c as Buffer;
      }
      if (n !== st.size) throw new Error(`copyIn: ${p} shrank while being copied`);
      yield pad(n);
    } else {
      throw new Error(`copyIn: ${p}: not a regular file, directory or symlink`);
    }
  }
  yield* walk(hostPath, arcname);
  yield Buffer.alloc(2 * BLOCK);
}

/** Reads exactly n bytes from a stream of chunks. */
class ChunkReader {
  private buf: Buffer = Buffer.alloc(0);
  private readonly it: AsyncIterator<Buffer>;
  constructor(src: AsyncIterable<Buffer>) {
    this.it = src[Symbol.asyncIterator]();
  }
  async read(n: number): Promise<Buffer | undefined> {
    while (this.buf.length < n) {
      const r = await this.it.next();
      if (r.done) return undefined;
      this.buf = this.buf.length ? Buffer.concat([this.buf, r.value]) : r.value;
    }
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }
}

function field(h: Buffer, off: number, len: number): string {
  const s = h.subarray(off, off + len);
  const z = s.indexOf(0);
  return (z >= 0 ? s.subarray(0, z) : s).toString("utf8");
}

function num(h: Buffer, off: number, len: number): number {
  const s = field(h, off, len).trim();
  return s ? parseInt(s, 8) : 0;
}

function parsePax(b: Buffer): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  while (i < b.length) {
    const sp = b.indexOf(0x20, i);
    if (sp < 0) break;
    const len = parseInt(b.subarray(i, sp).toString(), 10);
    if (!(len > 0)) break;
    const rec = b.subarray(sp + 1, i + len - 1).toString("utf8");
    const eq = rec.indexOf("=");
    if (eq > 0) out[rec.slice(0, eq)] = rec.slice(eq + 1);
    i += len;
  }
  return out;
}

/** Bound on one PAX or GNU long-name record (bytes). */
const MAX_META = 1 << 20;

/**
 * The name of the top entry of the box's archive of boxPath: its base name,
 * `.` for the root (the agent names entries so).
 */
export function topName(boxPath: string): string {
  const base = path.posix.basename(path.posix.normalize("/" + boxPath));
  return base === "" || base === "/" ? "." : base;
}

function refuse(entry: string, why: string): AirlockError {
  return new AirlockError(0, "unsafe_archive", `copyOut: refusing archive entry ${JSON.stringify(entry)}: ${why}; the copy is aborted`);
}

/** Whether the clean relative name is top or under it (everything is under "."). */
function under(name: string, top: string): boolean {
  return top === "." || name === top || name.startsWith(top + "/");
}

/**
 * Unpacks a tar stream (the box's archive of a path whose top entry is named
 * `top`) into destDir, never writing outside it. The box chooses every byte,
 * so each entry is checked before anything of it is written: it must be `top`
 * or under `top/` (any other name, `.bashrc` beside `out/x`, would land beside
 * the destination); absolute and `..` names are refused; no symlink is
 * followed while creating files (one the archive made or one already there);
 * symlinks leading out of the copied tree, hard links, devices and FIFOs are
 * refused; setuid/setgid bits cleared. The top entry is renamed to `rename`
 * when given. The first refused entry throws AirlockError (`unsafe_archive`,
 * naming it) and ends the copy: what was written until then stays, all of it
 * inside destDir.
 */
export async function untar(src: AsyncIterable<Buffer>, destDir: string, top: string, rename?: string): Promise<void> {
  const root = path.resolve(destDir);
  const rd = new ChunkReader(src);
  const topParts = top === "." ? [] : top.split("/");
  if (topParts.length > 1 || topParts.includes("..")) throw new Error(`copyOut: bad top name ${JSON.stringify(top)}`);
  // Where the copied tree lands: writes and symlink targets stay inside it.
  const copyRoot = path.join(root, rename ?? (top === "." ? "" : top));
  let pax: Record<string, string> = {};
  let longName: string | undefined;
  const safe = async (name: string): Promise<string> => {
    const parts = name.split("/").filter((p) => p !== "" && p !== ".");
    if (name.startsWith("/") || parts.includes("..") || name.includes("\0")) {
      throw refuse(name, "absolute or climbing out");
    }
    if (!under(parts.join("/") || ".", top)) throw refuse(name, `it is outside ${JSON.stringify(top)}, the path copied`);
    if (top === ".") {
      if (rename) parts.unshift(rename);
    } else if (rename) {
      parts[0] = rename;
    }
    if (parts.length === 0) return root;
    // No component below root may be a symlink (one the archive made, or one already there).
    let p = root;
    for (const part of parts.slice(0, -1)) {
      p = path.join(p, part);
      const st = await fsp.lstat(p).catch(() => undefined);
      if (st?.isSymbolicLink()) throw refuse(name, `it would be written through the symlink ${p}`);
    }
    return path.join(root, ...parts);
  };
  for (;;) {
    const h = await rd.read(BLOCK);
    if (!h) throw new Error("copyOut: the tar stream ended early (transfer cut?)");
    if (h.every((b) => b === 0)) return;
    const type = String.fromCharCode(h[156] || 0x30);
    const size = num(h, 124, 12);
    const body = async (): Promise<Buffer> => {
      if (size > MAX_META) throw new Error(`copyOut: tar metadata record of ${size} bytes`);
      const b = (await rd.read(size + ((BLOCK - (size % BLOCK)) % BLOCK))) ?? Buffer.alloc(0);
      return b.subarray(0, size);
    };
    if (type === "x") {
      pax = parsePax(await body());
      continue;
    }
    if (type === "g") {
      await body();
      continue;
    }
    if (type === "L") {
      longName = field(await body(), 0, size);
      continue;
    }
    const prefix = field(h, 345, 155);
    let name = pax.path ?? longName ?? (prefix ? `${prefix}/${field(h, 0, 100)}` : field(h, 0, 100));
    const linkname = pax.linkpath ?? field(h, 157, 100);
    pax = {};
    longName = undefined;
    name = name.replace(/\/+$/, "");
    const dst = await safe(name);
    const mode = num(h, 100, 8) & 0o1777;
    const mtime = num(h, 136, 12);
    switch (type) {
      case "5": {
        const st = await fsp.lstat(dst).catch(() => undefined);
        if (dst !== root && st?.isSymbolicLink()) throw refuse(name, `it would be written through the symlink ${dst}`);
        await fsp.mkdir(dst, { recursive: true, mode: mode || 0o755 });
        break;
      }
      case "0":
      case "\0":
      case "7": {
        await fsp.rm(dst, { force: true });
        const fh = await fsp.open(dst, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, mode & 0o777);
        try {
          let left = size;
          while (left > 0) {
            const c = await rd.read(Math.min(left, 256 << 10));
            if (!c) throw new Error("copyOut: the tar stream ended inside a file (transfer cut?)");
            await fh.write(c);
            left -= c.length;
          }
        } finally {
          await fh.close();
        }
        await rd.read((BLOCK - (size % BLOCK)) % BLOCK);
        await fsp.utimes(dst, mtime, mtime).catch(() => {});
        break;
      }
      case "2": {
        const target = path.resolve(path.dirname(dst), linkname);
        if (path.isAbsolute(linkname) || linkname.includes("\0") || (target !== copyRoot && !target.startsWith(copyRoot + path.sep))) {
          throw refuse(name, `a symlink to ${JSON.stringify(linkname)} leads out of the copy at ${copyRoot}`);
        }
        await fsp.rm(dst, { force: true });
        await fsp.symlink(linkname, dst);
        break;
      }
      default:
        throw refuse(name, `type ${JSON.stringify(type)} (hard links, devices and FIFOs are not copied)`);
    }
  }
}

/** The files calls of a box, on a client. */
export class Files {
  constructor(private readonly client: Client, private readonly box: () => Promise<string>) {}

  private async url(op: string, p: string, extra: Record<string, string> = {}): Promise<string> {
    const id = await this.box();
    const q = new URLSearchParams({ path: p, ...extra });
    return `/v1/boxes/${encodeURIComponent(id)}/${op}?${q}`;
  }

  async writeFile(p: string, data: string | Uint8Array, options: { mode?: number; parents?: boolean } = {}): Promise<void> {
    const extra: Record<string, string> = {};
    if (options.mode !== undefined) extra.mode = options.mode.toString(8);
    if (options.parents ?? true) extra.parents = "true";
    const res = await this.client.transfer("PUT", await this.url("files", p, extra), Buffer.from(data));
    res.resume();
  }

  async readFile(p: string, maxBytes = MAX_READ_FILE): Promise<Buffer> {
    const res = await this.client.transfer("GET", await this.url("files", p));
    return readAll(res, maxBytes);
  }

  async stat(p: string): Promise<FileInfo> {
    return this.client.request<FileInfo>("GET", await this.url("files/stat", p));
  }

  async listDir(p: string): Promise<FileInfo[]> {
    const r = await this.client.request<{ entries: FileInfo[] }>("GET", await this.url("files/list", p));
    return r.entries;
  }

  async mkdir(p: string, mode = 0o755): Promise<void> {
    const id = await this.box();
    await this.client.request("POST", `/v1/boxes/${encodeURIComponent(id)}/files/mkdir`, { path: p, mode });
  }

  async remove(p: string): Promise<void> {
    await this.client.request("DELETE", await this.url("files", p));
  }

  async copyIn(hostPath: string, boxPath: string): Promise<void> {
    await fsp.lstat(hostPath);
    const clean = path.posix.normalize(boxPath).replace(/(.)\/+$/, "$1");
    let intoDir = false;
    try {
      intoDir = (await this.stat(clean)).type === "dir";
    } catch (e) {
      if (!(e instanceof AirlockError) || e.code !== "file_not_found") throw e;
    }
    if (!intoDir && boxPath.endsWith("/")) {
      // "dir/" names a directory: made, with its parents, and the copy goes into it.
      await this.mkdir(clean, 0o755);
      intoDir = true;
    }
    const [dir, name] = intoDir ? [clean, path.basename(path.resolve(hostPath))] : [path.posix.dirname(clean), path.posix.basename(clean)];
    // A missing parent is made, as writeFile does (docker cp would refuse).
    if (!intoDir && dir !== "/") await this.mkdir(dir, 0o755);
    const res = await this.client.transfer("PUT", await this.url("archive", dir), Readable.from(tarOf(hostPath, name)), "application/x-tar");
    res.resume();
  }

  async copyOut(boxPath: string, hostPath: string, maxBytes?: number): Promise<void> {
    const st = await fsp.stat(hostPath).catch(() => undefined);
    const [dir, rename] = st?.isDirectory() ? [hostPath, undefined] : [path.dirname(hostPath), path.basename(hostPath)];
    const res = await this.client.transfer("GET", await this.url("archive", boxPath));
    try {
      await untar(bounded(res as AsyncIterable<Buffer>, maxBytes), dir, topName(boxPath), rename);
    } finally {
      res.destroy();
    }
  }
}

/** Default bound of readFile (1 GiB, the Go library's MaxReadFile): the box chooses what it sends. */
export const MAX_READ_FILE = 1 << 30;

function tooLarge(what: string, max: number): AirlockError {
  return new AirlockError(0, "too_large", `${what}: larger than the limit of ${max} bytes (pass a larger maxBytes, or use copyOut)`);
}

async function* bounded(src: AsyncIterable<Buffer>, maxBytes?: number): AsyncGenerator<Buffer> {
  let n = 0;
  for await (const c of src) {
    n += c.length;
    if (maxBytes !== undefined && n > maxBytes) throw tooLarge("copyOut: the archive", maxBytes);
    yield c;
  }
}

async function readAll(res: http.IncomingMessage, maxBytes: number): Promise<Buffer> {
  const want = Number(res.headers["content-length"]);
  if (Number.isFinite(want) && want > maxBytes) {
    res.destroy();
    throw tooLarge(`readFile: ${want} bytes`, maxBytes);
  }
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of res) {
    n += (c as Buffer).length;
    if (n > maxBytes) {
      res.destroy();
      throw tooLarge("readFile", maxBytes);
    }
    chunks.push(c as Buffer);
  }
  const body = Buffer.concat(chunks);
  if (!res.complete || (Number.isFinite(want) && body.length !== want)) {
    throw new AirlockError(0, "transfer_cut", `download cut by the server after ${body.length} bytes`);
  }
  return body;
}

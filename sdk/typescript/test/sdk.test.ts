// The SDK against a real `airlock serve` booting real boxes. One server and
// one shared CodeBox for the whole file keep VM time small; the examples and
// the tests that need their own box (start failure, images) make theirs.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { deflateSync } from "node:zlib";

import { AirlockError, Client, CodeBox, ExecError, SimpleBox } from "@airlock-run/sdk";

import { PKG, accepting, startServer, waitFor, type TestServer } from "./server.js";

let srv: TestServer;
let box: CodeBox;

function run(file: string, env: NodeJS.ProcessEnv, args: string[] = []): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [file, ...args], { env, timeout: 180_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

async function boxIds(): Promise<string[]> {
  const r = await Client.default().request<{ boxes: { id: string }[] | null }>("GET", "/v1/boxes");
  return (r.boxes ?? []).map((b) => b.id);
}

before(async () => {
  srv = await startServer();
  // Its port 8000 is published on a free port of the host's 127.0.0.1 ("published ports").
  box = new CodeBox({ network: "enabled", ports: [8000] });
  await box.start();
});

after(async () => {
  await box?.stop();
  await srv?.stop();
});

describe("CodeBox.run", () => {
  it("returns stdout", async () => {
    const cb = CodeBox.attach(box.id!);
    assert.equal(await cb.run("print('Hello from a microVM!')"), "Hello from a microVM!\n");
  });

  it("throws ExecError with the traceback in stderr when the code fails", async () => {
    const err = await box.run("print('before')\nraise ValueError('boom')").then(
      () => assert.fail("run resolved"), (e: unknown) => e);
    assert.ok(err instanceof ExecError, `${err}`);
    assert.equal(err.exitCode, 1);
    assert.equal(err.stdout, "before\n");
    assert.match(err.stderr, /^Traceback \(most recent call last\):\n[\s\S]*ValueError: boom\n$/);
    assert.match(err.message, /ValueError: boom/);
    assert.equal(err.timedOut, false);
  });

  it("enforces its timeout", async () => {
    const t0 = Date.now();
    // 5 s: Python must start and print in the box first, which takes
    // seconds on a loaded machine under TCG.
    const err = await box.run("import time\nprint('start', flush=True)\ntime.sleep(30)", { timeout: 5 }).then(
      () => assert.fail("run resolved"), (e: unknown) => e);
    assert.ok(err instanceof ExecError);
    assert.equal(err.timedOut, true);
    assert.equal(err.stdout, "start\n");
    assert.notEqual(err.exitCode, 0);
    assert.ok(Date.now() - t0 < 25_000, `took ${Date.now() - t0} ms`);
  });

  it("runs concurrent calls on one box", async () => {
    const outs = await Promise.all(Array.from({ length: 8 }, (_, i) => box.run(`print(${i} * 2)`)));
    assert.deepEqual(outs, Array.from({ length: 8 }, (_, i) => `${i * 2}\n`));
  });

  it("runScript reads a host file", async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "airlock-ts-script-"));
    try {
      const f = path.join(dir, "s.py");
      writeFileSync(f, "import sys\nprint(sys.version_info[0])\n");
      assert.equal(await box.runScript(f), "3\n");
    } finally {
      rmSync(dir, { recursive: true });
    }
  });
});

describe("SimpleBox.exec", () => {
  it("reports the exit code, stdout and stderr without throwing", async () => {
    const r = await box.exec("python3", "-c", "import sys; print('out'); sys.exit('bad')");
    assert.deepEqual([r.exitCode, r.stdout, r.stderr, r.errorMessage, r.timedOut], [1, "out\n", "bad\n", undefined, false]);
  });

  it("passes env, cwd, user and stdin; keeps bytes", async () => {
    let r = await box.exec("sh", "-c", 'echo "$A:$(pwd):$(id -u)"', { env: { A: "x" }, cwd: "/tmp", user: "65534" });
    assert.equal(r.stdout, "x:/tmp:65534\n");
    r = await box.exec("sh", "-c", String.raw`printf '\377ok'`);
    assert.deepEqual(r.stdoutBytes, Buffer.from([0xff, 0x6f, 0x6b]));
    assert.equal(r.stdout, "\ufffdok");
    r = await box.exec("cat", { stdin: Buffer.from([0, 1, 0x64]) });
    assert.deepEqual(r.stdoutBytes, Buffer.from([0, 1, 0x64]));
  });

  it("enforces its timeout", async () => {
    const t0 = Date.now();
    const r = await box.exec("sleep", "30", { timeout: 0.5 });
    assert.equal(r.timedOut, true);
    assert.notEqual(r.exitCode, 0);
    assert.ok(r.errorMessage);
    assert.ok(Date.now() - t0 < 20_000);
  });
});

describe("streaming exec", () => {
  it("streams stdout and stderr chunks and takes stdin", async () => {
    const p = box.stream("sh", "-c", "cat; echo err >&2; exit 5");
    await p.write("streamed\n");
    await p.closeStdin();
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    for await (const c of p) (c.stream === "stdout" ? out : err).push(c.data);
    assert.equal(Buffer.concat(out).toString(), "streamed\n");
    assert.equal(Buffer.concat(err).toString(), "err\n");
    assert.equal(p.exitCode, 5);
  });

  it("runs on a terminal that a resize frame resizes", async () => {
    const p = box.stream("sh", "-c", "stty size; read x; stty size", { tty: true, rows: 30, cols: 100 });
    let out = "";
    let resized = false;
    for await (const c of p) {
      assert.equal(c.stream, "stdout");
      out += c.data.toString();
      if (!resized && out.includes("30 100")) {
        resized = true;
        await p.resize(50, 132);
        await p.write("\n");
      }
    }
    assert.match(out, /30 100\r\n[\s\S]*50 132\r\n/);
    assert.equal(p.exitCode, 0);
  });

  it("loses nothing of a burst of output", async () => {
    const p = box.stream("seq", "1", "50000");
    const out: Buffer[] = [];
    for await (const c of p) out.push(c.data);
    const want = Array.from({ length: 50000 }, (_, i) => `${i + 1}\n`).join("");
    assert.equal(Buffer.concat(out).toString(), want);
    assert.equal(p.exitCode, 0);
  });

  it("a slow reader pauses the stream and gets every byte", async () => {
    const p = box.stream("head", "-c", "6000000", "/dev/zero");
    let n = 0;
    let first = true;
    for await (const c of p) {
      if (first) {
        first = false;
        await new Promise((r) => setTimeout(r, 1500)); // let more than the 1 MiB high-water mark queue up
      }
      n += c.data.length;
    }
    assert.equal(n, 6_000_000);
    assert.equal(p.exitCode, 0);
  });

  it("delivers output as it comes, and a signal ends the process", async () => {
    const p = box.stream("sh", "-c", "echo ready; exec sleep 30");
    const it = p[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal(first.done, false);
    assert.equal(first.value.data.toString(), "ready\n");
    await p.sendSignal("TERM");
    assert.equal(await p.wait(), 128 + 15);
  });

  it("leaving the loop early kills the process", async () => {
    for await (const c of box.stream("sh", "-c", "echo ready; exec sleep 31.5")) {
      assert.equal(c.data.toString(), "ready\n");
      break;
    }
    const gone = await waitFor(async () => (await box.exec("pgrep", "-f", "sleep 31.5")).exitCode === 1, 10_000);
    assert.ok(gone, "sleep still running after the stream was closed");
  });

  it("reports a command that is not found as exit code 127", async () => {
    assert.equal(await box.stream("no-such-command-xyz").wait(), 127);
  });
});

describe("contexts", () => {
  it("keep state; report values, exceptions and timeouts", async () => {
    await using ctx = await box.createContext();
    let r = await ctx.run("import math\nx = 41\nprint('hi')\nx + 1");
    assert.deepEqual([r.stdout, r.value, r.error], ["hi\n", "42", undefined]);
    r = await ctx.run("math.sqrt(x + 8)");
    assert.equal(r.value, "7.0");
    r = await ctx.run("x / 0");
    assert.equal(r.error?.name, "ZeroDivisionError");
    assert.match(r.error!.traceback, /ZeroDivisionError: division by zero/);
    r = await ctx.run("while True: pass", { timeout: 0.5 });
    assert.equal(r.timedOut, true);
    assert.equal((await ctx.run("x")).value, "41");
  });

  it("return matplotlib figures as PNG", { timeout: 240_000 }, async (t) => {
    const images = await Client.default().request<{ images: { ref: string }[] | null }>("GET", "/v1/images");
    if (!(images.images ?? []).some((i) => i.ref.includes("airlock/python-data"))) {
      t.skip("image airlock/python-data not built (hack/setup.sh builds it unless AIRLOCK_SETUP_SKIP_DATA=1)");
      return;
    }
    await using cb = new CodeBox({ image: "airlock/python-data", memoryMib: 1024, network: "disabled" });
    const ctx = await cb.createContext();
    const r = await ctx.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nprint('plotted')", { timeout: 180 });
    assert.equal(r.error, undefined, r.error?.traceback);
    assert.equal(r.stdout, "plotted\n");
    assert.equal(r.images.length, 1);
    assert.deepEqual(r.images[0].subarray(0, 8), Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
  });
});

/** A minimal wheel (zip, stored) of a module airlock_demo_pkg with VALUE = 42. */
function wheel(): Buffer {
  const name = "airlock_demo_pkg";
  const dist = `${name}-1.0.dist-info`;
  const files: [string, string][] = [
    [`${name}/__init__.py`, "VALUE = 42\n"],
    [`${dist}/METADATA`, `Metadata-Version: 2.1\nName: ${name}\nVersion: 1.0\n`],
    [`${dist}/WHEEL`, "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"],
  ];
  files.push([`${dist}/RECORD`, files.map(([p]) => `${p},,\n`).join("") + `${dist}/RECORD,,\n`]);
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc32 = (b: Buffer) => {
    let c = 0xffffffff;
    for (const x of b) c = crcTable[(c ^ x) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const locals: Buffer[] = [];
  const centrals: Buffer[] = [];
  let offset = 0;
  for (const [p, text] of files) {
    const nameBuf = Buffer.from(p);
    const raw = Buffer.from(text);
    const data = deflateSync(raw, { level: 9 }).subarray(2, -4); // raw deflate
    const crc = crc32(raw);
    const lh = Buffer.alloc(30);
    lh.writeUInt32LE(0x04034b50, 0); lh.writeUInt16LE(20, 4); lh.writeUInt16LE(8, 8);
    lh.writeUInt32LE(crc, 14); lh.writeUInt32LE(data.length, 18); lh.writeUInt32LE(raw.length, 22);
    lh.writeUInt16LE(nameBuf.length, 26);
    const ch = Buffer.alloc(46);
    ch.writeUInt32LE(0x02014b50, 0); ch.writeUInt16LE(20, 4); ch.writeUInt16LE(20, 6); ch.writeUInt16LE(8, 10);
    ch.writeUInt32LE(crc, 16); ch.writeUInt32LE(data.length, 20); ch.writeUInt32LE(raw.length, 24);
    ch.writeUInt16LE(nameBuf.length, 28); ch.writeUInt32LE(offset, 42);
    locals.push(lh, nameBuf, data);
    centrals.push(ch, nameBuf);
    offset += lh.length + nameBuf.length + data.length;
  }
  const cd = Buffer.concat(centrals);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0); end.writeUInt16LE(files.length, 8); end.writeUInt16LE(files.length, 10);
  end.writeUInt32LE(cd.length, 12); end.writeUInt32LE(offset, 16);
  return Buffer.concat([...locals, cd, end]);
}

describe("installPackage", () => {
  it("installs from a PEP 503 index on the host's loopback, then imports it", async () => {
    const whlName = "airlock_demo_pkg-1.0-py3-none-any.whl";
    const whl = wheel();
    const index = http.createServer((req, res) => {
      if (req.url?.replace(/\/$/, "") === "/simple/airlock-demo-pkg") {
        res.writeHead(200, { "Content-Type": "text/html" }).end(`<a href="/${whlName}">${whlName}</a>`);
      } else if (req.url === `/${whlName}`) {
        res.writeHead(200, { "Content-Type": "application/octet-stream" }).end(whl);
      } else {
        res.writeHead(404).end();
      }
    });
    await new Promise<void>((r) => index.listen(0, "127.0.0.1", r));
    try {
      const port = (index.address() as { port: number }).port;
      // The guest reaches the host's 127.0.0.1 as 198.18.0.1 (the server's
      // test-only internet mapping, see server.ts).
      const cb = CodeBox.attach(box.id!, { indexUrl: `http://198.18.0.1:${port}/simple/` });
      const out = await cb.installPackage("airlock-demo-pkg");
      assert.match(out, /Successfully installed airlock[-_]demo[-_]pkg-1\.0/);
      assert.equal(await cb.run("import airlock_demo_pkg; print(airlock_demo_pkg.VALUE)"), "42\n");
      await assert.rejects(cb.installPackage("airlock-no-such-pkg"), ExecError);
    } finally {
      index.close();
    }
  });
});

describe("files", () => {
  it("writes, reads, stats, lists, makes and removes files", async () => {
    const data = Buffer.alloc(18 * 1024 + 1);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7) & 0xff;
    await box.writeFile("/tmp/ts/dir/blob.bin", data, { mode: 0o600 });
    assert.deepEqual(await box.readFile("/tmp/ts/dir/blob.bin"), data);
    const st = await box.stat("/tmp/ts/dir/blob.bin");
    assert.deepEqual([st.type, st.size, st.mode, st.name], ["file", data.length, 0o600, "blob.bin"]);
    await box.writeFile("/tmp/ts/hello.txt", "héllo\n");
    assert.equal((await box.readFile("/tmp/ts/hello.txt")).toString(), "héllo\n");
    assert.deepEqual((await box.listDir("/tmp/ts")).map((e) => [e.name, e.type]), [["dir", "dir"], ["hello.txt", "file"]]);
    await box.mkdir("/tmp/ts/a/b");
    assert.equal((await box.stat("/tmp/ts/a/b")).type, "dir");
    await box.remove("/tmp/ts/a");
    for (const [call, code] of [
      [() => box.stat("/tmp/ts/a"), "file_not_found"],
      [() => box.readFile("/nonexistent"), "file_not_found"],
      [() => box.readFile("/tmp/ts"), "is_a_directory"],
      [() => box.writeFile("/tmp/nodir/x", "x", { parents: false }), "file_not_found"],
      [() => box.readFile("/tmp/ts/dir/blob.bin", { maxBytes: 100 }), "too_large"],
    ] as [() => Promise<unknown>, string][]) {
      const err = await call().then(() => assert.fail("resolved"), (e: unknown) => e);
      assert.ok(err instanceof AirlockError && err.code === code, `${err}, want ${code}`);
    }
  });

  it("copies trees in and out with docker cp rules, and keeps hostile trees inside the destination", async () => {
    const tmp = mkdtempSync(path.join(os.tmpdir(), "airlock-ts-cp-"));
    try {
      const src = path.join(tmp, "src");
      mkdirSync(path.join(src, "sub"), { recursive: true });
      writeFileSync(path.join(src, "data.csv"), "a,b\n1,2\n", { mode: 0o640 });
      const big = Buffer.alloc(3 << 20, 7);
      writeFileSync(path.join(src, "sub", "big.bin"), big);
      symlinkSync("data.csv", path.join(src, "link"));
      writeFileSync(path.join(src, "sub", "x".repeat(120) + ".txt"), "long name");
      // Missing parents are made, as writeFile makes them.
      await box.copyIn(path.join(src, "data.csv"), "/tmp/tscp-new/a/b/data.csv");
      assert.equal((await box.readFile("/tmp/tscp-new/a/b/data.csv")).toString(), "a,b\n1,2\n");
      // "dir/" names a directory: made, and the file goes into it (not a file named dir).
      await box.copyIn(path.join(src, "data.csv"), "/tmp/tscp-dir/x/");
      assert.equal((await box.readFile("/tmp/tscp-dir/x/data.csv")).toString(), "a,b\n1,2\n");
      await box.copyIn(src, "/tmp/tscp/tree");
      await box.copyIn(path.join(src, "data.csv"), "/tmp/tscp");
      const r = await box.exec("sh", "-c", "cd /tmp/tscp && stat -c '%n %a' tree/data.csv data.csv && readlink tree/link && ls tree/sub | wc -l");
      assert.equal(r.stdout, "tree/data.csv 640\ndata.csv 640\ndata.csv\n2\n", r.stderr);
      const out = path.join(tmp, "out");
      mkdirSync(out);
      await box.copyOut("/tmp/tscp/tree", out);
      assert.equal(readFileSync(path.join(out, "tree", "data.csv"), "utf8"), "a,b\n1,2\n");
      assert.deepEqual(readFileSync(path.join(out, "tree", "sub", "big.bin")), big);
      assert.equal(readFileSync(path.join(out, "tree", "sub", "x".repeat(120) + ".txt"), "utf8"), "long name");
      assert.equal(readlinkSync(path.join(out, "tree", "link")), "data.csv");
      await box.copyOut("/tmp/tscp/data.csv", path.join(out, "renamed.csv"));
      assert.equal(readFileSync(path.join(out, "renamed.csv"), "utf8"), "a,b\n1,2\n");
      await box.exec("sh", "-c", "mkdir -p /tmp/tsevil && ln -sf /etc /tmp/tsevil/etc && ln -sf ../../.. /tmp/tsevil/up");
      const dest = path.join(tmp, "dest");
      mkdirSync(dest);
      await assert.rejects(box.copyOut("/tmp/tsevil", dest), /leads out of the copy/);
      assert.deepEqual(readdirSync(tmp).sort(), ["dest", "out", "src"]);
      const big2 = await box.copyOut("/tmp/tscp/tree", path.join(tmp, "bounded"), { maxBytes: 1 << 20 }).then(() => assert.fail("copied"), (e: unknown) => e);
      assert.ok(big2 instanceof AirlockError && big2.code === "too_large", `${big2}`);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });

  it("attaches host volumes only under the server's --allow-volume directory", async () => {
    const shared = path.join(srv.volumes, "share");
    mkdirSync(shared);
    writeFileSync(path.join(shared, "in.txt"), "from the host");
    const b = new SimpleBox({ network: "none", volumes: [`${shared}:/data`] });
    try {
      assert.equal((await b.readFile("/data/in.txt")).toString(), "from the host");
      await b.writeFile("/data/out.txt", "from the box");
    } finally {
      await b.stop();
    }
    assert.equal(readFileSync(path.join(shared, "out.txt"), "utf8"), "from the box");
    const denied = new SimpleBox({ network: "none", volumes: [{ source: os.tmpdir(), target: "/data", readOnly: true }] });
    const err = await denied.start().then(() => assert.fail("started"), (e: unknown) => e);
    assert.ok(err instanceof AirlockError && err.status === 403 && err.code === "policy_denied", `${err}`);
    assert.match(err.message, /--allow-volume/);
  });
});

describe("published ports", () => {
  it("reach a server in the box on the host port bound", async () => {
    const ports = await box.ports();
    assert.equal(ports.length, 1);
    const [p] = ports;
    assert.deepEqual([p.hostIp, p.guestPort, p.protocol], ["127.0.0.1", 8000, "tcp"]);
    assert.ok(p.hostPort > 0, `host port ${p.hostPort}`);
    const r = await box.exec("sh", "-c", "mkdir -p /srv/ts && echo hello from node over a published port > /srv/ts/index.html && " +
      "cd /srv/ts && nohup python3 -m http.server 8000 >/dev/null 2>&1 &");
    assert.equal(r.exitCode, 0, r.stderr);
    let body = "";
    const ok = await waitFor(async () => {
      body = await new Promise<string>((resolve) => {
        const req = http.get({ host: "127.0.0.1", port: p.hostPort, path: "/", agent: false }, (res) => {
          let b = "";
          res.setEncoding("utf8").on("data", (d: string) => (b += d)).on("end", () => resolve(b));
        });
        req.on("error", () => resolve(""));
        req.setTimeout(5000, () => req.destroy());
      });
      return body !== "";
    }, 30_000);
    assert.ok(ok, "nothing answered on the published port");
    assert.equal(body, "hello from node over a published port\n");
  });

  it("are refused with policy_denied beyond the server's --allow-publish grants", async () => {
    // Refused before any box is made: no VM boots.
    for (const ports of [["8999:80"], ["0.0.0.0:0:80"], [{ hostIp: "::1", guestPort: 53, protocol: "udp" as const }]]) {
      const err = await new SimpleBox({ ports }).start().then(() => assert.fail("started"), (e: unknown) => e);
      assert.ok(err instanceof AirlockError && err.status === 403 && err.code === "policy_denied", `${err}`);
      assert.match(err.message, /--allow-publish/);
    }
  });

  it("reject malformed mappings before any request", () => {
    for (const bad of ["a:b", "1:2/sctp", 1.5, [8080, 80]]) assert.throws(() => new SimpleBox({ ports: [bad as never] }), TypeError);
  });
});

describe("errors", () => {
  it("a start failure rejects with a plain Error that says what to do", async () => {
    const cb = new CodeBox({ image: "localhost:1/no-such-image:latest" });
    const err = await cb.run("print(1)").then(() => assert.fail("run resolved"), (e: unknown) => e);
    assert.ok(err instanceof Error && !(err instanceof ExecError), `${err}`);
    assert.ok(err instanceof AirlockError);
    assert.equal(err.code, "image_not_found");
    assert.match(err.message, /^could not start a box from localhost:1\/no-such-image:latest: image not found: /);
    assert.match(err.message, /airlock import|build-debian|airlock pull/); // what to do
    await cb.stop();
  });

  it("a call after stop() rejects clearly", async () => {
    const cb = new CodeBox();
    await cb.stop();
    await assert.rejects(cb.run("print(1)"), /this CodeBox was stopped and its box removed; create a new CodeBox/);
    await assert.rejects(cb.exec("true"), /stopped/);
  });

  it("unknown box options are refused", async () => {
    const cb = new CodeBox({ gpus: 1 } as never);
    await assert.rejects(cb.run("print(1)"), (e: unknown) => e instanceof TypeError && /unsupported box options: gpus/.test(e.message));
  });

  it("a box removed behind the SDK's back is reported by code", async () => {
    const cb = CodeBox.attach("000000000000");
    await assert.rejects(cb.run("print(1)"), (e: unknown) => e instanceof AirlockError && e.code === "box_not_found" && e.status === 404);
  });
});

describe("secrets", () => {
  it("are placeholders in the box; setSecret rotates one and refuses an unknown one without echoing it", async () => {
    const b = new SimpleBox({ secrets: { TOKEN: { hosts: ["api.example.com"], value: "sk-ts-first" } } });
    try {
      const r = await b.exec("sh", "-c", 'echo "$TOKEN"');
      assert.ok(r.stdout.startsWith("airlock-secret-") && !r.stdout.includes("sk-ts"), r.stdout);
      await b.setSecret("TOKEN", "sk-ts-rotated");
      await assert.rejects(b.setSecret("OTHER", "sk-ts-never-echoed"),
        (e: unknown) => e instanceof AirlockError && e.status === 400 && !String(e.message).includes("sk-ts-never-echoed"));
      assert.equal((await b.exec("sh", "-c", 'echo "$TOKEN"')).stdout, r.stdout);
    } finally {
      await b.stop();
    }
  });
});

describe("TCP with a bearer token", () => {
  it("works with the token and is refused without it", async () => {
    const client = new Client({ endpoint: { url: srv.url, token: srv.token } });
    const cb = CodeBox.attach(box.id!, { client });
    assert.equal(await cb.run("print('over tcp')"), "over tcp\n");
    const p = cb.stream("echo", "ws over tcp");
    let out = "";
    for await (const c of p) out += c.data.toString();
    assert.equal(out, "ws over tcp\n");
    await cb.writeFile("/tmp/tcp/f.txt", "files over tcp");
    assert.equal((await cb.readFile("/tmp/tcp/f.txt")).toString(), "files over tcp");
    const tmp = mkdtempSync(path.join(os.tmpdir(), "airlock-ts-tcp-"));
    try {
      await cb.copyOut("/tmp/tcp", tmp);
      assert.equal(readFileSync(path.join(tmp, "tcp", "f.txt"), "utf8"), "files over tcp");
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
    client.close();
    const bad = new Client({ endpoint: { url: srv.url, token: "wrong" } });
    await assert.rejects(CodeBox.attach(box.id!, { client: bad }).run("print(1)"),
      (e: unknown) => e instanceof AirlockError && e.status === 401 && e.code === "unauthorized");
    bad.close();
  });

  it("AIRLOCK_URL and AIRLOCK_TOKEN select it from the environment", async () => {
    const script = `import { CodeBox } from "@airlock-run/sdk";
      console.log(JSON.stringify(await CodeBox.attach(process.argv[2]).run("print(6 * 7)")));`;
    const f = path.join(PKG, "build", "test", "env-url.mjs");
    writeFileSync(f, script);
    const env = { ...srv.env, AIRLOCK_URL: srv.url + "/", AIRLOCK_TOKEN: srv.token, AIRLOCK_SOCKET: "/nonexistent/a.sock" };
    const r = await run(f, env, [box.id!]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, JSON.stringify("42\n") + "\n");
  });
});

describe("server discovery", () => {
  it("starts airlock serve when nothing answers on the socket; it exits when idle", async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "airlock-ts-auto-"));
    const sock = path.join(dir, "run", "auto.sock");
    const saved = { ...process.env };
    try {
      // Its own home: the test server's home has a running box, which keeps a server from going idle.
      Object.assign(process.env, {
        AIRLOCK_HOME: path.join(dir, "home"), AIRLOCK_SOCKET: sock, AIRLOCK_BIN: srv.bin, AIRLOCK_SERVE_IDLE_EXIT: "1s",
      });
      const client = new Client();
      assert.equal(client.endpoint.socket, sock);
      const v = await client.request<{ api_version: string }>("GET", "/v1/version");
      assert.ok(v.api_version);
      assert.ok(existsSync(path.join(dir, "run", "serve.log")));
      client.close();
      // Probe with bare connections: a request would keep the server busy.
      assert.ok(await waitFor(async () => !(await accepting(sock)), 15_000), "the started server did not exit when idle");
      // The same client starts it again on its next call.
      assert.ok((await client.request<{ api_version: string }>("GET", "/v1/version")).api_version);
      client.close();
      assert.ok(await waitFor(async () => !(await accepting(sock)), 15_000), "the restarted server did not exit when idle");
    } finally {
      process.env = saved;
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("says what to do when there is no server and no binary", async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "airlock-ts-none-"));
    const saved = { ...process.env };
    try {
      delete process.env.AIRLOCK_BIN;
      process.env.PATH = dir;
      const client = new Client({ endpoint: { socket: path.join(dir, "none.sock") } });
      await assert.rejects(client.request("GET", "/v1/health"),
        (e: unknown) => e instanceof AirlockError && e.code === "no_server" && /no `airlock` binary on PATH .*AIRLOCK_BIN/.test(e.message));
      const noAuto = new Client({ endpoint: { socket: path.join(dir, "none.sock") }, autostart: false });
      await assert.rejects(noAuto.request("GET", "/v1/health"), /start one with `airlock serve`/);
    } finally {
      process.env = saved;
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("examples", () => {
  it("the seed's Node example prints its greeting and removes its box", async () => {
    const before = await boxIds();
    const r = await run(path.join(PKG, "build", "examples", "hello.js"), srv.env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, "Hello from Node + microVM!\n\n");
    assert.equal(r.stderr, "");
    assert.deepEqual(await boxIds(), before);
  });

  it("the agent loop calls execute_python through the openai package (a fake OpenAI server on loopback)", async () => {
    const primes = "primes = []\nn = 2\nwhile len(primes) < 10:\n    if all(n % p for p in primes):\n        primes.append(n)\n    n += 1\nprint(primes)\n";
    const requests: { path?: string; auth?: string; body: { messages: { role: string; content?: string; tool_call_id?: string }[]; tools?: { function: { name: string } }[] } }[] = [];
    const fake = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = JSON.parse(Buffer.concat(chunks).toString());
        requests.push({ path: req.url, auth: req.headers.authorization, body });
        const tool = body.messages.find((m: { role: string }) => m.role === "tool");
        const message = tool
          ? { role: "assistant", content: `The primes: ${tool.content.trim()}` }
          : { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
              function: { name: "execute_python", arguments: JSON.stringify({ code: primes }) } }] };
        const reply = {
          id: "chatcmpl-fake", object: "chat.completion", created: 0, model: body.model,
          choices: [{ index: 0, finish_reason: tool ? "stop" : "tool_calls", message }],
          usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
        };
        res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(reply));
      });
    });
    await new Promise<void>((r) => fake.listen(0, "127.0.0.1", r));
    const before = await boxIds();
    try {
      const port = (fake.address() as { port: number }).port;
      const env = { ...srv.env, OPENAI_API_KEY: "sk-test", OPENAI_BASE_URL: `http://127.0.0.1:${port}/v1`, OPENAI_MODEL: "fake-model" };
      const r = await run(path.join(PKG, "build", "examples", "agent.js"), env);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stdout, "The primes: stdout:\n[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]\n");
    } finally {
      fake.close();
    }
    assert.equal(requests.length, 2);
    assert.equal(requests[0].path, "/v1/chat/completions");
    assert.equal(requests[0].auth, "Bearer sk-test");
    assert.equal(requests[0].body.tools?.[0].function.name, "execute_python");
    const toolMsg = requests[1].body.messages.find((m) => m.role === "tool");
    assert.equal(toolMsg?.tool_call_id, "call_1");
    assert.equal(toolMsg?.content, "stdout:\n[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]\n");
    // `await using` in the example removed its box.
    assert.deepEqual(await boxIds(), before);
  });
});

describe("fork and snapshots", () => {
  // Lean: one parent forked into two children, snapshotted once and restored once.
  it("fork keeps contexts and files, children independent; snapshot, restore, list, get, remove", { timeout: 240_000 }, async () => {
    const name = "sdk-ts-snap";
    const client = Client.default();
    await using parent = new CodeBox({ network: "none" });
    const ctx = await parent.createContext();
    await ctx.run("x = 41");
    await parent.writeFile("/tmp/before.txt", "written before the fork");
    const kids = await parent.fork(2);
    const ids = kids.map((k) => k.id!);
    try {
      assert.equal(kids.length, 2);
      assert.ok(kids.every((k) => k instanceof CodeBox));
      assert.equal(new Set([parent.id, ...ids]).size, 3);
      for (const k of kids) {
        const twin = k.context(ctx.id);
        assert.deepEqual([twin.id, twin.boxId], [ctx.id, k.id]);
        assert.equal((await twin.run("x + 1")).value, "42");
        assert.equal((await k.readFile("/tmp/before.txt")).toString(), "written before the fork");
      }
      await kids[0].writeFile("/tmp/child0.txt", "only in child 0");
      await kids[0].context(ctx.id).run("x = 0");
      await assert.rejects(kids[1].stat("/tmp/child0.txt"), (e: unknown) => e instanceof AirlockError && e.code === "file_not_found");
      await assert.rejects(parent.stat("/tmp/child0.txt"), (e: unknown) => e instanceof AirlockError && e.code === "file_not_found");
      assert.equal((await kids[1].context(ctx.id).run("x")).value, "41");
      assert.equal((await ctx.run("x")).value, "41");
      assert.equal(await kids[1].run("print('plain run')"), "plain run\n");
    } finally {
      for (const k of kids) await k.stop();
    }
    const left = await boxIds();
    assert.ok(ids.every((id) => !left.includes(id)), "children not removed by stop()");
    await assert.rejects(parent.fork(0), RangeError);

    const snap = await parent.snapshot(name);
    assert.deepEqual([snap.name, snap.box, snap.network], [name, parent.id, "none"]);
    assert.ok(snap.image && snap.memoryMib > 0 && snap.cpus >= 1 && snap.stateBytes > 0);
    assert.ok(snap.created instanceof Date && !Number.isNaN(snap.created.getTime()));
    await assert.rejects(parent.snapshot(name), (e: unknown) => e instanceof AirlockError && e.status === 409 && e.code === "snapshot_exists");
    await parent.writeFile("/tmp/after.txt", "after the snapshot");
    const got = await client.snapshot(name);
    assert.deepEqual([got.name, got.box, got.image, got.stateBytes], [snap.name, snap.box, snap.image, snap.stateBytes]);
    assert.ok((await client.snapshots()).some((s) => s.name === name));
    {
      await using restored = new CodeBox({ fromSnapshot: name });
      assert.equal((await restored.readFile("/tmp/before.txt")).toString(), "written before the fork");
      await assert.rejects(restored.stat("/tmp/after.txt"), (e: unknown) => e instanceof AirlockError && e.code === "file_not_found");
      assert.equal(await restored.run("print(6 * 7)"), "42\n");
      // Paused in memory, then to disk: calls fail while it is on disk, and it goes on after each resume.
      await restored.pause();
      await restored.resume();
      await restored.pause({ toDisk: true });
      await assert.rejects(restored.exec("true"), (e: unknown) => e instanceof AirlockError && e.status === 409 && e.code === "box_not_running");
      await restored.resume();
      assert.equal((await restored.readFile("/tmp/before.txt")).toString(), "written before the fork");
    }
    // Refused before any VM starts: a restore keeps the snapshot's network.
    await assert.rejects(new SimpleBox({ fromSnapshot: name, allowNet: ["example.com"] }).start(),
      (e: unknown) => e instanceof AirlockError && e.status === 400 && e.code === "invalid_request");
    await client.removeSnapshot(name);
    assert.ok(!(await client.snapshots()).some((s) => s.name === name));
    for (const call of [() => client.snapshot(name), () => client.removeSnapshot(name), () => new SimpleBox({ fromSnapshot: name }).start()]) {
      await assert.rejects(call, (e: unknown) => e instanceof AirlockError && e.status === 404 && e.code === "snapshot_not_found");
    }
  });
});

describe("checkpoints", () => {
  it("checkpoint, rollback in place, list as a tree, remove", { timeout: 180_000 }, async () => {
    await using b = new SimpleBox({ network: "none" });
    await b.writeFile("/root/f", "a");
    const a = await b.checkpoint("A");
    assert.ok(a.name === "A" && a.parent === "" && a.current && a.stateBytes > 0, JSON.stringify(a));
    await assert.rejects(b.checkpoint("A"), (e: unknown) => e instanceof AirlockError && e.status === 409 && e.code === "checkpoint_exists");
    await b.writeFile("/root/f", "b");
    assert.equal((await b.checkpoint("B")).parent, "A");
    const id = b.id;
    await b.rollback("A");
    assert.equal(b.id, id);
    assert.equal(new TextDecoder().decode(await b.readFile("/root/f")), "a");
    assert.deepEqual((await b.checkpoints()).map((c) => [c.name, c.parent, c.current]), [["A", "", true], ["B", "A", false]]);
    await assert.rejects(b.rollback("nope"), (e: unknown) => e instanceof AirlockError && e.status === 404 && e.code === "checkpoint_not_found");
    {
      const [kid] = await b.fork(1, { fromCheckpoint: "B" });
      await using _kid = kid;
      assert.notEqual(kid.id, id);
      assert.equal(new TextDecoder().decode(await kid.readFile("/root/f")), "b");
    }
    await assert.rejects(b.fork(1, { fromCheckpoint: "nope" }), (e: unknown) => e instanceof AirlockError && e.status === 404 && e.code === "checkpoint_not_found");
    await b.removeCheckpoint("A");
    assert.deepEqual((await b.checkpoints()).map((c) => [c.name, c.parent]), [["B", ""]]);
  });
});

describe("export and import", () => {
  it("a box exported with its checkpoints imports and rolls back", { timeout: 240_000 }, async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "airlock-export-"));
    const archive = path.join(dir, "box.tar");
    try {
      {
        await using b = new SimpleBox({ network: "none" });
        await b.writeFile("/root/f", "a");
        await b.checkpoint("A");
        await b.writeFile("/root/f", "b");
        const n = await b.export(archive, { checkpoints: true });
        assert.ok(n > 0 && n === readFileSync(archive).length, `export: ${n} bytes`);
        assert.ok(!existsSync(archive + ".part"));
      }
      await assert.rejects(SimpleBox.importBox(path.join(dir, "missing.tar")));
      writeFileSync(path.join(dir, "junk.tar"), "not a tar archive");
      await assert.rejects(SimpleBox.importBox(path.join(dir, "junk.tar")),
        (e: unknown) => e instanceof AirlockError && e.status === 400 && e.code === "invalid_request");
      await using imported = await SimpleBox.importBox(archive, { name: "ts-imported-ckpt" });
      assert.deepEqual((await imported.checkpoints()).map((c) => c.name), ["A"]);
      assert.equal(new TextDecoder().decode(await imported.readFile("/root/f")), "b");
      await imported.rollback("A");
      assert.equal(new TextDecoder().decode(await imported.readFile("/root/f")), "a");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("stop", () => {
  it("removes a started box; later calls reject", async () => {
    const cb = CodeBox.attach(box.id!);
    const id = box.id!;
    await box.stop();
    await assert.rejects(box.run("print(1)"), /stopped/);
    await assert.rejects(cb.run("print(1)"), (e: unknown) => e instanceof AirlockError && e.code === "box_not_found");
    assert.ok(!(await boxIds()).includes(id));
    await box.stop(); // idempotent
  });
});

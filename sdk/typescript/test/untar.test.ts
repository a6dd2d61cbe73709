// copyOut's extraction fed hostile archives directly, as a box that plays
// the agent could send them (no server, no VM): nothing may land outside the
// destination. Run alone: node --test build/test/untar.test.js

import assert from "node:assert/strict";
import { linkSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, it } from "node:test";

import { tarOf, topName, untar } from "../src/files.js";

const tmps: string[] = [];
after(() => tmps.forEach((t) => rmSync(t, { recursive: true, force: true })));

function tmpDir(): string {
  const t = mkdtempSync(path.join(os.tmpdir(), "untar-"));
  tmps.push(t);
  return t;
}

/** An entry: name, type ("0" file, "5" dir, "2" symlink, "1" hard link) and data or link target. */
type Entry = [string, string, string];

function header(name: string, type: string, size: number, link: string): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0);
  h.write("0000644\0", 100);
  h.write("0000000\0", 108);
  h.write("0000000\0", 116);
  h.write(size.toString(8).padStart(11, "0") + "\0", 124);
  h.write("00000000000\0", 136);
  h.write("        ", 148);
  h.write(type, 156);
  h.write(link, 157);
  h.write("ustar\0" + "00", 257);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148);
  return h;
}

async function* tar(entries: Entry[]): AsyncGenerator<Buffer> {
  for (const [name, type, val] of entries) {
    if (type === "0") {
      const data = Buffer.from(val);
      yield header(name, type, data.length, "");
      yield Buffer.concat([data, Buffer.alloc((512 - (data.length % 512)) % 512)]);
    } else {
      yield header(name, type, 0, type === "5" ? "" : val);
    }
  }
  yield Buffer.alloc(1024);
}

function tree(root: string): string[] {
  return (readdirSync(root, { recursive: true }) as string[]).sort();
}

async function refused(p: Promise<void>, re: RegExp): Promise<void> {
  const err = await p.then(() => assert.fail("extracted"), (e: unknown) => e as { code?: string; message: string });
  assert.equal(err.code, "unsafe_archive", err.message);
  assert.match(err.message, re);
}

describe("untar of a hostile box archive", () => {
  it("names the top entry as the agent does", () => {
    assert.equal(topName("/out"), "out");
    assert.equal(topName("/tmp/out/"), "out");
    assert.equal(topName("/tmp/out/."), "out");
    assert.equal(topName("/"), ".");
  });

  for (const rename of ["new", undefined]) {
    it(`refuses entries outside the top (rename ${rename})`, async () => {
      // copyOut("/out", "~/new") or copyOut("/out", "~"): the box adds
      // ~/.bashrc and ~/.ssh/authorized_keys beside out/x.
      const home = tmpDir();
      writeFileSync(path.join(home, ".bashrc"), "mine\n");
      const evil = tar([["out", "5", ""], ["out/x", "0", "x"], [".bashrc", "0", "pwned\n"],
        [".ssh", "5", ""], [".ssh/authorized_keys", "0", "ssh-ed25519 AAAA evil\n"]]);
      await refused(untar(evil, home, "out", rename), /"\.bashrc".*outside "out"/);
      assert.equal(readFileSync(path.join(home, ".bashrc"), "utf8"), "mine\n");
      const top = rename ?? "out";
      assert.deepEqual(tree(home), [".bashrc", top, path.join(top, "x")]);
    });
  }

  it("refuses a symlink leading out of the copy, though inside destDir", async () => {
    // out/l -> .. is inside home once out lands at home/new: what follows it
    // is beside the copy.
    const home = tmpDir();
    for (const target of ["..", "../.bashrc", "/etc/passwd", "sub/../../x"]) {
      await refused(untar(tar([["out", "5", ""], ["out/l", "2", target]]), home, "out", "new"), /leads out of the copy/);
    }
    assert.deepEqual(tree(home), ["new"]);
  });

  it("refuses a write through a symlink already in the destination", async () => {
    const home = tmpDir();
    mkdirSync(path.join(home, "other"));
    symlinkSync("other", path.join(home, "out"));
    await refused(untar(tar([["out", "5", ""], ["out/x", "0", "x"]]), home, "out"), /through the symlink/);
    assert.deepEqual(tree(path.join(home, "other")), []);
  });

  it("refuses hard links", async () => {
    const home = tmpDir();
    writeFileSync(path.join(home, ".bashrc"), "mine\n");
    await refused(untar(tar([["out", "5", ""], ["out/h", "1", ".bashrc"], ["out/h", "0", "pwned\n"]]), home, "out", "new"),
      /"out\/h".*hard links/);
    assert.equal(readFileSync(path.join(home, ".bashrc"), "utf8"), "mine\n");
  });

  it("replaces an existing file rather than writing through its other hard links", async () => {
    const home = tmpDir();
    mkdirSync(path.join(home, "out"));
    writeFileSync(path.join(home, ".bashrc"), "mine\n");
    linkSync(path.join(home, ".bashrc"), path.join(home, "out", "x"));
    await untar(tar([["out", "5", ""], ["out/x", "0", "new\n"]]), home, "out");
    assert.equal(readFileSync(path.join(home, "out", "x"), "utf8"), "new\n");
    assert.equal(readFileSync(path.join(home, ".bashrc"), "utf8"), "mine\n");
  });

  it("copies a good tree, and the root of a box", async () => {
    const src = tmpDir();
    mkdirSync(path.join(src, "tree", "sub"), { recursive: true });
    writeFileSync(path.join(src, "tree", "a"), "a\n");
    symlinkSync("../a", path.join(src, "tree", "sub", "l"));
    const dst = tmpDir();
    await untar(tarOf(path.join(src, "tree"), "tree"), dst, "tree", "copy");
    assert.deepEqual(tree(dst), ["copy", "copy/a", "copy/sub", "copy/sub/l"]);
    assert.equal(readlinkSync(path.join(dst, "copy", "sub", "l")), "../a");
    await untar(tar([[".", "5", ""], ["./etc", "5", ""], ["./etc/hosts", "0", "h\n"]]), dst, ".", "root");
    assert.equal(readFileSync(path.join(dst, "root", "etc", "hosts"), "utf8"), "h\n");
  });
});

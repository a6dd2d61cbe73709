// BoxLite's Node API (@boxlite-ai/boxlite 0.10) on a real `airlock serve`:
// the runtime (JsBoxlite), its box handles and executions, the REST
// options, SimpleBox's BoxLite options (reuseExisting, runtime, exec's
// positional form) and the NotImplementedErrors that name what to use.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  ApiKeyCredential, BoxliteError, BoxliteRestOptions, Client, JsBoxlite, NotImplementedError, SimpleBox, type Event, type ExecOutput,
} from "@airlock-run/sdk";
import * as boxlite from "@airlock-run/sdk";

import { startServer, type TestServer } from "./server.js";

let srv: TestServer;

before(async () => {
  srv = await startServer();
});

after(async () => {
  await srv?.stop();
});

async function readAll(s: ExecOutput): Promise<string[]> {
  const out: string[] = [];
  for (let l = await s.next(); l !== null; l = await s.next()) out.push(l);
  return out;
}

describe("JsBoxlite", () => {
  it("creates, execs with streams, stops, restarts on exec and removes, with BoxLite's spelling", async () => {
    const rt = JsBoxlite.withDefaultConfig();
    assert.equal(JsBoxlite.withDefaultConfig(), rt);
    const box = await rt.create({ env: [{ key: "USER", value: "alice" }], autoRemove: false, detach: true }, "bl-demo");
    try {
      assert.equal(box.name, "bl-demo");
      const first = await box.info();
      assert.equal(first.state.running, true);
      // Detached: no lease; no ttl or idle timeout either.
      assert.ok(!first.leaseUntil && !first.expiresAt && !first.idleDeadline && !first.idleTimeout && !first.idleAction, JSON.stringify(first.raw));
      const ex = await box.exec("sh", ["-c", "echo $USER; echo oops >&2; echo $FOO"], [["FOO", "bar"]]);
      assert.match(await ex.id(), /.+/);
      // stderr first: the streams are read in any order.
      assert.deepEqual(await readAll(await ex.stderr()), ["oops\n"]);
      assert.deepEqual(await readAll(await ex.stdout()), ["alice\n", "bar\n"]);
      await assert.rejects(ex.stdout(), /already called/);
      assert.deepEqual(await ex.wait(), { exitCode: 0, errorMessage: undefined, timedOut: false });

      const cat = await box.exec("cat");
      const stdin = await cat.stdin();
      await stdin.writeString("one\n");
      await stdin.write(Buffer.from("two"));
      await stdin.close();
      assert.deepEqual(await readAll(await cat.stdout()), ["one\n", "two"]);
      assert.equal((await cat.wait()).exitCode, 0);

      const sleeper = await box.exec("sleep", ["60"]);
      await sleeper.kill();
      assert.ok([137, 143].includes((await sleeper.wait()).exitCode));
      const timed = await box.exec("sleep", ["60"], null, false, null, 0.5);
      assert.equal((await timed.wait()).timedOut, true);

      const info = await rt.getInfo("bl-demo");
      assert.equal(info?.id, box.id);
      assert.ok((await rt.listInfo()).some((b) => b.id === box.id));
      assert.equal(await rt.get("no-such-box"), null);
      assert.equal(await rt.getInfo("no-such-box"), null);

      await box.stop(); // autoRemove: false keeps it
      assert.equal((await box.info()).state.status, "stopped");
      const again = await box.exec("echo", ["back"]); // starts it again, as BoxLite's does
      assert.deepEqual(await readAll(await again.stdout()), ["back\n"]);

      const err = await rt.remove("bl-demo").then(() => assert.fail("removed a running box"), (e: unknown) => e);
      assert.ok(err instanceof BoxliteError, `${err}`);
      assert.equal(err.status, 409);
      const m = await rt.metrics();
      assert.ok(m.totalCommandsExecuted >= 5 && m.numRunningBoxes >= 1 && m.boxesCreatedTotal >= 2, JSON.stringify(m));
      // box.metrics(): read on the server's host (GET /v1/boxes/{id}/stats, what `airlock stats` shows).
      const bm = await box.metrics();
      assert.ok(bm.memoryBytes > 0 && bm.memoryLimitBytes === (await box.info()).memoryMib * 1048576 && bm.cpuSeconds > 0 &&
        bm.cpuPercent >= 0 && bm.diskBytes >= 0 && !bm.paused && bm.raw.id === box.id, JSON.stringify(bm));
      assert.ok(bm.networkBytesSent !== undefined && bm.commandsExecutedTotal === undefined, JSON.stringify(bm));
      assert.equal(box.created, true, "rt.create made it");
      assert.equal((await rt.get("bl-demo"))?.created, false, "rt.get found it");
    } finally {
      await rt.remove("bl-demo", true).catch(() => undefined);
    }
    assert.equal(await rt.getInfo("bl-demo"), null);
  });

  it("exports every value of @boxlite-ai/boxlite's index", () => {
    // BoxLite's lib/index.ts value exports (types are checked by the compiler: SimpleBoxOptions, Credential, ...).
    const names = ["JsBoxlite", "ApiKeyCredential", "getNativeModule", "getJsBoxlite", "SimpleBox", "BoxliteError", "ExecError",
      "TimeoutError", "ParseError", "CodeBox", "BrowserBox", "ComputerBox", "InteractiveBox", "SkillBox", "COMPUTERBOX_IMAGE",
      "COMPUTERBOX_CPUS", "COMPUTERBOX_MEMORY_MIB", "COMPUTERBOX_DISPLAY_NUMBER", "COMPUTERBOX_DISPLAY_WIDTH",
      "COMPUTERBOX_DISPLAY_HEIGHT", "COMPUTERBOX_GUI_HTTP_PORT", "COMPUTERBOX_GUI_HTTPS_PORT", "DESKTOP_READY_TIMEOUT",
      "DESKTOP_READY_RETRY_DELAY", "BROWSERBOX_IMAGE_CHROMIUM", "BROWSERBOX_IMAGE_FIREFOX", "BROWSERBOX_IMAGE_WEBKIT",
      "BROWSERBOX_PORT_CHROMIUM", "BROWSERBOX_PORT_FIREFOX", "BROWSERBOX_PORT_WEBKIT", "DEFAULT_CPUS", "DEFAULT_MEMORY_MIB"];
    const mod = boxlite as Record<string, unknown>;
    assert.deepEqual(names.filter((n) => mod[n] === undefined), []);
    assert.equal(boxlite.getJsBoxlite(), JsBoxlite);
    for (const [make, re] of [
      [() => new boxlite.BrowserBox(), /SimpleBox/], [() => new boxlite.ComputerBox(), /SimpleBox/],
      [() => new boxlite.InteractiveBox(), /tty: true/], [() => new boxlite.SkillBox(), /CodeBox/],
      [() => boxlite.getNativeModule(), /airlock serve/],
    ] as [() => unknown, RegExp][]) {
      assert.throws(make, (e: unknown) => e instanceof NotImplementedError && re.test((e as Error).message));
    }
    const t = new boxlite.TimeoutError("slow");
    assert.ok(t instanceof BoxliteError && t.code === "timeout" && t.message.includes("slow"));
    assert.ok(new boxlite.ParseError("bad") instanceof BoxliteError);
    const cred: boxlite.Credential = { getToken: () => ({ token: "t", expiresAt: null }) };
    assert.equal(new BoxliteRestOptions({ url: "http://127.0.0.1:1", credential: cred }).credential?.getToken().token, "t");
    const opts: boxlite.SimpleBoxOptions = { image: "python:slim" };
    assert.equal(opts.image, "python:slim");
  });

  it("shows a box's lease deadline (not detached: the runtime renews it)", async () => {
    const rt = JsBoxlite.withDefaultConfig();
    const box = await rt.create({});
    try {
      const info = await box.info();
      assert.ok(info.leaseUntil && info.leaseUntil === info.raw.lease_until && !info.expiresAt, JSON.stringify(info.raw));
      assert.ok(Date.parse(info.leaseUntil) > Date.parse(info.createdAt), info.leaseUntil);
    } finally {
      await rt.remove(box.id, true);
    }
  });

  it("names what to use where airlock has no equivalent, and checks arguments before sending", async () => {
    const rt = JsBoxlite.withDefaultConfig();
    const cases: [Promise<unknown> | (() => unknown), RegExp][] = [
      [rt.create({ entrypoint: ["dockerd"] }), /box\.exec/],
      [rt.create({ rootfsPath: "/tmp/oci" }), /airlock image import/],
      [rt.create({ secrets: [{ name: "k", value: "v" }] }), /secrets: \{ NAME: \{ value, hosts \} \}/],
      [() => JsBoxlite.rest("http://127.0.0.1:1", null, "acme"), /one airlock serve per tenant/],
      [() => new JsBoxlite({ imageRegistries: [{ host: "r" }] }), /airlock login/],
      [() => rt.images, /airlock images/],
      [new SimpleBox({ entrypoint: ["x"] }).start(), /exec\(\) or stream\(\)/],
    ];
    for (const [c, re] of cases) {
      const err = await (typeof c === "function" ? Promise.resolve().then(c) : c).then(() => assert.fail(`${re} resolved`), (e: unknown) => e);
      assert.ok(err instanceof NotImplementedError, `${err}`);
      assert.match((err as Error).message, re);
    }
    await assert.rejects(rt.create({ cpus: "2" as unknown as number }), (e: unknown) => e instanceof TypeError && /cpus/.test(String(e)));
    await assert.rejects(rt.create({ network: { mode: "on" as "enabled" } }), /network mode/);
  });

  it("connects over REST with an ApiKeyCredential; a wrong key is 401", async () => {
    const rt = JsBoxlite.rest(srv.url, new ApiKeyCredential(srv.token));
    assert.ok(Array.isArray(await rt.listInfo()));
    const viaOpts = JsBoxlite.rest(new BoxliteRestOptions({ url: srv.url, credential: new ApiKeyCredential(srv.token) }));
    assert.ok(Array.isArray(await viaOpts.listInfo()));
    assert.equal(String(new ApiKeyCredential(srv.token)), "ApiKeyCredential(***)");
    const err = await JsBoxlite.rest(srv.url, new ApiKeyCredential("wrong")).listInfo().then(() => assert.fail("listed"), (e: unknown) => e);
    assert.ok(err instanceof BoxliteError && err.status === 401, `${err}`);
  });
});

describe("SimpleBox with BoxLite's options", () => {
  it("reuseExisting takes the named box; exec's positional form; created says which", async () => {
    const rt = JsBoxlite.withDefaultConfig();
    const opts = { name: "bl-reuse", reuseExisting: true, autoRemove: false, runtime: rt };
    try {
      const first = new SimpleBox(opts);
      assert.equal(first.created, null);
      const w = await first.exec("sh", ["-c", "echo kept > /root/f"], { X: "1" });
      assert.equal(w.exitCode, 0);
      assert.equal(first.created, true);
      const pwd = await first.exec("pwd", [], undefined, { cwd: "/tmp", timeoutSecs: 30 });
      assert.equal(pwd.stdout, "/tmp\n");
      await first.stop(); // autoRemove: false: stopped, kept

      const second = new SimpleBox(opts);
      const r = await second.exec("cat", "/root/f");
      assert.equal(r.stdout, "kept\n");
      assert.equal(second.created, false);
      assert.equal(await second.getId(), first.id ?? (await rt.getInfo("bl-reuse"))?.id);
      await second.stop();
    } finally {
      await rt.remove("bl-reuse", true).catch(() => undefined);
    }
  });
});

/** Events of box id from the server's stream (after since), until its box.removed; within 60 s. */
async function boxEvents(id: string, since: number): Promise<Event[]> {
  const it = Client.default().events({ since });
  const out: Event[] = [];
  const timer = setTimeout(() => void it.return(undefined), 60_000);
  try {
    for await (const ev of it) {
      if (ev.box_id !== id) continue;
      out.push(ev);
      if (ev.type === "box.removed") break;
    }
  } finally {
    clearTimeout(timer);
  }
  return out;
}

describe("Client.events", () => {
  it("gives a box's transitions in order, numbered; resumes after a seq", async () => {
    const rt = JsBoxlite.withDefaultConfig();
    const box = await rt.create({ detach: true });
    const ex = await box.exec("sh", ["-c", "exit 3"]);
    assert.equal((await ex.wait()).exitCode, 3);
    await rt.remove(box.id, true);
    const evs = await boxEvents(box.id, 0);
    assert.deepEqual(evs.map((e) => e.type), ["box.created", "box.started", "exec.started", "exec.ended", "box.removed"]);
    for (let i = 1; i < evs.length; i++) assert.ok(evs[i].seq > evs[i - 1].seq, JSON.stringify(evs));
    assert.equal(evs[3].exit_code, 3);
    assert.equal(evs[2].exec_id, evs[3].exec_id);
    const resumed = await boxEvents(box.id, evs[1].seq);
    assert.deepEqual(resumed.map((e) => e.seq), evs.slice(2).map((e) => e.seq));
  });
});

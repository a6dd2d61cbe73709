// Errors name the field: the SDK refuses a bad argument before sending
// (TypeError, or RangeError for a value out of range, naming the
// parameter), and a 400 from the server rejects with an AirlockError whose
// message, `errors` and `fields` name each bad field by JSON pointer. None
// of these boot a box.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { AirlockError, Client, CodeBox, SimpleBox, type BoxOptions } from "@airlock-run/sdk";

import { startServer, type TestServer } from "./server.js";

let srv: TestServer;

before(async () => {
  srv = await startServer();
});

after(async () => {
  await srv?.stop();
});

// A client that points nowhere: a check that let a call through would fail
// otherwise (no server), not with the parameter's name.
const nowhere = () => new Client({ endpoint: { url: "http://127.0.0.1:1" } });

describe("arguments are checked before sending", () => {
  const cases: [BoxOptions, ErrorConstructor, string][] = [
    [{ memoryMib: "512" as unknown as number }, TypeError, "memoryMib must be an integer"],
    [{ cpus: 0 }, RangeError, "cpus = 0"],
    [{ image: 3 as unknown as string }, TypeError, "image must be a string"],
    [{ idleTimeout: -1 }, RangeError, "idleTimeout = -1"],
    [{ allowNet: "api.example.com" as unknown as string[] }, TypeError, "allowNet must be an array"],
    [{ allowHostPorts: ["8080"] as unknown as number[] }, TypeError, "allowHostPorts[0] must be an integer"],
    [{ labels: { tier: 1 } as unknown as Record<string, string> }, TypeError, "labels.tier must be a string"],
    [{ autoRemove: "yes" as unknown as boolean }, TypeError, "autoRemove must be a boolean"],
    [{ env: "A=1" as unknown as string[] }, TypeError, "env:"],
    [{ env: [["USER", 1]] as unknown as string[] }, TypeError, "env[0]"],
    [{ env: ["NOEQUALS"] }, RangeError, "env[0]"],
    [{ env: { "A=B": "c" } }, RangeError, "env.A=B"],
  ];
  for (const [o, E, words] of cases) {
    it(`box options ${JSON.stringify(o)}`, () => {
      assert.throws(() => new SimpleBox({ ...o, client: nowhere() }), (e: unknown) => e instanceof E && (e as Error).message.includes(words),
        `want ${E.name} naming ${words}`);
    });
  }

  it("env takes an object, KEY=value, BoxLite's pairs and {key, value}", () => {
    for (const env of [{ USER: "alice" }, ["USER=alice"], [["USER", "alice"]], [{ key: "USER", value: "alice" }]] as BoxOptions["env"][]) {
      const b = new SimpleBox({ env, client: nowhere() });
      assert.deepEqual((b as unknown as { spec: { env: string[] } }).spec.env, ["USER=alice"]);
    }
  });

  const calls: [string, (b: CodeBox) => Promise<unknown>, ErrorConstructor, string][] = [
    ["exec cmd", (b) => b.exec(3 as unknown as string), TypeError, "cmd must be a non-empty string"],
    ["exec args", (b) => b.exec("ls", 1 as unknown as string), TypeError, "args[0] must be a string"],
    ["exec timeout", (b) => b.exec("ls", { timeout: "5" as unknown as number }), TypeError, "timeout must be a number"],
    ["exec negative timeout", (b) => b.exec("ls", { timeout: -1 }), RangeError, "timeout = -1"],
    ["exec cwd", (b) => b.exec("ls", { cwd: 1 as unknown as string }), TypeError, "cwd must be a string"],
    ["exec env", (b) => b.exec("ls", { env: [["A", null]] as unknown as string[] }), TypeError, "env[0]"],
    ["run code", (b) => b.run(Buffer.from("1") as unknown as string), TypeError, "code must be a string"],
    ["run timeout", (b) => b.run("1", { timeout: "x" as unknown as number }), TypeError, "timeout must be a number"],
    ["installPackages", (b) => b.installPackages("numpy", 3 as unknown as string), TypeError, "packages[1] must be a string"],
  ];
  for (const [name, call, E, words] of calls) {
    it(name, async () => {
      const b = new CodeBox({ client: nowhere() });
      await assert.rejects(call(b), (e: unknown) => e instanceof E && (e as Error).message.includes(words), `want ${E.name} naming ${words}`);
    });
  }

  it("stream", () => {
    const b = new SimpleBox({ client: nowhere() });
    assert.throws(() => b.stream("ls", 1 as unknown as string), /args\[0\] must be a string/);
    assert.throws(() => b.stream("sh", { tty: true, rows: "24" as unknown as number }), /rows must be an integer/);
  });
});

describe("the server's 400 names the fields", () => {
  it("a create under the server's minimum", async () => {
    const err = await new SimpleBox({ memoryMib: 8 }).start().then(() => assert.fail("started"), (e: unknown) => e);
    assert.ok(err instanceof AirlockError, `${err}`);
    assert.equal(err.status, 400);
    assert.equal(err.code, "invalid_request");
    assert.deepEqual(err.fields, ["/memory_mib"]);
    assert.match(err.errors[0].message, /at least 64/);
    assert.match(err.message, /\/memory_mib/);
  });

  it("a body the SDK would not send, straight to the API", async () => {
    const err = await Client.default().request("POST", "/v1/boxes", { env: [["USER", "alice"]], cpus: 100 })
      .then(() => assert.fail("created"), (e: unknown) => e);
    assert.ok(err instanceof AirlockError, `${err}`);
    assert.equal(err.status, 400);
    assert.deepEqual([...err.fields].sort(), ["/cpus", "/env/0"]);
    assert.match(err.message, /\/env\/0/);
    assert.ok(err.errors.every((e) => e.location && e.message), JSON.stringify(err.errors));
  });

  it("a parameter by its name", async () => {
    const err = await Client.default().request("GET", "/v1/events?since=abc").then(() => assert.fail("answered"), (e: unknown) => e);
    assert.ok(err instanceof AirlockError && err.status === 400, `${err}`);
    assert.deepEqual(err.fields, ["since"]);
  });

  it("an unknown route and a wrong method are problems too", async () => {
    const c = Client.default();
    const nf = await c.request("GET", "/v1/no/such/route").then(() => assert.fail("answered"), (e: unknown) => e);
    assert.ok(nf instanceof AirlockError && nf.status === 404 && nf.code === "not_found", `${nf}`);
    assert.deepEqual(nf.errors, []);
    const na = await c.request("PATCH", "/v1/boxes").then(() => assert.fail("answered"), (e: unknown) => e);
    assert.ok(na instanceof AirlockError && na.status === 405 && na.code === "method_not_allowed", `${na}`);
  });
});

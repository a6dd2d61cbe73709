// airlock's JavaScript code context (internal/e2b/js.go): one node process
// in the box, each cell run in it, so declarations, globals and required
// modules carry over from cell to cell, as in node's REPL.
//
// In (stdin): "LENGTH\n" then LENGTH bytes of UTF-8: the cell's code.
// Out: the cell's output on stdout and stderr as it prints it; then the
// cell's outcome, {"value": TEXT} or {"error": {name, value, traceback}}
// or {}, written to the file $AIRLOCK_JS_RESULT; then an end line
// "$AIRLOCK_JS_TOKEN STATUS\n" on stdout (STATUS 1 when the cell threw)
// and "$AIRLOCK_JS_TOKEN 0\n" on stderr.
//
// The value is the completion value of the cell's last statement (as
// eval gives it), awaited when it is a promise; strings as they are,
// other values as util.inspect shows them; undefined is no value. A cell
// with a top-level await runs as the body of an async function: its
// value is what it returns, its declarations are its own.
(function () {
  const vm = require("vm");
  const util = require("util");
  const fs = require("fs");
  const token = process.env.AIRLOCK_JS_TOKEN;
  const resultFile = process.env.AIRLOCK_JS_RESULT;
  delete process.env.AIRLOCK_JS_TOKEN;
  delete process.env.AIRLOCK_JS_RESULT;
  globalThis.require = require;

  let buf = Buffer.alloc(0);
  let busy = false;
  let count = 0;

  function pump() {
    if (busy) return;
    const nl = buf.indexOf(10);
    if (nl < 0) return;
    const len = parseInt(buf.subarray(0, nl).toString(), 10);
    if (!(len >= 0) || buf.length < nl + 1 + len) return;
    const code = buf.subarray(nl + 1, nl + 1 + len).toString("utf8");
    buf = buf.subarray(nl + 1 + len);
    busy = true;
    cell(code).finally(() => {
      busy = false;
      pump();
    });
  }

  function text(v) {
    return typeof v === "string" ? v : util.inspect(v);
  }

  async function cell(code) {
    count++;
    const filename = "<cell-" + count + ">";
    const out = {};
    try {
      let v;
      try {
        v = vm.runInThisContext(code, { filename });
      } catch (e) {
        if (!(e instanceof SyntaxError) || !/await/.test(String(e.message))) throw e;
        v = await vm.runInThisContext("(async () => {\n" + code + "\n})()", { filename });
      }
      if (v !== null && typeof v === "object" && typeof v.then === "function") v = await v;
      if (v !== undefined) out.value = text(v);
    } catch (e) {
      const isErr = e instanceof Error;
      out.error = {
        name: isErr ? e.name : "Error",
        value: isErr ? String(e.message) : text(e),
        traceback: isErr && e.stack ? String(e.stack) : text(e),
      };
    }
    try {
      fs.writeFileSync(resultFile, JSON.stringify(out));
    } catch (e) {
      process.stderr.write("airlock: the cell's result was lost: " + e + "\n");
    }
    process.stdout.write(token + " " + (out.error ? 1 : 0) + "\n");
    process.stderr.write(token + " 0\n");
  }

  // What a callback throws after its cell ended is reported, and the
  // context lives on.
  process.on("uncaughtException", (e) => process.stderr.write("Uncaught " + ((e && e.stack) || e) + "\n"));
  process.on("unhandledRejection", (e) => process.stderr.write("Unhandled rejection " + ((e && e.stack) || e) + "\n"));

  process.stdin.on("data", (d) => {
    buf = Buffer.concat([buf, d]);
    pump();
  });
  process.stdin.on("end", () => process.exit(0));
})();

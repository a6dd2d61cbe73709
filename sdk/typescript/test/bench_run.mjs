// Benchmark helper for internal/server's BenchmarkNodeSDKRun (not a test):
// for each line on stdin, time one `await box.run("print(1)")` ("run") on
// the existing box named by argv[2], or one SDK request GET /v1/health
// ("health"), and print the seconds it took. The server is AIRLOCK_URL or
// AIRLOCK_SOCKET, as for any SDK user. Needs a build (npm run build).
import { createInterface } from "node:readline";
import { Client, CodeBox } from "../dist/index.js";

const box = CodeBox.attach(process.argv[2]);
const client = Client.default();
for await (const line of createInterface({ input: process.stdin })) {
  const t0 = performance.now();
  if (line === "health") {
    await client.request("GET", "/v1/health");
  } else {
    const out = await box.run("print(1)");
    if (out !== "1\n") throw new Error(`run returned ${JSON.stringify(out)}`);
  }
  const dt = performance.now() - t0;
  process.stdout.write(`${(dt / 1000).toFixed(6)}\n`);
}

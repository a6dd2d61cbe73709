/**
 * airlock: run untrusted, model-written code in QEMU microVMs.
 *
 * The seed documents' Node API:
 *
 *     import { CodeBox, ExecError } from "@airlock-run/sdk";
 *
 *     const cb = new CodeBox(); // default image "python:slim"
 *     try {
 *       console.log(await cb.run("print('Hello from Node + microVM!')"));
 *     } finally {
 *       await cb.stop();
 *     }
 *
 * The SDK talks to `airlock serve` over its unix socket (`AIRLOCK_SOCKET`,
 * default `~/.airlock/airlock.sock`) or over TCP (`AIRLOCK_URL` and
 * `AIRLOCK_TOKEN`). With no server running it starts `airlock serve` itself
 * (`airlock` on PATH, or `AIRLOCK_BIN`); that server exits after 5 minutes
 * with no request and no running box.
 *
 * @module
 */

export {
  CodeBox, Context, DEFAULT_IMAGE, ExecError, ExecStream, MAX_FORK, SimpleBox,
  type BoxInfo, type BoxOptions, type CellError, type CellResult, type CodeBoxOptions, type Env,
  type ExecOptions, type ExecResult, type OutputChunk, type PortMapping, type PublishedPort, type RunOptions, type Secret,
} from "./box.js";
export {
  AirlockError, Client, DEFAULT_IDLE_EXIT, SERVER_START_TIMEOUT_MS, defaultHome, defaultSocket, endpointFromEnv,
  type ClientOptions, type Endpoint, type Problem,
} from "./client.js";
export { type FileInfo } from "./files.js";
export { type Checkpoint, type Snapshot } from "./snapshots.js";
export type { components, paths, operations } from "./openapi.js";
/** An event of {@link Client.events}. */
export type Event = import("./openapi.js").components["schemas"]["Event"];
export {
  ApiKeyCredential, Box, Boxlite, BoxliteError, BoxliteRestOptions, EXECUTION_MAX_UNREAD, Execution, JsBoxlite, NotImplementedError,
  type AccessToken, type CopyOptions, type ExecOutput, type ExecStdin, type ExecWaitResult, type JsBoxInfo, type JsBoxOptions,
  type JsOptions, type JsRuntimeMetrics,
} from "./boxlite.js";

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
  type ClientOptions, type Endpoint, type FieldError, type Problem,
} from "./client.js";
export { type FileInfo } from "./files.js";
export { type Checkpoint, type Snapshot } from "./snapshots.js";
export type { components, paths, operations } from "./openapi.js";
/** An event of {@link Client.events}. */
export type Event = import("./openapi.js").components["schemas"]["Event"];
export {
  ApiKeyCredential, Box, Boxlite, BoxliteError, BoxliteRestOptions, EXECUTION_MAX_UNREAD, Execution, JsBoxlite, NotImplementedError,
  type AccessToken, type CopyOptions, type ExecOutput, type ExecStdin, type ExecWaitResult, type JsBoxInfo, type JsBoxOptions,
  type JsBoxMetrics, type JsOptions, type JsRuntimeMetrics,
} from "./boxlite.js";
// BoxLite's other exports: errors for its spelling, specialized boxes that
// throw NotImplementedError naming what to use, its loader and constants.
export {
  BROWSERBOX_IMAGE_CHROMIUM, BROWSERBOX_IMAGE_FIREFOX, BROWSERBOX_IMAGE_WEBKIT, BROWSERBOX_PORT_CHROMIUM, BROWSERBOX_PORT_FIREFOX,
  BROWSERBOX_PORT_WEBKIT, BrowserBox, COMPUTERBOX_CPUS, COMPUTERBOX_DISPLAY_HEIGHT, COMPUTERBOX_DISPLAY_NUMBER,
  COMPUTERBOX_DISPLAY_WIDTH, COMPUTERBOX_GUI_HTTPS_PORT, COMPUTERBOX_GUI_HTTP_PORT, COMPUTERBOX_IMAGE, COMPUTERBOX_MEMORY_MIB,
  ComputerBox, DEFAULT_CPUS, DEFAULT_MEMORY_MIB, DESKTOP_READY_RETRY_DELAY, DESKTOP_READY_TIMEOUT, InteractiveBox, ParseError,
  SkillBox, TimeoutError, getJsBoxlite, getNativeModule,
  type BrowserBoxOptions, type BrowserType, type ComputerBoxOptions, type Credential, type ImageHandle, type ImageInfo,
  type ImagePullResult, type InteractiveBoxOptions, type JsImageRegistry, type JsImageRegistryAuth, type NetworkSpec,
  type Screenshot, type SecurityOptions, type SimpleBoxOptions, type SkillBoxOptions,
} from "./boxlite.js";

// Fails when src/openapi.ts is not what openapi-typescript makes from the
// committed api/openapi.json (run `npm run gen` to refresh it). Run by
// hack/test.sh; needs the repository's api/openapi.json, which the package
// itself does not (it builds from the committed src/openapi.ts).
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const spec = path.resolve(pkg, "../../api/openapi.json");
const tmp = mkdtempSync(path.join(os.tmpdir(), "airlock-openapi-"));
try {
  const out = path.join(tmp, "openapi.ts");
  execFileSync(path.join(pkg, "node_modules/.bin/openapi-typescript"), [spec, "-o", out], { stdio: ["ignore", "ignore", "inherit"] });
  const want = readFileSync(out, "utf8");
  const have = readFileSync(path.join(pkg, "src/openapi.ts"), "utf8");
  if (want !== have) {
    console.error("sdk/typescript/src/openapi.ts is stale: api/openapi.json changed. Run `npm run gen` in sdk/typescript and commit the result.");
    process.exit(1);
  }
  console.log("src/openapi.ts matches api/openapi.json");
} finally {
  rmSync(tmp, { recursive: true, force: true });
}

// Argument checks run before anything is sent: a value of the wrong type
// throws TypeError, one out of range RangeError (JavaScript's ValueError),
// each naming the parameter, so that a mistake is told where it was made
// rather than as the server's 400.

/** `v` unless undefined/null; TypeError naming `name` when it is not a string. */
export function checkString(name: string, v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw new TypeError(`${name} must be a string, got ${describe(v)}`);
  return v;
}

/** `v` unless undefined/null; TypeError unless an integer, RangeError unless at least `min`. */
export function checkInt(name: string, v: unknown, min: number): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v)) throw new TypeError(`${name} must be an integer, got ${describe(v)}`);
  if (v < min) throw new RangeError(`${name} = ${v}: must be at least ${min}`);
  return v;
}

/** `v` unless undefined/null; TypeError unless a finite number, RangeError when negative. */
export function checkSeconds(name: string, v: unknown): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new TypeError(`${name} must be a number of seconds, got ${describe(v)}`);
  if (v < 0) throw new RangeError(`${name} = ${v}: must be >= 0`);
  return v;
}

/** `v` unless undefined/null; TypeError unless a boolean. */
export function checkBool(name: string, v: unknown): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw new TypeError(`${name} must be a boolean, got ${describe(v)}`);
  return v;
}

/** `v` unless undefined/null; TypeError naming `name[i]` unless an array of `what` (a lone string is not). */
export function checkArray<T>(name: string, v: unknown, what: "string" | "integer"): T[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw new TypeError(`${name} must be an array of ${what}s, got ${describe(v)}`);
  v.forEach((it, i) => {
    if (what === "string" ? typeof it !== "string" : typeof it !== "number" || !Number.isInteger(it)) {
      throw new TypeError(`${name}[${i}] must be a${what === "integer" ? "n" : ""} ${what}, got ${describe(it)}`);
    }
  });
  return v as T[];
}

/** `v` unless undefined/null; TypeError naming `name.key` unless an object of strings. */
export function checkStringMap(name: string, v: unknown): Record<string, string> | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "object" || Array.isArray(v)) throw new TypeError(`${name} must be an object of strings, got ${describe(v)}`);
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== "string") throw new TypeError(`${name}.${k} must be a string, got ${describe(x)}`);
  }
  return v as Record<string, string>;
}

/**
 * An environment as the API takes it, `["KEY=value", ...]`, from an object
 * `{KEY: "value"}`, a list of `"KEY=value"`, or BoxLite's `[key, value]`
 * pairs and `{key, value}` entries. TypeError naming `name` (or
 * `name[i]`) otherwise; a variable name that is empty or holds `=` is a
 * RangeError.
 */
export function envList(name: string, env: unknown): string[] | undefined {
  if (env === undefined || env === null) return undefined;
  const want = `want {KEY: "value"}, ["KEY=value"], [[key, value]] or [{key, value}]`;
  const out: string[] = [];
  const pair = (where: string, k: unknown, v: unknown): void => {
    if (typeof k !== "string" || typeof v !== "string") {
      throw new TypeError(`${where}: key and value must be strings, got ${describe(k)} and ${describe(v)}`);
    }
    if (!k || k.includes("=")) throw new RangeError(`${where}: variable name ${JSON.stringify(k)} must be non-empty and hold no "="`);
    out.push(`${k}=${v}`);
  };
  if (Array.isArray(env)) {
    env.forEach((e: unknown, i) => {
      const where = `${name}[${i}]`;
      if (typeof e === "string") {
        if (e.indexOf("=") < 1) throw new RangeError(`${where} = ${JSON.stringify(e)}: want "KEY=value"`);
        out.push(e);
      } else if (Array.isArray(e) && e.length === 2) {
        pair(where, e[0], e[1]);
      } else if (e !== null && typeof e === "object" && "key" in e) {
        pair(where, (e as { key: unknown }).key, (e as { value?: unknown }).value);
      } else {
        throw new TypeError(`${where}: ${want}, got ${describe(e)}`);
      }
    });
  } else if (typeof env === "object") {
    for (const [k, v] of Object.entries(env)) pair(`${name}.${k}`, k, v);
  } else {
    throw new TypeError(`${name}: ${want}, got ${describe(env)}`);
  }
  return out;
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? v.slice(0, 40) + "..." : v);
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  return typeof v;
}

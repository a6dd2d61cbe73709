import { CodeBox, ExecError } from "@airlock-run/sdk";

async function main(): Promise<void> {
  const cb = new CodeBox(); // default image "python:slim"
  try {
    const output = await cb.run("print('Hello from Node + microVM!')");
    console.log(output);
  } catch (err) {
    if (err instanceof ExecError) {
      console.error(`Python execution failed exitCode=${err.exitCode}: ${err.stderr}`);
    } else {
      console.error(`CodeBox failed to start: ${err}`);
    }
  } finally {
    await cb.stop();
  }
}

main();

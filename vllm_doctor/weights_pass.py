"""The weights pass, wired into :func:`vllm_doctor.runner.diagnose` by one call.

:func:`add_weight_facts` runs in the fast pass: it reads the safetensors headers (milliseconds,
no tensor data) into ``facts.checkpoint`` and, unless ``--fast``, starts the meta-device load
(probes/weight_probe.py) in a child process that runs *while* the import pass runs. The VD301-
VD304 checks collect its result through :func:`weight_load`, which waits for the child once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from vllm_doctor.facts import Facts
from vllm_doctor.probes.safetensors_header import read_checkpoint
from vllm_doctor.probes.weight_probe import start_weight_probe

LOAD_CODES = ("VD301", "VD302", "VD303", "VD304")
WEIGHT_CODES = (*LOAD_CODES, "VD305", "VD306", "VD307", "VD308")


def add_weight_facts(facts: Facts, options: Any, codes: Iterable[str], say: Callable[[str], None] | None = None) -> None:
    """Headers now; the meta-device load started in the background when a VD301-VD304 check wants it."""
    codes = set(codes)
    facts.tensor_parallel_size = int(getattr(options, "tensor_parallel_size", 1) or 1)
    if not codes & set(WEIGHT_CODES):
        return
    facts.checkpoint = read_checkpoint(facts.model_dir)
    if not codes & set(LOAD_CODES):
        return
    if getattr(options, "fast", False):
        facts.weight_load_error = "skipped by --fast (the weights pass imports vLLM)"
        return
    checkpoint = facts.checkpoint
    if checkpoint.format != "safetensors":
        facts.weight_load_error = (
            f"no safetensors checkpoint in the model directory (found: {checkpoint.format}); "
            "vllm-doctor reads safetensors headers only, never pickled .bin/.pt files"
        )
        return
    tensors = checkpoint.tensors
    if not tensors:
        facts.weight_load_error = "no checkpoint file could be read (see VD306/VD308)"
        return
    request = {
        "model_dir": facts.model_dir,
        "architectures": facts.architectures,
        "trust_remote_code": facts.trust_remote_code,
        # a path escapes the model dir: vLLM's config code must not read checkpoint headers either
        "paths_escape": any(p.kind in ("file-outside-dir", "index-path-outside-dir") for p in checkpoint.problems),
        "tensors": [{"name": t.name, "shape": t.shape, "dtype": t.dtype} for t in tensors],
    }
    timeout = float(getattr(options, "import_timeout", 180.0))
    facts.weight_job = start_weight_probe(request, timeout=timeout)
    if say is not None:
        say(f"weights pass: {len(tensors)} tensors from {len(checkpoint.files)} file(s) headers; "
            "building the model on the meta device in a fresh process ...")


def weight_load(facts: Facts) -> dict[str, Any] | None:
    """The meta-device load's result (waits for the child once); None with facts.weight_load_error set."""
    if facts.weight_load is None and facts.weight_job is not None:
        res = facts.weight_job.result()
        facts.weight_job = None
        facts.weight_load_seconds = round(res.seconds, 3)
        if res.ok:
            facts.weight_load = res.data
            err = res.data.get("error")
            if err:
                stage = {
                    "import": "importing vLLM",
                    "config": "building vLLM's config for this model directory",
                    "build": "building the model class on the meta device",
                    "load": "driving load_weights",
                    "internal": "the weights pass itself",
                }.get(err.get("stage"), err.get("stage"))
                facts.weight_load_error = f"failed while {stage}: {_short(str(err.get('summary')))}"
        else:
            tail = res.log_tail.strip().splitlines()[-3:]
            facts.weight_load_error = (res.error or "the weights pass failed") + ("\n" + "\n".join(tail) if tail else "")
    return facts.weight_load


def _short(summary: str, limit: int = 600) -> str:
    """The informative line of an error: pydantic wraps vLLM's own message in `Value error, ...`."""
    lines = [line.strip() for line in summary.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Value error, "):
            return f"{lines[0]}: {line[len('Value error, '):].split(' [type=')[0]}"[:limit]
    return " ".join(lines)[:limit]


def load_usable(facts: Facts) -> dict[str, Any] | None:
    """The load result only when the model was built and load_weights was driven."""
    data = weight_load(facts)
    if data is None or data.get("error") or "tensors" not in data:
        return None
    return data


def weights_report(facts: Facts) -> dict[str, Any] | None:
    """report.facts["weights"]: the checkpoint as read, and the full tensor -> parameter mapping."""
    if facts.checkpoint is None:
        return None
    out: dict[str, Any] = {
        "checkpoint": facts.checkpoint.to_dict(),
        "tensor_parallel_size": facts.tensor_parallel_size,
    }
    data = weight_load(facts) if facts.weight_job is not None or facts.weight_load is not None else None
    if facts.weight_load_error:
        out["load_error"] = facts.weight_load_error
    if data is not None:
        out["model"] = data.get("model")
        out["timings"] = {**data.get("timings", {}), "probe_wall_s": facts.weight_load_seconds}
        if "tensors" in data:
            out["load_weights"] = data.get("load_weights")
            out["mapping"] = {
                name: {
                    "status": t["status"],
                    "params": t["params"],
                    "shards": sorted({str(h["shard"]) for h in t.get("handed_to", []) if h.get("shard") is not None}),
                    "shape": t["shape"],
                    "dtype": t["dtype"],
                    **({"error": t["errors"][0]["error"]} if t.get("errors") else {}),
                    **({"looked_up": t["errors"][0].get("looked_up")} if t.get("errors") and t["errors"][0].get("looked_up") else {}),
                }
                for name, t in data["tensors"].items()
            }
            out["params"] = {
                name: {k: p[k] for k in ("shape", "dtype", "written", "covered", "numel", "sources", "shards_expected", "shards_missing", "loader", "in_returned", "vllm_exempt")}
                for name, p in data["params"].items()
            }
            if data.get("tracer_errors"):
                out["tracer_errors"] = data["tracer_errors"]
    return out

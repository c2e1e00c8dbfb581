"""Do the profiler's step times add up to the workload's wall time? (one clock check per mode)

    python bench/bench_clock.py MODEL_DIR [--modes default,eager,eager+mp] [--prompts 128 --input-len 128
        --output-len 256] [--engine-arg load_format=dummy ...]

For each mode it runs ``vllm-doctor profile`` (a fresh engine: vLLM's default mode, or
``--eager``; ``+mp``: with ``--multiprocess``, the engine core in its own process as ``vllm serve``
runs it) and prints a markdown table: the workload's wall time around ``llm.generate``, the
sum of the step times the report gives (steps x mean, per phase, on the clock the report names:
CUDA events on GPU, the wall clock on CPU), their ratio, the mean decode step and forward, the
share of the sampled forwards the per-layer timings account for, and the decode roofline line
when the report has one; and the device's idle time between steps (on the step clock, from one
step's end mark to the next one's start) with the share of the wall the steps and that idle time
account for together (the rest ran before the first step and after the last). A sum above the wall time is impossible (steps of one engine do not
overlap): the step clock is wrong. Well below it: time outside the steps (the scheduler, output
processing, or a host that cannot keep the device busy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def run_mode(model: str, mode: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "vllm_doctor", "profile", model, "--out", str(out), "-q",
        "--prompts", str(args.prompts), "--input-len", str(args.input_len), "--output-len", str(args.output_len),
        "--max-model-len", str(args.max_model_len),
    ]  # fmt: skip
    if args.images is not None:
        cmd += ["--images", str(args.images)]
    for extra in args.engine_arg:
        cmd += ["--engine-arg", extra]
    parts = mode.split("+")  # "eager", "default", and "+mp": the engine core in its own process, as served
    if "eager" in parts:
        cmd.append("--eager")
    if "mp" in parts:
        cmd.append("--multiprocess")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode not in (0, 1) or not (out / "report.json").is_file():
        raise SystemExit(f"{mode}: vllm-doctor profile exited {proc.returncode}\n{proc.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    return {"mode": mode, "report": report, "text": proc.stdout}


def row(result: dict[str, Any]) -> str:
    report = result["report"]
    engine = report["profiles"]["engine"]
    workload = report["profiles"].get("workload") or {}
    phases = engine.get("phases") or {}
    total = sum(p["steps"] * p["step_s_mean"] for p in phases.values())
    wall = workload.get("wall_s") or 0.0
    decode = phases.get("decode") or {}
    layers = engine.get("layers") or {}
    frac = layers.get("timed_fraction")
    roof = ((engine.get("roofline") or {}).get("phases") or {}).get("decode") or {}
    share = roof.get("bandwidth_share")
    gaps = engine.get("idle_between_steps") or {}
    idle = gaps.get("total_s")
    idle_text = "n/a" if idle is None else f"{idle:.3f} s ({1e3 * gaps['mean_s']:.2f} ms/step)"
    both = "n/a" if idle is None else f"{100 * (total + idle) / wall:.1f} %"
    acc = engine.get("time_accounting") or {}
    if acc.get("measured_share") is not None:  # the edges measured too, on the host's clock
        both += (f" (+ {1e3 * acc['before_first_s']:.0f} ms before the first step, {1e3 * acc['after_last_s']:.0f} ms"
                 f" after the last: {100 * acc['measured_share']:.1f} %)")  # fmt: skip
    return (
        f"| {result['mode']} | {engine.get('clock')} | {wall:.3f} s | {total:.3f} s | "
        f"{100 * total / wall:.1f} % | {idle_text} | {both} | {1e3 * (decode.get('step_s_mean') or 0):.2f} ms | "
        f"{1e3 * (decode.get('forward_s_mean') or 0):.2f} ms | "
        f"{'n/a' if frac is None else f'{100 * frac:.0f} %'} | {'n/a' if share is None else f'{100 * share:.0f} %'} |"
    )


def encoder_row(result: dict[str, Any]) -> str:
    """One line per phase that ran the encoder; '' for a text model."""
    phases = result["report"]["profiles"]["engine"].get("phases") or {}
    total = sum(p["steps"] * p["step_s_mean"] for p in phases.values())
    lines = []
    for name, p in phases.items():
        enc, steps_s = p.get("encoder_s"), p.get("encoder_step_s")
        if not p.get("encoder_steps") or enc is None or not steps_s:
            continue
        lines.append(
            f"| {result['mode']} | {name} | {p['encoder_steps']} | {enc:.3f} s | {steps_s:.3f} s | "
            f"{100 * enc / steps_s:.1f} % | {100 * enc / total:.1f} % |"
        )
    return "\n".join(lines)


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def observer_row(result: dict[str, Any]) -> str:
    """Decode steps by how the doctor timed them, on the step clock: per layer with the finer
    split (``layers_detail``), per layer at the layers' boundaries only, and not per layer; each
    group's median and its difference from the untimed steps' (the doctor's observer effect)."""
    steps = [s for s in result["report"]["profiles"]["engine"].get("steps") or [] if s.get("phase") == "decode"]
    groups = {
        "detail": [s["step_s"] for s in steps if s.get("layers_timed") and s.get("layers_detail", True)],
        "boundaries": [s["step_s"] for s in steps if s.get("layers_timed") and not s.get("layers_detail", True)],
        "untimed": [s["step_s"] for s in steps if not s.get("layers_timed")],
    }
    base = _median(groups["untimed"])
    cells = []
    for name in ("detail", "boundaries", "untimed"):
        med = _median(groups[name])
        if med is None:
            cells.append("n/a")
            continue
        diff = "" if name == "untimed" or not base else f" ({100 * (med / base - 1):+.1f} %)"
        cells.append(f"{len(groups[name])} × {1e3 * med:.2f} ms{diff}")
    engine = result["report"]["profiles"]["engine"]
    decode = (engine.get("phases") or {}).get("decode") or {}
    near, near_detail = decode.get("timed_vs_neighbours"), decode.get("detail_vs_neighbours")
    cells.append(
        "n/a"
        if near is None
        else f"{100 * near:+.1f} %" + ("" if near_detail is None else f" / {100 * near_detail:+.1f} %")
    )
    cost = next((c for c in (engine.get("layers") or {}).get("doctor_cost") or [] if c.get("bucket") == "decode"), None)

    def per_mark(key: str, marks: str) -> str:
        value = (cost or {}).get(key)
        return "n/a" if value is None else f"{1e6 * value:.1f} µs × {cost[marks]}"  # type: ignore[index]

    cells.append(f"{per_mark('per_mark_s', 'boundary_marks')} / {per_mark('detail_per_mark_s', 'detail_marks')}")
    return f"| {result['mode']} | " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--modes", default="default,eager")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--engine-arg", action="append", default=[])
    ap.add_argument("--images", type=int, help="images per prompt (a multimodal model; profile's default: 1)")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--keep", metavar="DIR", help="keep each mode's report directory under DIR")
    args = ap.parse_args()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-clock-"))
    results = [run_mode(args.model, mode, args, base / mode) for mode in args.modes.split(",")]
    print(f"command: python bench/bench_clock.py {' '.join(sys.argv[1:])}")
    print("| mode | step clock | workload wall | steps x mean | ratio | device idle between steps | steps + idle | "
          "decode step | decode forward | per-layer share of forward | decode bandwidth share |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        print(row(result))
    print("\nDecode steps by how they were timed (median step time on the step clock; vs the untimed steps):\n")
    print(
        "| mode | per layer, inside the layers too | per layer, the layers' boundaries | not per layer "
        "| against untimed neighbours (all timed / inside too) | a mark's cost (boundary / detailed step) |"
    )
    print("|---|---|---|---|---|---|")
    for result in results:
        print(observer_row(result))
    encoder = [encoder_row(result) for result in results]
    if any(encoder):
        print("\nA multimodal model's encoder (embed_multimodal: vision tower + projector), on the step clock:\n")
        print(
            "| mode | phase | steps that ran it | encoder | those steps in all | encoder share of them | of all step time |"
        )
        print("|---|---|---|---|---|---|---|")
        print("\n".join(line for line in encoder if line))
    for result in results:
        print(f"\n== {result['mode']}\n{result['text']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

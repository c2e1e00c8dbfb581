"""What the doctor costs while attached: decode throughput, one engine, side by side.

    python bench/bench_engine.py [MODEL_DIR] [--prompts 8 --input-len 16 --output-len 64 --repeats 3]

Runs the same greedy workload (fixed lengths, ignore_eos) on ONE engine in five modes,
``--repeats`` rounds (the order of the modes rotates every round so drift hits all alike), and
prints a markdown table of output tokens/s and the slowdown against the plain engine:

  none              the engine as the user built it (the doctor's extension mixed in, idle)
  per-step          attach(llm, layers=False, probe=False): step wrappers (+ forward and
                    logits timing on the sampled steps)
  per-layer         attach(llm, probe=False): + per-layer timing, sampled (the default: first
                    8 steps of each phase, then every 8th)
  per-layer, all    attach(llm, probe=False, sample_every=1): every step timed per layer
  top               attach(llm, probe=False, sample_every=64): what ``vllm-doctor top``'s model
                    panel attaches (per-layer timing on every 64th step of a phase)
  torch-prof        vLLM's own torch profiler (llm.start_profile / stop_profile), no doctor

"vs none" is the median over rounds of (mode / none of the same round) - 1, with its range: a
paired comparison, steadier than comparing medians. "doctor cost" is the doctor's own host time
per step, measured inside its wrappers and hooks (report.profiles["engine"]["doctor_overhead"]),
as a share of the worker's host time of a step: the precise view of the per-step cost, which
throughput differences of a few percent cannot resolve.

Without MODEL_DIR it builds a tiny random Llama (tests/fixtures/engine_models.py). CPU and GPU
(single-process engine, eager). Timings are wall clock around ``llm.generate``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dims", default="", help="gpu: a bigger tiny Llama (hidden 512, 4 layers, head_dim 64)")
    parser.add_argument("--execution", choices=("default", "eager"), default="default",
                        help="vLLM's default mode (torch.compile, CUDA graphs on GPU; the doctor's events are "
                        "captured into the graphs) or enforce_eager")
    parser.add_argument("--load-format", default=None, help="e.g. dummy: random weights for a config-only model dir")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--modes", default="", help="comma-separated subset of the modes (none is always run), "
                        "e.g. per-step for a longer A/B of the per-step profiler alone")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.execution == "default":  # as `vllm-doctor profile` starts its engines (stages/engine.py)
        from vllm_doctor.constants import GRAPH_TIMING_ENV, SWITCH_ON

        os.environ[GRAPH_TIMING_ENV] = SWITCH_ON
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    model = args.model
    if model is None:
        from tests.fixtures.engine_models import build_llama_dir

        dims = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                    num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=2048) if args.dims == "gpu" else None
        model = str(build_llama_dir(tmp / "tiny-llama", ["LlamaForCausalLM"], dims))

    import torch

    import vllm_doctor
    from vllm_doctor.compat.llm import (
        FAST_ENGINE_KWARGS,
        EngineHandle,
        execution_mode,
        greedy,
        start_engine,
        torch_profiler_kwargs,
    )
    from vllm_doctor.stages.engine import Workload, make_prompts

    cuda = torch.cuda.is_available()
    extra: dict[str, object] = {"enforce_eager": True, "gpu_memory_utilization": 0.3} if cuda else dict(FAST_ENGINE_KWARGS)
    if args.execution == "default":
        extra.pop("enforce_eager", None)
    if args.load_format:
        extra["load_format"] = args.load_format
    if args.max_num_seqs:
        extra["max_num_seqs"] = args.max_num_seqs
    llm = start_engine(model, max_model_len=args.input_len + args.output_len + 16,
                       **torch_profiler_kwargs(str(tmp / "torch")), **extra)
    handle = EngineHandle(llm)
    prompts = make_prompts(Workload(args.prompts, args.input_len, args.output_len), handle.vocab_size() or 1000)
    params = greedy(args.output_len, ignore_eos=True)

    def run() -> float:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t
        return sum(len(o.outputs[0].token_ids) for o in outs) / wall

    def none() -> float:
        return run()

    coverage: list[float] = []
    cost: dict[str, list[float]] = {}
    parts: dict[str, list[dict[str, float]]] = {}

    def doctored(name: str, **options: object) -> float:
        with vllm_doctor.attach(llm, probe=False, **options) as doc:  # type: ignore[arg-type]
            rate = run()
        profile = doc.report().profiles["engine"]  # an EngineProfile (vllm_doctor.analysis.records)
        over = profile.doctor_overhead
        if over is not None and over.share is not None:
            cost.setdefault(name, []).append(over.share)
            parts.setdefault(name, []).append({k: v / over.steps for k, v in over.host_s.items()})
        fraction = profile.layers.timed_fraction
        if fraction is not None and name == "per-layer, all":
            coverage.append(fraction)
        return rate

    def per_step() -> float:
        return doctored("per-step", layers=False)

    def per_layer() -> float:
        return doctored("per-layer")

    def per_layer_all() -> float:
        return doctored("per-layer, all", sample_every=1)

    def top() -> float:
        from vllm_doctor.live.sources import MODEL_SAMPLE_EVERY

        return doctored("top", sample_every=MODEL_SAMPLE_EVERY)

    def torch_prof() -> float:
        handle.start_torch_profile()
        try:
            return run()
        finally:
            handle.stop_torch_profile()

    modes = {"none": none, "per-step": per_step, "per-layer": per_layer, "per-layer, all": per_layer_all,
             "top": top, "torch-prof": torch_prof}
    if args.modes:
        wanted = {m.strip() for m in args.modes.split(",")}
        unknown = wanted - set(modes)
        if unknown:
            parser.error(f"unknown mode(s) {sorted(unknown)}; choose from {sorted(modes)}")
        modes = {name: fn for name, fn in modes.items() if name == "none" or name in wanted}
    run()  # warm-up
    results: dict[str, list[float]] = {m: [] for m in modes}
    names = list(modes)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(modes[name]())
    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({os.cpu_count()} cores)"
    print(f"\ncommand: python bench/bench_engine.py {' '.join(sys.argv[1:])}")
    print(f"engine: {model} on {device} ({args.execution} mode: {execution_mode(llm).get('summary')}); "
          f"{args.prompts} prompts x {args.input_len} in / {args.output_len} out, {args.repeats} rounds\n")
    print("| mode | output tokens/s (median) | min | max | vs none (median of paired rounds) | range | doctor cost (host) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, values in results.items():
        ratios = [v / b - 1 for v, b in zip(values, results["none"], strict=True)]
        share = f"{100 * statistics.median(cost[name]):.2f}%" if name in cost else "-"
        paired = f"{100 * statistics.median(ratios):+.1f}%" if name != "none" else "-"
        spread = f"{100 * min(ratios):+.1f}% .. {100 * max(ratios):+.1f}%" if name != "none" else "-"
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} | {paired} | {spread} | {share} |")
    print("\ndoctor's own host time per step (median over rounds): "
          + "; ".join(f"{name}: " + ", ".join(f"{k} {1e6 * statistics.median(p[k] for p in runs):.1f} us" for k in runs[0])
                      for name, runs in parts.items()))
    if coverage:
        print(f"\nper-layer timings (decoder layers + embedding + final norm) / forward time, every step timed: "
              f"median {statistics.median(coverage):.1%}, range {min(coverage):.1%}-{max(coverage):.1%}")


if __name__ == "__main__":
    main()

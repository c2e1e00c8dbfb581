"""``vllm-doctor profile MODEL_DIR --out DIR``: a workload on a real engine, written as reports."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_doctor.cli.common import (
    add_engine_options,
    add_fail_on,
    add_quiet,
    add_sample_every,
    add_step_clock,
    engine_options,
    print_engine_outcome,
    print_problems,
    progress_printer,
)
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.report.write import write_reports

EPILOG = """\
writes (atomically) into --out DIR:
  report.json   the report schema, engine profile under profiles.engine
  report.html   self-contained offline report: findings, engine anatomy, per-layer time,
                step timeline (prefill vs decode), KV usage over the run, memory breakdown
  trace.json    Chrome / Perfetto trace of steps and layers (ui.perfetto.dev)
  engine.log    everything the engine logged
  torch/        with --deep: vLLM's own torch profiler traces
  twin/         with --twin: the twin's own report.json, report.html, trace.json and engine.log

--twin auto|ARCH (an A/B against vLLM's in-tree twin of the model):
  finds the in-tree architecture with the same tensors in the same shapes (auto), from the
  checkpoint's tensor names and shapes and config.json's sizes (your own model_type, module
  names and config class are fine), builds it from the same sizes in a temporary directory
  (removed afterwards) with the same weights (or both runs on load_format=dummy when the tensor
  names differ), runs both on the same workload in the same mode, one after the other, and
  reports step-time and throughput ratios per phase, per layer kind, both rooflines and the
  largest gap (report.json: profiles.twin). Known: LlamaForCausalLM, Qwen2ForCausalLM,
  Qwen3ForCausalLM, Qwen3MoeForCausalLM (auto) and MistralForCausalLM (forced only). With no
  fitting twin, auto says why in one line and profiles the model alone; --twin ARCH that does
  not fit says what disagrees and exits 2 before any engine starts.

examples:
  vllm-doctor profile ./my-model --out prof
  vllm-doctor profile ./my-model --out prof --prompts 16 --input-len 256 --output-len 64 --deep
  vllm-doctor profile ./my-model --out prof --twin auto
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile",
        help="profile the forward pass on a real engine",
        description="Run a workload on a real vLLM engine with the doctor attached; write report.json, "
        "report.html and trace.json.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="model directory with config.json")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--prompts", type=int, default=8, metavar="N", help="number of prompts (default 8)")
    p.add_argument("--input-len", type=int, default=64, metavar="L", help="prompt length in tokens (default 64)")
    p.add_argument("--output-len", type=int, default=32, metavar="M", help="tokens generated per prompt (default 32)")
    p.add_argument(
        "--images",
        type=int,
        metavar="N",
        help="images per prompt for a multimodal model (default 1; 0: text only): the processor's dummy image "
        "size, random pixels per prompt; the encoder's time is reported apart from the decoder's",
    )
    p.add_argument(
        "--deep", action="store_true", help="also record vLLM's own torch profiler trace (slower) into DIR/torch"
    )
    p.add_argument("--no-layers", action="store_true", help="per-step timing only (no per-layer timing)")
    add_sample_every(p)
    add_step_clock(p)
    p.add_argument(
        "--twin",
        metavar="auto|ARCH",
        help="also run vLLM's in-tree architecture with the same layout (auto: found from the checkpoint; ARCH: "
        "forced, e.g. LlamaForCausalLM) on the same workload and mode, and compare (see below)",
    )
    add_fail_on(p)
    add_quiet(p)
    add_engine_options(p, with_switch=False)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_doctor.report.profile import answered_anatomy, render_anatomy, render_profile, render_twin
    from vllm_doctor.stages.engine import Workload, diagnose_engine

    progress = progress_printer(args.quiet)
    for name in ("prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise DoctorInputError(f"--{name.replace('_', '-')} must be at least 1")
    out = Path(args.out)
    if args.images is not None and args.images < 0:
        raise DoctorInputError("--images must be 0 or more")
    workload = Workload(prompts=args.prompts, input_len=args.input_len, output_len=args.output_len, images=args.images)
    deep_dir = str((out / "torch").resolve()) if args.deep else None
    progress(f"profile: {args.model} -> {out}")
    options = engine_options(
        args,
        workload=workload,
        deep_dir=deep_dir,
        layers=not args.no_layers,
        sample_every=args.sample_every,
        step_clock=args.step_clock,
    )
    twin_report = None
    if args.twin:
        from vllm_doctor.stages.twin import profile_with_twin

        report, twin_report = profile_with_twin(args.model, options, args.twin, progress=progress, log_dir=str(out))
    else:
        report = diagnose_engine(args.model, options, progress=progress, log_dir=str(out))
    paths = write_reports(out, report)
    if twin_report is not None:
        paths += write_reports(out / "twin", twin_report)
    progress("wrote " + ", ".join(str(p) for p in paths))
    anatomy = answered_anatomy(report)
    if anatomy is not None:
        print(render_anatomy(anatomy))
    print_engine_outcome(report)
    failure = report.facts.get("engine_failure")
    if not failure:
        print(render_profile(report.profiles["engine"], report.profiles.get("workload")))
    if "twin" in report.profiles:
        print(render_twin(report.profiles["twin"]))
    problems = print_problems(report, args.fail_on)
    return 1 if problems or failure else 0

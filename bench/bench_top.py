"""What ``vllm-doctor top`` costs while a real server is under load, side by side in one run.

    python bench/bench_top.py [--seconds 60] [--clients 2] [--max-tokens 32] [--out DIR]

Starts one real vLLM server (the example model, ``VLLM_DOCTOR=1 VLLM_SERVER_DEV_MODE=1``,
tests/served.py), keeps ``--clients`` client threads sending completions, and runs three
phases of ``--seconds`` each, in this order, twice (A B C A B C, so drift hits all alike):

  A  no top                              serving throughput only
  B  top at 1 Hz, model panel off        + the top process's CPU, RSS, first paint with data
  C  top at 1 Hz, model panel on         (the doctor's worker extension attached: profiling)

top runs headless (Textual's headless driver, the same app and panels) in its own process;
its CPU is read from /proc/PID/stat (utime + stime) once a second, its RSS from
/proc/PID/status. "first paint" is the time from the app's start to the first frame with
data drawn. Throughput is generated tokens / s counted by the clients (usage.completion_tokens).
Prints a markdown table; --out DIR also writes a recording of the last C phase
(top.jsonl.gz) and an SVG screenshot of the app at 160x48 (top.svg) taken at its end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.served import ServedEngine  # noqa: E402 - the repo root is put on the path above

CHILD = """
import time
T0 = time.monotonic()
import json, sys
from vllm_doctor.live.sources import LiveSource, ModelChannel
from vllm_doctor.tui.top_app import TopApp
url, seconds, model_on, record, svg, out = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5], sys.argv[6]
from vllm_doctor.live.devices import DeviceSampler
from vllm_doctor.live.sources import EnginePids
model = ModelChannel(url) if model_on else None
source = LiveSource(url, interval_s=1.0, window_s=60.0, model=model, devices=DeviceSampler(EnginePids(url, model)))
app = TopApp(source, record_path=record or None, record=bool(record))
def finish():
    if svg:
        open(svg, "w").write(app.export_screenshot(title="vllm-doctor top"))
    app.exit()
app.call_later(lambda: app.set_timer(seconds, finish))
app.run(headless=True, size=(160, 48))
first = None if app.first_data_at is None else app.first_data_at + (app.started_at - T0)
json.dump({"first_data_s": first, "frames": app.frames_shown}, open(out, "w"))
"""


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Load:
    """Client threads sending completions without pause; counts generated tokens."""

    def __init__(self, server: ServedEngine, clients: int, max_tokens: int) -> None:
        self.server, self.max_tokens = server, max_tokens
        self.tokens = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            reply = self.server.complete(f"client {i} request {n} says hello", self.max_tokens)
            with self.lock:
                self.tokens += int(reply["usage"]["completion_tokens"])
            n += 1

    def count(self) -> int:
        with self.lock:
            return self.tokens

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def phase(server: ServedEngine, load: Load, seconds: float, top: str | None, out: Path, tag: str) -> dict:
    result: dict = {"phase": top or "none"}
    child = None
    info = out / f"{tag}.json"
    if top is not None:
        record = str(out / "top.jsonl.gz") if top == "model" else ""
        svg = str(out / "top.svg") if top == "model" else ""
        env = dict(os.environ, PYTHONPATH=str(REPO))
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, server.base, str(seconds), "1" if top == "model" else "0", record, svg,
             str(info)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(2.0)  # imports and attach: not part of the steady state measured below
    tokens0, t0 = load.count(), time.monotonic()
    cpu: list[float] = []
    rss: list[int] = []
    if child is not None:
        last_cpu, last_t = proc_cpu_s(child.pid), time.monotonic()
    while time.monotonic() - t0 < seconds - (2.0 if child is not None else 0.0):
        time.sleep(1.0)
        if child is not None and child.poll() is None:
            now_cpu, now_t = proc_cpu_s(child.pid), time.monotonic()
            cpu.append((now_cpu - last_cpu) / (now_t - last_t) * 100)
            rss.append(proc_rss(child.pid))
            last_cpu, last_t = now_cpu, now_t
    result["tok_s"] = (load.count() - tokens0) / (time.monotonic() - t0)
    if child is not None:
        _, err = child.communicate(timeout=60)
        if child.returncode != 0:
            raise RuntimeError(f"top child failed: {err.decode()[-3000:]}")
        result.update(json.loads(info.read_text()))
        result["cpu_pct_mean"] = statistics.fmean(cpu)
        result["cpu_pct_max"] = max(cpu)
        result["rss_first_mb"] = rss[0] / 2**20
        result["rss_last_mb"] = rss[-1] / 2**20
        result["samples"] = len(cpu)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-top-"))
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-top-server-"))
    server = ServedEngine(tmp)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server on kill, too
    server.start()
    results = []
    try:
        load = Load(server, args.clients, args.max_tokens)
        time.sleep(5)  # warm up
        for r in range(args.rounds):
            for top in (None, "plain", "model"):
                res = phase(server, load, args.seconds, top, out, f"r{r}-{top}")
                print(json.dumps(res), flush=True)
                results.append(res)
        load.close()
    finally:
        server.stop()
    base = statistics.fmean(r["tok_s"] for r in results if r["phase"] == "none")
    print(f"\n{args.clients} clients, max_tokens {args.max_tokens}, {args.seconds:g} s per phase, {args.rounds} rounds\n")
    print("| top | serving tok/s | vs no top | top CPU % of a core (mean / max) | RSS first → last | first paint |")
    print("|---|---|---|---|---|---|")
    for name, label in (("none", "none"), ("plain", "1 Hz, model panel off"), ("model", "1 Hz, model panel on")):
        rows = [r for r in results if r["phase"] == name]
        tok = statistics.fmean(r["tok_s"] for r in rows)
        line = f"| {label} | {tok:.1f} | {(tok / base - 1) * 100:+.1f} % |"
        if name == "none":
            line += " – | – | – |"
        else:
            line += (f" {statistics.fmean(r['cpu_pct_mean'] for r in rows):.2f} / {max(r['cpu_pct_max'] for r in rows):.1f}"
                     f" | {rows[-1]['rss_first_mb']:.1f} → {rows[-1]['rss_last_mb']:.1f} MB"
                     f" | {max(r['first_data_s'] for r in rows):.2f} s |")
        print(line)
    print(f"\nload average at the end (1/5/15 min): {os.getloadavg()}; CPUs: {os.cpu_count()}")
    print(f"recording and screenshot in {out}")


if __name__ == "__main__":
    main()

"""What ``vllm-doctor top`` costs while a real server is under load, side by side in one run.

    python bench/bench_top.py [--seconds 60] [--clients 2] [--max-tokens 32] [--out DIR]
    python bench/bench_top.py --url http://127.0.0.1:8011 --clients 64 --max-tokens 128   # a server you run

Without --url it starts one real vLLM server (the example model, ``VLLM_DOCTOR=1``, no dev mode:
the model panel reads the workers through the doctor's private channel; tests/served.py); with
--url it uses that server (start it with ``VLLM_DOCTOR=1`` to measure the model panel). Each
phase also reads the CPU time of every engine process by role (API server, engine core,
workers): a model panel that costs the engine core nothing shows no change in its column. ``--clients`` client threads keep sending
completions (``ignore_eos``, ``--max-tokens`` each), and three phases of ``--seconds`` each run
``--rounds`` times, the order rotated each round (A B C, B C A, C A B, ...: drift and a phase's
place in the round hit all alike):

  A  no top                              serving throughput only
  B  top at 1 Hz, model panel off        + the top process's CPU, RSS, first paint with data
  C  top at 1 Hz, model panel on         (the doctor's worker extension attached: profiling)

top runs headless (Textual's headless driver, the same app and panels, built as
``vllm-doctor top URL`` builds them) in its own process; its CPU is read from /proc/PID/stat
(utime + stime) once a second once it is ready (its first data: the measured span starts there,
after the imports and the attach), its RSS from /proc/PID/status. "first
paint" is the wall time from starting top's process (interpreter start and imports included)
to the first frame with data drawn; it is also measured before the load starts ("idle").
Throughput is generated tokens / s as the server counts them (``vllm:generation_tokens``, read
from /metrics at the start and the end of each measured span, so requests in flight at the
edges count by the tokens they made inside it); the clients' own count
(usage.completion_tokens of finished requests) is printed beside it.
Prints a markdown table; --out DIR also writes a recording of the last C phase
(top.jsonl.gz) and an SVG screenshot of the app at 160x48 (top.svg) taken at its end.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


CHILD = """
import json, sys, time
url, seconds, mode, record, svg, out = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
# each mode prints "ready" once it has its first data, then runs `seconds` more: the parent
# measures that steady state, not the start (imports, attach) that precedes it
if mode == "scrape":  # only what top asks of the server: /metrics once a second
    from vllm_doctor.live.sources import Scraper
    scrape, n, end = Scraper(url), 0, None
    while end is None or time.monotonic() < end:
        scrape(2.0)
        if end is None:
            print("ready", flush=True)
            end = time.monotonic() + seconds
        n += 1
        time.sleep(1.0)
    json.dump({"first_data_wall": None, "frames": n}, open(out, "w"))
    sys.exit(0)
if mode in ("channel", "attached"):  # only what the model panel asks of the workers: a window through the channel at 1 Hz
    from vllm_doctor.live.attach import served_engine
    from vllm_doctor.live.sources import WindowReader
    reader, n, first, end, summary = WindowReader(served_engine(url)), 0, None, None, None
    while end is None or time.monotonic() < end:
        if end is not None and mode == "attached":  # attached (one read), the hooks on, nothing more read
            time.sleep(1.0)
            continue
        summary = reader.read()
        if end is None:
            first = time.time()
            print("ready", flush=True)
            end = time.monotonic() + seconds
        n += 1
        time.sleep(1.0)
    reader.close()
    doctor = summary.doctor.to_json() if summary is not None and summary.doctor is not None else None
    json.dump({"first_data_wall": first, "frames": n, "doctor": doctor}, open(out, "w"))
    sys.exit(0)
from vllm_doctor.cli.top import live_source  # as `vllm-doctor top URL` builds it
source = live_source(url, 1.0, 60.0, model=mode == "model", devices=mode != "nodevices")
from vllm_doctor.tui.top_app import TopApp
app = TopApp(source, record_path=record or None, record=bool(record))
def finish():
    if svg:
        open(svg, "w").write(app.export_screenshot(title="vllm-doctor top"))
    app.exit()
started = []
def ready():
    if started:
        return
    if app.first_data_at is not None and (mode != "model" or (app.frame is not None and app.frame.model
                                                              and app.frame.model.get("available"))):
        started.append(time.monotonic())
        print("ready", flush=True)
        app.set_timer(seconds, finish)
app.call_later(lambda: app.set_interval(0.2, ready))
app.call_later(lambda: app.set_timer(seconds + 120, finish))  # never ready: give up
app.run(headless=True, size=(160, 48))
first = None if app.first_data_at is None else time.time() - (time.monotonic() - app.started_at - app.first_data_at)
model = (app.frame.model or {}) if app.frame is not None else {}
json.dump({"first_data_wall": first, "frames": app.frames_shown, "doctor": model.get("doctor")}, open(out, "w"))
"""


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Server:
    """An OpenAI-compatible server at ``base``: one keep-alive connection per client thread."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        with urllib.request.urlopen(f"{self.base}/v1/models", timeout=30) as resp:
            self.model = json.load(resp)["data"][0]["id"]
        self.local = threading.local()
        from vllm_doctor.live.sources import EnginePids

        self.pids = EnginePids(self.base, None)()  # the API server and engine processes on this host

    def complete(self, prompt: str, max_tokens: int) -> dict:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            parsed = urllib.parse.urlsplit(self.base)
            conn = self.local.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True})
        try:
            conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.local.conn = None
            raise
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
        return json.loads(data)

    def generated(self) -> float:
        """Tokens the server has generated so far (its ``vllm:generation_tokens`` counter)."""
        from vllm_doctor.compat.metrics import resolve
        from vllm_doctor.live.prom import family_value, parse

        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as resp:
            exposition = parse(resp.read().decode())
        name = resolve(exposition.families).get("generation_tokens")
        value = family_value(exposition.families.get(name)) if name else None
        if value is None:
            raise RuntimeError(f"{self.base}/metrics has no generation-token counter")
        return value


class Load:
    """Client threads sending completions without pause; counts generated tokens."""

    def __init__(self, server: Server, clients: int, max_tokens: int, jitter: float = 0.0) -> None:
        self.server, self.max_tokens, self.jitter = server, max_tokens, jitter
        self.tokens = 0
        self.errors = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        n = 0
        rng = random.Random(i)  # the same lengths in every run
        while not self.stop.is_set():
            # jitter: lengths drawn from max_tokens × [1 − j, 1 + j], so requests do not start and
            # finish in waves (a batch that empties and refills together makes throughput swing)
            length = max(1, round(self.max_tokens * (1 + self.jitter * (2 * rng.random() - 1))))
            try:
                reply = self.server.complete(f"client {i} request {n} says hello", length)
            except Exception:
                with self.lock:
                    self.errors += 1
                time.sleep(0.5)
                continue
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


def start_top(base: str, seconds: float, mode: str, out: Path, tag: str, keep: bool) -> tuple[subprocess.Popen, float]:
    record = str(out / "top.jsonl.gz") if keep else ""
    svg = str(out / "top.svg") if keep else ""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spawned = time.time()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, base, str(seconds), mode, record, svg, str(out / f"{tag}.json")],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return child, spawned


def wait_ready(child: subprocess.Popen, timeout: float = 120.0) -> float:
    """Wait for the child's "ready" (its first data); the seconds it took."""
    import select

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and child.poll() is None:
        if select.select([child.stdout], [], [], 1.0)[0] and child.stdout.readline().strip() == b"ready":
            break
    return time.monotonic() - t0


def finish_top(child: subprocess.Popen, spawned: float, out: Path, tag: str) -> dict:
    _, err = child.communicate(timeout=120)
    if child.returncode != 0:
        raise RuntimeError(f"top child failed: {err.decode()[-3000:]}")
    info = json.loads((out / f"{tag}.json").read_text())
    first = info.pop("first_data_wall")
    info["first_data_s"] = None if first is None else first - spawned
    return info


def engine_cpu(pids: list[tuple[int, str]]) -> dict[str, float]:
    """CPU seconds of each engine process so far, by role (the server's side of the cost)."""
    total: dict[str, float] = {}
    for pid, role in pids:
        try:
            total[role] = total.get(role, 0.0) + proc_cpu_s(pid)
        except OSError:
            pass
    return total


def phase(server: Server, load: Load, seconds: float, top: str | None, out: Path, tag: str) -> dict:
    result: dict = {"phase": top or "none"}
    child = None
    if top is not None:
        child, spawned = start_top(server.base, seconds, top, out, tag, keep=top == "model")
        result["ready_s"] = wait_ready(child)  # imports, attach, first data: not the steady state measured below
    engine0, e0 = engine_cpu(server.pids), time.monotonic()
    served0, tokens0, t0 = server.generated(), load.count(), time.monotonic()
    cpu: list[float] = []
    rss: list[int] = []
    if child is not None:
        last_cpu, last_t = proc_cpu_s(child.pid), time.monotonic()
    while time.monotonic() - t0 < seconds - (1.0 if child is not None else 0.0):
        time.sleep(1.0)
        if child is not None and child.poll() is None:
            now_cpu, now_t = proc_cpu_s(child.pid), time.monotonic()
            cpu.append((now_cpu - last_cpu) / (now_t - last_t) * 100)
            rss.append(proc_rss(child.pid))
            last_cpu, last_t = now_cpu, now_t
    served1, tokens1, t1 = server.generated(), load.count(), time.monotonic()
    result["tok_s"] = (served1 - served0) / (t1 - t0)
    result["client_tok_s"] = (tokens1 - tokens0) / (t1 - t0)
    engine1, e1 = engine_cpu(server.pids), time.monotonic()
    result["engine_cpu_pct"] = {k: round((engine1[k] - engine0.get(k, 0.0)) / (e1 - e0) * 100, 1) for k in engine1}
    if child is not None:
        result.update(finish_top(child, spawned, out, tag))
        result["cpu_pct_mean"] = statistics.fmean(cpu)
        result["cpu_pct_max"] = max(cpu)
        result["rss_first_mb"] = rss[0] / 2**20
        result["rss_last_mb"] = rss[-1] / 2**20
        result["samples"] = len(cpu)
        if result.get("doctor") is None:
            result.pop("doctor", None)
    return result


def serve_model(model: Path, extra: list[str], out: Path, timeout: float, metrics: bool = False) -> Any:
    """``--serve``: the model served on 127.0.0.1 with the doctor's plugin, as tests/served.py serves
    (the doctor's /metrics series off unless ``metrics``: this bench reads /metrics in every phase,
    which would attach the exporter in all of them)."""
    from tests.served import doctor_plugin_installed, serve

    paths = [str(REPO)]
    if not doctor_plugin_installed():  # a source checkout (the GPU machine): declare the entry point
        from tests.fixtures.entry_points import doctor_entry_point_site

        paths.insert(0, str(doctor_entry_point_site(out / "ep")))
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env.update(PYTHONPATH=os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               VLLM_DOCTOR="1", VLLM_DOCTOR_METRICS="1" if metrics else "0")
    print(f"serving {model} {' '.join(extra)} (log: {out / 'server.log'})", flush=True)
    return serve(model, out / "server.log", env, extra, timeout=timeout)


def idle_first_paint(server: Server, out: Path, runs: int) -> list[float]:
    """First paint with no load on the server (top's own start, nothing competing)."""
    times = []
    for i in range(runs):
        child, spawned = start_top(server.base, 2.5, "plain", out, f"idle{i}", keep=False)
        first = finish_top(child, spawned, out, f"idle{i}")["first_data_s"]
        if first is not None:
            times.append(first)
    return times


LABELS = {"none": "none", "scrape": "/metrics only, 1 Hz (no app)", "channel": "model window only, 1 Hz (no app)",
          "attached": "attached, nothing read (no app)", "nodevices": "1 Hz, no devices, no model",
          "plain": "1 Hz, model panel off", "model": "1 Hz, model panel on"}
T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26, 11: 2.23, 12: 2.20,
       13: 2.18, 14: 2.16, 15: 2.14, 16: 2.13, 17: 2.12, 18: 2.11, 19: 2.10, 20: 2.09, 25: 2.06, 30: 2.05,
       40: 2.02}  # Student's t for a 95 % interval, by n (n − 1 degrees of freedom)


def paired(results: list[dict]) -> None:
    """Each phase against the no-top spans of the same run: by round (the same round's no-top
    span; a drift between rounds cancels), and against the no-top spans on either side (a drift
    linear over the three cancels). ``run`` keeps the spans of pooled runs apart; then the
    doctor's own clock in the worker, from the model phases."""
    runs = list(dict.fromkeys(r.get("run", 0) for r in results))
    names = [n for n in dict.fromkeys(r["phase"] for r in results) if n != "none"]
    if "none" in {r["phase"] for r in results} and names:
        print("\n| phase | throughput vs no top, same round: mean | 95 % interval | rounds "
              "| vs the no-top spans on either side (a linear drift cancels): mean | 95 % interval |")
        print("|---|---|---|---|---|---|")
        for name in names:
            ratios: list[float] = []
            sandwich: list[float] = []
            for run in runs:
                spans = [r for r in results if r.get("run", 0) == run]
                for k in dict.fromkeys(r.get("round") for r in spans):
                    rnd = [r for r in spans if r.get("round") == k]
                    none = [r["tok_s"] for r in rnd if r["phase"] == "none"]
                    ratios += [(r["tok_s"] / none[0] - 1) * 100 for r in rnd if r["phase"] == name and none]
                sandwich += neighbours(spans, name)
            if len(ratios) < 2:
                continue
            mean, half = interval(ratios)
            line = f"| {LABELS.get(name, name)} | {mean:+.2f} % | {mean - half:+.2f} % … {mean + half:+.2f} % | {len(ratios)} |"
            if len(sandwich) > 1:
                mean, half = interval(sandwich)
                line += f" {mean:+.2f} % | {mean - half:+.2f} % … {mean + half:+.2f} % |"
            else:
                line += " – | – |"
            print(line)
    doctor = [r["doctor"] for r in results if r.get("doctor") and r["doctor"].get("worker_share") is not None]
    if doctor:
        shares = [100 * d["worker_share"] for d in doctor]
        print(f"\nthe doctor's own clock in the worker (the model panel's last window, each model phase): "
              f"{statistics.fmean(shares):.2f} % of the worker's time (min {min(shares):.2f}, max {max(shares):.2f}; "
              f"{statistics.fmean(d['per_step_s'] for d in doctor) * 1e6:.1f} µs/step, "
              f"calls {statistics.fmean(d['rpc_s'] for d in doctor) * 1e3:.2f} ms per "
              f"{statistics.fmean(d['window_s'] for d in doctor):.1f} s window)")


def pool(logs: list[Path]) -> None:
    """The paired tables over the phase lines (the JSON lines printed while it ran) of several runs."""
    results = []
    for run, log in enumerate(logs):
        for line in log.read_text().splitlines():
            if line.startswith("{") and '"phase"' in line:
                results.append({**json.loads(line), "run": run})
    if not results:
        sys.exit(f"no phase lines in {', '.join(map(str, logs))}")
    print(f"{len(logs)} run(s), {len(results)} spans")
    paired(results)


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % interval (Student's t, n − 1 degrees of freedom)."""
    n = len(values)
    t = T95.get(n) or T95[max(k for k in T95 if k < n)]  # between rows: the row below (wider, never narrower)
    return statistics.fmean(values), t * statistics.stdev(values) / n ** 0.5


def neighbours(results: list[dict], name: str) -> list[float]:
    """Each span of ``name`` against the mean of the nearest no-top spans before and after it
    (one side at the ends), in %: the spans run in this order, so a drift that is linear over
    the three cancels, which pairing within a round does not do."""
    out = []
    for i, r in enumerate(results):
        if r["phase"] != name:
            continue
        before = next((x["tok_s"] for x in reversed(results[:i]) if x["phase"] == "none"), None)
        after = next((x["tok_s"] for x in results[i + 1:] if x["phase"] == "none"), None)
        around = [x for x in (before, after) if x is not None]
        if around:
            out.append((r["tok_s"] / statistics.fmean(around) - 1) * 100)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an OpenAI-compatible vLLM server to use instead of starting one")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-tokens-jitter", type=float, default=0.0, metavar="J",
                    help="each request's length drawn from max-tokens × [1 − J, 1 + J] (0.5: no waves)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--idle-runs", type=int, default=3, help="first-paint runs before the load starts")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--phases", default="none,plain,model",
                    help="phases per round, from: none, scrape (only /metrics at 1 Hz), channel (only the model panel's "
                         "window through the private channel at 1 Hz, no app), attached (the same reader attached, "
                         "reading nothing after its first window), nodevices (top without "
                         "NVML and /proc sampling), plain (top, model panel off), model (top, model panel on)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first phase")
    ap.add_argument("--serve", type=Path, default=None,
                    help="start `python -m vllm.entrypoints.openai.api_server --model SERVE` with the doctor's "
                         "plugin (VLLM_DOCTOR=1) and use it (bench/make_bench_model.py "
                         "writes one); stopped with its children at the end")
    ap.add_argument("--serve-args", default="", help="more arguments for --serve's server, one string")
    ap.add_argument("--metrics", action="store_true",
                    help="--serve with the doctor's series in /metrics on (the exporter, attached from the first "
                         "scrape: every phase then runs with it, the 'none' phase measures the server with it)")
    ap.add_argument("--serve-timeout", type=float, default=600.0, help="seconds --serve's server may take to start")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="LOG",
                    help="no run: the paired tables over the saved output of earlier runs (their rounds pooled)")
    args = ap.parse_args()
    if args.pool:
        pool(args.pool)
        return
    phases = [None if p == "none" else p for p in args.phases.split(",")]
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-top-"))
    out.mkdir(parents=True, exist_ok=True)
    engine = None
    stack = contextlib.ExitStack()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop a server we started on kill, too
    if args.url:
        server = Server(args.url)
    elif args.serve:
        server = Server(stack.enter_context(serve_model(args.serve, shlex.split(args.serve_args), out,
                                                        args.serve_timeout, args.metrics)).base)
    else:
        from tests.served import ServedEngine

        engine = ServedEngine(Path(tempfile.mkdtemp(prefix="bench-top-server-")))
        engine.start()
        server = Server(engine.base)
    results = []
    try:
        idle = idle_first_paint(server, out, args.idle_runs)
        print(json.dumps({"idle_first_paint_s": idle}), flush=True)
        load = Load(server, args.clients, args.max_tokens, args.max_tokens_jitter)
        time.sleep(args.warmup)
        for r in range(args.rounds):
            for top in phases[r % len(phases):] + phases[:r % len(phases)]:
                res = phase(server, load, args.seconds, top, out, f"r{r}-{top}")
                res["round"] = r
                print(json.dumps(res), flush=True)
                results.append(res)
        load.close()
    finally:
        if engine is not None:
            engine.stop()
        stack.close()
    alone = [r["tok_s"] for r in results if r["phase"] == "none"]
    base = statistics.fmean(alone) if alone else None
    print(f"\n{server.base}: {args.clients} clients, max_tokens {args.max_tokens}, {args.seconds:g} s per phase, "
          f"{args.rounds} rounds, {load.errors} failed requests\n")
    print("| top | serving tok/s | vs no top | top CPU % of a core (mean / max) | RSS first → last | first paint "
          "| engine processes' CPU % |")
    print("|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(r["phase"] for r in results):
        rows = [r for r in results if r["phase"] == name]
        tok = statistics.fmean(r["tok_s"] for r in rows)
        line = f"| {LABELS[name]} | {tok:.1f} | {'–' if base is None else f'{(tok / base - 1) * 100:+.1f} %'} |"
        cpu_rows = [r for r in rows if "cpu_pct_mean" in r]
        if not cpu_rows:
            line += " – | – | " + (f"idle: {statistics.median(idle):.2f} s (median of {len(idle)})" if idle and name == "none" else "–") + " |"
        else:
            firsts = [r["first_data_s"] for r in rows if r.get("first_data_s") is not None]
            line += (f" {statistics.fmean(r['cpu_pct_mean'] for r in cpu_rows):.2f} / {max(r['cpu_pct_max'] for r in cpu_rows):.1f}"
                     f" | {cpu_rows[-1]['rss_first_mb']:.1f} → {cpu_rows[-1]['rss_last_mb']:.1f} MB"
                     f" | {'–' if not firsts else f'{min(firsts):.2f}–{max(firsts):.2f} s'} |")
        engine = {k: statistics.fmean(r["engine_cpu_pct"].get(k, 0.0) for r in rows) for k in rows[0]["engine_cpu_pct"]}
        line += " " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(engine.items())) + " |"
        print(line)
    paired(results)
    print("\nper round (tok/s): " + "; ".join(
        " ".join(f"{r['phase']} {r['tok_s']:.0f}" for r in results if r.get("round") == k)
        for k in dict.fromkeys(r.get("round") for r in results)))
    print(f"load average at the end (1/5/15 min): {os.getloadavg()}; CPUs: {os.cpu_count()}")
    print(f"recording and screenshot in {out}")


if __name__ == "__main__":
    main()

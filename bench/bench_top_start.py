"""Where ``vllm-doctor top``'s first paint goes: a fresh top process, timed step by step.

    python bench/bench_top_start.py --url http://127.0.0.1:8011 [--runs 5] [--clients 64]

Each run starts top in a new process (headless, 160x48, as bench_top.py does) and prints, in
seconds since the parent spawned it: the interpreter's start (the child's first line), the
imports of ``vllm_doctor.cli.top``, ``live_source()`` (which starts the first scrape, NVML and
the model channel in threads), the import of the app, its mount, when the first ``/metrics``
answer arrived, when NVML was ready, when the first frame was built (``poll()``) and when it was
drawn with data (``first_data_at``, what bench_top.py reports as first paint). With
``--clients N`` the server is under load (N clients, bench_top.py's load) while it runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

CHILD = r"""
import time
t_main = time.time()
import json, sys
url, model, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
marks = {"main": t_main}
def mark(name):
    marks.setdefault(name, time.time())
from vllm_doctor.live import devices, sources
scrape_call = sources.Scraper.__call__
def timed_scrape(self, timeout):
    result = scrape_call(self, timeout)
    mark("first_scrape")
    return result
sources.Scraper.__call__ = timed_scrape
nvml_start = devices.DeviceSampler._start
def timed_start(self):
    nvml_start(self)
    mark("nvml_ready")
devices.DeviceSampler._start = timed_start
poll = sources.LiveSource.poll
def timed_poll(self):
    frame = poll(self)
    mark("first_poll")
    return frame
sources.LiveSource.poll = timed_poll
from vllm_doctor.cli.top import live_source
mark("import_cli")
source = live_source(url, 1.0, 60.0, model=model, devices=True)
mark("live_source")
from vllm_doctor.tui.top_app import TopApp
mark("import_app")
class App(TopApp):
    def on_mount(self):
        mark("mount")
        super().on_mount()
app = App(source)
mark("app")
def finish():
    app.exit()
app.call_later(lambda: app.set_timer(2.5, finish))
app.run(headless=True, size=(160, 48))
if app.first_data_at is not None:
    marks["first_data"] = time.time() - (time.monotonic() - app.started_at - app.first_data_at)
json.dump(marks, open(out, "w"))
"""

ORDER = ("main", "import_cli", "live_source", "import_app", "app", "mount", "first_scrape", "nvml_ready",
         "first_poll", "first_data")


def one(url: str, model: bool, out: Path) -> dict[str, float]:
    spawned = time.time()
    child = subprocess.run([sys.executable, "-c", CHILD, url, "1" if model else "0", str(out)],
                           capture_output=True, timeout=120, cwd=str(REPO))
    if child.returncode != 0:
        raise RuntimeError(child.stderr.decode()[-3000:])
    marks = json.loads(out.read_text())
    return {k: marks[k] - spawned for k in ORDER if k in marks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=0, help="load the server with N clients while top starts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", action="store_true", help="model panel on (the default of `vllm-doctor top`)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench-top-start.json"))
    args = ap.parse_args()
    load = None
    if args.clients:
        from bench_top import Load, Server

        load = Load(Server(args.url), args.clients, args.max_tokens)
        time.sleep(5)
    runs = []
    try:
        for _ in range(args.runs):
            runs.append(one(args.url, args.model, args.out))
            print(json.dumps({k: round(v, 3) for k, v in runs[-1].items()}), flush=True)
            time.sleep(0.5)
    finally:
        if load is not None:
            load.close()
    print(f"\n{args.url}, {'under load: ' + str(args.clients) + ' clients' if args.clients else 'idle'}, "
          f"model panel {'on' if args.model else 'off'}, {args.runs} runs: median seconds since spawn\n")
    print("| step | median s | min | max |")
    print("|---|---|---|---|")
    for k in ORDER:
        values = [r[k] for r in runs if k in r]
        if values:
            print(f"| {k} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")


if __name__ == "__main__":
    main()

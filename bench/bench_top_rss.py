"""Is ``top``'s memory flat over a long run? RSS of the top process at 1 Hz for --seconds.

    python bench/bench_top_rss.py [--seconds 600]
    python bench/bench_top_rss.py --url http://127.0.0.1:8000 [--clients 2]   # a real server, model panel on

A loopback HTTP server replays the real scrapes of tests/data/top/loaded.jsonl.gz in a loop,
with every counter and histogram count raised each round (so rates and latency windows keep
changing as on a loaded server); ``vllm-doctor top URL --screenshot ... --seconds S
--no-model`` runs the real app headless against it, with the devices panel sampling this
process. Its RSS is read from /proc/PID/status every 10 s. Prints the RSS after the first
minute (imports and caches are warm) and at the end, and the difference.

With --url, top runs against that real server instead, with the model panel on (start the
server with ``VLLM_DOCTOR=1``) and ``--clients`` threads sending
completions, so the model channel gathers windows with steps in them all along.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDING = REPO / "tests" / "data" / "top" / "loaded.jsonl.gz"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--url", help="a real server (model panel on) instead of the replayed scrapes")
    ap.add_argument("--clients", type=int, default=2, help="with --url: client threads sending completions")
    args = ap.parse_args()
    if args.url:
        sys.path.insert(0, str(REPO / "bench"))
        from bench_top import Load, Server

        load = Load(Server(args.url), args.clients, 32)
        try:
            watch(args.url, args.seconds, model=True, served=lambda: f"completions: {load.count()} tokens")
        finally:
            load.close()
        return
    raws = [r["raw"] for r in map(json.loads, gzip.open(RECORDING, "rt")) if r.get("raw")]
    first_counts = raws[0]
    span = {"n": 0}

    def scrape() -> str:
        i = span["n"]
        span["n"] += 1
        rounds, k = divmod(i, len(raws))
        text = raws[k]
        if not rounds:
            return text
        # raise every counter/count by the whole recording's growth per round: monotonic, no restart
        last = raws[-1]

        def bump(m: re.Match[str]) -> str:
            line = m.group(0)
            name, value = line.rsplit(" ", 1)
            if not (name.endswith(("_total", "_count", "_sum")) or "_bucket{" in name):
                return line
            a = re.search(re.escape(name) + r" (\S+)", last)
            b = re.search(re.escape(name) + r" (\S+)", first_counts)
            growth = float(a.group(1)) - float(b.group(1)) if a and b else 0.0
            return f"{name} {float(value) + rounds * (growth + 1):.1f}"

        return re.sub(r"^[^#\n].* \S+$", bump, text, flags=re.M)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = scrape().encode()
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        watch(f"http://127.0.0.1:{httpd.server_address[1]}", args.seconds, model=False,
              served=lambda: f"scrapes served {span['n']}")
    finally:
        httpd.shutdown()


def watch(url: str, seconds: float, model: bool, served: Callable[[], str]) -> None:
    """Run the real top against ``url`` for ``seconds``; print its RSS every 10 s."""
    shot = Path(tempfile.mkdtemp()) / "top.svg"
    child = subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "top", "--url", url, "--screenshot", str(shot), "--duration", str(seconds),
         *([] if model else ["--no-model"])],
        env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    while child.poll() is None:
        time.sleep(10)
        if child.poll() is None:
            samples.append((time.monotonic() - t0, rss_mb(child.pid)))
    err = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"top failed: {err[-2000:]}")
    warm = next((mb for t, mb in samples if t >= 60), samples[0][1])
    print(" ".join(f"{t:.0f}s:{mb:.1f}" for t, mb in samples))
    print(f"RSS after 60 s {warm:.1f} MB, at {samples[-1][0]:.0f} s {samples[-1][1]:.1f} MB, "
          f"difference {samples[-1][1] - warm:+.1f} MB over {samples[-1][0] - 60:.0f} s "
          f"(model panel {'on' if model else 'off'}); {served()}")


if __name__ == "__main__":
    main()

"""``vllm-doctor top --url URL``: the live view of a serving engine (and ``--once`` for scripts)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from vllm_doctor.cli.common import add_deprecated, add_url, on_stop_signals, progress_printer, resolve_url
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.files import write_text_atomic

EPILOG = """\
panels: engine state, throughput, latency (percentiles over --window with n), KV cache, GPUs
(NVML; on a CPU host the engine processes' CPU%, RSS and threads) and, when the server runs
with VLLM_DOCTOR=1 (started by this user, on this machine: the doctor's private channel, no dev
mode), the model from inside (forward time per step, slowest layers, KV bytes, live VD4xx/VD5xx
findings). --no-model leaves the model alone.

keys: ? what every number is (metric, formula)  p pause  +/- interval  w latency window
      z zoom a panel  r record on/off  q quit

A server that stops answering is shown STALE with the age of the last good scrape; numbers
stay frozen (greyed), history gets a gap. A restart (counters going back, a new
process_start_time_seconds) is counted and marked; no rate is computed across it.
q, kill (SIGTERM), a closed terminal (SIGHUP) or Ctrl-C from outside: top exits the normal
way and the model channel detaches from the workers.

exit codes (--once): 0 ok, 2 server unreachable or not a vLLM /metrics, 3 vllm-doctor failed

examples:
  vllm-doctor top --url http://127.0.0.1:8000
  vllm-doctor top --url 127.0.0.1:8000 --interval 2 --window 300 --record run.jsonl.gz
  vllm-doctor top --url 127.0.0.1:8000 --once --json          # two scrapes --interval apart
  vllm-doctor top --url 127.0.0.1:8000 --screenshot top.svg --duration 60   # no terminal needed
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="live view of a serving engine: metrics, GPUs, the model from inside",
        description="Watch a running vLLM server: scrape its /metrics every --interval seconds, sample the "
        "GPUs (or the engine processes on a CPU host), and read the model through the doctor's worker "
        "extension when the server has it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_url(p)
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (default 1)")
    p.add_argument(
        "--window", type=float, default=60.0, metavar="S", help="latency percentile window in seconds (default 60)"
    )
    p.add_argument("--record", metavar="FILE", help="record every refresh to FILE (gzip JSONL; replay FILE)")
    p.add_argument("--once", action="store_true", help="print one refresh (two scrapes --interval apart) and exit")
    p.add_argument("--json", action="store_true", help="with --once: print JSON")
    p.add_argument(
        "--screenshot",
        metavar="SVG",
        help="run without a terminal for --duration, then write the app's picture to SVG (160x48) and exit",
    )
    p.add_argument(
        "--duration", type=float, default=30.0, metavar="S", help="with --screenshot: how long, in seconds (default 30)"
    )
    add_deprecated(p, "--seconds", new="--duration", dest="duration", type=float, metavar="S")
    p.add_argument("--no-model", action="store_true", help="do not attach to the worker extension (model panel off)")
    p.add_argument("--no-devices", action="store_true", help="do not sample GPUs / engine processes")
    p.set_defaults(handler=run)


def _check(args: argparse.Namespace) -> str:
    from vllm_doctor.live.sources import normalize_url

    if args.interval <= 0 or args.window <= 0:
        raise DoctorInputError("--interval and --window must be positive")
    if args.screenshot and args.once:
        raise DoctorInputError("--screenshot runs the app; --once prints text: choose one")
    if args.json and not args.once:
        raise DoctorInputError("--json needs --once (the live view is interactive)")
    return normalize_url(resolve_url(args, "vllm-doctor top"))


def device_sampler(pids: Any, background: bool = False) -> Any:
    """GPUs through NVML (once, in this process) and the engine processes named by ``pids``."""
    from vllm_doctor.live.devices import DeviceSampler

    return DeviceSampler(pids, background=background)


def live_source(url: str, interval_s: float, window_s: float, *, model: bool = True, devices: bool = True) -> Any:
    """The source ``top`` draws from. Its first scrape, NVML's start and the model channel's
    attach begin here, while the app is still being imported."""
    from vllm_doctor.live.sources import EnginePids, LiveSource, ModelChannel

    channel = ModelChannel(url) if model else None
    sampler = device_sampler(EnginePids(url, channel), background=True) if devices else None
    return LiveSource(url, interval_s=interval_s, window_s=window_s, devices=sampler, model=channel, prefetch=True)


def run(args: argparse.Namespace) -> int:
    url = _check(args)
    if args.once:
        return run_once(url, args)
    shot = Path(args.screenshot) if args.screenshot else None
    stopped: list[int] = []
    apps: list[Any] = []
    done = threading.Event()

    def stop(signum: int) -> None:
        # kill, a closed terminal, Ctrl-C from outside: the app exits the normal way, so the
        # model channel detaches from the workers (hooks left behind would cost every step)
        stopped.append(signum)
        if apps:
            threading.Thread(target=_exit_app, args=(apps[0], done), daemon=True).start()

    with on_stop_signals(stop):  # from before the model channel attaches until it has detached
        source = live_source(url, args.interval, args.window, model=not args.no_model, devices=not args.no_devices)
        try:
            from vllm_doctor.tui.top_app import TopApp

            app = TopApp(source, record_path=args.record, record=bool(args.record))
            apps.append(app)
            if shot is not None:

                def finish() -> None:
                    write_text_atomic(shot, app.export_screenshot(title=f"vllm-doctor top {url}"))
                    app.exit()

                app.call_later(lambda: app.set_timer(args.duration, finish))
            if not stopped:
                if shot is not None:
                    app.run(headless=True, size=(160, 48))
                else:
                    app.run()
        finally:
            done.set()
            source.close()  # the model channel detaches (the app's unmount did it already, if it ran)
    if stopped:
        print(f"vllm-doctor: stopped by {signal.Signals(stopped[0]).name}", file=sys.stderr)
    elif shot is not None:
        print(f"wrote {shot}")
    return 0


def _exit_app(app: Any, done: threading.Event) -> None:
    """Ask the app to exit from another thread; until it runs, try again (the signal may come
    while it starts)."""
    while not done.is_set():
        try:
            app.call_from_thread(app.exit)
            return
        except RuntimeError:  # not running yet, or closing
            done.wait(0.1)


# --once gives a script one answer: each scrape may take as long as Prometheus's default
# scrape_timeout (the live view keeps its 2 s: it asks again a second later). A loaded server
# (TP=2 on two busy cores) once took over 2 s to answer the second scrape, and --once said
# "cannot reach" (exit 2) of a server that was serving.
ONCE_SCRAPE_TIMEOUT_S = 10.0


def run_once(url: str, args: argparse.Namespace) -> int:
    from vllm_doctor.live.sources import EnginePids, LiveSource, ModelWindow

    source = LiveSource(
        url,
        interval_s=args.interval,
        window_s=args.window,
        devices=None if args.no_devices else device_sampler(EnginePids(url, None)),
        timeout_s=ONCE_SCRAPE_TIMEOUT_S,
    )
    first = source.poll()
    if not first.metrics.ok:
        print(f"vllm-doctor: error: {first.metrics.error}", file=sys.stderr)
        source.close()
        return 2
    # the model from inside over the same interval (the private channel; attached, then detached)
    progress = progress_printer(False)
    window = None
    if not args.no_model:
        began = time.monotonic()
        window = ModelWindow(url).open()
        said = "attached to the workers" if window.reader is not None else f"no model: {window.reason}"
        progress(f"{said} ({time.monotonic() - began:.1f} s); reading for {args.interval:g} s")
    try:
        time.sleep(args.interval)
        frame = source.poll()
    finally:
        source.close()
        began = time.monotonic()
        model = window.read() if window is not None else None
        if window is not None:
            progress(f"read the model's window and detached ({time.monotonic() - began:.1f} s)")
    if not frame.metrics.ok:
        print(f"vllm-doctor: error: {frame.metrics.error}", file=sys.stderr)
        return 2
    if args.json:
        devices = frame.devices.to_json() if frame.devices is not None else None  # --json: the edge
        body = {"url": url, "interval_s": args.interval, **frame.metrics.to_json(), "devices": devices}
        if model is not None:
            body["model"] = model.to_json()
        print(json.dumps(body, indent=2, default=str))
        return 0
    from vllm_doctor.tui.panels import PANELS

    if model is not None:
        frame = replace(frame, model=model)
    for key, (title, draw) in PANELS.items():
        if key == "history" or (key == "model" and model is None):
            continue
        print(f"== {title}")
        print(draw(frame, 78).plain.rstrip())
    return 0

"""``vllm-doctor attach --url URL``: profile a served engine's own traffic, check it, detach."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from typing import Any

from vllm_doctor.cli.common import (
    add_deprecated,
    add_fail_on,
    add_quiet,
    add_sample_every,
    add_step_clock,
    add_url,
    on_stop_signals,
    print_problems,
    progress_printer,
    raise_interrupt,
    resolve_url,
)
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.files import json_text
from vllm_doctor.model import Severity
from vllm_doctor.report.write import write_reports

DURATION_S = 30.0  # --duration's default

EPILOG = """\
the server must run with the doctor's plugin, started by the user who runs the doctor, on this
machine:
  VLLM_DOCTOR=1 vllm serve ./my-model
VLLM_DOCTOR=1 makes the plugin add the doctor's worker extension (kept beside any extension of
your own), and each process that holds a worker opens the doctor's private channel: a Unix socket
(mode 0600) that only this user can open, in the user's private directory (mode 0700):
VLLM_DOCTOR_DIR, else $XDG_RUNTIME_DIR/vllm-doctor, else $TMPDIR/vllm-doctor-<uid> (where another
user made that one first, the server makes a fresh one and the doctor finds it). No dev mode, no
extra port. A port another OS user listens on is refused before anything is asked of it (exit 2),
whoever runs the doctor, root included. vLLM's dev endpoint /collective_rpc
(VLLM_SERVER_DEV_MODE=1) is used only where no channel is found and the server is this user's and
listens on loopback alone (the doctor says so); on any other address it is refused (anyone who
reaches the port could call worker methods). With VLLM_DOCTOR_METRICS=1 at the server's start,
its /metrics also carries the doctor's vllm_doctor_* series (the workers' hooks then stay on
while it runs; off by default: no request turns them on). Per-layer timing is finest with
--enforce-eager; under CUDA graphs it is per piecewise span (docs/engine-stage.md).

While attached, the engine's own traffic is profiled; the first prefill and decode steps are
probed op by op (VD403/VD404; --no-probe to skip). On exit (after --duration, Ctrl-C, kill or a
closed terminal) every hook is removed from the workers and the report is printed; --out DIR also writes
report.json, report.html and trace.json (as `profile`).

exit codes: 0 nothing at or above --fail-on, 1 findings, 2 server unreachable / another OS user's
server / no channel (no VLLM_DOCTOR=1) / dev endpoint refused off loopback, 3 vllm-doctor failed

examples:
  vllm-doctor attach --url http://127.0.0.1:8000 --duration 60 --out prof
  vllm-doctor attach --url 127.0.0.1:8000 --duration 10 --no-layers --json
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attach",
        help="attach to a served engine (vllm serve) and profile its traffic",
        description="Attach to a running `vllm serve` (started with VLLM_DOCTOR=1) through the doctor's private "
        "channel, profile the forward pass of its real traffic, run the engine-stage checks, detach.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_url(p)
    p.add_argument(
        "--duration",
        type=float,
        default=DURATION_S,
        metavar="S",
        help=f"how long to stay attached, in seconds (default {DURATION_S:g}; Ctrl-C ends it early and still reports)",
    )
    add_deprecated(p, "--seconds", new="--duration", dest="duration", type=float, metavar="S")
    p.add_argument("--out", metavar="DIR", help="also write report.json, report.html and trace.json into DIR")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-layers", action="store_true", help="per-step timing only (no per-layer timing)")
    add_sample_every(p)
    add_step_clock(p)
    p.add_argument("--no-probe", action="store_true", help="do not probe the first steps op by op (VD403/VD404)")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="limit for each request to the server (default 60 s)",
    )
    add_deprecated(p, "--timeout", new="--request-timeout", dest="request_timeout", type=float, metavar="S")
    add_fail_on(p)
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_doctor.live.attach import EngineDoctor, ExtensionMissing, served_engine
    from vllm_doctor.live.channel import ChannelHandle
    from vllm_doctor.report.profile import render_anatomy, render_profile

    progress = progress_printer(args.quiet)
    url = resolve_url(args, "vllm-doctor attach")
    if args.duration < 0:
        raise DoctorInputError("--duration must not be negative")
    handle = served_engine(url, timeout=args.request_timeout)
    if not isinstance(handle, ChannelHandle):  # vLLM's dev endpoint: say so, and why
        progress(
            f"no private channel found ({getattr(handle, 'fallback_reason', '')}): reading the workers through "
            f"vLLM's dev endpoint {handle.url}/collective_rpc"
        )
    doc = EngineDoctor(
        handle,
        layers=not args.no_layers,
        sample_every=args.sample_every,
        probe=not args.no_probe,
        step_clock=args.step_clock,
    )
    # Ctrl-C, kill, a closed terminal: from the attach until the detach, a stop signal ends the
    # window (or skips it) and the doctor still detaches and reports; it never leaves its hooks
    stops: list[int] = []
    in_window = [False]

    def stop(signum: int) -> None:
        stops.append(signum)
        if in_window[0]:
            raise_interrupt(signum)

    with on_stop_signals(stop):
        try:
            doc.attach()
        except ExtensionMissing as exc:
            raise DoctorInputError(str(exc)) from None
        workers = len(doc.install_replies)
        layers = [r.get("data", {}).get("layers_reason") for r in doc.install_replies if r.get("ok")]
        progress(
            f"attached to {workers} worker(s) of {handle.model_name()} at {handle.url}"
            + (f"; {layers[0]}" if layers and layers[0] else "")
        )
        unreachable = handle.unreachable_ranks() if isinstance(handle, ChannelHandle) else []
        if unreachable:  # another node's workers (Ray): their channels are on their own machines
            names = ", ".join(map(str, unreachable))
            progress(
                (f"ranks {names} have" if len(unreachable) > 1 else f"rank {names} has")
                + f" no channel on this machine (workers on other nodes): the report covers {workers} worker(s) "
                "reached here; run vllm-doctor on each node for the others"
            )
        progress(f"profiling the server's traffic for {args.duration:g} s (Ctrl-C to stop early)")
        start = time.monotonic()
        last_note = start
        try:
            in_window[0] = not stops
            if stops:
                raise KeyboardInterrupt(signal.Signals(stops[0]).name)
            while (left := args.duration - (time.monotonic() - start)) > 0:
                time.sleep(min(1.0, left))
                if time.monotonic() - last_note >= 10 and not args.quiet:
                    last_note = time.monotonic()
                    steps = [r.get("data", {}).get("steps") for r in doc.status() if r.get("ok")]
                    progress(f"{time.monotonic() - start:.0f} s: {steps[0] if steps else '?'} step(s) so far")
        except KeyboardInterrupt as exc:
            in_window[0] = False
            progress(f"interrupted{f' ({exc})' if str(exc) else ''}: detaching and reporting")
        finally:
            in_window[0] = False
        try:
            doc.detach()
        finally:
            if doc.attached:
                progress("could not detach cleanly; the hooks stay until the server restarts")
    report = doc.report(handle.model_name())
    report.timings["attached_s"] = round(time.monotonic() - start, 3)
    if args.out:
        paths = write_reports(Path(args.out), report)
        progress("wrote " + ", ".join(str(p) for p in paths))
    if args.json:
        print(json_text(report.to_dict()))
        return 1 if report.problems(Severity(args.fail_on)) else 0
    print(render_anatomy(report.facts["engine"]))
    print(render_profile(report.profiles["engine"]))
    return 1 if print_problems(report, args.fail_on) else 0

"""``vllm-doctor replay FILE``: drive the ``top`` app from a recording."""

from __future__ import annotations

import argparse
from typing import Any

from vllm_doctor.errors import DoctorInputError

EPILOG = """\
A recording (vllm-doctor top --url URL --record FILE) holds every refresh: the raw /metrics scrape,
the derived numbers, the devices and the model panel. Replay re-derives the numbers from the
raw scrapes with the same code as top, so the latency window (w) can be changed afterwards.

keys: ←/→ seek 10 refreshes  home/end first/last  +/- speed  p pause  w window  z zoom
      ? what every number is  q quit

exit codes: 0 ok, 2 not a recording / unreadable file

examples:
  vllm-doctor replay run.jsonl.gz
  vllm-doctor replay run.jsonl.gz --speed 4
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a recording of top (--record FILE) in the same app",
        description="Replay a recording made with `vllm-doctor top --url URL --record FILE`: the same panels, "
        "with seek and speed keys. Attach a recording to a bug report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="the recording (gzip JSONL)")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="replay speed (default 1 = recorded pace)")
    p.add_argument("--window", type=float, default=None, metavar="S", help="latency window (default: as recorded)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_doctor.live.record import ReplaySource

    if args.speed <= 0:
        raise DoctorInputError("--speed must be positive")
    source = ReplaySource(args.file, speed=args.speed, window_s=args.window)
    from vllm_doctor.tui.top_app import TopApp

    TopApp(source, replay=True).run()
    return 0

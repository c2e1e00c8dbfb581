"""``vllm-doctor view REPORT``: open a report the doctor wrote in the terminal UI."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vllm_doctor.cli.common import EXIT_INPUT, EXIT_OK

EPILOG = """\
REPORT is any report the doctor writes: `check --json` output (with or without --engine),
or report.json from `profile --out DIR` / `attach --out DIR` (or that DIR itself).

panes (keys 1-6): findings with each check's explanation, engine anatomy, steps (prefill /
decode and every step), per-layer time (o: sort order), memory breakdown, KV cache.
? shows the keys and where each number comes from; q quits.

examples:
  vllm-doctor view prof/report.json
  vllm-doctor check ./my-model --json > r.json; vllm-doctor view r.json
  vllm-doctor view prof --screenshot view.svg      # the screen as SVG, no terminal needed
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "view",
        help="browse a report in the terminal UI",
        description="Open a report the doctor wrote (check --json, profile, attach) in the terminal UI.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", help="report JSON file, or a directory with report.json")
    p.add_argument(
        "--screenshot",
        metavar="SVG",
        help="write the first screen as SVG (pane by --pane, size by --size) instead of opening the UI",
    )
    p.add_argument("--pane", default="findings", choices=["findings", "anatomy", "steps", "layers", "memory", "kv"],
                   help="with --screenshot: the pane to show (default findings)")  # fmt: skip
    p.add_argument("--size", default="160x48", metavar="COLSxROWS", help="with --screenshot: terminal size (160x48)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_doctor.errors import DoctorInputError
    from vllm_doctor.tui.report_view import ViewApp, screenshot

    app = ViewApp(args.report)  # reads and checks the file first: bad input exits 2 before any screen
    if args.screenshot:
        try:
            cols, rows = (int(n) for n in args.size.lower().split("x"))
        except ValueError:
            raise DoctorInputError(f"--size {args.size!r}: expected COLSxROWS, e.g. 160x48") from None
        if not (40 <= cols <= 1000 and 10 <= rows <= 1000):
            raise DoctorInputError(f"--size {args.size}: columns 40-1000, rows 10-1000")
        try:
            screenshot(app, args.screenshot, (cols, rows), args.pane)
        except OSError as exc:
            raise DoctorInputError(f"--screenshot {args.screenshot}: cannot write it ({exc.strerror or exc})") from None
        print(f"wrote {args.screenshot}", file=sys.stderr)
        return EXIT_OK
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        raise DoctorInputError("view needs a terminal", "run it in a terminal, or write an SVG with --screenshot FILE")
    app.run()
    return EXIT_OK if app.return_code in (None, 0) else EXIT_INPUT

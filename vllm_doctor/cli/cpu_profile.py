"""``vllm-doctor cpu-profile``: py-spy record of a running engine's EngineCore and workers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_doctor.cli.common import EXIT_FINDINGS, EXIT_OK, add_target, progress_printer
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.files import json_text, write_json_atomic, write_text_atomic
from vllm_doctor.report.write import CPU_PROFILE_INDEX

BEHIND_NOTE_S = 1.0  # py-spy warns from one second behind its rate

EPILOG = """\
Records each EngineCore and worker process (--api-server adds the API server) with py-spy for
--duration seconds of wall-clock time (py-spy's own --duration counts samples: on a busy machine
it records for much longer), without pausing the engine, and writes into DIR, atomically:
  cpu-<role><rank>-<pid>.speedscope.json   open at https://www.speedscope.app
  cpu-<role><rank>-<pid>.svg               flamegraph, opens in a browser
  index.json                               what was recorded (and why a process was not)
If DIR holds a report.html (from `vllm-doctor profile --out DIR` or `attach --out DIR`), a
"CPU profile" section linking the flamegraphs is added to it; a later `profile --out DIR`
keeps the links.

Only samples of threads running Python code are kept (py-spy's default): an idle engine gives
none. Profile while it serves traffic, or add --idle to keep waiting threads too.

exit codes: 0 profiles written, 1 no process gave a sample (idle), 2 bad target / py-spy
missing, too old or refused, 3 vllm-doctor failed

examples:
  vllm-doctor cpu-profile --url http://127.0.0.1:8000 --duration 20 --out prof
  vllm-doctor cpu-profile --pid 12345 --duration 10 --out prof --native
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cpu-profile",
        help="py-spy record of EngineCore and workers: speedscope JSON + flamegraph SVG",
        description="Record the host-side (Python) CPU profile of a running vLLM engine's EngineCore and "
        "worker processes with py-spy: a speedscope JSON and a flamegraph SVG per process.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target(p)
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="seconds to record (default 10)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the profiles and index.json")
    p.add_argument("--rate", type=int, default=100, metavar="HZ", help="samples per second (default 100)")
    p.add_argument("--native", action="store_true", help="include native (C/C++/CUDA) frames (py-spy --native)")
    p.add_argument("--idle", action="store_true", help="also keep samples of waiting threads (py-spy --idle)")
    p.add_argument("--api-server", action="store_true", help="record the API server process too")
    p.add_argument("--json", action="store_true", help="print index.json's content")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_doctor.live.cpu_profile import record_engine
    from vllm_doctor.live.stacks import pyspy_or_input_error
    from vllm_doctor.report.html import link_cpu_profile

    progress = progress_printer(args.quiet)
    if args.rate < 1 or args.rate > 1000:
        raise DoctorInputError("--rate must be between 1 and 1000 Hz")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DoctorInputError(f"--out {out} exists and is not a directory")
    spy = pyspy_or_input_error()  # before anything is said or written: exit 2 if py-spy is unusable
    progress(f"recording for {args.duration:g} s ...")
    index = record_engine(
        out,
        args.duration,
        url=args.url,
        pid=args.pid,
        rate=args.rate,
        native=args.native,
        idle=args.idle,
        include_api_server=args.api_server,
        spy=spy,
    )
    write_json_atomic(out / CPU_PROFILE_INDEX, index)
    report_html = out / "report.html"
    if report_html.is_file():
        write_text_atomic(report_html, link_cpu_profile(report_html.read_text(encoding="utf-8"), index))
        progress(f"linked the flamegraphs from {report_html}")
    written = [p for p in index["processes"] if p["flamegraph"] or p["speedscope"]]
    if args.json:
        print(json_text(index))
    else:
        for p in index["processes"]:
            files = ", ".join(str(out / f) for f in (p["flamegraph"], p["speedscope"]) if f)
            line = f"  {p['label']:<11} pid {p['pid']:<7} {files or 'no profile'}"
            if p["error"]:
                line += f"\n{'':>13}{p['error']}" + (f"\n{'':>13}hint: {p['hint']}" if p["hint"] else "")
            if (p.get("behind_s") or 0) >= BEHIND_NOTE_S:
                line += (
                    f"\n{'':>13}py-spy fell up to {p['behind_s']:.1f} s behind --rate {args.rate} (a busy machine, or "
                    "many threads): fewer samples over the same seconds; a lower --rate keeps up"
                )
            print(line)
        print(f"index: {out / CPU_PROFILE_INDEX}")
    return EXIT_OK if written else EXIT_FINDINGS

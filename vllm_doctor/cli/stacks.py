"""``vllm-doctor stacks``: what every process of a running engine is doing, from py-spy dumps."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vllm_doctor.cli.common import EXIT_FINDINGS, EXIT_OK, add_deprecated, add_target
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.files import json_text

EPILOG = """\
Finds every process of the engine (API server, EngineCore, workers: vLLM titles them
VLLM::EngineCore, VLLM::Worker_TP1, ...) from the process listening on --url's port, or from
--pid (any process of the engine: the doctor walks up to its root), dumps each one's Python
stacks with py-spy, and says in one line per process what it does; then one verdict:
  idle | busy | stuck in the model | stuck in a collective | stuck in start-up
"stuck" means the stack did not move over the samples (default 2, 1 s apart). The engine
needs no plugin and no flag: a hung engine can be read as it is.

py-spy (pip install py-spy) must be allowed to read the processes: same user or root; on
Linux with Yama, kernel.yama.ptrace_scope=0 or root; in Docker, --cap-add SYS_PTRACE. The
doctor never uses sudo; when py-spy is refused it says which of these applies.

exit codes: 0 idle or busy, 1 stuck, 2 bad target / py-spy missing, too old or refused,
3 vllm-doctor failed

examples:
  vllm-doctor stacks --url http://127.0.0.1:8000
  vllm-doctor stacks --pid 12345 --native --json
  vllm-doctor stacks --url 127.0.0.1:8000 --watch 5          # every 5 s until Ctrl-C
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "stacks",
        help="what each process of a running engine is doing (py-spy), and a verdict",
        description="Dump the Python stacks of every process of a running vLLM engine with py-spy, label "
        "each by role and rank, and say what it is doing: idle, busy, stuck in the model, stuck in a "
        "collective, stuck in start-up.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target(p)
    p.add_argument("--native", action="store_true", help="include native (C/C++/CUDA) frames (py-spy --native)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (one object per round with --watch)")
    p.add_argument(
        "--samples", type=int, default=2, metavar="N", help="dumps per process (default 2; 1 cannot tell stuck)"
    )
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between samples (default 1)")
    p.add_argument(
        "--watch",
        type=float,
        metavar="N",
        help="repeat every N seconds until Ctrl-C, and say which stacks did not move since the last round",
    )
    p.add_argument("--rounds", type=int, metavar="K", help="with --watch: stop after K rounds")
    p.add_argument("--stacks", action="store_true", help="also print each process's main-thread stack")
    p.add_argument(
        "--pyspy-timeout", type=float, default=30.0, metavar="S", help="limit for each py-spy call (default 30 s)"
    )
    add_deprecated(p, "--timeout", new="--pyspy-timeout", dest="pyspy_timeout", type=float, metavar="S")
    p.set_defaults(handler=run)


def render(report: dict[str, Any], show_stacks: bool = False, still_rounds: dict[int, int] | None = None) -> str:
    """The text of one stacks report (its to_dict())."""
    procs = report["processes"]
    head = f"{report['target']}: {len(procs)} process(es)"
    if report["samples"] > 1:
        head += f", {report['samples']} samples over {report['seconds']:.1f} s"
    lines = [head]
    width = max((len(p["label"]) for p in procs), default=10)
    for p in procs:
        text = p["summary"] if not p["error"] else f"error: {p['error']}"
        if p["did_not_move"] and p["state"] not in ("idle", "error"):
            text += " (did not move)"
        if p["error"] and p["hint"]:
            text += f"\n{'':>{width + 14}}hint: {p['hint']}"
        lines.append(f"  {p['label']:<{width}}  pid {p['pid']:<7} {text}")
        if show_stacks and p.get("threads"):
            main = next((t for t in p["threads"] if t["os_thread_id"] == p["pid"]), p["threads"][0])
            lines += [f"{'':>{width + 6}}{f['name']} ({f['file']}:{f['line']})" for f in main["frames"]]
    if still_rounds is not None:
        stuck = [p for p in procs if still_rounds.get(p["pid"], 0) and p["state"] != "idle"]
        if stuck:
            lines.append(
                "did not move since the last round: "
                + ", ".join(f"{p['label']} ({still_rounds[p['pid']]} round(s))" for p in stuck)
            )
        elif report["round"] > 1:
            lines.append("every non-idle stack moved since the last round")
    lines.append(f"verdict: {report['verdict']['text']}")
    return "\n".join(lines)


def exit_code(report: dict[str, Any]) -> int:
    return EXIT_FINDINGS if str(report["verdict"]["kind"]).startswith("stuck") else EXIT_OK


def run(args: argparse.Namespace) -> int:
    from vllm_doctor.live import stacks

    if args.samples < 1 or args.interval < 0 or (args.watch is not None and args.watch <= 0):
        raise DoctorInputError("--samples must be >= 1, --interval >= 0 and --watch > 0")
    if args.rounds is not None and (args.watch is None or args.rounds < 1):
        raise DoctorInputError("--rounds needs --watch and must be >= 1")
    if args.watch is None:
        report = stacks.collect(
            url=args.url,
            pid=args.pid,
            samples=args.samples,
            interval=args.interval,
            native=args.native,
            timeout=args.pyspy_timeout,
        ).to_dict()
        print(json_text(report) if args.json else render(report, args.stacks))
        return exit_code(report)
    still_rounds: dict[int, int] = {}
    code = EXIT_OK
    try:
        for rep in stacks.watch(args.url, args.pid, args.watch, args.rounds, args.native, args.pyspy_timeout):
            report = rep.to_dict()
            for p in report["processes"]:
                still_rounds[p["pid"]] = still_rounds.get(p["pid"], 0) + 1 if p["did_not_move"] else 0
            if args.json:
                print(json_text(report | {"did_not_move_rounds": still_rounds}, indent=None), flush=True)
            else:
                print(render(report, args.stacks, still_rounds) + "\n", flush=True)
            code = exit_code(report)
    except KeyboardInterrupt:
        print("vllm-doctor: stopped", file=sys.stderr)
    return code

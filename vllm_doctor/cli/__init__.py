"""``vllm-doctor``: the command line, one module per verb.

Verbs: check, rules, rule, profile, attach, stacks, cpu-profile, top, replay, view. The overview
(``vllm-doctor --help``) lists each verb once: the hand-written list in ``DESCRIPTION``; argparse's
own list of the subcommands is suppressed (tests/unit/test_cli_help.py keeps the two in step).

Exit codes: 0 no finding at or above --fail-on; 1 findings at or above it; 2 usage or input
error (bad path, unreadable config.json); 3 the doctor itself failed.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from vllm_doctor import __version__
from vllm_doctor.cli import attach, check, cpu_profile, profile, replay, rules, stacks, top, view
from vllm_doctor.cli.common import EXIT_FINDINGS, EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, Parser
from vllm_doctor.constants import DISTRIBUTION
from vllm_doctor.errors import DoctorInputError

__all__ = ["EXIT_FINDINGS", "EXIT_INPUT", "EXIT_INTERNAL", "EXIT_OK", "build_parser", "main"]

DESCRIPTION = """\
Find out why vLLM will not find, build, load or run your custom model — before vLLM tells you.

commands:
  check MODEL_DIR   registry, config.json and model-class checks (exit 0/1/2/3);
                    --engine adds device, KV-cache and memory checks on a real engine
  profile MODEL_DIR --out DIR
                    forward profile on a real engine: report.json, report.html, trace.json
  attach --url URL  attach to a served engine (vllm serve with VLLM_DOCTOR=1), profile its
                    traffic, run the engine checks, detach
  stacks --url URL | --pid PID
                    what each process of a running engine does (py-spy), one verdict:
                    idle / busy / stuck in the model / in a collective / in start-up
  cpu-profile --url URL | --pid PID --out DIR
                    py-spy record of EngineCore and workers: speedscope JSON + flamegraph SVG
  top --url URL     live view of a serving engine: state, throughput, latency, KV cache,
                    GPUs, the model from inside; --record FILE, --once --json
  replay FILE       replay a recording of top in the same app (seek, speed)
  rules             the check catalogue
  rule CODE         one check explained: what, why, example, fix, references
  view REPORT       browse a report (check --json, profile, attach) in the terminal UI

`vllm-doctor COMMAND --help` gives a command's options, what it prints and examples.
"""

EPILOG = """\
exit codes: 0 no finding at or above --fail-on; 1 findings at or above it; 2 usage or input
error (bad path, unreadable config.json, server unreachable); 3 vllm-doctor itself failed
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="vllm-doctor",
        usage="%(prog)s [-h] [--version] [--debug] COMMAND ...",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vllm-doctor {__version__} ({DISTRIBUTION})")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    # DESCRIPTION lists the verbs: argparse's second list of them is suppressed
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS, prog=parser.prog)
    check.add_parser(sub)
    profile.add_parser(sub)
    attach.add_parser(sub)
    stacks.add_parser(sub)
    cpu_profile.add_parser(sub)
    top.add_parser(sub)
    replay.add_parser(sub)
    rules.add_parsers(sub)
    view.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_INPUT
    try:
        return int(args.handler(args))
    except DoctorInputError as exc:
        print(f"vllm-doctor: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("vllm-doctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # the doctor's own failure: say so, exit 3
        print(f"vllm-doctor: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("  this is a bug in vllm-doctor; rerun with --debug and report the traceback", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())

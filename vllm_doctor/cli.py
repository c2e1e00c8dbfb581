"""``vllm-doctor``: the command line.

Exit codes: 0 no finding at or above --fail-on; 1 findings at or above it; 2 usage or input
error (bad path, unreadable config.json); 3 the doctor itself failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence

from vllm_doctor import __version__
from vllm_doctor.cli_engine import (
    add_attach_parser,
    add_engine_options,
    add_profile_parser,
    cmd_attach,
    cmd_profile,
    positive_int,
)
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import Severity

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3

DESCRIPTION = """\
Find out why vLLM will not find, build, load or run your custom model — before vLLM tells you.

commands:
  check MODEL_DIR   registry, config.json and model-class checks (exit 0/1/2/3);
                    --engine adds device, KV-cache and memory checks on a real engine
  profile MODEL_DIR --out DIR
                    forward profile on a real engine: report.json, report.html, trace.json
  attach URL        attach to a served engine (vllm serve with VLLM_DOCTOR=1), profile its
                    traffic, run the engine checks, detach
  rules             the check catalogue
  rule CODE         one check explained: what, why, example, fix, references
"""

CHECK_EPILOG = """\
passes:
  fast pass    config.json + vLLM's registry tables read from its source + plugin entry
               points read statically; no `import vllm` (well under 2 s)
  import pass  a FRESH process imports vLLM and loads every vllm.general_plugins entry point
               the way an engine process does, then imports and inspects your model class
               (about 5-15 s); --fast skips it

exit codes: 0 nothing at or above --fail-on, 1 findings, 2 bad input, 3 vllm-doctor failed

examples:
  vllm-doctor check ./my-model
  vllm-doctor check ./my-model --json > report.json
  vllm-doctor check ./my-model --select VD1 --fail-on warn
  vllm-doctor check ./my-model --script serve.py     # is my script's register_model visible?
"""


def _codes(value: str) -> set[str]:
    return {c.strip().upper() for c in value.split(",") if c.strip()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-doctor", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"vllm-doctor {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p_check = sub.add_parser(
        "check",
        help="check a model directory",
        description="Check a model directory (config.json + weights) against the vLLM installed here.",
        epilog=CHECK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p_check.add_argument("model", help="model directory with config.json (or a hub id already in the local HF cache)")
    p_check.add_argument("--json", action="store_true", help="print the report as JSON (schema: docs/report-schema.json)")
    p_check.add_argument("--output", "-o", metavar="FILE", help="also write the JSON report to FILE (atomically)")
    p_check.add_argument(
        "--fail-on", choices=[s.value for s in Severity], default="error",
        help="lowest severity that makes the exit code 1 (default: error)",
    )
    p_check.add_argument("--select", type=_codes, default=set(), metavar="CODES", help="only these codes or prefixes, comma-separated (VD1,VD205)")
    p_check.add_argument("--ignore", type=_codes, default=set(), metavar="CODES", help="skip these codes or prefixes")
    p_check.add_argument("--trust-remote-code", action="store_true", help="as vLLM's flag: allow auto_map code from the model dir")
    p_check.add_argument("--fast", action="store_true", help="fast pass only: do not import vLLM")
    p_check.add_argument("--script", metavar="FILE", help="your serving script: find register_model calls the engine's processes will not run (VD102)")
    p_check.add_argument("--timeout", type=float, default=180.0, metavar="S", help="limit for the import pass (default 180 s)")
    p_check.add_argument(
        "--tensor-parallel-size", "-tp", type=positive_int, default=1, metavar="N",
        help="check that the model can be split over N ranks (VD305; default 1)",
    )
    p_check.add_argument("--verbose", "-v", action="store_true", help="list passing checks and whole tracebacks")
    p_check.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    add_engine_options(p_check, with_switch=True)
    add_profile_parser(sub)
    add_attach_parser(sub)

    p_rules = sub.add_parser("rules", help="list every check", description="List the check catalogue.")
    p_rules.add_argument("--json", action="store_true", help="as JSON")
    p_rule = sub.add_parser("rule", help="explain one check", description="Explain one check.")
    p_rule.add_argument("code", help="e.g. VD101 or architecture-not-registered")
    p_rule.add_argument("--json", action="store_true", help="as JSON")
    return parser


def _cmd_check(args: argparse.Namespace) -> int:
    from vllm_doctor.cli_engine import add_engine_stage
    from vllm_doctor.report.io import write_json_atomic
    from vllm_doctor.report.text import render
    from vllm_doctor.runner import CheckOptions, diagnose

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"vllm-doctor: {msg}", file=sys.stderr, flush=True)

    options = CheckOptions(
        trust_remote_code=args.trust_remote_code,
        fast=args.fast,
        select=args.select,
        ignore=args.ignore,
        script=args.script,
        import_timeout=args.timeout,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    report = diagnose(args.model, options, progress)
    anatomy = add_engine_stage(args, report, progress) if args.engine else None
    data = report.to_dict()
    if args.output:
        write_json_atomic(args.output, data)
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(render(report, verbose=args.verbose))
        if anatomy:
            print("\n" + anatomy)
    if any(f.outcome.value == "crash" for f in report.findings):
        progress("a check crashed (see CRASH above); other findings are still valid")
    return EXIT_FINDINGS if report.problems(Severity(args.fail_on)) else EXIT_OK


def _find_meta(code: str):  # type: ignore[no-untyped-def]
    from vllm_doctor.checks import CATALOGUE

    key = code.strip()
    if key.upper() in CATALOGUE:
        return CATALOGUE[key.upper()].meta
    for entry in CATALOGUE.values():
        if entry.meta.name == key:
            return entry.meta
    return None


def _cmd_rules(args: argparse.Namespace) -> int:
    from vllm_doctor.checks import CATALOGUE

    metas = [CATALOGUE[c].meta for c in sorted(CATALOGUE)]
    if args.json:
        print(json.dumps([m.to_dict() for m in metas], indent=2))
        return EXIT_OK
    for m in metas:
        print(f"{m.code}  {m.name:<38} {m.severity.value:<5} {m.stage.value:<6} {m.summary}")
    return EXIT_OK


def _cmd_rule(args: argparse.Namespace) -> int:
    meta = _find_meta(args.code)
    if meta is None:
        raise DoctorInputError(f"no check named {args.code!r}", "`vllm-doctor rules` lists them")
    if args.json:
        print(json.dumps(meta.to_dict(), indent=2))
        return EXIT_OK
    e = meta.explanation
    print(f"{meta.code} {meta.name} ({meta.severity.value}, {meta.stage.value} stage)\n\n{meta.summary}\n")
    print(f"What\n  {e.what}\n\nWhy it hurts\n  {e.why}\n\nExample\n" + "\n".join("  " + line for line in e.example.splitlines()))
    print("\nFix\n" + "\n".join("  " + line for line in e.fix.splitlines()))
    if e.references:
        print("\nReferences\n" + "\n".join(f"  {r}" for r in e.references))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_INPUT
    handlers = {"check": _cmd_check, "rules": _cmd_rules, "rule": _cmd_rule, "profile": cmd_profile, "attach": cmd_attach}
    try:
        return handlers[args.command](args)
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

"""``vllm-doctor check MODEL_DIR``: the static stage, and with ``--engine`` the engine stage."""

from __future__ import annotations

import argparse
from typing import Any

from vllm_doctor.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    add_deprecated,
    add_engine_options,
    add_fail_on,
    add_quiet,
    codes,
    engine_options,
    print_engine_outcome,
    progress_printer,
)
from vllm_doctor.model import Severity

EPILOG = """\
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


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="check a model directory",
        description="Check a model directory (config.json + weights) against the vLLM installed here.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="model directory with config.json (or a hub id already in the local HF cache)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema: docs/report-schema.json)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE (atomically)")
    add_deprecated(p, "--output", "-o", new="--out", dest="out", metavar="FILE")
    add_fail_on(p)
    p.add_argument(
        "--select",
        type=codes,
        default=set(),
        metavar="CODES",
        help="only these codes or prefixes, comma-separated (VD1,VD205)",
    )
    p.add_argument("--ignore", type=codes, default=set(), metavar="CODES", help="skip these codes or prefixes")
    p.add_argument("--fast", action="store_true", help="fast pass only: do not import vLLM")
    p.add_argument(
        "--script",
        metavar="FILE",
        help="your serving script: find register_model calls the engine's processes will not run (VD102)",
    )
    p.add_argument(
        "--import-timeout",
        type=float,
        default=180.0,
        metavar="S",
        help="limit for the import pass, and for the weights pass (default 180 s each)",
    )
    add_deprecated(p, "--timeout", new="--import-timeout", dest="import_timeout", type=float, metavar="S")
    p.add_argument("--verbose", "-v", action="store_true", help="list passing checks and whole tracebacks")
    add_quiet(p)
    add_engine_options(p, with_switch=True)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_doctor.files import json_text, write_json_atomic
    from vllm_doctor.report.profile import answered_anatomy, render_anatomy
    from vllm_doctor.report.text import render
    from vllm_doctor.stages.engine import Workload, diagnose_engine
    from vllm_doctor.stages.static import CheckOptions, diagnose

    progress = progress_printer(args.quiet)
    engine = engine_options(args, workload=Workload())
    options = CheckOptions(
        trust_remote_code=engine.trust_remote_code,
        fast=args.fast,
        select=args.select,
        ignore=args.ignore,
        script=args.script,
        import_timeout=args.import_timeout,
        tensor_parallel_size=engine.tensor_parallel_size,
        pipeline_parallel_size=engine.pipeline_parallel_size,
        enable_expert_parallel=engine.enable_expert_parallel,
        max_memory=engine.max_memory,
    )
    report = diagnose(args.model, options, progress)
    if args.engine:
        report = diagnose_engine(
            report.target, engine, report, select=args.select, ignore=args.ignore, progress=progress
        )
    data = report.to_dict()
    if args.out:
        write_json_atomic(args.out, data)
    if args.json:
        print(json_text(data))
    else:
        print(render(report, verbose=args.verbose))
        if args.engine:
            print()
            anatomy = answered_anatomy(report)
            if anatomy is not None:
                print(render_anatomy(anatomy))
            print_engine_outcome(report)
    if any(f.outcome.value == "crash" for f in report.findings):
        progress("a check crashed (see CRASH above); other findings are still valid")
    return EXIT_FINDINGS if report.problems(Severity(args.fail_on)) else EXIT_OK

"""``vllm-doctor rules`` and ``vllm-doctor rule CODE``: the check catalogue."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vllm_doctor.cli.common import EXIT_OK
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import CheckMeta
from vllm_doctor.report.rule import render_rule


def add_parsers(sub: Any) -> None:
    p_rules = sub.add_parser("rules", help="list every check", description="List the check catalogue.")
    p_rules.add_argument("--json", action="store_true", help="as JSON")
    p_rules.set_defaults(handler=run_rules)
    p_rule = sub.add_parser("rule", help="explain one check", description="Explain one check.")
    p_rule.add_argument("code", help="e.g. VD101 or architecture-not-registered")
    p_rule.add_argument("--json", action="store_true", help="as JSON")
    p_rule.set_defaults(handler=run_rule)


def find_meta(code: str) -> CheckMeta | None:
    from vllm_doctor.checks import CATALOGUE

    key = code.strip()
    if key.upper() in CATALOGUE:
        return CATALOGUE[key.upper()].meta
    for entry in CATALOGUE.values():
        if entry.meta.name == key:
            return entry.meta
    return None


def run_rules(args: argparse.Namespace) -> int:
    from vllm_doctor.checks import CATALOGUE

    metas = [CATALOGUE[c].meta for c in sorted(CATALOGUE)]
    if args.json:
        print(json.dumps([m.to_dict() for m in metas], indent=2))
        return EXIT_OK
    for m in metas:
        print(f"{m.code}  {m.name:<38} {m.severity_text:<5} {m.stage.value:<6} {m.topic:<9} {m.summary}")
    return EXIT_OK


def run_rule(args: argparse.Namespace) -> int:
    meta = find_meta(args.code)
    if meta is None:
        raise DoctorInputError(f"no check named {args.code!r}", "`vllm-doctor rules` lists them")
    if args.json:
        print(json.dumps(meta.to_dict(), indent=2))
        return EXIT_OK
    print(render_rule(meta))
    return EXIT_OK

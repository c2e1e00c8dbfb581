"""The catalogue, ``vllm-doctor rule`` and ``check`` agree on a check's severity (issue 47 item 11).

A check's findings take its catalogue severity unless the check gives one per finding
(``emit.fail(..., severity=Severity.X)``): every such severity in a check's own body must be the
catalogue's or declared in ``@check(also=...)``, which the README's table and ``rule`` print
(``warn (or error)``). Read from the checks' source: a severity given per finding that the
catalogue does not name fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from vllm_doctor.checks import CATALOGUE
from vllm_doctor.report.catalogue import markdown
from vllm_doctor.report.rule import render_rule

CHECKS = Path(__file__).resolve().parents[2] / "vllm_doctor" / "checks"


def severities_given(fn: ast.FunctionDef) -> set[str]:
    """Severity names a check's body passes to ``emit.fail`` / ``emit.warn`` as ``severity=``."""
    found: set[str] = set()
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in ("fail", "warn"):
            for kw in call.keywords:
                if kw.arg == "severity":
                    found |= {n.attr.lower() for n in ast.walk(kw.value)
                              if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "Severity"}
    return found


def checks_in_source() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted(CHECKS.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, ast.FunctionDef):
                for dec in fn.decorator_list:
                    if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "check":
                        out[dec.args[0].value] = severities_given(fn)  # type: ignore[attr-defined]
    return out


def test_every_severity_a_check_gives_is_in_the_catalogue() -> None:
    given = checks_in_source()
    assert set(given) == set(CATALOGUE)
    undeclared = {
        code: sorted(sev - {(m := CATALOGUE[code].meta).severity.value} - {s.value for s in m.also})
        for code, sev in given.items()
    }
    assert {c: s for c, s in undeclared.items() if s} == {}, "declare them in @check(also=...)"


def test_the_catalogue_and_rule_name_them() -> None:
    meta = CATALOGUE["VD206"].meta  # an error where this vLLM requires embed_input_ids, else a warning
    assert meta.severity_text == "warn (or error)"
    assert render_rule(meta).startswith("VD206 embed-input-ids-missing (warn (or error), static stage)")
    assert "| VD206 | `embed-input-ids-missing` | warn (or error) | static |" in markdown()
    assert CATALOGUE["VD205"].meta.severity_text == "error"

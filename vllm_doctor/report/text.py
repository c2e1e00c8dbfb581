"""Human-readable rendering of a Report for the terminal."""

from __future__ import annotations

from vllm_doctor.analysis.records import ResolvedClass, held
from vllm_doctor.checks import CATALOGUE
from vllm_doctor.model import Finding, Outcome, Report, report_order
from vllm_doctor.units import clip

MARK = {
    Outcome.FAIL: "FAIL",
    Outcome.WARN: "WARN",
    Outcome.CRASH: "CRASH",
    Outcome.PASS: "ok",
    Outcome.SKIP: "skip",
    Outcome.NOT_APPLICABLE: "n/a",
}


def finding_lines(f: Finding, verbose: bool) -> list[str]:
    """One finding as the CLI prints it: mark, code, name, severity; message; at; fix; traceback; vLLM's words."""
    name = CATALOGUE[f.code].meta.name if f.code in CATALOGUE else ""
    head = f"{MARK[f.outcome]:<5} {f.code} {name} [{f.severity.value}]"
    lines = [head, f"      {f.message}"]
    if f.subject:
        lines.append(f"      at: {f.subject}")
    if f.hint:
        lines.append(f"      fix: {f.hint}")
    tb = f.evidence.get("traceback") if f.is_problem else None
    if tb:
        tail = tb.strip().splitlines()
        shown = tail if verbose else tail[-6:]
        lines.append("      traceback" + ("" if verbose else " (last lines; --verbose for all)") + ":")
        lines.extend("        " + line for line in shown)
    if f.evidence.get("vllm_error") and f.is_problem:
        lines.append(f"      vLLM would say: {clip(f.evidence['vllm_error'], 200)}")
    return lines


def render(report: Report, verbose: bool = False) -> str:
    out = [f"vllm-doctor check {report.target}"]
    env = report.environment
    out.append(
        f"  vLLM {env.get('vllm') or 'not installed'} | torch {env.get('torch') or '-'} | "
        f"transformers {env.get('transformers') or '-'} | registry from {report.facts.get('registry_source', '?')}"
    )
    resolved = held(report, "facts", "resolved", ResolvedClass)
    if resolved is not None:
        out.append(f"  resolves to: {resolved.architecture} -> {resolved.target}")
    out.append("")
    ordered = sorted(report.findings, key=report_order)  # the most severe first
    problems = [f for f in ordered if f.is_problem]
    others = [f for f in ordered if not f.is_problem]
    for f in problems:
        out.extend(finding_lines(f, verbose))
        out.append("")
    if verbose:
        for f in others:
            out.extend(finding_lines(f, verbose))
    else:
        counts: dict[str, int] = {}
        for f in others:
            counts[MARK[f.outcome]] = counts.get(MARK[f.outcome], 0) + 1
        if others:
            out.append("  " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + " (--verbose lists them)")
        skips = [f for f in others if f.outcome is Outcome.SKIP]
        for f in skips[:3]:
            out.append(f"  skip {f.code}: {clip(f.message.splitlines()[0], 160)}")
    t = report.timings
    out.append(
        f"  {len(problems)} problem(s); fast pass {t.get('static_pass_s', 0):.2f} s"
        + (f", import pass {t['import_pass_s']:.1f} s" if "import_pass_s" in t else "")
    )
    if report.facts.get("engine_log"):  # check --engine: the directory it lies in is kept for the user
        out.append(f"  engine log: {report.facts['engine_log']}")
    return "\n".join(out)

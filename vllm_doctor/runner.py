"""Gather facts (fast static pass, then the import pass in a fresh process) and run the checks."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vllm_doctor import environment
from vllm_doctor.checks import CATALOGUE
from vllm_doctor.compat.plugins import discover_general_plugins
from vllm_doctor.compat.source_tables import (
    read_transformers_class_names,
    read_transformers_model_types,
    read_vllm_registry_tables,
)
from vllm_doctor.facts import Facts
from vllm_doctor.model import Finding, Outcome, Report, Severity, Stage
from vllm_doctor.probes.import_probe import run_import_probe
from vllm_doctor.probes.model_dir import resolve_model_dir
from vllm_doctor.probes.script_scan import scan_script
from vllm_doctor.weights_pass import add_weight_facts, weights_report

Progress = Callable[[str], None]


@dataclass
class CheckOptions:
    trust_remote_code: bool = False
    fast: bool = False  # static pass only: no vLLM import
    select: set[str] = field(default_factory=set)  # codes or prefixes ("VD1"); empty = all
    ignore: set[str] = field(default_factory=set)
    script: str | None = None
    caller_registry: dict[str, str] | None = None
    import_timeout: float = 180.0
    tensor_parallel_size: int = 1  # VD305: can the model be split this many ways?


def _matches(code: str, patterns: Iterable[str]) -> bool:
    return any(code.startswith(p) for p in patterns)


def selected_codes(options: CheckOptions) -> list[str]:
    # engine-stage checks need a running engine: engine_stage.py runs them (check --engine)
    codes = [c for c in sorted(CATALOGUE) if CATALOGUE[c].meta.stage is not Stage.ENGINE]
    if options.select:
        codes = [c for c in codes if _matches(c, options.select)]
    return [c for c in codes if not _matches(c, options.ignore)]


def gather_static_facts(model: str, options: CheckOptions) -> Facts:
    """Everything that needs no vLLM import: config.json, source tables, plugin entry points."""
    model_dir = resolve_model_dir(model)
    facts = Facts(
        model_dir=str(model_dir.path),
        config=model_dir.config,
        trust_remote_code=options.trust_remote_code,
        vllm_plugins_env=os.environ.get("VLLM_PLUGINS"),
    )
    tables = read_vllm_registry_tables()
    if tables is not None:
        facts.builtin_archs = {arch: f"{m}:{c}" for arch, (m, c) in tables.builtin.items()}
        facts.transformers_backend_archs = tables.transformers_backend_archs
        facts.previously_supported = tables.previously_supported
        facts.out_of_tree = tables.out_of_tree
        facts.vllm_config_model_types = tables.config_registry
    facts.transformers_model_types = read_transformers_model_types()
    facts.transformers_class_names = read_transformers_class_names()
    facts.plugins = discover_general_plugins()
    if facts.builtin_archs is not None:
        predicted = dict(facts.builtin_archs)
        for plugin in facts.plugins:
            if plugin.allowed and plugin.problem is None:
                for reg in plugin.registrations:
                    predicted[reg.arch] = reg.target if reg.lazy else ":".join(reg.target.rsplit(".", 1))
        facts.registry = predicted
        facts.registry_source = "static"
    if options.script:
        facts.script_registrations = scan_script(options.script)
    facts.caller_registry = options.caller_registry
    return facts


def add_import_facts(facts: Facts, options: CheckOptions) -> float:
    """Run the import pass; replace the predicted registry with the measured one."""
    result = run_import_probe(facts.architectures, timeout=options.import_timeout)
    if result.ok:
        facts.import_pass = result.data
        facts.registry = dict(result.data.get("registry", {}))
        facts.registry_source = "import"
    else:
        facts.import_pass_error = result.error
        facts.import_pass = None
        if result.stderr_tail:
            facts.import_pass_error = f"{result.error}\n{result.stderr_tail[-1500:]}"
    return result.seconds


def run_checks(facts: Facts, codes: Iterable[str]) -> list[Finding]:
    """Run each check; one that raises becomes a ``crash`` finding and the run goes on."""
    findings: list[Finding] = []
    for code in codes:
        entry = CATALOGUE[code]
        try:
            findings.extend(entry.run(facts))
        except Exception as exc:  # a bug in a check must not hide the other findings
            import traceback

            findings.append(
                Finding(
                    code=code,
                    outcome=Outcome.CRASH,
                    severity=Severity.ERROR,
                    message=f"the check itself failed: {type(exc).__name__}: {exc}",
                    evidence={"traceback": traceback.format_exc()},
                    hint="this is a vllm-doctor bug; please report it with the traceback",
                )
            )
    return findings


def diagnose(model: str, options: CheckOptions | None = None, progress: Progress | None = None) -> Report:
    """The whole static stage: facts, checks, report. Raises DoctorInputError on bad input."""
    options = options or CheckOptions()
    say = progress or (lambda _msg: None)
    codes = selected_codes(options)
    t0 = time.monotonic()
    facts = gather_static_facts(model, options)
    add_weight_facts(facts, options, codes, say)  # headers now; meta-device load in the background
    report = Report(target=facts.model_dir)
    report.timings["static_facts_s"] = round(time.monotonic() - t0, 3)
    static_codes = [c for c in codes if "import" not in CATALOGUE[c].meta.requires]
    static_findings = run_checks(facts, static_codes)
    report.timings["static_pass_s"] = round(time.monotonic() - t0, 3)
    problems = [f for f in static_findings if f.is_problem]
    say(f"fast pass: {len(problems)} problem(s) in {report.timings['static_pass_s']:.2f} s"
        + (f" ({', '.join(sorted({f.code for f in problems}))})" if problems else ""))
    if options.fast:
        report.findings = static_findings
        for code in codes:
            if code not in static_codes:
                report.findings.append(
                    Finding(code, Outcome.SKIP, CATALOGUE[code].meta.severity, "skipped by --fast (needs the import pass)")
                )
    else:
        say("import pass: loading vLLM and the plugins in a fresh process ...")
        report.timings["import_pass_s"] = round(add_import_facts(facts, options), 3)
        if facts.import_pass_error:
            say(f"import pass failed: {facts.import_pass_error.splitlines()[0]}")
        report.findings = run_checks(facts, codes)
    report.findings.sort(key=lambda f: (f.code, f.subject))
    report.timings["total_s"] = round(time.monotonic() - t0, 3)
    report.environment = environment.collect(facts)
    report.facts = {
        "model_dir": facts.model_dir,
        "architectures": facts.config.get("architectures"),
        "model_type": facts.config.get("model_type"),
        "registry_source": facts.registry_source,
        "plugins": [p.to_dict() for p in facts.plugins],
        "resolved": _resolved(facts),
        "import_pass": _import_summary(facts),
        "weights": weights_report(facts),
    }
    return report


def _resolved(facts: Facts) -> dict[str, str] | None:
    from vllm_doctor.checks.registry import resolved_target

    got = resolved_target(facts)
    return {"architecture": got[0], "target": got[1]} if got else None


def _import_summary(facts: Facts) -> dict[str, object] | None:
    if facts.import_pass is None:
        return {"error": facts.import_pass_error} if facts.import_pass_error else None
    data = facts.import_pass
    return {
        "vllm_version": data.get("vllm_version"),
        "timings": data.get("timings"),
        "plugins": data.get("plugins"),
        "classes": data.get("classes"),
    }

"""The static stage of ``vllm-doctor check``: gather every fact, then run the checks.

Fast pass: config.json, vLLM's tables read from source, plugin entry points, safetensors
headers (no vLLM import). Import pass: a fresh child imports vLLM and the plugins
(:mod:`vllm_doctor.probes.import_probe`) while a second child builds the model on the meta
device (:mod:`vllm_doctor.stages.weights`). Both go through :mod:`vllm_doctor.stages.child`.
Checks run only once their facts are complete; they never wait or mutate.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_doctor.analysis.records import ImportSummary, PluginFound, ResolvedClass
from vllm_doctor.checks import CATALOGUE, needs_import, run_checks, select_codes
from vllm_doctor.checks.base import run_from_config
from vllm_doctor.compat.plugins import discover_general_plugins, plugin_quantization_methods
from vllm_doctor.compat.source_tables import (
    read_transformers_class_names,
    read_transformers_model_types,
    read_transformers_sub_configs,
    read_vllm_quantization_methods,
    read_vllm_registry_tables,
)
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Outcome, Report, Stage, report_order
from vllm_doctor.probes import environment
from vllm_doctor.probes.model_dir import resolve_model_dir
from vllm_doctor.probes.script_scan import scan_script
from vllm_doctor.stages.child import run_child
from vllm_doctor.stages.weights import finish_weights_pass, start_weights_pass, weights_report

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
    pipeline_parallel_size: int = 1  # VD305: can its layers be split over this many stages?
    enable_expert_parallel: bool = False  # VD305: experts divided over the ranks, not sliced
    max_memory: int | str | None = "default"  # per child process group; "default": stages.child.default_memory_limit


def selected_codes(options: CheckOptions) -> list[str]:
    """The static stage's codes (engine-stage checks run in stages/engine.py: check --engine)."""
    return select_codes((Stage.STATIC, Stage.LIVE), options.select, options.ignore)


def caller_registry() -> dict[str, str] | None:
    """This process's ModelRegistry, if the caller already imported vLLM (never imports it)."""
    if "vllm" not in sys.modules:
        return None
    from vllm_doctor.compat.runtime import registry_snapshot

    try:
        return registry_snapshot()
    except Exception:
        return None


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
    if facts.model_type:  # does its config class build a vision tower config.json may leave out?
        facts.hf_sub_configs = read_transformers_sub_configs(facts.model_type)
    if isinstance(facts.config.get("quantization_config"), dict):  # what --fast asks of a method's name
        facts.quantization_methods = read_vllm_quantization_methods()
        facts.plugin_quantization_methods = plugin_quantization_methods(facts.plugins)
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
    request = {
        "architectures": facts.architectures,
        "model_dir": facts.model_dir,
        "trust_remote_code": facts.trust_remote_code,
    }
    res = run_child(
        "import", request, timeout=options.import_timeout, what="the import pass", memory_limit=options.max_memory
    )
    error = res.error
    if res.timed_out:
        error = f"{error} (a plugin or model module may hang on import)"
    elif res.ok and "fatal" in res.data:
        error = res.data["fatal"]
    if error is None:
        facts.import_pass = res.data
        facts.registry = dict(facts.imports.registry) if facts.imports else {}
        facts.registry_source = "import"
    else:
        facts.import_pass = None
        facts.import_pass_error = f"{error}\n{res.log_tail[-1500:]}" if res.log_tail else error
        facts.pass_failures.append({"pass": "the import pass", "error": facts.import_pass_error})
    return res.seconds


def diagnose(model: str, options: CheckOptions | None = None, progress: Progress | None = None) -> Report:
    """The whole static stage: facts, checks, report. Raises DoctorInputError on bad input."""
    options = options or CheckOptions()
    say = progress or (lambda _msg: None)
    codes = selected_codes(options)
    t0 = time.monotonic()
    facts = gather_static_facts(model, options)
    weights_job = start_weights_pass(facts, options, codes, say)  # headers now; the load beside the import pass
    report = Report(target=facts.model_dir)
    report.timings["static_facts_s"] = round(time.monotonic() - t0, 3)
    static_codes = [c for c in codes if not needs_import(c)]
    static_findings = run_checks(facts, static_codes)
    report.timings["static_pass_s"] = round(time.monotonic() - t0, 3)
    problems = [f for f in static_findings if f.is_problem]
    say(
        f"fast pass: {len(problems)} problem(s) in {report.timings['static_pass_s']:.2f} s"
        + (f" ({', '.join(sorted({f.code for f in problems}))})" if problems else "")
    )
    if options.fast:
        finish_weights_pass(facts, weights_job)
        report.findings = static_findings
        for code in codes:
            if code not in static_codes:  # what config.json alone tells (checks.base.from_config), else a skip
                report.findings.extend(
                    run_from_config(facts, code)
                    or [
                        Finding(
                            code,
                            Outcome.SKIP,
                            CATALOGUE[code].meta.severity,
                            "skipped by --fast (needs the import pass)",
                        )
                    ]
                )
    else:
        say("import pass: loading vLLM and the plugins in a fresh process ...")
        report.timings["import_pass_s"] = round(add_import_facts(facts, options), 3)
        if facts.import_pass_error:
            say(f"import pass failed: {facts.import_pass_error.splitlines()[0]}")
        finish_weights_pass(facts, weights_job)
        report.findings = run_checks(facts, codes)
    report.findings.sort(key=report_order)
    report.timings["total_s"] = round(time.monotonic() - t0, 3)
    report.environment = environment.collect(facts)
    report.facts = {
        "model_dir": facts.model_dir,
        "architectures": facts.config.get("architectures"),
        "model_type": facts.config.get("model_type"),
        "registry_source": facts.registry_source,
        "plugins": [PluginFound.of(p.to_dict()) for p in facts.plugins],
        "resolved": _resolved(facts),
        "import_pass": _import_summary(facts),
        "weights": weights_report(facts),
    }
    if facts.perf is not None:  # the performance lint's module tree (a later A/B re-runs VD6xx on it)
        report.facts["perf"] = facts.perf
    return report


def _resolved(facts: Facts) -> ResolvedClass | None:
    from vllm_doctor.checks.registry import resolved_target

    got = resolved_target(facts)
    return ResolvedClass(architecture=got[0], target=got[1]) if got else None


def _import_summary(facts: Facts) -> ImportSummary | None:
    if facts.import_pass is None:
        return ImportSummary(error=facts.import_pass_error) if facts.import_pass_error else None
    got = facts.imports
    if got is None:
        return None
    return ImportSummary(
        vllm_version=got.vllm_version, timings=got.timings, plugins=tuple(got.plugins), classes=got.classes
    )

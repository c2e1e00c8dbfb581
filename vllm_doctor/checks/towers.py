"""VD313: a whole tower of the model (a top-level sub-module: a VLM's vision tower, projector or
language model) that load_weights never fills, named once with the cause (the reading is in
:mod:`.tower_load`; VD301 and VD302 leave that tower's parameters and tensors to it)."""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, check, known
from vllm_doctor.checks.tower_load import Tower, mapper_text, unloaded_towers
from vllm_doctor.checks.weight_loading import NOT_INITIALIZED, REFS_LOADING
from vllm_doctor.facts import wire
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage

MAX_LISTED = 50


@check(
    "VD313",
    "tower-not-loaded",
    "A whole top-level sub-module of the model (a VLM's vision tower, projector, language model) that load_weights "
    "never fills, named once with the cause.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "The parameters of each top-level module of the class vLLM builds (`vision_tower`, `multi_modal_projector`, "
        "`language_model` of a LLaVA-style model) must be written by `load_weights`. When (nearly) all of one are "
        "not, vllm-doctor names the module once and says why, from the checkpoint's names: its tensors sit under "
        "another prefix (`model.vision_tower.*` for `vision_tower.*`, the layout transformers >= 4.52 saves) that "
        "the class's `hf_to_vllm_mapper` does not map; or they carry the right names and load_weights drops them "
        "before any weight loader; or it raises on them; or the checkpoint has none."
    ),
    why=(
        "A vision tower left on its construction-time values makes vLLM answer image prompts with plausible "
        "nonsense; when load_weights returns None (or reports the names) vLLM's own check "
        f"(`{NOT_INITIALIZED}`) says nothing. One finding per tower says what dozens of per-parameter findings "
        "(VD301, VD302, which defer to this one) cannot: which prefix to map."
    ),
    example=(
        "checkpoint: model.vision_tower.encoder.layers.0.mlp.fc1.weight, ...; model: vision_tower.encoder.layers.0"
        ".mlp.fc1.weight, ...; hf_to_vllm_mapper maps only 'model.language_model.'. VD313: \"vision_tower: 20 of 20 "
        'parameters never loaded", fix: add "model.vision_tower.": "vision_tower." to the mapper.'
    ),
    fix=(
        "Add the prefix pair to the class's `hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={...})` (and pass "
        "`mapper=self.hf_to_vllm_mapper` to `AutoWeightsLoader.load_weights`), or remove the filter in load_weights "
        "that drops the tower's tensors, or re-export the checkpoint with them."
    ),
    references=("vllm/model_executor/models/utils.py:WeightsMapper", *REFS_LOADING),
    requires=("checkpoint", "weights-load"),
)
def tower_not_loaded(facts: Facts, emit: Emit) -> Iterable[Finding]:
    data = known(facts.usable_weights())
    towers = unloaded_towers(facts)
    if not towers:
        tops = sorted({n.split(".", 1)[0] for n in data.params})
        yield emit.ok(f"every top-level module gets its parameters from the checkpoint ({', '.join(tops)})", "model")
        return
    mapper = data.layout.mapper
    params = data.params
    for tower in towers:
        notices = any(params[n].in_returned is False and not params[n].vllm_exempt for n in tower.unfilled)
        if tower.error:
            consequence = f"vLLM fails at start-up, loading the weights: {tower.error}"
        elif notices:
            consequence = f"vLLM stops at start-up (`{NOT_INITIALIZED}`)"
        else:
            consequence = (
                "vLLM's own missing-weight check does not catch it: the module runs on construction-time values"
            )
        vllm_error = tower.error or (NOT_INITIALIZED if notices else "")
        message, hint = _explain(tower, mapper_text(mapper))
        yield emit.fail(
            f"{tower.name}: {len(tower.unfilled)} of {tower.params} parameters never loaded ({message}); {consequence}",
            tower.name,
            {
                "tower": tower.name,
                "parameters": tower.params,
                "never_loaded": len(tower.unfilled),
                "cause": tower.cause,
                "checkpoint_prefix": tower.checkpoint_prefix,
                "parameter_prefix": tower.parameter_prefix,
                "checkpoint_tensors": len(tower.tensors),
                "tensors": tower.tensors[:MAX_LISTED],
                "parameters_never_loaded": tower.unfilled[:MAX_LISTED],
                "hf_to_vllm_mapper": wire.write(mapper),  # a finding's evidence is report.json's
                "error": tower.error,
                "vllm_notices": notices,
                "vllm_error": vllm_error,
            },
            hint,
        )


def _explain(tower: Tower, mapper: str) -> tuple[str, str]:
    """(what happened, the fix) for one tower."""
    n = len(tower.tensors)
    if tower.cause == "prefix":
        ck, pp = tower.checkpoint_prefix, tower.parameter_prefix
        return (
            f"the checkpoint holds its tensors as {ck}* ({n} tensors, e.g. {tower.tensors[0]}), the model names them "
            f"{pp}*, and nothing maps one onto the other: {mapper}",
            f'add "{ck}": "{pp}" to hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={{...}}) and pass '
            "mapper=self.hf_to_vllm_mapper to AutoWeightsLoader.load_weights",
        )
    if tower.cause == "filtered":
        return (
            f"the checkpoint has its {n} tensors under the names the model maps to its parameters, but load_weights "
            "never passes them to any weight loader: it filters them out",
            f"remove the filter in load_weights that drops the {tower.name}.* tensors (and return the loaded names, "
            "so that vLLM's own check can see the rest)",
        )
    if tower.cause == "raised":
        return (
            f"load_weights raises on its {n} checkpoint tensors, whose names map onto its parameters",
            "see the error: the tensors carry the parameters' names, so the fault is in load_weights",
        )
    return (
        "the checkpoint has no tensor whose name ends like its parameters'",
        f"re-export the checkpoint with the {tower.name} weights, or map their names in hf_to_vllm_mapper ({mapper})",
    )

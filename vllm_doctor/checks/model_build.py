"""VD310: vLLM could not build the model (or run its load_weights) in the weights pass."""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks import weights_base  # noqa: F401  (registers the weights-pass gate VD310 requires)
from vllm_doctor.checks.base import Emit, check, informative_line
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage

_BUILD_STAGES = {
    "config": ("building vLLM's config for this model directory", "vLLM's config"),
    "class": ("resolving the model class", "the model class"),
    "build": ("building the model on the meta device (vLLM's initialize_model)", "the model's construction"),
    "load": ("driving load_weights", "load_weights"),
}


@check(
    "VD310",
    "model-build-failed",
    "vLLM cannot build the model class under this config.json, or load_weights raises, in the weights pass.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "The weights pass builds the model the way vLLM's loader does (EngineArgs -> VllmConfig -> "
        "get_model_architecture -> initialize_model, on the meta device, so no memory is spent) and drives its "
        "load_weights with the checkpoint's tensor names and shapes. When that raises, this is the error vLLM will "
        "raise at start-up, with the model's own line where the traceback has one. When another check already "
        "names the cause (the class cannot be imported or resolved, its __init__ signature, config.json rejected "
        "or with absurd sizes, no load_weights), this check defers to it instead of reporting the cause twice."
    ),
    why=(
        "Without it, a model whose __init__ raises under the real config (an attribute a ported config lacks, a "
        "size that does not divide, a layer built with arguments vLLM's layer refuses) leaves every weight check "
        "skipped and the run says nothing; the engine then fails at start-up, far from the cause."
    ),
    example=(
        "failed while building the model on the meta device: TypeError: 'NoneType' object is not subscriptable "
        "at my_model/model.py:61 in __init__"
    ),
    fix=(
        "Open the line named: it runs when vLLM constructs the model, on every device. Read sizes and options from "
        "the config the way vLLM's own models do (getattr with a default for optional keys such as rope_scaling), "
        "and build layers with the arguments vLLM's layer classes take."
    ),
    requires=("weights-pass",),
    # VD2: the class's interface (vLLM's config refuses a class whose forward or compute_logits it rejects)
    defers_to=("VD101", "VD103", "VD104", "VD105", "VD106", "VD108", "VD109", "VD111", "VD2", "VD309"),
)
def model_build_failed(facts: Facts, emit: Emit) -> Iterable[Finding]:
    if facts.weights_reply() is None:
        yield emit.not_applicable(facts.weight_load_error or "the weights pass did not run")
        return
    err = facts.weights_build_error()
    if err is None:
        yield emit.ok("vLLM built the model on the meta device and load_weights ran to the end")
        return
    stage = str(err.stage)
    if stage not in _BUILD_STAGES:  # "import" / "internal": the pass itself failed (VD100)
        yield emit.not_applicable(f"the weights pass itself did not complete (VD100): {err.summary}")
        return
    doing, subject = _BUILD_STAGES[stage]
    where = err.where
    summary = informative_line(str(err.summary))
    yield emit.fail(
        f"failed while {doing}: {summary}" + (f" at {where}" if where else ""),
        subject,
        {
            "stage": stage,
            "vllm_error": str(err.summary)[:3000],
            "where": where,
            "traceback": str(err.traceback)[-4000:],
        },
        f"fix the line named ({where})"
        if where
        else "read the traceback in the evidence: the innermost frame is where it failed",
    )

"""VD2xx: does the model class meet vLLM's model contract? (facts from the import pass)"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, check, gate, known
from vllm_doctor.checks.registry import inspected_class
from vllm_doctor.facts.import_pass import ClassContract
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage
from vllm_doctor.units import clip

GENERIC = "This model does not support `--runner generate`"
FORWARD_KWARGS = ("input_ids", "positions", "intermediate_tensors", "inputs_embeds")


@gate("contract", after_import=True)
def _contract_inspected(facts: Facts, emit: Emit) -> Finding | None:
    """The import pass read the class's contract facts (after gate ``model-class``)."""
    _arch, target, record = inspected_class(facts)
    if record.contract is None:
        why = "it could not be imported (see VD106)" if record.import_error is not None else "it was not inspected"
        return emit.skip(f"{target}: {why}", target)
    return None


def _contract(facts: Facts) -> tuple[str, ClassContract]:
    """(target, contract facts) of the class vLLM would build (gates ``model-class``, ``contract``)."""
    _arch, target, record = inspected_class(facts)
    return target, known(record.contract)


def _verdict(contract: ClassContract) -> str:
    ok = contract.vllm.is_text_generation_model
    return "" if ok is None else f" (vLLM's own check: is_text_generation_model = {ok})"


@check(
    "VD201",
    "init-signature-not-vllm-style",
    "The model's `__init__` does not take keyword arguments `vllm_config` and `prefix`.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "vLLM constructs every model as `Model(vllm_config=vllm_config, prefix=prefix)` and reads the HF config from "
        "`vllm_config.model_config.hf_config`."
    ),
    why=(
        f"An HF-style `__init__(self, config)` fails vLLM's interface check: vLLM says only `{GENERIC}`, or warns "
        f"`vLLM model class should accept vllm_config and prefix` and guesses arguments."
    ),
    example="class MyForCausalLM(nn.Module):\n    def __init__(self, config): ...",
    fix=(
        "def __init__(self, *, vllm_config: VllmConfig, prefix: str = ''):\n    config = "
        "vllm_config.model_config.hf_config"
    ),
    references=("vllm/model_executor/model_loader/utils.py:initialize_model",),
    requires=("import", "model-class", "contract"),
)
def init_signature(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    params = c.init_params or []
    missing = [p for p in ("vllm_config", "prefix") if p not in params]
    if missing:
        yield emit.fail(
            f"{target}.__init__ lacks {', '.join(missing)}: its parameters are ({', '.join(params)}){_verdict(c)}",
            f"{target}.__init__",
            {"init_params": params, "missing": missing, "source": c.source, "vllm_error": GENERIC},
            "def __init__(self, *, vllm_config, prefix: str = ''): config = vllm_config.model_config.hf_config",
        )
    else:
        yield emit.ok(f"{target}.__init__ takes vllm_config and prefix", f"{target}.__init__")


@check(
    "VD202",
    "subclasses-pretrainedmodel",
    "The vLLM model class subclasses transformers' `PreTrainedModel`.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "A vLLM model is a plain `torch.nn.Module` built from vLLM layers (parallel linear layers, vLLM's Attention "
        "with a paged KV cache); the HF `PreTrainedModel` class is for training and `from_pretrained`."
    ),
    why=(
        "Measured on vLLM 0.32: with a vLLM-style constructor the subclass is built and runs, but it drags in HF's "
        "machinery (post_init weight init over vLLM's loaders, `config_class` checks, generation mixins, HF's "
        "attention if its layers are reused) that vLLM never uses; with an HF-style constructor vLLM rejects it "
        "(`This model does not support `--runner generate``, see VD201). It usually means the model was ported by "
        "subclassing the HF class instead of rebuilding it from vLLM layers."
    ),
    example="class MyForCausalLM(PreTrainedModel): ...",
    fix="Subclass `nn.Module` and use vLLM layers; keep the HF class for training only.",
    requires=("import", "model-class", "contract"),
)
def subclasses_pretrainedmodel(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    if c.is_pretrained_model:
        hf_base = next((m for m in c.mro if m.startswith("transformers.")), "PreTrainedModel")
        yield emit.warn(
            f"{target} subclasses {hf_base}{_verdict(c)}",
            target,
            {"mro": c.mro, "source": c.source},
            "subclass torch.nn.Module and build the model from vLLM layers",
        )
    elif not c.is_nn_module:
        yield emit.fail(f"{target} is not a torch.nn.Module", target, {"mro": c.mro}, "subclass torch.nn.Module")
    else:
        yield emit.ok(f"{target} is a plain nn.Module", target)


@check(
    "VD203",
    "forward-signature-mismatch",
    "`forward` does not accept the keywords vLLM's model runner passes.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what="The model runner calls `model(input_ids=..., positions=..., intermediate_tensors=..., inputs_embeds=...)`.",
    why=(
        f"Without `positions` vLLM's interface check fails (`{GENERIC}`); without the other two the first forward "
        f"raises TypeError."
    ),
    example="def forward(self, input_ids, attention_mask=None): ...  # HF style",
    fix="def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None): ...",
    requires=("import", "model-class", "contract"),
)
def forward_signature(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    if not c.forward_callable:
        yield emit.fail(
            f"{target} has no callable forward",
            f"{target}.forward",
            {},
            "define forward(self, input_ids, positions, ...)",
        )
        return
    supports = c.forward_supports
    missing = [kw for kw in FORWARD_KWARGS if not supports.get(kw)]
    if missing:
        yield emit.fail(
            (
                f"{target}.forward does not accept {', '.join(missing)}: its parameters are "
                f"({', '.join(c.forward_params or [])}){_verdict(c)}"
            ),
            f"{target}.forward",
            {
                "forward_params": c.forward_params,
                "missing": missing,
                "vllm_error": GENERIC
                if {"input_ids", "positions"} & set(missing)
                else "TypeError at the first forward",
            },
            "def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None)",
        )
    else:
        yield emit.ok(f"{target}.forward accepts {', '.join(FORWARD_KWARGS)}", f"{target}.forward")


@check(
    "VD204",
    "compute-logits-missing",
    "The class has no callable `compute_logits`, so vLLM does not treat it as a text-generation model.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "vLLM calls `forward` for hidden states and then `compute_logits(hidden_states)` (usually "
        "`self.logits_processor(self.lm_head, hidden_states)`)."
    ),
    why=f"Without it `is_text_generation_model` is false and vLLM says `{GENERIC}`.",
    example="def logits(self, hidden_states): ...  # renamed",
    fix="def compute_logits(self, hidden_states): return self.logits_processor(self.lm_head, hidden_states)",
    requires=("import", "model-class", "contract"),
)
def compute_logits_missing(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    if not c.compute_logits_callable:
        yield emit.fail(
            f"{target} has no compute_logits{_verdict(c)}",
            f"{target}.compute_logits",
            {"vllm_error": GENERIC},
            "def compute_logits(self, hidden_states): return self.logits_processor(self.lm_head, hidden_states)",
        )
    else:
        yield emit.ok(f"{target}.compute_logits exists", f"{target}.compute_logits")


@check(
    "VD205",
    "load-weights-missing-or-returns-none",
    "`load_weights` is missing, or returns None, which silently turns off vLLM's missing-weight check.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "vLLM's default loader calls `model.load_weights(weights)` and compares the returned set of loaded parameter "
        "names with the model's parameters."
    ),
    why=(
        "No `load_weights`: loading raises AttributeError. Returning None: vLLM skips its `Following weights were not "
        "initialized from checkpoint` check, so missing weights go unnoticed and the model generates garbage."
    ),
    example="def load_weights(self, weights):\n    for name, w in weights: ...\n    # no return",
    fix="Collect the names you load into a set and `return loaded_params` (see vLLM's llama.py).",
    references=("vllm-project/vllm#15536",),
    requires=("import", "model-class", "contract"),
)
def load_weights_contract(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    if not c.load_weights_callable:
        yield emit.fail(
            f"{target} has no load_weights",
            f"{target}.load_weights",
            {},
            "define load_weights(self, weights) -> set[str]",
        )
    elif c.load_weights_returns_value is False:
        # an error, as the catalogue says: vLLM loads the model, but a parameter the checkpoint
        # never fills then goes unnoticed (random weights, garbage output, no message)
        yield emit.fail(
            f"{target}.load_weights returns None: vLLM cannot tell which parameters were never loaded",
            f"{target}.load_weights",
            {"source": c.source},
            "collect loaded parameter names in a set and return it",
        )
    else:
        yield emit.ok(f"{target}.load_weights returns the loaded names", f"{target}.load_weights")


@check(
    "VD206",
    "embed-input-ids-missing",
    "The class has no `embed_input_ids` method.",
    severity=Severity.WARN,
    also=(Severity.ERROR,),
    stage=Stage.STATIC,
    topic="contract",
    what="vLLM embeds token ids through `model.embed_input_ids(input_ids)` (older vLLM: `get_input_embeddings`).",
    why=(
        f"vLLM 0.32 requires it in `is_vllm_model` (`The model (...) is missing the embed_input_ids method`, then "
        f"`{GENERIC}`); older versions warn."
    ),
    example="def get_input_embeddings(self, input_ids): ...  # pre-rename name",
    fix="def embed_input_ids(self, input_ids): return self.model.embed_tokens(input_ids)",
    requires=("import", "model-class", "contract"),
)
def embed_input_ids_missing(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    if c.embed_input_ids_callable:
        yield emit.ok(f"{target}.embed_input_ids exists", f"{target}.embed_input_ids")
        return
    required = bool(c.vllm.requires_embed_input_ids)
    hint = (
        "rename get_input_embeddings to embed_input_ids"
        if c.get_input_embeddings_callable
        else "def embed_input_ids(self, input_ids): return self.model.embed_tokens(input_ids)"
    )
    yield emit.fail(
        f"{target} has no embed_input_ids" + (" (required by this vLLM)" if required else ""),
        f"{target}.embed_input_ids",
        {"required_by_installed_vllm": required, "has_get_input_embeddings": c.get_input_embeddings_callable},
        hint,
        severity=Severity.ERROR if required else Severity.WARN,
    )


@check(
    "VD207",
    "cuda-initialized-at-import",
    "Importing the model module initialises CUDA.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "vLLM imports model modules in processes that later fork workers; CUDA cannot be re-initialised in a forked "
        "child."
    ),
    why=(
        "`RuntimeError: Cannot re-initialize CUDA in forked subprocess` in the workers (on a CPU build: `Torch not "
        "compiled with CUDA enabled` at import)."
    ),
    example="GPU_NAME = torch.cuda.get_device_name(0)  # at module level",
    fix="Move device queries into __init__/forward, or make them lazy; register the class lazily ('module:Class').",
    references=("vllm-project/vllm#12754", "vllm-project/vllm#8893"),
    requires=("import", "model-class"),
)
def cuda_initialized_at_import(facts: Facts, emit: Emit) -> Iterable[Finding]:
    _arch, target, record = inspected_class(facts)
    frames = record.cuda_init_at_import
    if frames:
        yield emit.fail(
            f"importing {target.split(':')[0]} initialises CUDA at {frames[-1]}",
            frames[-1],
            {"stack": frames},
            "move the CUDA call out of module level (into __init__ or forward)",
        )
    else:
        yield emit.ok(f"importing {target.split(':')[0]} does not touch CUDA", target)


# config.json keys that make a checkpoint multimodal (transformers' vision-language and audio configs)
MULTIMODAL_CONFIG_KEYS = (
    "vision_config",
    "audio_config",
    "image_token_index",
    "image_token_id",
    "video_token_index",
    "video_token_id",
    "audio_token_index",
    "audio_token_id",
)
TEXT_ONLY_ERROR = "Multi-modal processor not available for text-only models"


def multimodal_config_keys(config: dict[str, object]) -> list[str]:
    """The top-level keys of config.json that say the checkpoint takes images, video or audio."""
    return [k for k in MULTIMODAL_CONFIG_KEYS if config.get(k) is not None]


@check(
    "VD209",
    "multimodal-processor-not-registered",
    "The class implements `SupportsMultiModal` but vLLM's multimodal registry has no processor for it.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "vLLM turns an image (video, audio) request into model inputs with the processor registered on the model "
        "class: `@MULTIMODAL_REGISTRY.register_processor(Processor, info=ProcessingInfo, "
        "dummy_inputs=DummyInputsBuilder)` on the class that the architecture resolves to."
    ),
    why=(
        "vLLM starts with one warning (`... is treated as multimodal but has no registered multimodal processor; "
        "running in text-only mode.`), serves text, and refuses every request with an image in the caller's input "
        f"processing: `ValueError: {TEXT_ONLY_ERROR}`."
    ),
    example="class MyVLForConditionalGeneration(nn.Module, SupportsMultiModal): ...  # no decorator",
    fix=(
        "@MULTIMODAL_REGISTRY.register_processor(MyProcessor, info=MyProcessingInfo, "
        "dummy_inputs=MyDummyInputsBuilder)\nclass MyVLForConditionalGeneration(nn.Module, SupportsMultiModal): ..."
    ),
    references=("vllm/config/model.py:_supports_multimodal_inputs", "vllm/multimodal/registry.py:register_processor"),
    requires=("import", "model-class", "contract"),
)
def multimodal_processor_not_registered(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    if c.vllm.supports_multimodal is not True:
        yield emit.not_applicable(f"{target} does not implement SupportsMultiModal", target)
        return
    if c.vllm.has_mm_processor is None:
        error = f": {c.vllm.has_mm_processor_error}" if c.vllm.has_mm_processor_error else ""
        yield emit.skip(f"this vLLM's multimodal registry could not be asked{error}", target)
        return
    if c.vllm.has_mm_processor:
        yield emit.ok(f"{target} has a multimodal processor registered", target)
        return
    elsewhere = c.vllm.mm_processor_on
    where = (
        f"; the registration sits on {', '.join(elsewhere)} instead, a class the architecture does not resolve to"
        if elsewhere
        else ""
    )
    yield emit.fail(
        f"{target} implements SupportsMultiModal but has no multimodal processor registered{where}: vLLM runs it "
        f"in text-only mode and refuses image requests ({TEXT_ONLY_ERROR})",
        target,
        {"supports_multimodal": True, "has_mm_processor": False, "mm_processor_on": list(elsewhere)},
        (f"move the @MULTIMODAL_REGISTRY.register_processor(...) decorator from {elsewhere[0].rsplit('.', 1)[-1]} to "
         f"{target.rsplit(':', 1)[-1].rsplit('.', 1)[-1]}, the class the architecture resolves to")
        if elsewhere
        else "decorate the class vLLM resolves with @MULTIMODAL_REGISTRY.register_processor(Processor, info=..., "
        "dummy_inputs=...)",
    )  # fmt: skip


@check(
    "VD210",
    "multimodal-interface-missing",
    "config.json describes a multimodal checkpoint but the class does not implement `SupportsMultiModal`.",
    severity=Severity.ERROR,
    also=(Severity.WARN,),
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "vLLM treats a model as multimodal only when its class implements `SupportsMultiModal` (the "
        "`supports_multimodal` class flag); only then does it read `limit_mm_per_prompt`, build the multimodal "
        "processor and call `embed_multimodal`."
    ),
    why=(
        "vLLM starts with no warning, ignores `limit_mm_per_prompt`, serves text, and refuses every request with an "
        f"image in the caller's input processing: `ValueError: {TEXT_ONLY_ERROR}`. (A class that says it is "
        "multimodal for a config without a vision part is reported as a warning: its dummy-input build needs "
        "what the config lacks.)"
    ),
    example="class MyVLForConditionalGeneration(nn.Module):  # config.json has vision_config, image_token_index",
    fix=(
        "from vllm.model_executor.models.interfaces import SupportsMultiModal\n"
        "class MyVLForConditionalGeneration(nn.Module, SupportsMultiModal):\n"
        "    def embed_multimodal(self, **kwargs): ...  # the image embeddings"
    ),
    references=("vllm/model_executor/models/interfaces.py:SupportsMultiModal",),
    requires=("import", "model-class", "contract"),
)
def multimodal_interface_missing(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    keys = multimodal_config_keys(facts.config)
    says = c.vllm.supports_multimodal
    if says is None:
        error = f": {c.vllm.supports_multimodal_error}" if c.vllm.supports_multimodal_error else ""
        yield emit.skip(f"this vLLM could not say whether the class is multimodal{error}", target)
    elif keys and not says:
        yield emit.fail(
            f"config.json is multimodal ({', '.join(keys)}) but {target} does not implement SupportsMultiModal: "
            f"vLLM serves it text-only, silently, and refuses image requests ({TEXT_ONLY_ERROR})",
            target,
            {"config_keys": keys, "supports_multimodal": False},
            "derive the class from vllm.model_executor.models.interfaces.SupportsMultiModal and implement "
            "embed_multimodal",
        )
    elif says and not keys:
        yield emit.fail(
            f"{target} implements SupportsMultiModal but config.json has none of {', '.join(MULTIMODAL_CONFIG_KEYS)}",
            target,
            {"config_keys": [], "supports_multimodal": True},
            "check that config.json is the multimodal checkpoint's (vision_config, the image token id)",
            severity=Severity.WARN,
        )
    elif keys:
        yield emit.ok(f"config.json is multimodal ({', '.join(keys)}); {target} implements SupportsMultiModal", target)
    else:
        yield emit.not_applicable("a text model: config.json names no vision, video or audio part", target)


PROMPT_REPLACEMENT = "Failed to apply prompt replacement"


@check(
    "VD211",
    "multimodal-dummy-inputs-fail",
    "The multimodal processor cannot be built, or fails on the dummy inputs vLLM feeds it at start-up.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "At start-up vLLM builds the registered processor (processing info, dummy-inputs builder, the model "
        "directory's processor files and tokenizer) and processes a dummy prompt with one dummy item per modality "
        "to size its encoder budget; every request with an image runs the same processor and prompt update."
    ),
    why=(
        "vLLM fails at engine start inside the dummy-input build (an image token id that the prompt update does not "
        f"find: `AssertionError: {PROMPT_REPLACEMENT} for mm_items['image'][0]`); where the processing info gives "
        "`get_mm_max_tokens_per_item` the engine starts with one warning (`Multi-modal warmup failed`, no reason) "
        "and every image request fails with the same error."
    ),
    example='config.json "image_token_index": 32000 while the tokenizer\'s "<image>" is 3',
    fix=(
        "make config.json's image token id the tokenizer's id of the image token the prompt update targets; the "
        "traceback shows where the processor failed"
    ),
    references=("vllm/multimodal/encoder_budget.py:get_mm_max_toks_per_item",),
    requires=("import",),
)
def multimodal_dummy_inputs_fail(facts: Facts, emit: Emit) -> Iterable[Finding]:
    verdict = facts.imports.config_verdict if facts.imports else None
    if verdict is None or not verdict.ok:
        yield emit.not_applicable("vLLM did not load the config (see VD108)")
        return
    mm = verdict.multimodal
    if mm is None:
        yield emit.not_applicable("vLLM does not treat the model as multimodal")
        return
    if mm.ok:
        per_item = ", ".join(f"{m}: {n} token(s)" for m, n in sorted(mm.tokens_per_item.items()))
        yield emit.ok(f"the multimodal processor handles vLLM's dummy inputs ({per_item or 'no items'})")
        return
    if mm.stage == "doctor":
        yield emit.skip(f"the doctor could not ask this vLLM's multimodal registry: {mm.error}")
        return
    if mm.stage == "processor" and "has no registered multimodal processor" in str(mm.error):
        yield emit.not_applicable("no multimodal processor is registered (see VD209)")
        return
    first = str(mm.error).splitlines()[0] if mm.error else "?"
    when = (
        "vLLM starts (one warning: 'Multi-modal warmup failed') and fails every request with an image"
        if mm.declares_max_tokens
        else "vLLM fails at engine start, building its dummy inputs"
    )
    stage = {"processor": "building the processor", "info": "its processing info", "dummy_inputs": "the dummy inputs"}
    token_keys = [k for k in MULTIMODAL_CONFIG_KEYS if k.endswith(("_index", "_id")) and k in facts.config]
    ids = ", ".join(f"{k} = {facts.config[k]}" for k in token_keys)
    vocab = facts.config.get("vocab_size", (facts.config.get("text_config") or {}).get("vocab_size"))
    ids_given = [facts.config[k] for k in token_keys if isinstance(facts.config[k], int)]
    if isinstance(vocab, int) and any(i >= vocab for i in ids_given):
        ids += f"; outside the vocabulary of {vocab} token(s)"
    right = ""
    # the config names a token the placeholder is not (vLLM 0.32 then fails with "Failed to apply
    # prompt replacement", 0.26 with "Expected there to be 1 prompt placeholders ...")
    mismatch = bool(mm.placeholder_ids) and bool(ids_given) and not set(ids_given) & set(mm.placeholder_ids or ())
    if mm.placeholder_ids and token_keys and len(set(mm.placeholder_ids)) == 1:
        # the placeholder text is one token: the id the config must name
        right = (
            f" ({mm.placeholder_text!r} is token {mm.placeholder_ids[0]} in the tokenizer: "
            f"set {token_keys[0]} to {mm.placeholder_ids[0]})"
        )
    hint = (
        f"the image token id in config.json ({ids or 'none set'}) is not the one the prompt update finds in the "
        f"prompt: make config.json's image token id the tokenizer's id of the image token{right}"
        if mismatch or PROMPT_REPLACEMENT in str(mm.error)
        else "fix the processor where the traceback points (the processing info, the dummy-inputs builder, or the "
        "model directory's processor files)"
    )
    yield emit.fail(
        f"the multimodal processor fails on {stage.get(str(mm.stage), str(mm.stage))}: {clip(first, 300)}; {when}",
        "config.json",
        {
            "stage": mm.stage,
            "error": mm.error,
            "traceback": mm.traceback,
            "declares_max_tokens": mm.declares_max_tokens,
            "placeholder_text": mm.placeholder_text,
            "placeholder_ids": mm.placeholder_ids,
        },
        hint,
    )


ENCODER_NONE_ERROR = (
    "AssertionError: Expected multimodal embeddings to be a list/tuple of 2D tensors, or a single 3D tensor, but got "
    "<class 'NoneType'> instead. This is most likely due to incorrect implementation of the model's `embed_multimodal` "
    "method."
)


@check(
    "VD212",
    "multimodal-embedding-contract",
    "A multimodal class lacks `embed_multimodal`, or its `embed_input_ids` cannot merge the image embeddings.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "On a step with images vLLM's runner calls `embed_multimodal(**pixel_inputs)` (one embedding per item, in "
        "prompt order), then `embed_input_ids(input_ids, multimodal_embeddings=..., is_multimodal=mask)`, which must "
        "write the items' embeddings on the placeholder positions of the mask. `SupportsMultiModal` gives an empty "
        "`embed_multimodal` (it returns None) and a default `embed_input_ids` that merges through "
        "`get_language_model()`. (Older vLLM: `get_multimodal_embeddings`, `get_input_embeddings`.)"
    ),
    why=(
        "Measured on vLLM 0.32: without its own `embed_multimodal` (e.g. still named `get_multimodal_embeddings`) the "
        "engine starts, serves text, and fails every image request in the engine core: "
        f"`{ENCODER_NONE_ERROR}`. An `embed_input_ids` that takes the image embeddings and never reads them fails "
        "nothing: the decoder sees the image token's own embedding on every placeholder, and the answer does not "
        "depend on the image (see VD213 for the engine's evidence)."
    ),
    example=(
        "def get_multimodal_embeddings(self, **kwargs): ...  # vLLM calls embed_multimodal\n"
        "def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):\n"
        "    return self.embed_tokens(input_ids)  # the image embeddings are dropped"
    ),
    fix=(
        "def embed_multimodal(self, **kwargs): return list(self.projector(self.vision_tower(kwargs['pixel_values'])))\n"
        "def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):\n"
        "    embeds = self.embed_tokens(input_ids)\n"
        "    if multimodal_embeddings:\n"
        "        embeds[is_multimodal] = torch.cat(list(multimodal_embeddings)).to(embeds.dtype)\n"
        "    return embeds"
    ),
    references=(
        "vllm/model_executor/models/interfaces.py:SupportsMultiModal",
        "vllm/v1/worker/utils.py:sanity_check_mm_encoder_outputs",
    ),
    requires=("import", "model-class", "contract"),
)
def multimodal_embedding_contract(facts: Facts, emit: Emit) -> Iterable[Finding]:
    target, c = _contract(facts)
    if c.vllm.supports_multimodal is not True:
        yield emit.not_applicable(f"{target} does not implement SupportsMultiModal", target)
        return
    methods = c.multimodal_methods
    if methods is None or methods.encoder is None or methods.merge is None:
        yield emit.skip("the import pass did not read the class's multimodal methods", target)
        return
    encoder, merge = methods.encoder, methods.merge
    problems = 0
    if encoder.interface:
        legacy = f" (it defines {', '.join(encoder.legacy)}, vLLM's older name)" if encoder.legacy else ""
        problems += 1
        yield emit.fail(
            f"{target} does not implement {encoder.name}{legacy}: vLLM calls SupportsMultiModal's empty one, which "
            f"returns None, and fails every image request in the engine core ({ENCODER_NONE_ERROR.split('. ')[0]})",
            f"{target}.{encoder.name}",
            {
                "method": encoder.name,
                "defined_by": encoder.owner,
                "legacy_names": encoder.legacy,
                "vllm_error": ENCODER_NONE_ERROR,
            },
            f"rename {encoder.legacy[0]} to {encoder.name}"
            if encoder.legacy
            else f"def {encoder.name}(self, **kwargs): one [num_tokens, hidden] tensor per item, in prompt order",
        )
    if not merge.interface:
        refused = [kw for kw, ok in merge.accepts.items() if not ok]
        unread = [kw for kw in merge.unread or () if kw not in refused]
        where = f"{target}.{merge.name}"
        evidence = {"method": merge.name, "defined_by": merge.owner, "params": merge.params}
        if refused:
            problems += 1
            yield emit.fail(
                f"{where}({', '.join(merge.params or [])}) does not accept {', '.join(refused)}: vLLM's runner passes "
                f"{merge.name}(input_ids, multimodal_embeddings=..., is_multimodal=...) on a multimodal model's steps",
                where,
                {**evidence, "not_accepted": refused},
                f"def {merge.name}(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None): write the "
                "embeddings on the positions is_multimodal marks",
            )
        elif "multimodal_embeddings" in unread:
            problems += 1
            yield emit.fail(
                f"{where} takes multimodal_embeddings but never reads it: the image embeddings are not merged at the "
                "placeholder positions, silently (the answer does not depend on the image)",
                where,
                {**evidence, "unread": unread},
                "write them on the placeholder positions: embeds[is_multimodal] = "
                "torch.cat(list(multimodal_embeddings)).to(embeds.dtype), or return "
                "super().embed_input_ids(input_ids, multimodal_embeddings, is_multimodal=is_multimodal)",
            )
    if not problems:
        how = "SupportsMultiModal's default" if merge.interface else f"its own, taking {', '.join(merge.accepts)}"
        yield emit.ok(f"{target} implements {encoder.name}; {merge.name}: {how}", target)

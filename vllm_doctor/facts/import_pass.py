"""The import pass's reply (:mod:`vllm_doctor.probes.import_probe`): what vLLM made of the
plugins, the registry, the model's classes and its config in a fresh process.

A child process sends it as JSON; :attr:`vllm_doctor.facts.static.Facts.imports` reads it once
into these records (leniently, as every reply: :mod:`vllm_doctor.facts.wire`), which the VD1xx
and VD2xx checks read by attribute. ``Facts.import_pass`` keeps the reply as it came (the
report shows its parts as sent). Producers: :mod:`vllm_doctor.compat.runtime`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import wire


@dataclass(frozen=True)
class VllmVerdicts(wire.Record):
    """vLLM's own interface checks on the class (None: this vLLM has no such check, or it raised)."""

    is_vllm_model: bool | None = None
    is_text_generation_model: bool | None = None
    is_pooling_model: bool | None = None
    supports_pp: bool | None = None
    # multimodal: does it implement SupportsMultiModal, and has vLLM's registry a processor for it
    supports_multimodal: bool | None = None
    has_mm_processor: bool | None = None
    # where it has none: the classes of its module that carry the registration instead
    mm_processor_on: list[str] = field(default_factory=list)
    # what vLLM raised when asked (the checks that could not ask say it)
    supports_multimodal_error: str | None = None
    has_mm_processor_error: str | None = None
    # does the installed vLLM require embed_input_ids for is_vllm_model? (0.32 does)
    requires_embed_input_ids: bool | None = None


@dataclass(frozen=True)
class MultimodalMethod(wire.Record):
    """One of the two methods vLLM's runner calls on a multimodal model with images, under the
    installed vLLM's name (``runtime.multimodal_methods``)."""

    name: str = ""  # embed_multimodal / embed_input_ids (older vLLM: get_multimodal_embeddings / get_input_embeddings)
    owner: str | None = None  # the class in the MRO that defines it
    interface: bool = False  # that class is vLLM's SupportsMultiModal (not the model's own code)
    legacy: list[str] = field(default_factory=list)  # older names of it that the model's classes define
    params: list[str] | None = None  # an overridden merge method's parameters
    accepts: dict[str, bool] = field(default_factory=dict)  # keyword vLLM passes -> accepted
    unread: list[str] | None = None  # of those keywords, the ones its body never reads (None: no source)


@dataclass(frozen=True)
class MultimodalMethods(wire.Record):
    encoder: MultimodalMethod | None = None  # embed_multimodal: pixels -> one embedding per item
    merge: MultimodalMethod | None = None  # embed_input_ids: token embeddings + the items' on the placeholders


@dataclass(frozen=True)
class ClassContract(wire.Record):
    """What the VD2xx checks need about a model class (``runtime.contract_facts``)."""

    qualname: str | None = None
    mro: list[str] = field(default_factory=list)
    is_nn_module: bool = True
    source: str | None = None  # "file:line"
    is_pretrained_model: bool | None = None
    init_params: list[str] | None = None  # None: no signature
    init_accepts_vllm_config: bool | None = None
    init_accepts_prefix: bool | None = None
    forward_callable: bool | None = None
    forward_params: list[str] | None = None
    forward_supports: dict[str, bool] = field(default_factory=dict)  # keyword -> accepted
    compute_logits_callable: bool | None = None
    load_weights_callable: bool | None = None
    load_weights_returns_value: bool | None = None  # None: no source to read
    embed_input_ids_callable: bool | None = None
    get_input_embeddings_callable: bool | None = None
    vllm: VllmVerdicts = field(default_factory=VllmVerdicts)
    multimodal_methods: MultimodalMethods | None = None  # only for a class vLLM treats as multimodal


@dataclass(frozen=True)
class ClassRecord(wire.Record):
    """One architecture's class, imported under a CUDA-init watch (``runtime.load_class``)."""

    target: str = ""  # "module:Class"
    import_error: str | None = None  # the traceback; None: it imported
    import_error_summary: str = ""
    module_file: str | None = None
    imported_before: bool | None = None
    cuda_init_at_import: list[str] | None = None  # the frames that initialised CUDA on import
    contract: ClassContract | None = None  # None: not inspected (no class, or contract_error)
    contract_error: str | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class PluginLoad(wire.Record):
    """One ``vllm.general_plugins`` entry point as vLLM loads it (None: that step did not run)."""

    name: str = ""
    value: str = ""
    allowed: bool | None = None
    loaded: bool | None = None
    called: bool | None = None
    error: str = ""  # the traceback of the step that failed


@dataclass(frozen=True)
class MultimodalDummyInputs(wire.Record):
    """A multimodal model's processor built and fed vLLM's start-up dummy inputs in the import
    pass (``runtime.multimodal_dummy_inputs``)."""

    ok: bool = False
    stage: str | None = None  # where it failed: processor, info, dummy_inputs (doctor: the doctor's question)
    error: str | None = None
    traceback: str | None = None
    modalities: list[str] = field(default_factory=list)
    tokens_per_item: dict[str, int] = field(default_factory=dict)  # placeholder tokens of one dummy item
    declares_max_tokens: bool | None = None  # the processing info gives get_mm_max_tokens_per_item
    # the dummy prompt's placeholder text (one item per modality) and the tokenizer's ids of it
    placeholder_text: str | None = None
    placeholder_ids: list[int] | None = None


@dataclass(frozen=True)
class VisionConfig(wire.Record):
    """Where the HF config vLLM loaded keeps its vision tower's settings (``runtime.vision_config``)."""

    source: str = ""  # "vision_config" (a sub-config) or "flat" (vision_* fields of the config itself)
    config_class: str | None = None  # the sub-config's class, or the config's
    values: dict[str, Any] = field(default_factory=dict)  # its main sizes (hidden_size, layers, image and patch size)


@dataclass(frozen=True)
class ConfigVerdict(wire.Record):
    """vLLM's own verdict on config.json (``runtime.config_verdict``)."""

    ok: bool = False
    error: str | None = None  # why vLLM refused it
    type: str | None = None  # the exception's class
    model_type: str | None = None
    config_class: str | None = None
    architectures: list[str] = field(default_factory=list)  # what vLLM would build
    multimodal: MultimodalDummyInputs | None = None  # None: a text model (or an older doctor)
    vision: VisionConfig | None = None  # None: no vision settings on the config (or an older doctor)


@dataclass(frozen=True)
class ImportPass(wire.Record):
    """The import pass's reply."""

    vllm_version: str | None = None
    fatal: str | None = None  # vLLM could not be imported
    timings: dict[str, float] = field(default_factory=dict)
    plugins: list[PluginLoad] = field(default_factory=list)
    registry: dict[str, str] = field(default_factory=dict)  # arch -> "module:Class"
    transformers_model_types: list[str] | None = None  # None: not read (see the error)
    transformers_model_types_error: str | None = None
    classes: dict[str, ClassRecord] = field(default_factory=dict)  # arch -> its class
    vllm_config_model_types: list[str] = field(default_factory=list)
    config_verdict: ConfigVerdict | None = field(default=None, metadata=wire.rules(empty_none=True))
    cuda_initialized: bool | None = None

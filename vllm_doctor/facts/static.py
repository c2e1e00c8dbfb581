"""The snapshot every static check reads. Plain data gathered by probes; no vLLM objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm_doctor.facts import wire
from vllm_doctor.facts.checkpoint import CheckpointFacts
from vllm_doctor.facts.import_pass import ClassRecord, ImportPass
from vllm_doctor.facts.perf import PerfAnatomy
from vllm_doctor.facts.plugins import PluginInfo

TRANSFORMERS_BACKEND_PACKAGE = "vllm.model_executor.models."


def is_transformers_backend(target: str) -> bool:
    """Is ``target`` ("module:Class", "module.Class" or a module) vLLM's Transformers backend
    (``vllm.model_executor.models.transformers`` / ``transformers_*``)?"""
    module = target.split(":", 1)[0]
    if not module.startswith(TRANSFORMERS_BACKEND_PACKAGE):
        return False
    return module[len(TRANSFORMERS_BACKEND_PACKAGE) :].startswith("transformers")


# ---- the weights pass's reply (compat/weights.py, stages/weights_trace.py): what the VD3xx checks read


@dataclass(frozen=True)
class HandedTo(wire.Record):
    """A weight_loader call a checkpoint tensor was handed to."""

    param: str = ""
    shard: Any = None  # the shard id (None: the parameter is not sharded)
    loader: str | None = None  # the kind of loader


@dataclass(frozen=True)
class LoadError(wire.Record):
    """An error load_weights (``where``: "load_weights") or a weight_loader ("weight_loader") raised."""

    where: str | None = None
    error: str = ""
    kind: str | None = None  # "raised", "meta-limitation", "shape", ...
    looked_up: str | None = None  # the parameter name load_weights looked for
    traceback: str = ""
    param: str | None = None
    shard: Any = None
    expected_shape: list[int] | None = None
    actual_shape: list[int] | None = None


@dataclass(frozen=True)
class TensorLoad(wire.Record):
    """One checkpoint tensor: what became of it (``status``), the parameters it filled, the loaders
    it was handed to and the errors it met."""

    status: str = ""  # "loaded", "skipped", "raised", "handed_not_written", "shape_mismatch", "partial", ...
    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    params: list[str] = field(default_factory=list)  # the parameters it wrote
    handed_to: list[HandedTo] = field(default_factory=list)
    consumed: int = 0
    numel: int = 0
    errors: list[LoadError] = field(default_factory=list)
    expected_shape: list[int] | None = None  # a tensor of the wrong shape: the shape its parameter wants


@dataclass(frozen=True)
class ParamLoad(wire.Record):
    """One parameter of the built model: how much of it the checkpoint filled, and from where."""

    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    numel: int = 0
    covered: int = 0  # elements written
    written: bool = False
    fill_only: bool = False
    sources: list[str] = field(default_factory=list)  # the checkpoint tensors written into it
    shards_expected: list[Any] | None = None
    shards_loaded: list[Any] | None = None
    shards_missing: list[Any] | None = None
    loader: Any = None
    module: str | None = None
    replaced_by_assignment: bool = False
    failed_from: list[str] = field(default_factory=list)  # the tensors whose loading into it failed
    in_returned: bool | None = None  # in load_weights' returned names (None: it returned none)
    vllm_exempt: bool = False  # vLLM does not require it
    num_experts: int | None = None  # a fused-MoE parameter
    expert_loads: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class LoadWeightsCall(wire.Record):
    """How load_weights itself went: what it returned, its restarts, the errors before any tensor."""

    returned: str | None = None
    returned_count: int | None = None
    returned_approximate: bool = False
    restarts: int = 0
    global_errors: list[LoadError] = field(default_factory=list)


@dataclass(frozen=True)
class QuantModule(wire.Record):
    """One layer of the built model with the quantization method vLLM gave it (compat/quant_build.py)."""

    class_name: str | None = field(default=None, metadata=wire.rules(key="class"))  # the layer's class
    quant_method: str | None = None  # its quant_method's class (None: it has none)
    scheme: str | None = None  # a compressed-tensors layer's scheme class
    plain_linear: bool = False  # a torch nn.Linear (no quant_config can reach it)
    kv_cache: bool = False  # a KV-cache quantization method (its scales only)
    quantized: bool = False  # a method that quantizes its weights
    params: list[str] = field(default_factory=list)  # its own parameters' leaves


@dataclass(frozen=True)
class QuantLayers(wire.Record):
    """The built model's layers by quantization method (the reply's ``quant``): what VD314-VD317 read."""

    method: str | None = None  # vLLM's quantization method for the model (None: unquantized)
    modules: dict[str, QuantModule] = field(default_factory=dict)
    defaulted: dict[str, str] = field(default_factory=dict)  # parameter -> why vLLM fills it itself
    dropped: list[str] = field(default_factory=list)  # checkpoint tensors the method's mapper discards
    by_name: list[str] | None = None  # the module names a method quantizes by name (GPTQ); None: not by name


@dataclass(frozen=True)
class HfMapper(wire.Record):
    """The class's ``hf_to_vllm_mapper`` (vLLM's WeightsMapper) as plain tables; a table it lacks is not sent."""

    WIRE_SPARSE: ClassVar[bool] = True

    orig_to_new_prefix: dict[str, str | None] | None = None  # checkpoint prefix -> the model's (None: dropped)
    orig_to_new_suffix: dict[str, str | None] | None = None
    orig_to_new_substr: dict[str, str | None] | None = None


@dataclass(frozen=True)
class UnbuiltPart(wire.Record):
    """The module a checkpoint tensor's name leads to that the model deliberately did not build."""

    module: str = ""  # its path in the model
    kind: str = ""  # "layer": past the end of a built ModuleList; "none": a sub-module the class set to None
    index: int = 0  # a layer's index (kind "layer")
    built: int = 0  # the layers the list holds (kind "layer")


@dataclass(frozen=True)
class Layout(wire.Record):
    """The built model's side of the checkpoint's names (the reply's ``layout``; compat/weights.py)."""

    mapper: HfMapper | None = None  # hf_to_vllm_mapper's tables; None: the class has none
    mapped: dict[str, str | None] = field(default_factory=dict)  # checkpoint name -> the mapper's (None: dropped)
    unbuilt: dict[str, UnbuiltPart] = field(default_factory=dict)  # checkpoint name -> the module not built


@dataclass(frozen=True)
class BuildError(wire.Record):
    """Where the weights pass stopped (the reply's ``error``): the stage, vLLM's error, the model's line."""

    stage: str | None = None  # "import" | "class" | "config" | "build" | "load" | "internal"
    summary: str | None = None  # the error's type and message
    traceback: str | None = None
    where: str | None = None  # "file:line in function" of the model's own frame (None: none)


@dataclass(frozen=True)
class BuiltModel(wire.Record):
    """The model the weights pass built (the reply's ``model``): vLLM's dtype and class for it."""

    dtype: str | None = None  # torch's name ("bfloat16")
    dtype_name: str | None = None  # the safetensors name ("BF16")
    architectures: list[str] = field(default_factory=list)  # config.json's, as vLLM read them
    hf: dict[str, Any] = field(default_factory=dict)  # the HF text config's sizes and tie_word_embeddings
    architecture: str | None = None  # the one vLLM resolved (None: it stopped before)
    class_name: str | None = field(default=None, metadata=wire.rules(key="class"))  # "module.Class"
    parameters: int | None = None  # elements of the built model's parameters


@dataclass(frozen=True)
class MixerRecord(wire.Record):
    """A token mixer the built model registered in vLLM's forward context (compat/mixers.py)."""

    prefix: str | None = None  # the name it registered under
    path: str | None = None  # where it sits in the model (None: not found in the module tree)
    kind: str | None = None  # facts/mixers.py's kind by class (attention, mla, mamba, ...)
    family: str | None = None  # attention, mla or state
    class_name: str | None = field(default=None, metadata=wire.rules(key="class"))
    # the sizes it caches by, where the layer has them (an MLA layer: its latent width and rope dim)
    num_kv_heads: int | None = None
    head_size: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None


@dataclass(frozen=True)
class StateInterfaces(wire.Record):
    """What the model's class declares of vLLM's state interfaces (compat/mixers.py state_interfaces)."""

    WIRE_SPARSE: ClassVar[bool] = True  # written as sent (an older reply may lack a flag)

    is_hybrid: bool | None = None
    has_inner_state: bool | None = None
    is_attention_free: bool | None = None
    methods: dict[str, bool] | None = None  # facts/mixers.py STATE_METHODS -> whether a class of the model's defines it


@dataclass(frozen=True)
class AttentionReading(wire.Record):
    """How vLLM reads config.json's attention (compat/mixers.py): an answer vLLM could not give is not sent."""

    WIRE_SPARSE: ClassVar[bool] = True

    model_type: str | None = None  # the HF text config's model_type
    use_mla: bool | None = None  # ModelConfig.use_mla
    head_size: int | None = None  # ModelConfig.get_head_size(): what it sizes attention metadata by


@dataclass(frozen=True)
class WeightLoad(wire.Record):
    """The weights pass's reply as the checks read it: each checkpoint tensor and each parameter
    of the model built on the meta device, load_weights' own outcome and the parameters nearest
    to each name that failed, the layers' quantization methods and the model's layout; and, there
    even when load_weights was not driven, where the pass stopped, the model built and its token
    mixers. Read once per reply (:meth:`Facts.weights_reply`)."""

    tensors: dict[str, TensorLoad] = field(default_factory=dict)
    params: dict[str, ParamLoad] = field(default_factory=dict)
    load_weights: LoadWeightsCall = field(default_factory=LoadWeightsCall)
    nearest: dict[str, list[str]] = field(default_factory=dict)
    quant: QuantLayers | None = None  # None: not read (the reading failed: ``quant_error``)
    layout: Layout = field(default_factory=Layout)
    error: BuildError | None = None  # where the pass stopped (None: it ran to the end)
    model: BuiltModel | None = None  # None: vLLM's config could not be built
    mixers: list[MixerRecord] | None = None  # None: not read (the model was not built, or ``mixers_error``)
    mixers_error: str | None = None
    state_interfaces: StateInterfaces | None = None
    attention_reading: AttentionReading | None = None


@dataclass
class Facts:
    model_dir: str
    config: dict[str, Any]
    trust_remote_code: bool = False
    vllm_plugins_env: str | None = None  # VLLM_PLUGINS as set, None if unset
    # vLLM's built-in table (arch -> "module:Class") and friends, read from source or import
    builtin_archs: dict[str, str] | None = None
    transformers_backend_archs: set[str] = field(default_factory=set)
    previously_supported: dict[str, str] = field(default_factory=dict)
    out_of_tree: dict[str, str] = field(default_factory=dict)
    vllm_config_model_types: set[str] = field(default_factory=set)
    # the sub-configs transformers' config class for config.json's model_type declares (source)
    hf_sub_configs: set[str] | None = None
    # the quantization methods vLLM knows (source) and those the plugins register (None: unknown)
    quantization_methods: list[str] | None = None
    plugin_quantization_methods: set[str] | None = None
    transformers_model_types: set[str] | None = None
    transformers_class_names: set[str] | None = None
    plugins: list[PluginInfo] = field(default_factory=list)
    # the registry an engine process will see: "import" (measured in a fresh process) or
    # "static" (built-ins + literal registrations read from plugin source)
    registry: dict[str, str] | None = None
    registry_source: str = "static"
    # import pass (fresh process) results
    import_pass: dict[str, Any] | None = None
    import_pass_error: str | None = None
    # VD102 inputs
    caller_registry: dict[str, str] | None = None
    script_registrations: list[dict[str, Any]] | None = None
    # VD3xx inputs (stages/weights.py): safetensors headers, read in the fast pass; the
    # meta-device load_weights run (a child beside the import pass), collected before checks run
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    checkpoint: CheckpointFacts | None = None
    # the files of the model directory vLLM must not be handed (probes/model_files.py; VD113):
    # {"name", "kind", "detail", "checkpoint"}; None: not read
    refused_files: list[dict[str, Any]] | None = None
    weight_load: dict[str, Any] | None = None
    weight_load_error: str | None = None
    weight_load_seconds: float | None = None
    # the performance lint's view of the meta-device build (VD6xx), or why there is none
    perf: PerfAnatomy | None = None
    perf_error: str | None = None
    # passes that ran and did not complete (time-out, crash, no vLLM): {"pass", "error"}; VD100
    pass_failures: list[dict[str, str]] = field(default_factory=list)
    # (the import pass reply it was read from, its record): read once per reply
    _imports: tuple[dict[str, Any], ImportPass] | None = field(default=None, init=False, repr=False, compare=False)
    # (the weights pass reply it was read from, its record): read once per reply
    _weights: tuple[dict[str, Any], WeightLoad] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def imports(self) -> ImportPass | None:
        """The import pass's reply (``import_pass``, kept as sent) as its record; None when it
        did not run or failed."""
        data = self.import_pass
        if data is None:
            return None
        if self._imports is None or self._imports[0] is not data:
            self._imports = (data, wire.read(ImportPass, data))
        return self._imports[1]

    def class_info(self, arch: str) -> ClassRecord | None:
        """The import pass's record of the class registered under ``arch``."""
        return self.imports.classes.get(arch) if self.imports is not None else None

    # ---- derived views ----
    @property
    def architectures(self) -> list[str]:
        archs = self.config.get("architectures")
        if isinstance(archs, list):
            return [a for a in archs if isinstance(a, str)]
        return []

    @property
    def model_type(self) -> str | None:
        mt = self.config.get("model_type")
        return mt if isinstance(mt, str) else None

    @property
    def auto_map(self) -> dict[str, str]:
        am = self.config.get("auto_map")
        return am if isinstance(am, dict) else {}

    def plugin_registrations(self) -> list[tuple[PluginInfo, str, str, str]]:
        """(plugin, arch, target, where) for every registration an allowed plugin makes.

        From the static scan, plus (after the import pass) archs the measured registry added
        or changed vs the built-ins. Plugins excluded by VLLM_PLUGINS register nothing.
        """
        out: list[tuple[PluginInfo, str, str, str]] = []
        for plugin in self.plugins:
            if not plugin.allowed:
                continue
            for reg in plugin.registrations:
                out.append((plugin, reg.arch, reg.target, reg.where))
        if self.registry_source == "import" and self.registry is not None and self.builtin_archs is not None:
            known = {(arch, target) for _, arch, target, _ in out}
            extra = [(a, t) for a, t in self.registry.items() if self.builtin_archs.get(a) != t and (a, t) not in known]
            if extra:
                # only a plugin the static scan could not follow can have made these
                opaque = [p for p in self.plugins if p.allowed and (p.dynamic or p.problem or not p.function_found)]
                owner = (
                    opaque[0]
                    if len(opaque) == 1
                    else PluginInfo(name="(an installed plugin)", value="", distribution=None, allowed=True)
                )
                out.extend((owner, arch, target, "registered at import time") for arch, target in extra)
        return out

    def usable_weight_load(self) -> dict[str, Any] | None:
        """The weights pass's result when the model was built and load_weights was driven."""
        data = self.weight_load
        if data is None or data.get("error") or "tensors" not in data:
            return None
        return data

    def weights_reply(self) -> WeightLoad | None:
        """The weights pass's reply (``weight_load``, kept as sent) as its record, read once per
        reply, whatever stage it got to; None when the pass did not run or failed."""
        data = self.weight_load
        if data is None:
            return None
        if self._weights is None or self._weights[0] is not data:
            self._weights = (data, WeightLoad.of(data))
        return self._weights[1]

    def usable_weights(self) -> WeightLoad | None:
        """:meth:`weights_reply` when the model was built and load_weights was driven
        (:meth:`usable_weight_load`); None otherwise."""
        return self.weights_reply() if self.usable_weight_load() is not None else None

    def weights_build_error(self) -> BuildError | None:
        """Where the weights pass stopped (its reply's ``error``), or None: it ran to the end or did not run."""
        reply = self.weights_reply()
        return reply.error if reply is not None else None

    def class_record(self, arch: str) -> dict[str, Any] | None:
        """The import pass's record for the class registered under ``arch``."""
        if not self.import_pass:
            return None
        record = self.import_pass.get("classes", {}).get(arch)
        return record if isinstance(record, dict) else None

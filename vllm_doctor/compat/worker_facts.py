"""Worker-side fact collectors: anatomy, placement, KV cache, memory.

These run inside a vLLM worker (through the extension's ``doctor_*`` methods) and read the
worker only through :mod:`vllm_doctor.compat.worker`. Each builds the record the doctor's side
reads (:mod:`vllm_doctor.facts.anatomy`, :mod:`~vllm_doctor.facts.placement`,
:mod:`~vllm_doctor.facts.kv`, :mod:`~vllm_doctor.facts.memory`) and returns its ``to_json()``
dict, so the two sides of the wire are one module.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from vllm_doctor.compat import mixers, roles
from vllm_doctor.compat import worker as wv
from vllm_doctor.compat.common import hf_text_config, qualname
from vllm_doctor.compat.weights import is_fused_moe, num_experts
from vllm_doctor.facts.anatomy import Anatomy
from vllm_doctor.facts.kv import (
    AttentionLayer,
    CacheConfig,
    HfShape,
    KvCache,
    KvGroup,
    KvSpec,
    KvTensor,
    PlannedTensor,
)
from vllm_doctor.facts.memory import VLLM_MEASURES, CudaMemory, MemoryFacts
from vllm_doctor.facts.mixers import kind_of_spec, mamba_type_name
from vllm_doctor.facts.placement import DevicePlace, Placement, PlacementCounts, Shard, TensorPlace

MAX_LISTED = 200  # tensors listed per category; the rest are counted
MAX_SHARDS = 4096  # parameters whose per-rank shape (and fingerprint) the cross-rank check gets
FINGERPRINT_SAMPLES = 1024


def _shard_dim(model: nn.Module, name: str, p: torch.Tensor) -> int | None:
    """The dimension vLLM splits this parameter on over tensor-parallel ranks, else None
    (replicated, or not knowable). vLLM's parallel layers say it by class: column-parallel
    layers (QKV, merged, vocabulary) split weight and bias on ``output_dim``, row-parallel ones
    split the weight on ``input_dim`` and replicate the bias; a module of the model's own that
    sets exactly one of the two loader attributes splits on that one."""
    path, _, leaf = name.rpartition(".")
    try:
        owner = model.get_submodule(path) if path else model
    except AttributeError:
        return None
    if getattr(owner, "tp_size", None) == 1:
        return None
    mro = {c.__name__ for c in type(owner).__mro__}
    out_dim, in_dim = getattr(p, "output_dim", None), getattr(p, "input_dim", None)
    if "RowParallelLinear" in mro:
        return in_dim if leaf == "weight" and isinstance(in_dim, int) else None
    if mro & {"ColumnParallelLinear", "VocabParallelEmbedding"}:
        return out_dim if isinstance(out_dim, int) else 0
    if isinstance(out_dim, int) != isinstance(in_dim, int):
        return out_dim if isinstance(out_dim, int) else in_dim
    return None


def fingerprint(t: torch.Tensor) -> list[float] | None:
    """Two numbers that tell two tensors' values apart without copying them: the float64 sum,
    and a position-weighted sum of up to 1024 evenly spaced elements. None for meta tensors,
    non-float tensors and tensors with one value everywhere (they prove nothing)."""
    if t.device.type == "meta" or not t.is_floating_point() or t.numel() == 0:
        return None
    with torch.no_grad():
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
        sample = flat[::step][:FINGERPRINT_SAMPLES].to(torch.float64)
        if bool((sample == sample[0]).all()):
            return None
        weights = torch.arange(1, sample.numel() + 1, dtype=torch.float64, device=sample.device)
        return [float(torch.sum(flat, dtype=torch.float64)), float((sample * weights).sum())]


def shards(model: nn.Module, tp_size: int | None) -> dict[str, Shard]:
    """Each parameter's shape on this rank, the dimension vLLM splits it on, and (when there is
    more than one tensor-parallel rank) a fingerprint of its values: the cross-rank check's input."""
    out: dict[str, Shard] = {}
    for name, p in model.named_parameters(remove_duplicate=True):
        if len(out) >= MAX_SHARDS:
            break
        dim = _shard_dim(model, name, p)
        shape = list(p.shape)
        if p.numel() == 0 and _repacked(model, name):
            # vLLM's CPU backend moved the weight into a packed kernel (oneDNN, sgl, zentorch) after
            # loading and left an empty parameter: its shape and values are not visible here
            out[name] = Shard(shape, dim, repacked=True)
        elif dim is not None and (tp_size or 1) > 1:
            out[name] = Shard(shape, dim, fingerprint=fingerprint(p))
        else:
            out[name] = Shard(shape, dim)
    return out


def _repacked(model: nn.Module, name: str) -> bool:
    """``name`` is the emptied weight of a linear layer whose GEMM vLLM's CPU backend packed."""
    owner, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(owner)
    except AttributeError:
        return False
    return attr == "weight" and callable(getattr(module, "cpu_linear", None))


def _norm_device(dev: torch.device) -> torch.device:
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def same_device(tensor_dev: torch.device, worker_dev: torch.device) -> bool:
    a, b = _norm_device(tensor_dev), _norm_device(worker_dev)
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _owner_class(model: nn.Module, qualified: str) -> tuple[str, bool]:
    """(class name of the module that owns ``qualified``, is it one of vLLM's own classes)."""
    path = qualified.rsplit(".", 1)[0] if "." in qualified else ""
    try:
        owner = model.get_submodule(path) if path else model
    except AttributeError:
        return "?", False
    cls = type(owner)
    return cls.__qualname__, cls.__module__.startswith("vllm.")


def anatomy(worker: Any) -> dict[str, Any]:
    """``doctor_anatomy``: who the worker is and how it runs the model."""
    return Anatomy(wv.identity(worker), wv.compile_record(worker)).to_json()


def perf(worker: Any) -> dict[str, Any]:
    """``doctor_perf``: the performance lint's view of the worker's model (VD6xx)."""
    from vllm_doctor.compat.common import hf_text_config
    from vllm_doctor.compat.perf import perf_anatomy

    model = wv.model(worker)
    if model is None:
        raise RuntimeError("the worker has no model loaded yet")
    model_config = wv.sub_config(worker, "model_config")
    hf = hf_text_config(model_config) if model_config is not None else None
    where = mixers.mixer_paths(model, wv.forward_context(worker))
    return perf_anatomy(model, hf, getattr(model_config, "dtype", None), "engine worker", where).to_json()


def placement(worker: Any) -> dict[str, Any]:
    """VD401/VD402/VD405/VD406 facts: where each parameter and buffer lives, and what the worker is."""
    return placement_record(worker).to_json()


def placement_record(worker: Any) -> Placement:
    model = wv.model(worker)
    dev = wv.device(worker)
    model_config = wv.sub_config(worker, "model_config")
    model_dtype = getattr(model_config, "dtype", None)
    head: dict[str, Any] = {
        "worker": wv.identity(worker),
        "device": device_facts(worker),
        "model_dtype": str(model_dtype) if model_dtype is not None else None,
    }
    if model is None:
        return Placement(**head, model=None)
    misplaced: list[TensorPlace] = []
    dtype_mismatch: list[TensorPlace] = []
    by_device: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    counts = {"parameters": 0, "buffers": 0, "misplaced": 0, "dtype_mismatch": 0}
    tensors: list[tuple[str, str, torch.Tensor]] = [
        ("parameter", n, p) for n, p in model.named_parameters(remove_duplicate=True)
    ] + [("buffer", n, b) for n, b in model.named_buffers(remove_duplicate=True)]
    for kind, name, t in tensors:
        counts["parameters" if kind == "parameter" else "buffers"] += 1
        by_device[str(t.device)] = by_device.get(str(t.device), 0) + 1
        by_dtype[str(t.dtype)] = by_dtype.get(str(t.dtype), 0) + 1
        if not same_device(t.device, dev):
            counts["misplaced"] += 1
            if len(misplaced) < MAX_LISTED:
                owner, builtin = _owner_class(model, name)
                misplaced.append(
                    TensorPlace(
                        name=name,
                        kind=kind,
                        device=str(t.device),
                        dtype=str(t.dtype),
                        shape=list(t.shape),
                        bytes=t.numel() * t.element_size(),
                        module_class=owner,
                        vllm_builtin=builtin,
                    )
                )
        if (
            kind == "parameter"
            and model_dtype is not None
            and t.is_floating_point()
            and t.dtype != model_dtype
            and t.element_size() > 1  # fp8 weights are quantization
        ):
            counts["dtype_mismatch"] += 1
            if len(dtype_mismatch) < MAX_LISTED:
                owner, builtin = _owner_class(model, name)
                dtype_mismatch.append(
                    TensorPlace(
                        name=name,
                        kind=kind,
                        dtype=str(t.dtype),
                        shape=list(t.shape),
                        module_class=owner,
                        vllm_builtin=builtin,
                    )
                )
    # float64 anywhere (numpy's default dtype; never what a GPU kernel wants): VD405 warns on every device
    float64 = [
        TensorPlace(
            name=name,
            kind=kind,
            device=str(t.device),
            dtype=str(t.dtype),
            shape=list(t.shape),
            module_class=_owner_class(model, name)[0],
        )
        for kind, name, t in tensors
        if t.dtype == torch.float64
    ][:MAX_LISTED]
    pc = wv.sub_config(worker, "parallel_config")
    return Placement(
        **head,
        model=qualname(model),
        counts=PlacementCounts(**counts),
        misplaced=misplaced,
        dtype_mismatch=dtype_mismatch,
        float64=float64,
        by_device=by_device,
        by_dtype=by_dtype,
        shards=shards(model, getattr(pc, "tensor_parallel_size", None)),
    )


def device_facts(worker: Any) -> DevicePlace:
    """The worker's device as vLLM, torch and the environment see it (VD402)."""
    dev = _norm_device(wv.device(worker))
    pc = wv.sub_config(worker, "parallel_config")
    info: dict[str, Any] = {
        "device": str(dev),
        "type": dev.type,
        "index": dev.index,
        "rank": getattr(worker, "rank", None),
        "local_rank": getattr(worker, "local_rank", None),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "assigned_physical_gpu_ids": _jsonable(getattr(pc, "assigned_physical_gpu_ids", None)),
        "hostname": os.uname().nodename,
    }
    if dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        info.update(
            current_device=torch.cuda.current_device(),
            device_count=torch.cuda.device_count(),
            name=props.name,
            uuid=str(getattr(props, "uuid", "")) or None,
            pci_bus_id=_pci_bus_id(props),
            total_memory=props.total_memory,
            # not in every torch: what the roofline's peak bandwidth is computed from
            memory_bus_width_bits=_int_or_none(getattr(props, "memory_bus_width", None)),
            memory_clock_khz=_int_or_none(getattr(props, "memory_clock_rate", None)),
            multi_processor_count=_int_or_none(getattr(props, "multi_processor_count", None)),
        )
    return DevicePlace(**info)


def _pci_bus_id(props: Any) -> str | None:
    parts = [getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if any(p is None for p in parts):
        return None
    domain, bus, device = parts
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


# ---- KV cache -----------------------------------------------------------------------------


def _spec(spec: Any) -> KvSpec:
    """vLLM's KVCacheSpec: what this vLLM exposes of it. A group's ``UniformTypeKVCacheSpecs``
    (layers of one type with different sizes) is described by its first layer's spec."""
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, dict) and inner:
        spec = next(iter(inner.values()))
    sizes: dict[str, int | None] = {}
    for attr in ("block_size", "num_kv_heads", "head_size", "head_size_v", "sliding_window", "attention_chunk_size"):
        sizes[attr] = _int_or_none(getattr(spec, attr, None))
    dtype = getattr(spec, "dtype", None)
    try:
        page_size: int | None = int(spec.page_size_bytes)
    except Exception:
        page_size = None
    mamba_type = mamba_type_name(getattr(spec, "mamba_type", None))
    shapes = getattr(spec, "shapes", None)
    dtypes = getattr(spec, "dtypes", None)
    mode = getattr(spec, "mamba_cache_mode", None)
    return KvSpec(
        type=type(spec).__name__ if spec is not None else None,
        dtype=str(dtype) if dtype is not None else None,
        page_size_bytes=page_size,
        kind=kind_of_spec(type(spec).__name__, mamba_type) if spec is not None else None,
        mamba_type=mamba_type,
        shapes=[[int(d) for d in sh] for sh in shapes] if isinstance(shapes, (list, tuple)) else [],
        dtypes=[str(d) for d in dtypes] if isinstance(dtypes, (list, tuple)) else [],
        mamba_cache_mode=str(getattr(mode, "value", mode)) if mode is not None else None,
        unpadded_page_bytes=_unpadded_page(spec, page_size),
        **sizes,
    )


def _unpadded_page(spec: Any, page_size: int | None) -> int | None:
    """A page's bytes before vLLM padded it to the groups' common page size: an attention spec's
    ``real_page_size_bytes``, a Mamba spec's states (its ``page_size_padded`` is the padded one)."""
    real = getattr(spec, "real_page_size_bytes", None)
    if isinstance(real, int):
        return real
    shapes, dtypes = getattr(spec, "shapes", None), getattr(spec, "dtypes", None)
    if isinstance(shapes, (list, tuple)) and isinstance(dtypes, (list, tuple)) and len(shapes) == len(dtypes):
        try:
            total = 0
            for shape, dtype in zip(shapes, dtypes, strict=True):
                n = 1
                for d in shape:
                    n *= int(d)
                total += n * torch.empty((), dtype=dtype).element_size()
            return total  # a Mamba page holds one request's states
        except Exception:
            return page_size
    return page_size


def _capacity(worker: Any, kcc: Any) -> tuple[int | None, float | None]:
    """vLLM's own capacity: tokens and requests of max_model_len at once, as it logs them
    ("KV cache size: N tokens, Maximum concurrency ..."). The engine stores them in its
    cache_config (vLLM 0.32); else asked of vLLM's functions with the worker's config."""
    cache_config = wv.sub_config(worker, "cache_config")
    tokens = getattr(cache_config, "kv_cache_size_tokens", None)
    conc = getattr(cache_config, "kv_cache_max_concurrency", None)
    if isinstance(tokens, int) and isinstance(conc, (int, float)):
        return tokens, float(conc)
    if kcc is None:
        return None, None
    try:
        from vllm.v1.core import kv_cache_utils as ku
    except Exception:
        return None, None
    vc = wv.vllm_config(worker)
    try:
        capacity = getattr(ku, "get_kv_cache_capacity", None)
        if callable(capacity):
            n, c = capacity(vc, kcc)
            return int(n), float(c)
        conc_of = getattr(ku, "get_max_concurrency_for_kv_cache_config", None)
        if callable(conc_of):
            c = float(conc_of(vc, kcc))
            max_len = _int_or_none(getattr(wv.sub_config(worker, "model_config"), "max_model_len", None))
            return (int(c * max_len) if max_len else None), c
    except Exception:
        return None, None
    return None, None


def kv_cache(worker: Any) -> dict[str, Any]:
    """VD501/VD504/VD208 facts: KV tensors (shared storage counted once), the plan, attention layers."""
    return kv_cache_record(worker).to_json()


def kv_cache_record(worker: Any) -> KvCache:
    tensors = wv.kv_caches(worker)
    storages: dict[int, int] = {}
    layers: list[KvTensor] = []
    for t in tensors:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        storages.setdefault(ptr, st.nbytes())
        layers.append(
            KvTensor(
                shape=list(t.shape),
                dtype=str(t.dtype),
                device=str(t.device),
                view_bytes=t.numel() * t.element_size(),
                storage=list(storages).index(ptr),
            )
        )
    plan: dict[str, Any] = {}
    if torch.cuda.is_available() and wv.device(worker).type == "cuda":
        plan["torch_cuda_allocated_bytes"] = torch.cuda.memory_allocated()
    kcc = wv.kv_cache_config(worker)
    if kcc is not None:
        planned = [
            PlannedTensor(
                size=int(getattr(kt, "size", 0)),
                layers=list(getattr(kt, "shared_by", None) or getattr(kt, "layers", []) or []),
            )
            for kt in getattr(kcc, "kv_cache_tensors", []) or []
        ]
        layout = getattr(kcc, "kv_cache_layout", None)
        raw = list(getattr(kcc, "kv_cache_tensors", []) or [])
        # vLLM 0.32 places every planned tensor at an offset of one backing allocation of `size`
        # bytes (its groups overlay each other); older vLLM allocates each planned tensor apart
        aliased = bool(raw) and all(hasattr(kt, "offset") and hasattr(kt, "layer_stride") for kt in raw)
        capacity, concurrency = _capacity(worker, kcc)
        plan.update(
            num_blocks=_int_or_none(getattr(kcc, "num_blocks", None)),
            planned_tensors=planned,
            planned_bytes=max(p.size for p in planned) if aliased else sum(p.size for p in planned),
            planned_aliased=aliased,
            capacity_tokens=capacity,
            max_concurrency=concurrency,
            layout=str(layout) if layout is not None else None,
            groups=[
                KvGroup(list(getattr(g, "layer_names", [])), _spec(getattr(g, "kv_cache_spec", None)))
                for g in getattr(kcc, "kv_cache_groups", []) or []
            ],
        )
    cache_config = wv.sub_config(worker, "cache_config")
    model_config = wv.sub_config(worker, "model_config")
    sched = wv.sub_config(worker, "scheduler_config")
    pc = wv.sub_config(worker, "parallel_config")
    return KvCache(
        num_tensors=len(tensors),
        layers=layers,
        num_storages=len(storages),
        storage_bytes=sum(storages.values()),
        view_bytes=sum(layer.view_bytes or 0 for layer in layers),
        cache_config=CacheConfig(
            **{
                a: _jsonable(getattr(cache_config, a, None))
                for a in (
                    "block_size",
                    "num_gpu_blocks",
                    "cache_dtype",
                    "kv_cache_memory_bytes",
                    "gpu_memory_utilization",
                    "enable_prefix_caching",
                )
            }
        ),
        max_model_len=_int_or_none(getattr(model_config, "max_model_len", None)),
        max_num_seqs=_int_or_none(getattr(sched, "max_num_seqs", None)),
        max_num_batched_tokens=_int_or_none(getattr(sched, "max_num_batched_tokens", None)),
        tensor_parallel_size=_int_or_none(getattr(pc, "tensor_parallel_size", None)) or 1,
        hf_config=_hf_config(model_config, pc),
        attention_layers=attention_layers(worker),
        **plan,
    )


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _attr(cfg: Any, name: str, default: Any = None) -> Any:
    """A config attribute, or ``default`` where reading it raises: Gemma 4's config raises on a
    global ``head_dim`` (a per-layer attribute there), not AttributeError."""
    try:
        return getattr(cfg, name, default)
    except Exception:
        return default


def _hf_config(model_config: Any, parallel_config: Any = None) -> HfShape:
    cfg = hf_text_config(model_config)
    out: dict[str, Any] = {}
    for attr in (
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_size",
        "intermediate_size",
        "vocab_size",
    ):
        value = _attr(cfg, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out[attr] = value
        elif attr == "intermediate_size" and _int_list(value):
            # one MLP size per layer (Gemma 3n): their mean, so the layers' total is the same
            out[attr] = round(sum(value) / len(value))
    tied = _attr(cfg, "tie_word_embeddings", None)
    if isinstance(tied, bool):
        out["tie_word_embeddings"] = tied
    # experts: a dense decoder's byte count does not describe them (the roofline says so)
    experts = [_attr(cfg, a, None) for a in ("num_local_experts", "n_routed_experts", "num_experts")]
    out["moe"] = any(isinstance(e, int) and not isinstance(e, bool) and e > 1 for e in experts)
    if out["moe"]:
        out.update(_moe_sizes(cfg))
    model_type = _attr(cfg, "model_type", None)
    get_head_size = getattr(model_config, "get_head_size", None)
    if callable(get_head_size):
        try:
            out["vllm_head_size"] = int(get_head_size())
        except Exception:
            pass
    get_kv_heads = getattr(model_config, "get_num_kv_heads", None)
    if callable(get_kv_heads) and parallel_config is not None:
        try:
            out["vllm_num_kv_heads"] = int(get_kv_heads(parallel_config))
        except Exception:
            pass
    use_mla = getattr(model_config, "use_mla", None)
    if isinstance(use_mla, bool):
        out["use_mla"] = use_mla
    for attr in ("kv_lora_rank", "qk_rope_head_dim"):
        value = _attr(cfg, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out[attr] = value
    return HfShape(model_type=model_type if isinstance(model_type, str) else None, **out)


def _int_list(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def _moe_sizes(cfg: Any) -> dict[str, int]:
    """An MoE config's sizes under Mixtral's, Qwen2-MoE's and DeepSeek's keys: routed experts,
    experts per token, one expert's MLP size, the shared experts' MLP size (Qwen2-MoE's
    ``shared_expert_intermediate_size``, DeepSeek's ``n_shared_experts x moe_intermediate_size``)."""

    def whole(*keys: str) -> int | None:
        for key in keys:
            value = _attr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    expert_mlp = whole("moe_intermediate_size", "intermediate_size")
    shared = whole("shared_expert_intermediate_size")
    n_shared = whole("n_shared_experts")
    if shared is None and n_shared and expert_mlp:
        shared = n_shared * expert_mlp
    sizes = {
        "num_experts": whole("num_local_experts", "n_routed_experts", "num_experts"),
        "num_experts_per_tok": whole("num_experts_per_tok", "moe_top_k", "top_k"),
        "moe_intermediate_size": expert_mlp,
        "shared_expert_intermediate_size": shared,
    }
    return {k: v for k, v in sizes.items() if v is not None}


def attention_layers(worker: Any) -> list[AttentionLayer]:
    """Attention layers from vLLM's forward context, matched to their path in the model."""
    sfc = wv.forward_context(worker)
    model = wv.model(worker)
    paths: dict[int, list[str]] = {}
    if model is not None:
        for name, mod in model.named_modules(remove_duplicate=False):
            paths.setdefault(id(mod), []).append(name)
    vc = wv.vllm_config(worker)
    out = []
    for prefix, layer in sfc.items():
        impl = getattr(layer, "impl", None)
        if impl is None and isinstance(layer, nn.Module) and any(is_fused_moe(m) for m in layer.modules()):
            continue  # vLLM's fused MoE layers are in the forward context too (its op looks them up): no attention
        own = mixers.layer_spec(layer, vc)
        sinks = getattr(impl, "sinks", None)  # each backend implementation keeps them (gpt-oss)
        backend = getattr(layer, "attn_backend", None)
        kv = getattr(layer, "kv_cache", None)
        if isinstance(kv, (list, tuple)):
            kv = kv[0] if kv and isinstance(kv[0], torch.Tensor) else None
        out.append(
            AttentionLayer(
                prefix=prefix,
                layer_name=getattr(layer, "layer_name", None),
                layer_class=qualname(layer),
                impl=type(impl).__name__ if impl is not None else None,
                backend=getattr(backend, "__name__", str(backend)) if backend is not None else None,
                num_kv_heads=_int_or_none(getattr(layer, "num_kv_heads", None) or getattr(impl, "num_kv_heads", None)),
                num_heads=_int_or_none(getattr(layer, "num_heads", None) or getattr(impl, "num_heads", None)),
                head_size=_int_or_none(getattr(layer, "head_size", None) or getattr(impl, "head_size", None)),
                kv_cache_dtype=str(getattr(layer, "kv_cache_dtype", "")) or None,
                module_paths=paths.get(id(layer), []),
                kv_cache_shape=list(kv.shape) if isinstance(kv, torch.Tensor) else None,
                kv_sharing_target=getattr(layer, "kv_sharing_target_layer_name", None)
                or getattr(impl, "kv_sharing_target_layer_name", None),
                kind=mixers.layer_kind(layer, own),
                spec=_spec(own) if own is not None else None,
                sinks=sinks is not None and sinks is not False,
            )
        )
    return out


# ---- memory -------------------------------------------------------------------------------


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t.device.type == "meta":
            continue
        st = t.untyped_storage()
        seen.setdefault(st.data_ptr(), st.nbytes())
    return sum(seen.values())


def _encoder_bytes(model: nn.Module) -> int:
    """A multimodal model's encoder parameters (vision tower, projector:
    :func:`vllm_doctor.compat.roles.model_parts`): what a decode step never reads. 0 for a text model."""
    parts = tuple(f"{x}." for x in roles.model_parts(model).encoder)
    return _unique_bytes([p for name, p in model.named_parameters() if name.startswith(parts)]) if parts else 0


def _hidden_weight_bytes(model: nn.Module) -> tuple[int, int]:
    """Bytes of linear weights the CPU backend repacked out of sight (its ``weight`` is empty).

    vLLM's CPU backend hands the weight to oneDNN/sgl kernels after loading and leaves a
    ``[0]``-shaped parameter behind; estimate the hidden bytes from the layer's shape.
    """
    total, layers = 0, 0
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or w.numel() != 0:
            continue
        n_in = getattr(mod, "input_size_per_partition", None)
        n_out = getattr(mod, "output_size_per_partition", None)
        dtype = getattr(mod, "params_dtype", None) or w.dtype
        if isinstance(n_in, int) and isinstance(n_out, int) and isinstance(dtype, torch.dtype):
            total += n_in * n_out * torch.empty(0, dtype=dtype).element_size()
            layers += 1
    return total, layers


def host_memory() -> dict[str, int]:
    """This process's resident memory (VmRSS) and its peak (VmHWM), from /proc."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def memory(worker: Any) -> dict[str, Any]:
    """VD503 facts: weights, KV, activations, CUDA graphs, as far as this device lets us measure."""
    return memory_record(worker).to_json()


def private_pool_bytes(dev: torch.device) -> int | None:
    """Bytes of the device's segments in torch's private memory pools: where CUDA graphs
    capture (vLLM's graph pool; also a ``torch.cuda.MemPool`` of vLLM's sleep mode, if on). From
    the allocator's snapshot (``segment_pool_id`` (0, 0) is the ordinary pool); None where the
    snapshot cannot be read or carries no pool ids."""
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:
        return None
    total = 0
    for seg in segments:
        if seg.get("device") not in (None, dev.index):
            continue
        pool = seg.get("segment_pool_id")
        if pool is None:
            return None
        if tuple(pool) != (0, 0):
            total += int(seg.get("total_size") or 0)
    return total


def _expert_bytes(model: nn.Module) -> dict[str, int]:
    """An MoE's routed experts as the worker holds them: its fused-MoE layers, the experts each
    holds on this rank, their parameters' bytes (all layers); nothing for a dense model."""
    fused = [(n, m) for n, m in model.named_modules() if n and is_fused_moe(m)]
    fused = [(n, m) for n, m in fused if not any(n.startswith(f + ".") for f, _ in fused)]  # topmost only
    if not fused:
        return {}
    counts = [num_experts(m) for _, m in fused]
    return {
        "moe_layers": len(fused),
        "moe_experts": max((c for c in counts if c), default=0),
        "expert_parameter_bytes": _unique_bytes([p for _, m in fused for p in m.parameters()]),
    }


def memory_record(worker: Any) -> MemoryFacts:
    model = wv.model(worker)
    mr = wv.runner(worker)
    dev = wv.device(worker)
    weights: dict[str, int] = {}
    if model is not None:
        hidden, n_hidden = _hidden_weight_bytes(model)
        weights = {
            "parameter_bytes": _unique_bytes(list(model.parameters())),
            "buffer_bytes": _unique_bytes(list(model.buffers())),
            "repacked_weight_bytes_estimate": hidden,
            "repacked_layers": n_hidden,
            "encoder_parameter_bytes": _encoder_bytes(model),
            **_expert_bytes(model),
        }
    measured: dict[str, int] = {}
    for name in VLLM_MEASURES:
        value = getattr(mr if name == "model_memory_usage" else worker, name, None)
        if isinstance(value, (int, float)):
            measured[name] = int(value)
    cuda = None
    if dev.type == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(dev)
        cuda = CudaMemory(
            allocated=torch.cuda.memory_allocated(dev),
            reserved=torch.cuda.memory_reserved(dev),
            max_allocated=torch.cuda.max_memory_allocated(dev),
            max_reserved=torch.cuda.max_memory_reserved(dev),
            device_free=free,
            device_total=total,
            graph_pool_bytes=private_pool_bytes(dev),
        )
    return MemoryFacts(
        pid=os.getpid(),
        device=str(dev),
        kv_bytes=_unique_bytes(wv.kv_caches(worker)),
        vllm=measured,
        host=host_memory(),
        cuda=cuda,
        compile=wv.compile_record(worker),
        **weights,
    )

"""Capability-detecting views of a vLLM worker (V1 and V2 model runners, CPU and CUDA).

vLLM's worker internals drift between releases; every attribute is probed with ``getattr`` and
a missing one becomes ``None`` (reported as "unavailable") rather than an exception. Facts
measured on vLLM 0.26 (CUDA, V1 and V2 runners) and 0.32 (CPU, V1 runner):

- ``worker.model_runner.get_model()`` unwraps CUDA-graph wrappers; ``.model`` may be a wrapper.
- ``model_runner.kv_caches``: a list of per-layer tensors that can share one storage.
- ``model_runner.kv_cache_config``: ``num_blocks``, ``kv_cache_tensors`` (planned sizes),
  ``kv_cache_groups`` (layer names + spec).
- ``vllm_config.compilation_config.static_forward_context``: attention layers by prefix.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from vllm_doctor.compat import roles
from vllm_doctor.compat.common import qualname
from vllm_doctor.facts.anatomy import CompileState, WorkerIdentity


def runner(worker: Any) -> Any:
    return getattr(worker, "model_runner", None)


def model(worker: Any) -> nn.Module | None:
    """The model as an ``nn.Module`` (CUDA-graph wrappers unwrapped)."""
    mr = runner(worker)
    if mr is None:
        return None
    get_model = getattr(mr, "get_model", None)
    if callable(get_model):
        try:
            m = get_model()
            if isinstance(m, nn.Module):
                return m
        except Exception:
            pass
    m = getattr(mr, "model", None)
    if isinstance(m, nn.Module):
        return m
    unwrap = getattr(m, "unwrap", None)
    if callable(unwrap):
        inner = unwrap()
        if isinstance(inner, nn.Module):
            return inner
    return None


def device(worker: Any) -> torch.device:
    dev = getattr(worker, "device", None)
    if dev is None:
        dev = getattr(runner(worker), "device", None)
    return torch.device(dev) if dev is not None else torch.device("cpu")


def vllm_config(worker: Any) -> Any:
    return getattr(worker, "vllm_config", None) or getattr(runner(worker), "vllm_config", None)


def sub_config(worker: Any, name: str) -> Any:
    found = getattr(worker, name, None)
    if found is None:
        found = getattr(vllm_config(worker), name, None)
    return found


def served_model_name(worker: Any) -> str | None:
    """The name the server serves the model as (``--served-model-name``, else the model's path):
    vLLM's own metrics label the model with it (``model_name``)."""
    model_config = sub_config(worker, "model_config")
    name = getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return str(name) if name else None


def kv_caches(worker: Any) -> list[torch.Tensor]:
    """Per-layer KV tensors, whatever container the runner keeps them in."""
    kv = getattr(runner(worker), "kv_caches", None)
    if kv is None:
        return []
    items = list(kv.values()) if isinstance(kv, dict) else list(kv)
    out: list[torch.Tensor] = []
    for item in items:
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, (list, tuple)):  # some backends keep (k, v) pairs
            out.extend(t for t in item if isinstance(t, torch.Tensor))
    return out


def kv_cache_config(worker: Any) -> Any:
    return getattr(runner(worker), "kv_cache_config", None)


def forward_context(worker: Any) -> dict[str, Any]:
    cc = sub_config(worker, "compilation_config")
    sfc = getattr(cc, "static_forward_context", None)
    return dict(sfc) if isinstance(sfc, dict) else {}


def forward_context_class() -> type | None:
    """vLLM's ``ForwardContext`` (a dataclass built by every ``set_forward_context``), or None."""
    try:
        from vllm.forward_context import ForwardContext
    except Exception:
        return None
    return ForwardContext if isinstance(ForwardContext, type) else None


def current_forward_layers() -> dict[str, Any] | None:
    """The layers of the forward context set now (``no_compile_layers``), or None outside one."""
    try:
        from vllm import forward_context as fc
    except Exception:
        return None
    is_set = getattr(fc, "is_forward_context_available", None)
    if callable(is_set) and not is_set():
        return None
    context = getattr(fc, "_forward_context", None)
    layers = getattr(context, "no_compile_layers", None)
    return layers if isinstance(layers, dict) else None


def encoder_method(m: nn.Module) -> str | None:
    """The method through which vLLM's runner runs a multimodal model's encoder (vision tower,
    projector) on a step with new images: ``embed_multimodal``; None for a text model."""
    if callable(getattr(m, "embed_multimodal", None)) and getattr(m, "supports_multimodal", False):
        return "embed_multimodal"
    return None


def merge_method(m: nn.Module) -> str | None:
    """The method through which vLLM's runner writes a multimodal model's image embeddings into
    its token embeddings, ``embed_input_ids(input_ids, multimodal_embeddings=..., is_multimodal=mask)``
    (so in 0.26 to 0.33); None for a text model or where this vLLM's interface has no such method."""
    if not getattr(m, "supports_multimodal", False) or not callable(getattr(m, "embed_input_ids", None)):
        return None
    try:
        from vllm.model_executor.models.interfaces import SupportsMultiModal
    except Exception:
        return None
    return "embed_input_ids" if callable(getattr(SupportsMultiModal, "embed_input_ids", None)) else None


def language_model(m: nn.Module) -> nn.Module | None:
    """A multimodal model's language model, whose modules the per-layer profiler times
    (:func:`vllm_doctor.compat.roles.language_model`); None for a text model, or where it cannot say."""
    return roles.language_model(m)


def encoder_cache(worker: Any) -> dict[str, Any] | None:
    """The runner's encoder cache: multimodal item hash -> its encoder output (a tensor of
    embedding rows). V1 runners hold the dict as ``encoder_cache``; the V2 runner an object whose
    ``encoder_outputs`` is it. None where the runner has none (a text model on V2)."""
    cache = getattr(runner(worker), "encoder_cache", None)
    if isinstance(cache, dict):
        return cache
    outputs = getattr(cache, "encoder_outputs", None)
    return outputs if isinstance(outputs, dict) else None


def encoder_cache_budget(worker: Any) -> tuple[int | None, str | None]:
    """The encoder cache's size in embedding rows and where it is read: the runner's multimodal
    budget (``mm_budget.encoder_cache_size``, what vLLM's scheduler sizes it by), else the
    scheduler config's ``encoder_cache_size`` (the floor vLLM starts from)."""
    budget = getattr(runner(worker), "mm_budget", None)
    size = getattr(budget, "encoder_cache_size", None)
    if isinstance(size, int) and size > 0:
        return size, "mm_budget.encoder_cache_size"
    sched = getattr(getattr(worker, "vllm_config", None), "scheduler_config", None)
    size = getattr(sched, "encoder_cache_size", None)
    if isinstance(size, int) and size > 0:
        return size, "scheduler_config.encoder_cache_size"
    return None, None


def encoder_prefixes(m: nn.Module) -> tuple[str, ...]:
    """A multimodal model's encoder parts, towers first (:func:`vllm_doctor.compat.roles.model_parts`)."""
    return roles.model_parts(m).encoder


def encoder_parts(m: nn.Module) -> list[tuple[str, str]]:
    """A multimodal model's encoder parts as ``(part, module name)``, the towers before the
    connectors (:func:`vllm_doctor.compat.roles.model_parts`): :data:`~vllm_doctor.compat.roles.VISION_TOWER`
    or :data:`~vllm_doctor.compat.roles.PROJECTOR`."""
    return roles.model_parts(m).pairs()


def compiled_root(m: nn.Module) -> bool:
    """Is the root model's class one vLLM compiles (``@support_torch_compile`` sets
    ``do_not_compile`` False on its instances)? Its forward then runs inside the compiled code."""
    return getattr(m, "do_not_compile", True) is False


# the keyword with which the V2 runner's ``_dummy_run`` (its memory profile, warm-up and capture
# sizes, while the engine starts) calls ``execute_model`` with a made-up SchedulerOutput: not an
# engine step (the V1 runner's dummy runs call the model directly, not execute_model)
DUMMY_RUN_KWARG = "dummy_run"


def full_graph_replay(worker: Any) -> tuple[Any, str] | None:
    """(object, method) that replays a FULL CUDA graph in place of the model's forward: the V2
    runner's ``cudagraph_manager.run_fullgraph(desc)``. None where the runner has none (V1
    runners replay inside a wrapper called as the model)."""
    manager = getattr(runner(worker), "cudagraph_manager", None)
    if manager is not None and callable(getattr(manager, "run_fullgraph", None)) and hasattr(manager, "__dict__"):
        return manager, "run_fullgraph"
    return None


def model_forward_call(worker: Any) -> tuple[Any, str] | None:
    """(runner, method) through which the V1 model runner calls the model in ``execute_model``:
    ``_model_forward(input_ids=..., positions=..., ...)``, which calls ``self.model`` (in default
    mode a ``CUDAGraphWrapper`` that replays a FULL CUDA graph, or the compiled forward). The
    CPU runner subclasses it. None where the runner has no such method (the V2 runner calls
    ``self.model`` or ``cudagraph_manager.run_fullgraph`` inline)."""
    mr = runner(worker)
    if mr is None or not hasattr(mr, "__dict__"):
        return None
    if callable(getattr(type(mr), "_model_forward", None)):
        return mr, "_model_forward"
    return None


def runner_kind(worker: Any) -> str:
    """ "v2" for vLLM's V2 model runner (``vllm.v1.worker.gpu.model_runner`` or a subclass)."""
    mr = runner(worker)
    for cls in type(mr).__mro__:
        if cls.__module__.startswith("vllm.v1.worker.gpu.") or cls.__module__.startswith("vllm.v1.worker.cpu."):
            return "v2"
    return "v1"


def compile_record(worker: Any) -> CompileState:
    """Is the model run eagerly (Python hooks fire) or through torch.compile / CUDA graphs?"""
    model_config = sub_config(worker, "model_config")
    cc = sub_config(worker, "compilation_config")
    enforce_eager = bool(getattr(model_config, "enforce_eager", False))
    mode = getattr(cc, "mode", None)
    if mode is None:
        mode = getattr(cc, "level", None)  # older name of the same setting
    cudagraph_mode = getattr(cc, "cudagraph_mode", None)
    mode_value = int(getattr(mode, "value", mode) or 0) if mode is not None else 0
    cg_name = getattr(cudagraph_mode, "name", str(cudagraph_mode)) if cudagraph_mode is not None else "NONE"
    compiled = mode_value != 0 and not enforce_eager
    cudagraphs = cg_name not in ("NONE", "None") and not enforce_eager
    # vLLM compiles only classes decorated with @support_torch_compile (they carry do_not_compile);
    # a custom model without it runs its Python forward even when compilation is configured
    m = model(worker)
    compiled_modules = (
        [name for name, mod in m.named_modules() if getattr(mod, "do_not_compile", True) is False]
        if compiled and m is not None
        else []
    )
    eager = enforce_eager or (not compiled_modules and not cudagraphs)
    return CompileState(
        enforce_eager=enforce_eager,
        compilation_mode=getattr(mode, "name", str(mode)),
        cudagraph_mode=cg_name,
        compiled=compiled,
        compiled_modules=compiled_modules[:20],
        cudagraphs=cudagraphs,
        eager=eager,
    )


def compile_state(worker: Any) -> dict[str, Any]:
    """:func:`compile_record` as its wire dict (what the profiler and the hidden-state capture read)."""
    return compile_record(worker).to_json()


def identity(worker: Any) -> WorkerIdentity:
    """Who this worker is: pid, ranks, device, runner and model classes."""
    dev = device(worker)
    pc = sub_config(worker, "parallel_config")
    m = model(worker)
    ranks = parallel_ranks()
    return WorkerIdentity(
        pid=os.getpid(),
        ppid=os.getppid(),
        rank=getattr(worker, "rank", None),
        local_rank=getattr(worker, "local_rank", None),
        is_driver_worker=getattr(worker, "is_driver_worker", None),
        device=str(dev),
        worker_class=qualname(worker),
        model_runner_class=qualname(runner(worker)),
        model_runner_kind=runner_kind(worker),
        model_class=qualname(m) if m is not None else None,
        model_module_file=_module_file(type(m)) if m is not None else None,
        tensor_parallel_size=getattr(pc, "tensor_parallel_size", None),
        pipeline_parallel_size=getattr(pc, "pipeline_parallel_size", None),
        data_parallel_size=getattr(pc, "data_parallel_size", None),
        world_size=getattr(pc, "world_size", None),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        process_title=_process_title(),
        tp_rank=ranks["tp_rank"],
        pp_rank=ranks["pp_rank"],
    )


def parallel_ranks() -> dict[str, int | None]:
    """This process's rank in its tensor- and pipeline-parallel groups (None where vLLM's
    distributed state is not initialised or the accessor does not exist)."""
    out: dict[str, int | None] = {"tp_rank": None, "pp_rank": None}
    try:
        from vllm.distributed import parallel_state as ps
    except Exception:
        return out
    for key, getter in (("tp_rank", "get_tp_group"), ("pp_rank", "get_pp_group")):
        try:
            out[key] = int(getattr(ps, getter)().rank_in_group)
        except Exception:
            pass
    return out


def _module_file(cls: type) -> str | None:
    import sys

    module = sys.modules.get(cls.__module__)
    return getattr(module, "__file__", None)


def _process_title() -> str | None:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw.split(b"\0")[0].decode(errors="replace")[:120] or None

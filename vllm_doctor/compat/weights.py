"""Weight-loading coverage without weights: build the model on the meta device and drive its
REAL ``load_weights`` with meta tensors shaped like the checkpoint's.

Runs only in a fresh child process (task ``weights``: stages/weights_trace.py). What it does,
the way vLLM's ``DefaultModelLoader`` would, minus every byte of tensor data:

1. load the ``vllm.general_plugins`` entry points; re-register the lazily registered class of
   each config.json architecture as a class object so vLLM inspects it in this process (no
   inspection subprocess, no model-info cache);
2. build a ``VllmConfig`` for the model directory (world size 1), initialise vLLM's distributed
   state for one CPU process (gloo, a ``file://`` rendezvous in a private temp dir), and build
   the model under ``torch.device("meta")`` with vLLM's own ``initialize_model``;
3. wrap every parameter's ``weight_loader`` (and every module-level reference to
   ``default_weight_loader``) to record which checkpoint tensor reached which parameter, with
   which shard id, and what raised; a ``TorchDispatchMode`` records every in-place write into
   a parameter's storage (``copy_``, ``fill_``, ...) with the elements it covers and the
   checkpoint tensors the written data came from (provenance follows views and copies);
4. feed ``model.load_weights`` meta tensors of the checkpoint's names, shapes and dtypes, in
   vLLM's order. When it raises, the exception is recorded against the tensor being loaded
   and ``load_weights`` is called again with the tensors after it, so one run finds every
   problem. vLLM's own missing-weight check is simulated on the names it returns.

The hooks only observe and translate: every event goes to a :class:`LoadRecorder` as plain data
(names, storage element ranges, shard ids, exception text). The accounting behind it (coverage,
consumption, statuses, the result) is the pass's own logic and lives beside its stage, in
stages/weights_trace.py, whose ledger the caller hands to :func:`meta_load`. Everything
returned is JSON-able; no vLLM or torch object leaves this module.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from vllm_doctor.compat.common import format_exc, hf_text_config, is_fused_moe, user_frame
from vllm_doctor.constants import SCRATCH_DIR_ENV

MAX_RESTARTS = 10_000


def _exc_summary(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1500]


def _format_exc(exc: BaseException) -> str:
    return format_exc(exc, limit=6000)


def torch_dtype(name: str) -> Any:
    """safetensors dtype name -> torch dtype (uint8 for what this torch lacks)."""
    import torch

    table = {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "I16": "int16",
        "U16": "uint16",
        "F16": "float16",
        "BF16": "bfloat16",
        "I32": "int32",
        "U32": "uint32",
        "F32": "float32",
        "I64": "int64",
        "U64": "uint64",
        "F64": "float64",
        "C64": "complex64",
        "F8_E5M2": "float8_e5m2",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E8M0": "float8_e8m0fnu",
    }
    return getattr(torch, table.get(name, "uint8"), torch.uint8)


def dtype_name(dtype: Any) -> str:
    """torch dtype -> safetensors spelling (BF16, F32, ...), for comparing with headers."""
    text = str(dtype).replace("torch.", "")
    table = {
        "bool": "BOOL",
        "uint8": "U8",
        "int8": "I8",
        "int16": "I16",
        "uint16": "U16",
        "float16": "F16",
        "bfloat16": "BF16",
        "int32": "I32",
        "uint32": "U32",
        "float32": "F32",
        "int64": "I64",
        "uint64": "U64",
        "float64": "F64",
        "complex64": "C64",
        "float8_e5m2": "F8_E5M2",
        "float8_e4m3fn": "F8_E4M3",
        "float8_e8m0fnu": "F8_E8M0",
    }
    return table.get(text, text)


def _storage_key(t: Any) -> int | None:
    try:
        return int(t.untyped_storage()._cdata)
    except Exception:
        return None


def moe_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, int | None]:
    """(shard id, expert id) of a call to vLLM's fused-MoE weight loader, ``weight_loader(param,
    loaded_weight, weight_name, shard_id, expert_id)`` (by keyword or position); (None, None) for
    any other loader."""
    expert = kwargs.get("expert_id")
    shard = kwargs.get("shard_id")
    if expert is None and len(args) >= 3 and isinstance(args[0], str) and isinstance(args[2], int):
        shard, expert = args[1], args[2]
    elif expert is not None and shard is None and len(args) >= 2 and isinstance(args[0], str):
        shard = args[1]
    if isinstance(expert, bool) or not isinstance(expert, int):
        return None, None
    return shard, expert


def num_experts(module: Any) -> int | None:
    """A fused-MoE layer's experts on this rank (``local_num_experts``, else ``global_num_experts``);
    None for any other module."""
    for attr in ("local_num_experts", "global_num_experts", "num_experts"):
        n = getattr(module, attr, None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def expected_shards(module: Any) -> list[Any] | None:
    """Shard ids a fused/stacked linear layer is loaded with, from vLLM's layer classes."""
    names = {c.__name__ for c in type(module).__mro__}
    if "QKVParallelLinear" in names:
        return ["q", "k", "v"]
    if "MergedColumnParallelLinear" in names:
        sizes = getattr(module, "output_sizes", None)
        return list(range(len(sizes))) if isinstance(sizes, list | tuple) else None
    return None


def expected_shape(param: Any, module: Any, shard: Any) -> list[int] | None:
    """The checkpoint tensor shape this (param, shard) load wants, at tensor-parallel size 1."""
    try:
        shape = list(param.shape)
        if shard is None:
            org = getattr(module, "org_vocab_size", None)
            if isinstance(org, int) and shape and org <= shape[0]:
                shape[0] = org  # vocab padding: the checkpoint holds the unpadded rows
            return shape
        out_dim = getattr(param, "output_dim", 0)
        if not isinstance(out_dim, int):
            out_dim = 0
        size = None
        if isinstance(shard, str) and hasattr(module, "_get_shard_size_mapping"):
            size = module._get_shard_size_mapping(shard)
        elif isinstance(shard, int) and isinstance(getattr(module, "output_sizes", None), list | tuple):
            size = module.output_sizes[shard]
        if size is None or out_dim >= len(shape):
            return None
        shape[out_dim] = int(size)
        return shape
    except Exception:
        return None


class LoadRecorder(Protocol):
    """What the hooks report, as plain data (kept by :class:`vllm_doctor.stages.weights_trace.LoadLedger`)."""

    current: str | None  # the checkpoint tensor being fed to load_weights
    restarts: int
    loaders: dict[str, str]  # parameter -> its weight loader's name
    tracer_errors: list[str]

    def begin_call(
        self, param: str, shard: Any, origins: list[str], kind: str, expert: int | None = None
    ) -> dict[str, Any]: ...
    def end_call(self) -> None: ...
    def loader_failed(
        self,
        call: dict[str, Any],
        error: str,
        traceback: str,
        want: list[int] | None,
        got: list[int] | None,
        shape_like: bool,
    ) -> None: ...
    def record_write(
        self,
        op: str,
        owners: list[tuple[str, int, int]],
        view: tuple[int, int, list[int], list[int], bool],
        src_origins: set[str],
        src_numel: int,
    ) -> None: ...
    def begin_load_weights(self) -> None: ...
    def returned_none(self) -> None: ...
    def returned_not_iterable(self, type_name: str) -> None: ...
    def returned_names(self, names: set[str]) -> None: ...
    def load_weights_failed(
        self, text: str, error: str, traceback: str, yielded: list[int], key: str | None, value_error: bool
    ) -> int | None: ...
    def results(
        self,
        params: dict[str, dict[str, Any]],
        exempt: set[str],
        expected_shape: Callable[[str, Any], list[int] | None],
        moved_to_meta: list[str],
    ) -> dict[str, Any]: ...
    def nearest(self, tensors: dict[str, Any], params: list[str]) -> dict[str, list[str]]: ...


NewLedger = Callable[[list[dict[str, Any]], list[str]], LoadRecorder]  # (checkpoint headers, parameter names)


class LoadTracer:
    """Hooks ``model.load_weights``: follows every checkpoint tensor through vLLM's weight loaders
    and torch's in-place writes, and reports what it sees to a :class:`LoadRecorder`."""

    def __init__(self, model: Any, headers: list[dict[str, Any]], new_ledger: NewLedger) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.moved_to_meta = self._params_to_meta(model)
        self.params: dict[str, Any] = dict(model.named_parameters())
        self.ledger = new_ledger(headers, list(self.params))
        self.name_of: dict[int, str] = {id(p): n for n, p in self.params.items()}
        self.owner: dict[str, Any] = {}
        for mname, module in model.named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                full = f"{mname}.{pname}" if mname else pname
                if full in self.params:
                    self.owner[full] = module
        self.storage_params: dict[int, list[tuple[str, int, int]]] = {}
        self.initial_storage: dict[str, int | None] = {}
        for name, p in self.params.items():
            key = _storage_key(p)
            self.initial_storage[name] = key
            if key is not None:
                start = p.storage_offset()
                self.storage_params.setdefault(key, []).append((name, start, start + p.numel()))
        self.order = [h["name"] for h in headers]
        self.ckpt: dict[str, Any] = {}
        self.origin: dict[int, set[str]] = {}  # storage -> the checkpoint tensors its data came from
        self._keep: list[Any] = []  # keeps tagged tensors alive so storage ids stay unique
        for h in headers:
            t = torch.empty(h["shape"], dtype=torch_dtype(h["dtype"]), device="meta")
            self.ckpt[h["name"]] = t
            key = _storage_key(t)
            if key is not None:
                self.origin[key] = {h["name"]}

    @staticmethod
    def _params_to_meta(model: Any) -> list[str]:
        """Some layers (e.g. Transformers-backend modules) create parameters on the CPU even
        under a meta default device; swap plain ones for meta parameters so loading them can be
        followed (a copy from a meta tensor into real memory cannot run)."""
        import torch

        swapped: dict[int, Any] = {}
        names: list[str] = []
        for mname, module in model.named_modules():
            for pname, p in list(module._parameters.items()):
                if p is None or p.device.type == "meta":
                    continue
                if id(p) not in swapped:
                    if type(p) is not torch.nn.Parameter:
                        continue  # a vLLM parameter subclass: leave it (reported as unverifiable)
                    new = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
                    new.__dict__.update(p.__dict__)
                    swapped[id(p)] = new
                    names.append(f"{mname}.{pname}" if mname else pname)
                module._parameters[pname] = swapped[id(p)]
        return names

    # ---- provenance and writes (called from the dispatch mode) ----
    def origins_of(self, t: Any) -> set[str]:
        key = _storage_key(t)
        return set(self.origin.get(key, ())) if key is not None else set()

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        from torch.utils._pytree import tree_leaves

        torch = self.torch
        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        origins: set[str] = set()
        for a in inputs:
            origins |= self.origins_of(a)
        if origins:
            for o in tree_leaves(out):
                if isinstance(o, torch.Tensor):
                    key = _storage_key(o)
                    if key is not None and key not in self.origin and key not in self.storage_params:
                        self.origin[key] = set(origins)
                        self._keep.append(o)
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if not name.endswith("_") or not args or not isinstance(args[0], torch.Tensor):
            return
        dst = args[0]
        key = _storage_key(dst)
        owners = self.storage_params.get(key) if key is not None else None
        if not owners:
            return
        src_origins: set[str] = set()
        src_numel = 0
        if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
            src = args[1]
            src_origins = self.origins_of(src)
            src_numel = src.numel()
        elif name not in ("fill_", "zero_"):
            for a in inputs[1:]:
                src_origins |= self.origins_of(a)
        view = (dst.numel(), dst.storage_offset(), list(dst.shape), list(dst.stride()), dst.is_contiguous())
        self.ledger.record_write(name, owners, view, src_origins, src_numel)

    # ---- weight-loader wrappers ----
    def wrap(self, name: str, loader: Callable[..., Any], kind: str) -> Callable[..., Any]:
        tracer = self
        ledger = self.ledger

        def doctor_weight_loader(param: Any, loaded_weight: Any, *args: Any, **kwargs: Any) -> Any:
            pname = tracer.name_of.get(id(param), name)
            shard, expert = moe_call(args, kwargs)
            if expert is None:
                shard = (
                    args[0]
                    if args and isinstance(args[0], str | int)
                    else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
                )
            if isinstance(shard, bool):
                shard = None
            origins = sorted(tracer.origins_of(loaded_weight)) if hasattr(loaded_weight, "untyped_storage") else []
            call = ledger.begin_call(pname, shard, origins, kind, expert=expert)
            try:
                return loader(param, loaded_weight, *args, **kwargs)
            except Exception as exc:  # recorded; the load goes on so every problem is found
                tracer.loader_error(call, param, loaded_weight, exc)
                return None
            finally:
                ledger.end_call()

        doctor_weight_loader.__doctor_wrapped__ = loader  # type: ignore[attr-defined]
        return doctor_weight_loader

    def loader_error(self, call: dict[str, Any], param: Any, loaded_weight: Any, exc: Exception) -> None:
        module = self.owner.get(call["param"])
        self.ledger.loader_failed(
            call,
            error=_exc_summary(exc),
            traceback=_format_exc(exc),
            want=expected_shape(param, module, call["shard"]) if module is not None else None,
            got=list(loaded_weight.shape) if hasattr(loaded_weight, "shape") else None,
            shape_like=isinstance(exc, AssertionError | RuntimeError),
        )

    def install_wrappers(self) -> int:
        """Wrap every parameter's weight_loader and every module's default_weight_loader name."""
        count = 0
        for name, p in self.params.items():
            loader = getattr(p, "weight_loader", None)
            if callable(loader):
                qual = getattr(loader, "__qualname__", type(loader).__name__)
                self.ledger.loaders[name] = qual
                try:
                    p.weight_loader = self.wrap(name, loader, qual)
                    count += 1
                except Exception as exc:
                    self.ledger.tracer_errors.append(f"cannot wrap {name}.weight_loader: {exc!r}")
            else:
                self.ledger.loaders[name] = "default_weight_loader"
        try:
            from vllm.model_executor.model_loader import weight_utils

            original = weight_utils.default_weight_loader
            wrapped = self.wrap("", original, "default_weight_loader")
            for module in list(sys.modules.values()):
                try:
                    if getattr(module, "default_weight_loader", None) is original:
                        setattr(module, "default_weight_loader", wrapped)  # noqa: B010
                except Exception:
                    continue
        except Exception as exc:
            self.ledger.tracer_errors.append(f"cannot wrap default_weight_loader: {exc!r}")
        return count

    # ---- driving load_weights ----
    def drive(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracer = self
        ledger = self.ledger

        class Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                try:
                    tracer.observe(func, args, kwargs, out)
                except Exception as exc:  # the tracer must never change the load
                    if len(ledger.tracer_errors) < 20:
                        ledger.tracer_errors.append(f"{func}: {exc!r}")
                return out

        pos = 0
        total = len(self.order)
        while pos < total and ledger.restarts <= MAX_RESTARTS:
            yielded: list[int] = []

            def feed(start: int, yielded: list[int] = yielded) -> Iterator[tuple[str, Any]]:
                for i in range(start, total):
                    yielded.append(i)
                    ledger.current = tracer.order[i]
                    yield tracer.order[i], tracer.ckpt[tracer.order[i]]
                ledger.current = None

            ledger.begin_load_weights()
            try:
                with Watch():
                    ret = self.model.load_weights(feed(pos))
                    self._collect(ret)
                pos = total
            except Exception as exc:
                key = exc.args[0] if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) else None
                restart = ledger.load_weights_failed(
                    text=str(exc),
                    error=_exc_summary(exc),
                    traceback=_format_exc(exc),
                    yielded=yielded,
                    key=key,
                    value_error=isinstance(exc, ValueError),
                )
                if restart is None:
                    break
                pos = restart

    def _collect(self, ret: Any) -> None:
        """What one load_weights call returned (the names of the parameters it loaded)."""
        if ret is None:
            self.ledger.returned_none()
            return
        try:
            names = set(ret)
        except TypeError:
            self.ledger.returned_not_iterable(type(ret).__name__)
            return
        self.ledger.returned_names({n for n in names if isinstance(n, str)})

    # ---- results ----
    def vllm_exempt(self) -> set[str]:
        """Parameters vLLM 0.32's ``track_weights_loading`` does not require (unquantized)."""
        exempt: set[str] = set()
        for mname, module in self.model.named_modules():
            qm = getattr(module, "quant_method", None)
            if getattr(qm, "uses_meta_device", False) or getattr(qm, "process_weights_after_loading", None) is not None:
                for pname, _ in module.named_parameters():
                    exempt.add(f"{mname}.{pname}" if mname else pname)
        return exempt

    def param_facts(self) -> dict[str, dict[str, Any]]:
        """Each parameter as the ledger's results want it (plain data)."""
        out: dict[str, dict[str, Any]] = {}
        for name, p in self.params.items():
            replaced = _storage_key(p) != self.initial_storage.get(name)
            module = self.owner.get(name)
            out[name] = {
                "shape": list(p.shape),
                "dtype": str(p.dtype).replace("torch.", ""),
                "numel": p.numel(),
                "replaced": replaced,
                "replaced_sources": sorted(self.origins_of(p)) if replaced else [],
                "shards_expected": expected_shards(module) if module is not None else None,
                "module": type(module).__name__ if module is not None else None,
                "num_experts": num_experts(module) if module is not None and is_fused_moe(module) else None,
            }
        return out

    def expected_shape_of(self, pname: str, shard: Any) -> list[int] | None:
        p = self.params.get(pname)
        return expected_shape(p, self.owner.get(pname), shard) if p is not None else None

    def results(self) -> dict[str, Any]:
        return self.ledger.results(self.param_facts(), self.vllm_exempt(), self.expected_shape_of, self.moved_to_meta)


def mapper_facts(model: Any) -> dict[str, Any] | None:
    """The class's ``hf_to_vllm_mapper`` (vLLM's ``WeightsMapper``) as plain tables, or None
    when the class has none: what it renames today, for a finding that suggests an entry."""
    mapper = getattr(type(model), "hf_to_vllm_mapper", None)
    if mapper is None:
        return None
    out: dict[str, Any] = {}
    for key in ("orig_to_new_prefix", "orig_to_new_suffix", "orig_to_new_substr"):
        table: Any = getattr(mapper, key, None)
        if table is not None and hasattr(table, "items"):
            out[key] = {str(k): (None if v is None else str(v)) for k, v in table.items()}
    return out


def mapped_names(model: Any, names: list[str]) -> dict[str, str | None]:
    """Checkpoint name -> the name the class's ``hf_to_vllm_mapper`` gives it (None: the mapper
    drops it), for the names it changes; empty without a mapper."""
    mapper = getattr(type(model), "hf_to_vllm_mapper", None)
    # map_name since vLLM 0.33 (0.26-0.32: _map_name, kept as an alias)
    rename = getattr(mapper, "map_name", None) or getattr(mapper, "_map_name", None)
    if not callable(rename):
        return {}
    out: dict[str, str | None] = {}
    for name in names:
        try:
            new = rename(name)
        except Exception:
            continue
        if new != name:
            out[name] = None if new is None else str(new)
    return out


def unbuilt_parts(model: Any, names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Checkpoint tensors (``names``: checkpoint name -> the name the model's mapper gives it)
    whose module the model deliberately did not build: a layer index past the end of the
    ``ModuleList`` it built (vLLM's CLIP/SigLIP towers build only the layers up to LLaVA's
    ``vision_feature_layer``), or a sub-module the class set to None (their ``post_layernorm``
    then). Asked of the built module tree, never of a list of names."""
    import torch

    out: dict[str, dict[str, Any]] = {}
    for name, mapped in names.items():
        parts = mapped.split(".")
        module = model
        for i, part in enumerate(parts[:-1]):
            if isinstance(module, torch.nn.ModuleList | torch.nn.Sequential) and part.isdigit():
                if int(part) >= len(module):
                    where = ".".join(parts[:i])
                    out[name] = {"module": where, "kind": "layer", "index": int(part), "built": len(module)}
                    break
                module = module[int(part)]
                continue
            children = module._modules
            if part in children and children[part] is not None:
                module = children[part]
                continue
            if (part in children or part in module.__dict__) and getattr(module, part, 0) is None:
                out[name] = {"module": ".".join(parts[: i + 1]), "kind": "none"}
            break  # a parameter, or a name the model does not have: not ours to judge
    return out


def layout_facts(model: Any, checkpoint_names: list[str]) -> dict[str, Any]:
    """What the tower checks (VD313, VD302) ask of the built model beyond the load itself."""
    renamed = mapped_names(model, checkpoint_names)
    targets = {n: renamed.get(n, n) for n in checkpoint_names if renamed.get(n, n) is not None}
    return {
        "mapper": mapper_facts(model),
        "mapped": renamed,
        "unbuilt": unbuilt_parts(model, {n: str(m) for n, m in targets.items()}),
    }


def _hf_facts(model_config: Any) -> dict[str, Any]:
    hf = hf_text_config(model_config)
    out: dict[str, Any] = {}
    for key in (
        "tie_word_embeddings",
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_size",
        "intermediate_size",
        "vocab_size",
        "head_dim",
        "num_hidden_layers",
    ):
        value = getattr(hf, key, None)
        if isinstance(value, bool | int | float | str) or value is None:
            out[key] = value
    # vLLM >= 0.32: config says tied, checkpoint ships lm_head -> built untied (None: no such logic)
    untied = getattr(model_config, "word_embeddings_untied_by_checkpoint", None)
    out["untied_by_checkpoint"] = (
        untied
        if isinstance(untied, bool)
        else (False if hasattr(model_config, "maybe_untie_word_embeddings") else None)
    )
    return out


def preregister_in_process(architectures: list[str]) -> dict[str, Any]:
    """Import the lazily registered class of each architecture here and register the class
    object, so vLLM inspects it in this process instead of a subprocess."""
    from vllm import ModelRegistry

    out: dict[str, Any] = {}
    models = getattr(ModelRegistry, "models", None)
    if not isinstance(models, dict):
        return out
    for arch in architectures:
        entry = models.get(arch)
        load = getattr(entry, "load_model_cls", None)
        if entry is None or not callable(load) or not hasattr(entry, "module_name"):
            continue
        try:
            cls = load()
            ModelRegistry.register_model(arch, cls)
            out[arch] = f"{cls.__module__}:{cls.__qualname__}"
        except BaseException as exc:
            out[arch] = {"error": _exc_summary(exc), "traceback": _format_exc(exc)}
    return out


def build_vllm_config(model_dir: str, trust_remote_code: bool, read_files: bool = True) -> Any:
    """vLLM's config for the directory, as the engine would build it (tensor-parallel size 1).

    read_files=False uses load_format "dummy", with which vLLM reads no checkpoint header at
    config time (the doctor asks for it when a checkpoint path escapes the model directory).
    """
    from vllm.engine.arg_utils import EngineArgs

    kwargs: dict[str, Any] = dict(
        model=model_dir,
        trust_remote_code=trust_remote_code,
        enforce_eager=True,
        # the load format the engine will use ("auto"): vLLM 0.32 decides some things from the
        # checkpoint's headers at config time (e.g. untying a tied lm_head the checkpoint carries)
        skip_tokenizer_init=True,
        tensor_parallel_size=1,
    )
    if not read_files:
        kwargs["load_format"] = "dummy"
    return EngineArgs(**kwargs).create_engine_config()


def _forward_context(vllm_config: Any) -> dict[str, Any]:
    """The layers the built model registered (``static_forward_context``)."""
    layers = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None)
    return dict(layers) if isinstance(layers, dict) else {}


def init_single_process_distributed(tmpdir: str) -> None:
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"file://{tmpdir}/rendezvous", local_rank=0, backend="gloo"
    )
    parallel_state.ensure_model_parallel_initialized(1, 1)


def meta_load(request: dict[str, Any], new_ledger: NewLedger) -> dict[str, Any]:
    """The whole child job. Never raises: failures land in ``result["error"]``."""
    # the gloo rendezvous file, inside the job's directory: a pass killed at its deadline never
    # reaches the finally below, and its parent removes that directory
    scratch = os.environ.get(SCRATCH_DIR_ENV)
    tmp = tempfile.mkdtemp(prefix="vllm-doctor-dist-", dir=scratch if scratch and os.path.isdir(scratch) else None)
    try:
        return _meta_load(request, tmp, new_ledger)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _meta_load(request: dict[str, Any], tmp: str, new_ledger: NewLedger) -> dict[str, Any]:
    result: dict[str, Any] = {"timings": {}, "stage": "import"}
    t0 = time.monotonic()

    def fail(stage: str, exc: BaseException) -> dict[str, Any]:
        result["error"] = {
            "stage": stage,
            "summary": _exc_summary(exc),
            "traceback": _format_exc(exc),
            "where": user_frame(exc),
        }
        return result

    def lap(key: str, since: float) -> float:
        now = time.monotonic()
        result["timings"][key] = round(now - since, 3)
        return now

    try:
        import torch
        import vllm

        result["vllm_version"] = getattr(vllm, "__version__", None)
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    except BaseException as exc:
        return fail("import", exc)
    t = lap("import_s", t0)
    result["stage"] = "class"
    result["preregistered"] = preregister_in_process(request.get("architectures", []))
    t = lap("class_s", t)
    result["stage"] = "config"
    try:
        vllm_config = build_vllm_config(
            request["model_dir"], bool(request.get("trust_remote_code")), read_files=not request.get("paths_escape")
        )
        model_config = vllm_config.model_config
        result["model"] = {
            "dtype": str(model_config.dtype).replace("torch.", ""),
            "dtype_name": dtype_name(model_config.dtype),
            "architectures": list(getattr(model_config, "architectures", []) or []),
            "hf": _hf_facts(model_config),
        }
    except BaseException as exc:
        return fail("config", exc)
    t = lap("config_s", t)
    result["stage"] = "build"
    from vllm.config import set_current_vllm_config

    try:
        from vllm.model_executor.model_loader.utils import get_model_architecture, initialize_model
        from vllm.utils.torch_utils import set_default_torch_dtype

        model_cls, arch = get_model_architecture(model_config)
        result["model"]["architecture"] = arch
        result["model"]["class"] = f"{model_cls.__module__}.{model_cls.__qualname__}"
        with set_current_vllm_config(vllm_config):
            init_single_process_distributed(tmp)
        with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            model = initialize_model(vllm_config=vllm_config, model_class=model_cls)
        result["model"]["parameters"] = sum(p.numel() for p in model.parameters())
    except BaseException as exc:
        return fail("build", exc)
    try:  # the mixers it built, the state interfaces its class declares, how vLLM reads its attention (VD214-VD217)
        from vllm_doctor.compat import mixers

        result["mixers"] = mixers.built_mixers(model, _forward_context(vllm_config))
        result["state_interfaces"] = mixers.state_interfaces(model_cls)
        result["attention_reading"] = mixers.attention_reading(model_config)
    except Exception as exc:
        result["mixers_error"] = f"reading the built mixers failed: {_exc_summary(exc)}"
    t = lap("build_s", t)
    try:  # the performance lint's view of the built tree (VD6xx); its failure is not the model's
        from vllm_doctor.compat.common import hf_text_config
        from vllm_doctor.compat.perf import perf_anatomy

        built = {m["path"]: m["family"] for m in result.get("mixers") or () if m.get("path") and m.get("family")}
        result["perf"] = perf_anatomy(
            model, hf_text_config(model_config), model_config.dtype, "meta-device build", built
        ).to_json()
    except Exception as exc:
        result["perf_error"] = f"reading the module tree failed: {_exc_summary(exc)}"
    t = lap("perf_s", t)
    result["stage"] = "load"
    if not callable(getattr(model, "load_weights", None)):
        result["error"] = {
            "stage": "load",
            "summary": f"{type(model).__name__} has no load_weights (see VD205)",
            "traceback": "",
        }
        return result
    try:
        tracer = LoadTracer(model, request["tensors"], new_ledger)
        result["wrapped_loaders"] = tracer.install_wrappers()
        with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            tracer.drive()
        result.update(tracer.results())
    except BaseException as exc:
        return fail("load", exc)
    lap("load_s", t)
    try:  # the quantization checks' view (VD314-VD317); its failure is not the model's
        from vllm_doctor.compat.quant_build import quant_facts

        names = [h["name"] for h in request["tensors"]]
        result["quant"] = quant_facts(model, model_config, getattr(vllm_config, "quant_config", None), names)
    except Exception as exc:
        result["quant_error"] = f"reading the layers' quantization methods failed: {_exc_summary(exc)}"
    try:  # the tower checks' view; its failure is not the model's
        result["layout"] = layout_facts(model, [h["name"] for h in request["tensors"]])
    except Exception as exc:
        result["layout_error"] = f"reading the module tree failed: {_exc_summary(exc)}"
    result["nearest"] = tracer.ledger.nearest(result["tensors"], list(result["params"]))
    result["stage"] = "done"
    try:
        from vllm.distributed import parallel_state

        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
    except Exception:
        pass
    result["timings"]["total_s"] = round(time.monotonic() - t0, 3)
    return result

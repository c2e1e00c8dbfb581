"""Weight-loading coverage without weights: build the model on the meta device and drive its
REAL ``load_weights`` with meta tensors shaped like the checkpoint's.

Runs only in a fresh child process (see probes/weight_probe.py). What it does, the way vLLM's
``DefaultModelLoader`` would, minus every byte of tensor data:

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

Everything returned is JSON-able; no vLLM or torch object leaves this module.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from vllm_doctor.compat.common import format_exc, hf_text_config, user_frame
from vllm_doctor.constants import SCRATCH_DIR_ENV

MAX_RESTARTS = 10_000
MAX_RUNS_FOR_EXACT_COVERAGE = 200_000
META_LIMITATION = ("meta tensors", "meta device", "Cannot copy out of meta tensor", "NotImplementedError")


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


def _intervals(t: Any) -> list[tuple[int, int]] | None:
    """Storage element ranges a (possibly strided) view covers; None if too many to list."""
    n = t.numel()
    if n == 0:
        return []
    off = t.storage_offset()
    if t.is_contiguous():
        return [(off, off + n)]
    dims = [(s, st) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1]
    dims.sort(key=lambda d: -d[1])
    run = 1
    while dims and dims[-1][1] == run:
        size, _ = dims.pop()
        run *= size
    runs = n // run
    if runs > MAX_RUNS_FOR_EXACT_COVERAGE:
        return None
    starts = [off]
    for size, stride in dims:
        starts = [s + i * stride for s in starts for i in range(size)]
    return [(s, s + run) for s in starts]


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


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


def _quoted(text: str) -> list[str]:
    return re.findall(r"'([^']+)'", text)


class LoadTracer:
    """Records the journey of every checkpoint tensor through ``model.load_weights``."""

    def __init__(self, model: Any, headers: list[dict[str, Any]]) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.moved_to_meta = self._params_to_meta(model)
        self.params: dict[str, Any] = dict(model.named_parameters())
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
        self.headers = headers
        self.order = [h["name"] for h in headers]
        self.ckpt: dict[str, Any] = {}
        self.origin: dict[int, set[str]] = {}
        self._keep: list[Any] = []  # keeps tagged tensors alive so storage ids stay unique
        for h in headers:
            t = torch.empty(h["shape"], dtype=torch_dtype(h["dtype"]), device="meta")
            self.ckpt[h["name"]] = t
            key = _storage_key(t)
            if key is not None:
                self.origin[key] = {h["name"]}
        self.tensors: dict[str, dict[str, Any]] = {
            h["name"]: {
                "shape": h["shape"],
                "dtype": h["dtype"],
                "numel": self.ckpt[h["name"]].numel(),
                "handed_to": [],
                "written": [],
                "consumed": 0,
                "errors": [],
                "broadcast": False,
            }
            for h in headers
        }
        self.coverage: dict[str, list[tuple[int, int]]] = {n: [] for n in self.params}
        self.unplaced: dict[str, int] = dict.fromkeys(self.params, 0)
        self.fill_only: dict[str, bool] = {}
        self.sources: dict[str, set[str]] = {n: set() for n in self.params}
        self.shards: dict[str, list[Any]] = {n: [] for n in self.params}
        self.loaders: dict[str, str] = {}
        self.calls: list[dict[str, Any]] = []  # stack of active weight-loader calls
        self.tracer_errors: list[str] = []
        self.global_errors: list[dict[str, Any]] = []
        self.returned: set[str] | None = set()
        self.returned_approximate = False  # a call raised: its names are assumed, not returned
        self.written_this_call: set[str] = set()
        self.returned_kind = "set"
        self.restarts = 0
        self.current: str | None = None

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
        call = self.calls[-1] if self.calls else None
        if not src_origins and call is not None and call["tensor"] is not None and name == "copy_":
            src_origins = {call["tensor"]}  # the loader built the data from the tensor it was handed
        regions = _intervals(dst)
        for pname, start, end in owners:
            if regions is None:
                self.unplaced[pname] += dst.numel()
                covered = dst.numel()
            else:
                clipped = [(max(s, start) - start, min(e, end) - start) for s, e in regions if s < end and e > start]
                if not clipped:
                    continue
                self.coverage[pname].extend(clipped)
                covered = sum(e - s for s, e in clipped)
            if src_origins:
                self.sources[pname] |= src_origins
                self.fill_only[pname] = False
            else:
                self.fill_only.setdefault(pname, True)
            for o in src_origins:
                rec = self.tensors.get(o)
                if rec is None:
                    continue
                if pname not in rec["written"]:
                    rec["written"].append(pname)
                if name == "copy_":
                    share = src_numel if len(src_origins) == 1 else min(rec["numel"], src_numel)
                    rec["consumed"] += share
                    if src_numel and src_numel < covered:
                        rec["broadcast"] = True
            self.written_this_call.add(pname)
            if call is not None:
                call["writes"] += 1

    # ---- weight-loader wrappers ----
    def wrap(self, name: str, loader: Callable[..., Any], kind: str) -> Callable[..., Any]:
        tracer = self

        def doctor_weight_loader(param: Any, loaded_weight: Any, *args: Any, **kwargs: Any) -> Any:
            pname = tracer.name_of.get(id(param), name)
            shard = (
                args[0]
                if args and isinstance(args[0], str | int)
                else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
            )
            if isinstance(shard, bool):
                shard = None
            origins = sorted(tracer.origins_of(loaded_weight)) if hasattr(loaded_weight, "untyped_storage") else []
            tensor = origins[0] if len(origins) == 1 else (tracer.current if not origins else None)
            call = {"param": pname, "tensor": tensor, "shard": shard, "writes": 0}
            for o in origins or ([tensor] if tensor else []):
                rec = tracer.tensors.get(o)
                if rec is not None:
                    rec["handed_to"].append({"param": pname, "shard": shard, "loader": kind})
            if pname in tracer.shards:
                tracer.shards[pname].append(shard)
            tracer.calls.append(call)
            try:
                return loader(param, loaded_weight, *args, **kwargs)
            except Exception as exc:  # recorded; the load goes on so every problem is found
                tracer.loader_error(call, param, loaded_weight, exc)
                return None
            finally:
                tracer.calls.pop()

        doctor_weight_loader.__doctor_wrapped__ = loader  # type: ignore[attr-defined]
        return doctor_weight_loader

    def loader_error(self, call: dict[str, Any], param: Any, loaded_weight: Any, exc: Exception) -> None:
        pname = call["param"]
        module = self.owner.get(pname)
        want = expected_shape(param, module, call["shard"]) if module is not None else None
        got = list(loaded_weight.shape) if hasattr(loaded_weight, "shape") else None
        text = _exc_summary(exc)
        shape_words = ("size", "shape", "exceeds dimension", "Attempted to load weight")
        mismatch = want is not None and got is not None and want != got
        is_shape = mismatch or (isinstance(exc, AssertionError | RuntimeError) and any(w in text for w in shape_words))
        limited = any(w in text for w in META_LIMITATION) and not is_shape
        err = {
            "where": "weight_loader",
            "param": pname,
            "shard": call["shard"],
            "error": text,
            "kind": "shape" if is_shape else ("meta-limitation" if limited else "raised"),
            "expected_shape": want,
            "actual_shape": got,
            "traceback": _format_exc(exc),
        }
        target = call["tensor"]
        if target in self.tensors:
            self.tensors[target]["errors"].append(err)
        else:
            self.global_errors.append(err)

    def install_wrappers(self) -> int:
        """Wrap every parameter's weight_loader and every module's default_weight_loader name."""
        count = 0
        for name, p in self.params.items():
            loader = getattr(p, "weight_loader", None)
            if callable(loader):
                qual = getattr(loader, "__qualname__", type(loader).__name__)
                self.loaders[name] = qual
                try:
                    p.weight_loader = self.wrap(name, loader, qual)
                    count += 1
                except Exception as exc:
                    self.tracer_errors.append(f"cannot wrap {name}.weight_loader: {exc!r}")
            else:
                self.loaders[name] = "default_weight_loader"
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
            self.tracer_errors.append(f"cannot wrap default_weight_loader: {exc!r}")
        return count

    # ---- driving load_weights ----
    def _culprit(self, exc: BaseException, yielded: list[int]) -> int | None:
        if not yielded:
            return None
        text = str(exc)
        quoted = _quoted(text) + (
            [exc.args[0]] if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) else []
        )
        for i in reversed(yielded):
            if self.order[i] in text:
                return i
        for q in quoted:
            for i in reversed(yielded):
                n = self.order[i]
                if n.startswith(q + ".") or q.startswith(n):
                    return i
        return yielded[-1]

    def drive(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracer = self

        class Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                try:
                    tracer.observe(func, args, kwargs, out)
                except Exception as exc:  # the tracer must never change the load
                    if len(tracer.tracer_errors) < 20:
                        tracer.tracer_errors.append(f"{func}: {exc!r}")
                return out

        pos = 0
        total = len(self.order)
        while pos < total and self.restarts <= MAX_RESTARTS:
            yielded: list[int] = []

            def feed(start: int, yielded: list[int] = yielded) -> Iterator[tuple[str, Any]]:
                for i in range(start, total):
                    yielded.append(i)
                    tracer.current = tracer.order[i]
                    yield tracer.order[i], tracer.ckpt[tracer.order[i]]
                tracer.current = None

            self.written_this_call = set()
            try:
                with Watch():
                    ret = self.model.load_weights(feed(pos))
                    ret = self._collect(ret)
                pos = total
            except Exception as exc:
                # A call that raised returns no names; vLLM would have stopped there anyway.
                # Count what it wrote as reported, so the simulation of vLLM's own missing-weight
                # check stays meaningful for the other parameters.
                if self.returned is not None:
                    self.returned |= self.written_this_call
                    self.returned_approximate = True
                culprit = self._culprit(exc, yielded)
                looked_up = (
                    exc.args[0] if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) else None
                )
                if looked_up is None and isinstance(exc, ValueError):
                    m = re.search(r"no module or parameter named '([^']+)'", str(exc))
                    looked_up = m.group(1) if m else None
                err = {
                    "where": "load_weights",
                    "error": _exc_summary(exc),
                    "kind": "meta-limitation" if any(w in str(exc) for w in META_LIMITATION) else "raised",
                    "looked_up": looked_up,
                    "traceback": _format_exc(exc),
                }
                if culprit is None:
                    self.global_errors.append(err)
                    break
                self.tensors[self.order[culprit]]["errors"].append(err)
                self.restarts += 1
                pos = culprit + 1

    def _collect(self, ret: Any) -> Any:
        if ret is None:
            self.returned_kind = "none"
            self.returned = None
            return ret
        try:
            names = set(ret)
        except TypeError:
            self.returned_kind = type(ret).__name__
            return ret
        if self.returned is not None:
            self.returned |= {n for n in names if isinstance(n, str)}
        return ret

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

    def results(self) -> dict[str, Any]:
        exempt = self.vllm_exempt()
        failed_from: dict[str, list[str]] = {}
        for tname, rec in self.tensors.items():
            for e in rec["errors"]:
                if e.get("param"):
                    failed_from.setdefault(e["param"], []).append(tname)
        params: dict[str, Any] = {}
        for name, p in self.params.items():
            numel = p.numel()
            replaced = _storage_key(p) != self.initial_storage.get(name)
            if replaced:
                covered = numel
                srcs = self.origins_of(p)
                self.sources[name] |= srcs
            else:
                covered = min(numel, sum(e - s for s, e in _merge(self.coverage[name])) + self.unplaced[name])
            module = self.owner.get(name)
            want = expected_shards(module) if module is not None else None
            got = self.shards[name]
            loaded_shards = (
                want if (want is not None and None in got) else sorted({s for s in got if s is not None}, key=str)
            )
            params[name] = {
                "shape": list(p.shape),
                "dtype": str(p.dtype).replace("torch.", ""),
                "numel": numel,
                "covered": covered,
                "written": covered >= numel and bool(self.sources[name]),
                "fill_only": bool(self.fill_only.get(name)) and not self.sources[name],
                "sources": sorted(self.sources[name]),
                "shards_expected": want,
                "shards_loaded": loaded_shards if want is not None else None,
                "shards_missing": [s for s in want if s not in loaded_shards] if want is not None else None,
                "loader": self.loaders.get(name),
                "module": type(module).__name__ if module is not None else None,
                "replaced_by_assignment": replaced,
                "failed_from": failed_from.get(name, []),
                "in_returned": None if self.returned is None else name in self.returned,
                "vllm_exempt": name in exempt,
            }
        tensors: dict[str, Any] = {}
        for name in self.order:
            rec = self.tensors[name]
            errors = rec["errors"]
            kinds = {e["kind"] for e in errors}
            if "shape" in kinds:
                status = "shape_mismatch"
            elif "raised" in kinds:
                status = "raised"
            elif "meta-limitation" in kinds:
                status = "unverifiable"
            elif rec["consumed"] == 0 and not rec["written"]:
                status = "handed_not_written" if rec["handed_to"] else "skipped"
            elif rec["consumed"] and rec["consumed"] < rec["numel"]:
                status = "partial"
            elif rec["broadcast"]:
                status = "broadcast"
            else:
                status = "loaded"
            tensors[name] = {
                "status": status,
                "shape": rec["shape"],
                "dtype": rec["dtype"],
                "params": rec["written"],
                "handed_to": rec["handed_to"][:8],
                "consumed": rec["consumed"],
                "numel": rec["numel"],
                "errors": [{k: v for k, v in e.items()} for e in errors[:3]],
            }
            if status in ("shape_mismatch", "partial", "broadcast"):
                first = rec["handed_to"][0] if rec["handed_to"] else None
                want = None
                for e in errors:
                    if e.get("expected_shape"):
                        want = e["expected_shape"]
                        break
                if want is None and first is not None:
                    p = self.params.get(first["param"])
                    module = self.owner.get(first["param"])
                    if p is not None:
                        want = expected_shape(p, module, first["shard"])
                tensors[name]["expected_shape"] = want
        return {
            "params": params,
            "tensors": tensors,
            "load_weights": {
                "returned": self.returned_kind,
                "returned_count": None if self.returned is None else len(self.returned),
                "returned_approximate": self.returned_approximate,
                "restarts": self.restarts,
                "global_errors": self.global_errors[:5],
            },
            "tracer_errors": self.tracer_errors[:20],
            "moved_to_meta": self.moved_to_meta[:50],
        }


def nearest_params(names: list[str], params: list[str], limit: int = 3) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in names[:64]:
        out[n] = difflib.get_close_matches(n, params, n=limit, cutoff=0.6)
    return out


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


def init_single_process_distributed(tmpdir: str) -> None:
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"file://{tmpdir}/rendezvous", local_rank=0, backend="gloo"
    )
    parallel_state.ensure_model_parallel_initialized(1, 1)


def meta_load(request: dict[str, Any]) -> dict[str, Any]:
    """The whole child job. Never raises: failures land in ``result["error"]``."""
    # the gloo rendezvous file, inside the job's directory: a pass killed at its deadline never
    # reaches the finally below, and its parent removes that directory
    scratch = os.environ.get(SCRATCH_DIR_ENV)
    tmp = tempfile.mkdtemp(prefix="vllm-doctor-dist-", dir=scratch if scratch and os.path.isdir(scratch) else None)
    try:
        return _meta_load(request, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _meta_load(request: dict[str, Any], tmp: str) -> dict[str, Any]:
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
    t = lap("build_s", t)
    result["stage"] = "load"
    if not callable(getattr(model, "load_weights", None)):
        result["error"] = {
            "stage": "load",
            "summary": f"{type(model).__name__} has no load_weights (see VD205)",
            "traceback": "",
        }
        return result
    try:
        tracer = LoadTracer(model, request["tensors"])
        result["wrapped_loaders"] = tracer.install_wrappers()
        with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            tracer.drive()
        result.update(tracer.results())
    except BaseException as exc:
        return fail("load", exc)
    lap("load_s", t)
    failing = [n for n, r in result["tensors"].items() if r["status"] in ("raised", "skipped")]
    looked = [e.get("looked_up") for n in failing for e in result["tensors"][n]["errors"] if e.get("looked_up")]
    result["nearest"] = nearest_params(sorted(set(looked) | set(failing)), list(result["params"]))
    result["stage"] = "done"
    try:
        from vllm.distributed import parallel_state

        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
    except Exception:
        pass
    result["timings"]["total_s"] = round(time.monotonic() - t0, 3)
    return result

"""The weights pass, child side: the meta-device load's trace and its bookkeeping -- which
checkpoint tensor reached which parameter, how much of each parameter was written and from
what, what raised, and the result the VD3xx checks read.

:func:`child_task` runs in a FRESH process (task ``weights`` of :mod:`vllm_doctor.stages.child`;
the parent side is :mod:`vllm_doctor.stages.weights`). There
:func:`vllm_doctor.compat.weights.meta_load` builds the model on the meta device, hooks vLLM's
weight loaders and torch's in-place writes, and reports every event to a :class:`LoadLedger` as
plain data (parameter and tensor names, storage element ranges, shard ids, exception text); the
ledger keeps the accounts and assembles the JSON-able result (``params``, ``tensors``,
``load_weights``, ``nearest``). Everything here but :func:`child_task` is pure: no vLLM, no
torch, no other module of the doctor's.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from typing import Any

MAX_RUNS_FOR_EXACT_COVERAGE = 200_000
# what torch and vLLM say when an operation cannot run on meta tensors (not the model's fault)
META_LIMITATION = ("meta tensors", "meta device", "Cannot copy out of meta tensor", "NotImplementedError")
# what a loader's size check says when the tensor does not fit the parameter
SHAPE_WORDS = ("size", "shape", "exceeds dimension", "Attempted to load weight")

Interval = tuple[int, int]  # [start, end) in storage elements
Owner = tuple[str, int, int]  # a parameter that shares a storage: (name, first element, end)
View = tuple[int, int, list[int], list[int], bool]  # a tensor's (numel, storage offset, shape, stride, contiguous)
ExpectedShape = Callable[[str, Any], "list[int] | None"]  # (parameter, shard id) -> checkpoint shape


def storage_runs(
    numel: int, offset: int, shape: list[int], stride: list[int], contiguous: bool
) -> list[Interval] | None:
    """Storage element ranges a (possibly strided) view covers; None if too many to list."""
    if numel == 0:
        return []
    if contiguous:
        return [(offset, offset + numel)]
    dims = [(s, st) for s, st in zip(shape, stride, strict=True) if s != 1]
    dims.sort(key=lambda d: -d[1])
    run = 1
    while dims and dims[-1][1] == run:
        size, _ = dims.pop()
        run *= size
    runs = numel // run
    if runs > MAX_RUNS_FOR_EXACT_COVERAGE:
        return None
    starts = [offset]
    for size, step in dims:
        starts = [s + i * step for s in starts for i in range(size)]
    return [(s, s + run) for s in starts]


def merge_intervals(intervals: list[Interval]) -> list[Interval]:
    """Sorted, overlapping and touching ranges joined."""
    out: list[Interval] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def clip_to(regions: list[Interval], start: int, end: int) -> list[Interval]:
    """The parts of ``regions`` inside [start, end), relative to ``start``."""
    return [(max(s, start) - start, min(e, end) - start) for s, e in regions if s < end and e > start]


def covered_elements(intervals: list[Interval]) -> int:
    """How many distinct elements the ranges cover."""
    return sum(e - s for s, e in merge_intervals(intervals))


def nearest_params(names: list[str], params: list[str], limit: int = 3) -> dict[str, list[str]]:
    """For each of (at most 64) names, the parameter names closest to it."""
    out: dict[str, list[str]] = {}
    for n in names[:64]:
        out[n] = difflib.get_close_matches(n, params, n=limit, cutoff=0.6)
    return out


def quoted(text: str) -> list[str]:
    """The '...'-quoted parts of an error message."""
    return re.findall(r"'([^']+)'", text)


def pick_culprit(order: list[str], yielded: list[int], text: str, key: str | None) -> int | None:
    """The position (in ``order``) of the checkpoint tensor a ``load_weights`` error is about:
    the last fed tensor the message names, else one a quoted name (or the KeyError's ``key``) is
    a prefix or a module of, else the last tensor fed; None when none was fed."""
    if not yielded:
        return None
    names = quoted(text) + ([key] if key is not None else [])
    for i in reversed(yielded):
        # the name itself, not inside a longer one (vLLM's message lists the model's parameters:
        # 'language_model.lm_head.weight' does not name the checkpoint's lm_head.weight)
        if re.search(r"(?<![\w.])" + re.escape(order[i]) + r"(?![\w.])", text):
            return i
    for q in names:
        for i in reversed(yielded):
            n = order[i]
            if n.startswith(q + ".") or q.startswith(n):
                return i
    return yielded[-1]


def looked_up_name(text: str, key: str | None, value_error: bool) -> str | None:
    """The parameter name a failed lookup asked for: a KeyError's key, or the name in vLLM's
    "no module or parameter named '...'" ValueError."""
    if key is not None:
        return key
    if value_error:
        m = re.search(r"no module or parameter named '([^']+)'", text)
        return m.group(1) if m else None
    return None


def loader_error_kind(text: str, want: list[int] | None, got: list[int] | None, shape_like: bool) -> str:
    """The kind of a weight loader's error: ``shape`` (the tensor does not fit: the shapes differ,
    or the size check of an assertion or a RuntimeError failed), ``meta-limitation`` (the op
    cannot run on meta tensors) or ``raised``."""
    mismatch = want is not None and got is not None and want != got
    if mismatch or (shape_like and any(w in text for w in SHAPE_WORDS)):
        return "shape"
    return "meta-limitation" if any(w in text for w in META_LIMITATION) else "raised"


def tensor_status(rec: dict[str, Any]) -> str:
    """What became of one checkpoint tensor, from its record (errors first, then the writes)."""
    kinds = {e["kind"] for e in rec["errors"]}
    if "shape" in kinds:
        return "shape_mismatch"
    if "raised" in kinds:
        return "raised"
    if "meta-limitation" in kinds:
        return "unverifiable"
    if rec["consumed"] == 0 and not rec["written"]:
        return "handed_not_written" if rec["handed_to"] else "skipped"
    if rec["consumed"] and rec["consumed"] < rec["numel"]:
        return "partial"
    if rec["broadcast"]:
        return "broadcast"
    return "loaded"


def loaded_shards(expected: list[Any] | None, got: list[Any]) -> list[Any]:
    """The shard ids a parameter was loaded with (all expected ones when it was also loaded whole)."""
    if expected is not None and None in got:
        return expected
    return sorted({s for s in got if s is not None}, key=str)


class LoadLedger:
    """The accounts of one meta-device load, kept from the events the hooks report.

    ``headers``: the checkpoint's tensors (``name``, ``shape``, ``dtype``) in the order they are
    fed; ``params``: the model's parameter names.
    """

    def __init__(self, headers: list[dict[str, Any]], params: list[str]) -> None:
        self.order: list[str] = [h["name"] for h in headers]
        self.tensors: dict[str, dict[str, Any]] = {
            h["name"]: {
                "shape": h["shape"],
                "dtype": h["dtype"],
                "numel": math.prod(h["shape"]),
                "handed_to": [],
                "written": [],
                "consumed": 0,
                "errors": [],
                "broadcast": False,
            }
            for h in headers
        }
        self.coverage: dict[str, list[Interval]] = {n: [] for n in params}
        self.unplaced: dict[str, int] = dict.fromkeys(params, 0)  # elements written where no range was listed
        self.fill_only: dict[str, bool] = {}
        self.sources: dict[str, set[str]] = {n: set() for n in params}
        self.shards: dict[str, list[Any]] = {n: [] for n in params}
        # fused-MoE parameters: [expert id, shard id, checkpoint tensor] per loader call
        self.expert_loads: dict[str, list[list[Any]]] = {}
        self.loaders: dict[str, str] = {}
        self.calls: list[dict[str, Any]] = []  # stack of active weight-loader calls
        self.tracer_errors: list[str] = []
        self.global_errors: list[dict[str, Any]] = []
        self.returned: set[str] | None = set()
        self.returned_approximate = False  # a call raised: its names are assumed, not returned
        self.written_this_call: set[str] = set()
        self.returned_kind = "set"
        self.restarts = 0
        self.current: str | None = None  # the checkpoint tensor being fed to load_weights

    # ---- weight-loader calls ----
    def begin_call(
        self, param: str, shard: Any, origins: list[str], kind: str, expert: int | None = None
    ) -> dict[str, Any]:
        """A weight loader was called for ``param`` with data from the checkpoint tensors
        ``origins`` (none known: the tensor being fed); ``expert``: a fused-MoE loader's expert id."""
        tensor = origins[0] if len(origins) == 1 else (self.current if not origins else None)
        call = {"param": param, "tensor": tensor, "shard": shard, "writes": 0}
        if expert is not None:
            self.expert_loads.setdefault(param, []).append([expert, shard, tensor])
        for o in origins or ([tensor] if tensor else []):
            rec = self.tensors.get(o)
            if rec is not None:
                rec["handed_to"].append({"param": param, "shard": shard, "loader": kind})
        if param in self.shards:
            self.shards[param].append(shard)
        self.calls.append(call)
        return call

    def end_call(self) -> None:
        self.calls.pop()

    def loader_failed(
        self,
        call: dict[str, Any],
        error: str,
        traceback: str,
        want: list[int] | None,
        got: list[int] | None,
        shape_like: bool,
    ) -> None:
        """The loader of ``call`` raised ``error``; ``want``/``got``: the checkpoint shape the
        parameter wants and the one it was handed; ``shape_like``: an AssertionError or a
        RuntimeError (how size checks fail)."""
        err = {
            "where": "weight_loader",
            "param": call["param"],
            "shard": call["shard"],
            "error": error,
            "kind": loader_error_kind(error, want, got, shape_like),
            "expected_shape": want,
            "actual_shape": got,
            "traceback": traceback,
        }
        target = call["tensor"]
        if target in self.tensors:
            self.tensors[target]["errors"].append(err)
        else:
            self.global_errors.append(err)

    # ---- writes into parameter storage ----
    def record_write(self, op: str, owners: list[Owner], view: View, src_origins: set[str], src_numel: int) -> None:
        """An in-place ``op`` wrote into ``view`` of a storage the parameters ``owners`` share,
        with data from the checkpoint tensors ``src_origins`` (``src_numel`` elements copied
        when ``op`` is ``copy_``)."""
        call = self.calls[-1] if self.calls else None
        if not src_origins and call is not None and call["tensor"] is not None and op == "copy_":
            src_origins = {call["tensor"]}  # the loader built the data from the tensor it was handed
        numel = view[0]
        regions = storage_runs(*view)
        for pname, start, end in owners:
            if regions is None:
                self.unplaced[pname] += numel
                covered = numel
            else:
                clipped = clip_to(regions, start, end)
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
                if op == "copy_":
                    share = src_numel if len(src_origins) == 1 else min(rec["numel"], src_numel)
                    rec["consumed"] += share
                    if src_numel and src_numel < covered:
                        rec["broadcast"] = True
            self.written_this_call.add(pname)
            if call is not None:
                call["writes"] += 1

    # ---- load_weights calls ----
    def begin_load_weights(self) -> None:
        """One call of ``load_weights`` starts (the first, or a restart after an error)."""
        self.written_this_call = set()

    def returned_none(self) -> None:
        self.returned_kind = "none"
        self.returned = None

    def returned_not_iterable(self, type_name: str) -> None:
        self.returned_kind = type_name

    def returned_names(self, names: set[str]) -> None:
        if self.returned is not None:
            self.returned |= names

    def load_weights_failed(
        self, text: str, error: str, traceback: str, yielded: list[int], key: str | None, value_error: bool
    ) -> int | None:
        """``load_weights`` raised (``text``: the message, ``error``: type and message, ``key``: a
        KeyError's key) after being fed the tensors at ``yielded``. Returns the position to
        restart from, or None when the error names no tensor (the load stops there)."""
        # A call that raised returns no names; vLLM would have stopped there anyway. Count what
        # it wrote as reported, so the simulation of vLLM's own missing-weight check stays
        # meaningful for the other parameters.
        if self.returned is not None:
            self.returned |= self.written_this_call
            self.returned_approximate = True
        culprit = pick_culprit(self.order, yielded, text, key)
        err = {
            "where": "load_weights",
            "error": error,
            "kind": "meta-limitation" if any(w in text for w in META_LIMITATION) else "raised",
            "looked_up": looked_up_name(text, key, value_error),
            "traceback": traceback,
        }
        if culprit is None:
            self.global_errors.append(err)
            return None
        self.tensors[self.order[culprit]]["errors"].append(err)
        self.restarts += 1
        return culprit + 1

    # ---- results ----
    def results(
        self,
        params: dict[str, dict[str, Any]],
        exempt: set[str],
        expected_shape: ExpectedShape,
        moved_to_meta: list[str],
    ) -> dict[str, Any]:
        """The pass's result. ``params``, per parameter in the model's order: ``shape``,
        ``dtype``, ``numel``, ``replaced`` (its storage was swapped by assignment) with
        ``replaced_sources`` (the checkpoint tensors the new data came from), ``shards_expected``
        (the shard ids its layer is loaded with, or None) and ``module`` (its layer's class
        name, or None); ``exempt``: the parameters vLLM does not require."""
        failed_from: dict[str, list[str]] = {}
        for tname, rec in self.tensors.items():
            for e in rec["errors"]:
                if e.get("param"):
                    failed_from.setdefault(e["param"], []).append(tname)
        out_params: dict[str, Any] = {}
        for name, p in params.items():
            numel = p["numel"]
            if p["replaced"]:
                covered = numel
                self.sources[name] |= set(p["replaced_sources"])
            else:
                covered = min(numel, covered_elements(self.coverage[name]) + self.unplaced[name])
            want = p["shards_expected"]
            loaded = loaded_shards(want, self.shards[name])
            out_params[name] = {
                "shape": p["shape"],
                "dtype": p["dtype"],
                "numel": numel,
                "covered": covered,
                "written": covered >= numel and bool(self.sources[name]),
                "fill_only": bool(self.fill_only.get(name)) and not self.sources[name],
                "sources": sorted(self.sources[name]),
                "shards_expected": want,
                "shards_loaded": loaded if want is not None else None,
                "shards_missing": [s for s in want if s not in loaded] if want is not None else None,
                "loader": self.loaders.get(name),
                "module": p["module"],
                "replaced_by_assignment": p["replaced"],
                "failed_from": failed_from.get(name, []),
                "in_returned": None if self.returned is None else name in self.returned,
                "vllm_exempt": name in exempt,
            }
            if p.get("num_experts"):
                out_params[name]["num_experts"] = p["num_experts"]
                out_params[name]["expert_loads"] = self.expert_loads.get(name, [])
        tensors: dict[str, Any] = {}
        for name in self.order:
            rec = self.tensors[name]
            errors = rec["errors"]
            status = tensor_status(rec)
            tensors[name] = {
                "status": status,
                "shape": rec["shape"],
                "dtype": rec["dtype"],
                "params": rec["written"],
                "handed_to": rec["handed_to"][:8],
                "consumed": rec["consumed"],
                "numel": rec["numel"],
                "errors": [dict(e) for e in errors[:3]],
            }
            if status in ("shape_mismatch", "partial", "broadcast"):
                tensors[name]["expected_shape"] = self._expected_shape_of(rec, expected_shape)
        return {
            "params": out_params,
            "tensors": tensors,
            "load_weights": {
                "returned": self.returned_kind,
                "returned_count": None if self.returned is None else len(self.returned),
                "returned_approximate": self.returned_approximate,
                "restarts": self.restarts,
                "global_errors": self.global_errors[:5],
            },
            "tracer_errors": self.tracer_errors[:20],
            "moved_to_meta": moved_to_meta[:50],
        }

    @staticmethod
    def _expected_shape_of(rec: dict[str, Any], expected_shape: ExpectedShape) -> list[int] | None:
        """The shape a tensor should have had: its loader error's, else its first parameter's."""
        for e in rec["errors"]:
            if e.get("expected_shape"):
                want: list[int] = e["expected_shape"]
                return want
        first = rec["handed_to"][0] if rec["handed_to"] else None
        return expected_shape(first["param"], first["shard"]) if first is not None else None

    @staticmethod
    def nearest(tensors: dict[str, Any], params: list[str]) -> dict[str, list[str]]:
        """The parameters nearest to each name a failing tensor has or looked up."""
        failing = [n for n, r in tensors.items() if r["status"] in ("raised", "skipped")]
        looked = [e.get("looked_up") for n in failing for e in tensors[n]["errors"] if e.get("looked_up")]
        return nearest_params(sorted(set(looked) | set(failing)), params)


def child_task(request: dict[str, Any], _progress: Any) -> dict[str, Any]:
    """The child's side (run through :mod:`vllm_doctor.stages.child`): the meta-device load."""
    try:
        from vllm_doctor.compat.weights import meta_load

        return meta_load(request, LoadLedger)
    except BaseException as exc:  # the doctor's own bug: reported as the pass's "internal" stage
        return {"error": {"stage": "internal", "summary": f"{type(exc).__name__}: {exc}", "traceback": ""}}

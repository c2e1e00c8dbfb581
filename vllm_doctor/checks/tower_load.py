"""What the weights pass says about whole towers, for VD313 and for the per-name checks that
defer to it (VD301, VD302); no check registers here.

A tower is a top-level sub-module of the model vLLM builds (``vision_tower``,
``multi_modal_projector``, ``language_model`` of a LLaVA-style class; ``model`` and ``lm_head``
of a text model). When load_weights leaves (nearly) all of a tower empty, one finding names it
with the cause, read off the checkpoint's names:

- ``prefix``: the checkpoint holds the tower's tensors under another prefix (``model.vision_tower.``
  for ``vision_tower.``): the hf_to_vllm_mapper entry that would map them;
- ``filtered``: the tensors carry the parameters' names (after the class's mapper), and
  load_weights drops them before any weight loader sees them;
- ``raised``: the names match, and load_weights raises on them;
- ``absent``: the checkpoint has nothing that looks like the tower's parameters.

The weights pass also reports (its :class:`~vllm_doctor.facts.static.Layout`'s ``unbuilt``) the
checkpoint tensors whose module the model deliberately did not build: a layer past the end of a
built ``ModuleList`` (vLLM's CLIP/SigLIP towers under LLaVA's ``vision_feature_layer``) or a
sub-module the class set to None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vllm_doctor.facts.static import Facts, HfMapper, Layout, ParamLoad, TensorLoad

# a tower is reported when at least this share of its parameters (and two of them) is never written
MOST = 0.8
MIN_SUFFIX = 2  # dotted components two names must share at the end to be the same parameter
LAYER_COUNT_KEYS = ("num_hidden_layers", "num_layers")


@dataclass(frozen=True)
class Tower:
    """A top-level module that load_weights leaves (nearly) empty, and why."""

    name: str
    params: int  # the tower's parameters
    unfilled: list[str]  # those never written
    cause: str  # prefix | filtered | raised | absent
    tensors: list[str]  # the checkpoint tensors that belong to it (their VD302 findings defer here)
    checkpoint_prefix: str = ""
    parameter_prefix: str = ""
    error: str = ""


def _module_prefix(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else name


def _unfilled(p: ParamLoad) -> bool:
    """Nothing was written into it and no load into it failed (VD303 has those); a fused-MoE
    parameter that got some experts is VD311's."""
    if p.written or p.covered or p.failed_from:  # a field an older doctor's reply lacks reads as not
        return False
    return not (p.num_experts is not None and p.expert_loads)


def unloaded_towers(facts: Facts) -> list[Tower]:
    """The towers load_weights leaves (nearly) empty, with the cause read off the names."""
    data = facts.usable_weights()
    if data is None:
        return []
    params, tensors = data.params, data.tensors
    unread = {_module_prefix(n) for n in (facts.checkpoint.unread_tensors if facts.checkpoint else [])}
    groups: dict[str, list[str]] = {}
    for name in params:
        groups.setdefault(name.split(".", 1)[0], []).append(name)
    lay = data.layout
    towers = []
    for tower, members in groups.items():
        if any(_module_prefix(n) in unread for n in members):
            continue  # VD301 says skip for parameters in unreadable files
        unfilled = [n for n in members if _unfilled(params[n])]
        if len(unfilled) >= 2 and len(unfilled) >= MOST * len(members):
            towers.append(_cause(tower, len(members), unfilled, tensors, lay))
    return towers


def _cause(tower: str, count: int, unfilled: list[str], tensors: dict[str, TensorLoad], lay: Layout) -> Tower:
    # the parameters by their trailing components, to find the checkpoint tensor each one is
    index: dict[str, str] = {}
    for name in unfilled:
        parts = name.split(".")
        for k in range(MIN_SUFFIX, len(parts) + 1):
            index.setdefault(".".join(parts[-k:]), name)
    same: dict[str, list[str]] = {}  # status -> tensors whose mapped name is a parameter's
    pairs: dict[tuple[str, str], list[str]] = {}  # (checkpoint prefix, parameter prefix) -> tensors
    for tname, t in tensors.items():
        if t.status not in ("raised", "skipped") or tname in lay.unbuilt:
            continue
        mapped = lay.mapped[tname] if tname in lay.mapped else tname
        if mapped in index and index[mapped] == mapped:
            same.setdefault(t.status, []).append(tname)
            continue
        parts = tname.split(".")
        for k in range(len(parts), MIN_SUFFIX - 1, -1):
            param = index.get(".".join(parts[-k:]))
            if param is None:
                continue
            suffix = ".".join(parts[-k:])
            pairs.setdefault(_tower_pair(tname, param, suffix, tower), []).append(tname)
            break
    best = max(pairs.items(), key=lambda kv: len(kv[1]), default=None)
    matched_same = sum(len(v) for v in same.values())
    if best is not None and len(best[1]) >= matched_same:
        (ck, pp), names = best
        # the prefix's other failing tensors are the tower's too (q/k/v of a fused qkv_proj, layers
        # it did not build): one mapper entry settles them all
        names = [n for n, t in tensors.items() if n.startswith(ck) and t.status in ("raised", "skipped")]
        return Tower(
            tower,
            count,
            unfilled,
            "prefix",
            names,
            checkpoint_prefix=ck,
            parameter_prefix=pp,
            error=_error(names, tensors),
        )
    if same:
        raised = same["raised"] if "raised" in same else []
        skipped = same["skipped"] if "skipped" in same else []
        if len(raised) > len(skipped):
            return Tower(tower, count, unfilled, "raised", raised, error=_error(raised, tensors))
        return Tower(tower, count, unfilled, "filtered", skipped)
    return Tower(tower, count, unfilled, "absent", [])


def _error(names: list[str], tensors: dict[str, TensorLoad]) -> str:
    """The first error load_weights raised on one of ``names`` (what vLLM stops with), shortened
    to its first sentence: vLLM's "no module or parameter named" lists every parameter after it."""
    for name in names:
        for err in tensors[name].errors:
            if err.kind == "raised":
                text = err.error.splitlines()[0]
                return text.split(". The available parameters")[0][:300]
    return ""


def _tower_pair(tensor: str, param: str, suffix: str, tower: str) -> tuple[str, str]:
    """The prefixes the two names differ by, widened until the parameter's names the tower:
    (model.vision_tower.x.weight, vision_tower.x.weight) -> ("model.vision_tower.", "vision_tower.")."""
    ck, pp = tensor[: len(tensor) - len(suffix)], param[: len(param) - len(suffix)]
    rest = suffix.split(".")
    while not pp.startswith(tower + ".") and len(rest) > 1:
        ck, pp = ck + rest[0] + ".", pp + rest[0] + "."
        rest = rest[1:]
    return ck, pp


def tower_params(facts: Facts) -> set[str]:
    """The parameters VD313 reports by tower (VD301 defers to it)."""
    return {n for t in unloaded_towers(facts) for n in t.unfilled}


def tower_tensors(facts: Facts) -> set[str]:
    """The checkpoint tensors VD313 accounts for (VD302 defers to it)."""
    return {n for t in unloaded_towers(facts) for n in t.tensors}


def config_ints(config: dict[str, Any], prefix: str = "") -> list[tuple[str, int]]:
    """Every integer of config.json with its dotted key (sub-configs included)."""
    out: list[tuple[str, int]] = []
    for key, value in config.items():
        if isinstance(value, dict):
            out.extend(config_ints(value, f"{prefix}{key}."))
        elif isinstance(value, int) and not isinstance(value, bool):
            out.append((prefix + key, value))
    return out


def unbuilt_groups(facts: Facts, names: list[str]) -> dict[str, dict[str, Any]]:
    """The skipped tensors ``names`` whose module the model deliberately did not build, by the
    module they would have gone into, each with what says so. A layer past the built ones counts
    only where config.json declares that many layers (``*num_hidden_layers`` / ``*num_layers``)."""
    data = facts.usable_weights()
    if data is None:
        return {}
    unbuilt = data.layout.unbuilt
    ints = config_ints(facts.config)
    counts = [(k, v) for k, v in ints if k.rsplit(".", 1)[-1].endswith(LAYER_COUNT_KEYS)]
    feature = [(k, v) for k, v in ints if "feature_layer" in k]
    groups: dict[str, dict[str, Any]] = {}
    for name in names:
        if name not in unbuilt:
            continue
        part = unbuilt[name]
        module = part.module
        if part.kind == "layer":
            index, built = part.index, part.built
            # the count nearest the module by name (vision_config.num_hidden_layers for vision_tower.*)
            words = set(re.split(r"[._]", module))
            declared = sorted((len(words & set(re.split(r"[._]", k))), v, k) for k, v in counts if v > index)
            if not declared:
                continue  # config.json does not say the model has that layer: a real finding
            group = groups.setdefault(
                module,
                {
                    "module": module,
                    "kind": "layer",
                    "built": built,
                    "indices": [],
                    "declared": {declared[-1][2]: declared[-1][1]},
                    "feature_layer": dict(feature),
                    "tensors": [],
                },
            )
            if index not in group["indices"]:
                group["indices"].append(index)
        else:
            group = groups.setdefault(module, {"module": module, "kind": "none", "tensors": []})
        group["tensors"].append(name)
    return groups


def mapper_text(mapper: HfMapper | None) -> str:
    if mapper is None:
        return "the class has no hf_to_vllm_mapper"
    prefixes = mapper.orig_to_new_prefix or {}
    if not prefixes:
        return "its hf_to_vllm_mapper maps no prefix"
    return "its hf_to_vllm_mapper maps " + ", ".join(f"{k!r} -> {v!r}" for k, v in prefixes.items())

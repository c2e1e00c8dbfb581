"""The plausibility bounds of config.json's sizes that more than the checks need: VD309
(checks/config_sizes.py) reports them, and the import pass's child (probes/import_probe.py) asks
:func:`vision_size_problems` before it lets vLLM feed its multimodal processor dummy images of the
config's size. Plain functions on the decoded config.json; no vLLM."""

from __future__ import annotations

import json
import math
from typing import Any

_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}

# a vision tower's sizes (config.json's vision_config): vLLM feeds the multimodal processor dummy images of
# image_size at start-up, and the import pass does the same; the largest published towers are well under these
VISION_CONFIGS = ("vision_config",)
VISION_LIMITS: dict[str, int] = {
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1_000,
    "num_attention_heads": 1 << 12,
    "image_size": 1 << 13,
    "patch_size": 1 << 10,
}
MAX_PATCHES = 1 << 18  # (image_size / patch_size)**2 image tokens per image: 448 / 14 gives 1,024


def shown(value: Any, limit: int = 60) -> str:
    """A config value as config.json spells it, cut to ``limit`` characters."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    elif isinstance(value, (int, float)):
        text = repr(value)
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def size_problem(key: str, value: Any, limits: dict[str, int]) -> str | None:
    """Why ``value`` cannot be the size ``key`` (under ``limits``), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {_JSON_TYPES.get(type(value), type(value).__name__)}, not a whole number"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "is not a number"
        return "is a float, not a whole number" + (f" (write {int(value)})" if value.is_integer() else "")
    if value <= 0:
        return "must be at least 1" if value == 0 else "is negative"
    if value > limits[key]:
        return f"is over {limits[key]:,}, vllm-doctor's plausibility limit for {key}"
    return None


def vision_size_problems(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The vision tower sizes of config.json's ``vision_config`` that are out of bounds (numbers only:
    an image_size given as [height, width] is checked item by item; other shapes are the config
    class's business). Each: key (dotted), value, why."""
    out: list[dict[str, Any]] = []
    for name in VISION_CONFIGS:
        cfg = config.get(name)
        if not isinstance(cfg, dict):
            continue
        sides: dict[str, int] = {}
        for key in VISION_LIMITS:
            value = cfg.get(key)
            items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
            for i, item in items:
                if isinstance(item, bool) or not isinstance(item, (int, float)):
                    continue
                where = f"{name}.{key}" + (f"[{i}]" if i is not None else "")
                why = size_problem(key, item, VISION_LIMITS)
                if why is not None:
                    out.append({"key": where, "value": shown(item), "why": why})
                elif isinstance(item, int) and key in ("image_size", "patch_size"):
                    sides[key] = max(sides.get(key, 0), item)
        if sides.get("image_size") and sides.get("patch_size"):
            patches = (sides["image_size"] // sides["patch_size"]) ** 2
            if patches > MAX_PATCHES:
                out.append(
                    {
                        "key": f"{name}.patch_size",
                        "value": shown(sides["patch_size"]),
                        "why": f"cuts an image of {sides['image_size']:,} pixels a side into {patches:,} patches "
                        f"(over {MAX_PATCHES:,}, vllm-doctor's plausibility limit)",
                    }
                )
    return out

"""Reading a worker's reply into a record: one lenient reader per wire type (stdlib only).

The worker-side collectors (:mod:`vllm_doctor.compat.worker_facts`) build the records of
:mod:`vllm_doctor.facts.placement`, :mod:`~vllm_doctor.facts.kv`, :mod:`~vllm_doctor.facts.memory`
and :mod:`~vllm_doctor.facts.anatomy` and send their ``to_wire()`` dict; the doctor's side reads
that dict back with the record's ``from_wire``. The two ends may be different doctor versions (a
served engine keeps the doctor it started with), so a decoder never raises on a reply's shape:
a field that is missing or of another type reads as its default (None, 0, empty), a field it does
not know is ignored, and a reply of a newer wire version is read for the fields this one knows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

R = TypeVar("R")

VERSION_KEY = "wire_version"  # each record's wire version, in its to_wire() dict


def version(data: Mapping[str, Any]) -> int:
    """The reply's wire version: 0 for a reply of a doctor that sent none."""
    return opt_int(data.get(VERSION_KEY)) or 0


def mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}


def opt_int(value: Any) -> int | None:
    """An integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def opt_float(value: Any) -> float | None:
    """A number (an int is kept as it is), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def opt_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def int_list(value: Any) -> list[int]:
    """A list of integers (a shape), else empty: a list with anything else in it is not one."""
    if isinstance(value, (list, tuple)) and all(opt_int(v) is not None for v in value):
        return list(value)
    return []


def str_list(value: Any) -> list[str]:
    """The strings of a list (anything else in it dropped), else empty."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else []


def float_list(value: Any) -> list[float] | None:
    """A list of numbers, else None."""
    if isinstance(value, (list, tuple)) and all(opt_float(v) is not None for v in value):
        return list(value)
    return None


def int_map(value: Any) -> dict[str, int]:
    """The integer entries of a ``str -> int`` dict (counts by device, by dtype)."""
    return {k: v for k, v in mapping(value).items() if isinstance(k, str) and opt_int(v) is not None}


def records(value: Any, decode: Callable[[Mapping[str, Any]], R]) -> list[R]:
    """Each dict of a list, decoded (anything else in the list dropped)."""
    if not isinstance(value, (list, tuple)):
        return []
    return [decode(v) for v in value if isinstance(v, dict)]


def without_none(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less its None values: for the parts of a reply that list only what vLLM exposed."""
    return {k: v for k, v in data.items() if v is not None}

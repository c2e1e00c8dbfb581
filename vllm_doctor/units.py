"""Human-readable numbers and clipped text for messages and reports (standard library only)."""

from __future__ import annotations

import re
from typing import Any

_BYTE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def fmt_bytes(n: Any) -> str:
    """``1.50 GiB``, ``64.00 MiB``, ``3.00 KiB``, ``12 B``; ``n/a`` for None."""
    if n is None:
        return "n/a"
    n = float(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_s(s: Any) -> str:
    """``1.23 s``, ``4.56 ms``, ``7.8 µs``; ``n/a`` for None."""
    if s is None:
        return "n/a"
    s = float(s)
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def parse_bytes(text: str) -> int:
    """``"64M"``, ``"1.5GiB"``, ``"2g"``, ``"67108864"`` -> bytes (binary units); ValueError otherwise."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)(?:i?b)?", text.strip().lower().replace(" ", ""))
    if m is None:
        raise ValueError(f"expected bytes like 67108864, 64M or 2G, got {text!r}")
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2)])


ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters for display: unchanged when it fits, else cut at
    the last whitespace before the limit and ended with ``…``.

    A word that would cost more than a quarter of the width (a path, an identifier, a repr) is
    cut inside itself instead. For display text only: evidence a program reads keeps its own
    fixed-length cut.
    """
    if len(text) <= limit:
        return text
    if limit <= 1:
        return ELLIPSIS[:limit]
    head = text[: limit - 1]  # room for the ellipsis
    if not text[limit - 1].isspace():  # the cut falls inside a word: back up to its start
        space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
        if space >= limit - limit // 4:
            head = head[:space]
    return head.rstrip(" \t\n,;:") + ELLIPSIS


# the profiler's clocks (``profile["clock"]``) in words: every time a report shows names one
CLOCK_NAMES = {
    "cuda_events": "device clock (CUDA events)",
    "wall_clock": "wall clock (the CPU is the device)",
}


def clock_name(kind: Any) -> str:
    """``cuda_events`` -> "device clock (CUDA events)"; an unknown clock is named as it is."""
    return CLOCK_NAMES.get(str(kind), str(kind or "unknown clock"))

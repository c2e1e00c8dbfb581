"""Human-readable numbers for messages and reports (standard library only)."""

from __future__ import annotations

from typing import Any


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

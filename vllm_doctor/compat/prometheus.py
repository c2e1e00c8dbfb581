"""``prometheus_client``, the library vLLM's ``/metrics`` answers from: the doctor's exporter
(:mod:`vllm_doctor.live.exporter`) registers its collector on the library's default registry
and hands it plain :class:`Family` rows, turned here into the library's metric families.

vLLM serves ``/metrics`` from ``prometheus_client.REGISTRY`` unless ``PROMETHEUS_MULTIPROC_DIR``
is set (several API servers): then from a registry of the files its processes write, which a
collector in one process cannot join (:func:`register` says so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class Family:
    """One metric family as plain data: ``kind`` "counter" (``name`` without ``_total``) or "gauge"."""

    name: str
    kind: str
    help: str
    labels: list[str]
    samples: list[tuple[list[str], float]] = field(default_factory=list)


def register(collector: Any) -> str | None:
    """Add ``collector`` (with ``collect()`` giving :func:`families`' output) to the default
    registry; None, or why its series will not be in ``/metrics``."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:  # vLLM depends on it: a process without it serves no /metrics either
        return "prometheus_client is not installed"
    REGISTRY.register(collector)
    if os.environ.get(MULTIPROC_ENV):
        return (
            f"{MULTIPROC_ENV} is set (several API servers): vLLM answers /metrics from its processes' files, "
            "without the doctor's series"
        )
    return None


def families(rows: list[Family]) -> list[Any]:
    """The library's metric families of ``rows``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    out: list[Any] = []
    for row in rows:
        cls = CounterMetricFamily if row.kind == "counter" else GaugeMetricFamily
        fam = cls(row.name, row.help, labels=row.labels)
        for values, value in row.samples:
            fam.add_metric(values, value)
        out.append(fam)
    return out

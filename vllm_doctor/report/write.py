"""The report files of an engine run: report.json, report.html and trace.json, each written atomically.

``profile --out``, ``attach --out`` and :func:`vllm_doctor.profile` write them the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_doctor.model import Report

CPU_PROFILE_INDEX = "index.json"
CPU_PROFILE_KIND = "vllm-doctor cpu-profile"


def cpu_profile_index(out: Path) -> dict[str, Any] | None:
    """The index.json a ``cpu-profile --out`` left in ``out``, if any (its flamegraphs get linked)."""
    try:
        data = json.loads((out / CPU_PROFILE_INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == CPU_PROFILE_KIND else None


def write_reports(out: Path, report: Report) -> list[Path]:
    """report.json, report.html and trace.json into ``out``, each written atomically."""
    from vllm_doctor.files import write_json_atomic, write_text_atomic
    from vllm_doctor.report.html import render_html
    from vllm_doctor.report.trace import chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    data = report.to_dict()
    paths = [out / "report.json", out / "report.html", out / "trace.json"]
    write_json_atomic(paths[0], data)
    write_text_atomic(paths[1], render_html(data, cpu_profile_index(out)))
    write_json_atomic(paths[2], chrome_trace(report.profiles.get("engine") or {}, report.facts.get("engine")))
    return paths

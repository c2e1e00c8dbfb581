"""The report files of an engine run: report.json, report.html and trace.json, each written atomically.

``profile --out``, ``attach --out`` and :func:`vllm_doctor.profile` write them the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_doctor.analysis.records import EngineAnatomy, EngineProfile, held
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
    paths = [out / "report.json", out / "report.html", out / "trace.json"]
    write_json_atomic(paths[0], report.to_dict())  # the records' JSON: written here, at the edge
    write_text_atomic(paths[1], render_html(report, cpu_profile_index(out)))
    profile = held(report, "profiles", "engine", EngineProfile) or EngineProfile()
    write_json_atomic(paths[2], chrome_trace(profile, held(report, "facts", "engine", EngineAnatomy)))
    return paths

"""Open a report the doctor wrote, or say in one line why the file is not one (before any screen is drawn)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorInputError

MAX_REPORT_BYTES = 512 * 2**20  # a profile with a long trace is tens of MB; more is not a report of ours
HINT = (
    "give a report the doctor wrote: `vllm-doctor check DIR --json > r.json`, or report.json from "
    "`vllm-doctor profile DIR --out OUT` / `vllm-doctor attach --url URL --out OUT`"
)


def load_report(path: str | Path) -> dict[str, Any]:
    """The report at ``path`` (a report.json, or a directory holding one) as a dict.

    Raises DoctorInputError (one line and a hint) for a missing file, a directory without a
    report.json, something that is not a regular file, a file too large, text that is not UTF-8
    JSON, and JSON that is not a vllm-doctor report.
    """
    p = Path(path)
    try:
        if p.is_dir():
            if not (p / "report.json").is_file():
                raise DoctorInputError(f"{p}: a directory with no report.json in it", HINT)
            p = p / "report.json"
        st = p.stat()
    except FileNotFoundError:
        raise DoctorInputError(f"{p}: no such file", HINT) from None
    except OSError as exc:
        raise DoctorInputError(f"{p}: cannot read it ({exc.strerror or exc})", HINT) from None
    if not stat.S_ISREG(st.st_mode):  # never open a FIFO or a device: it could block forever
        raise DoctorInputError(f"{p}: not a regular file", HINT)
    if st.st_size > MAX_REPORT_BYTES:
        raise DoctorInputError(f"{p}: {st.st_size} bytes, larger than any report the doctor writes", HINT)
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise DoctorInputError(f"{p}: cannot read it ({exc.strerror or exc})", HINT) from None
    except UnicodeDecodeError as exc:
        raise DoctorInputError(f"{p}: not UTF-8 text (byte {exc.start})", HINT) from None
    except json.JSONDecodeError as exc:
        raise DoctorInputError(f"{p}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", HINT) from None
    except RecursionError:
        raise DoctorInputError(f"{p}: JSON nested too deeply to be a report", HINT) from None
    problem = why_not_a_report(data)
    if problem:
        raise DoctorInputError(f"{p}: not a vllm-doctor report ({problem})", HINT)
    return data  # type: ignore[no-any-return]


def why_not_a_report(data: Any) -> str:
    """'' for a doctor report (any version: sections may be missing), else what is wrong."""
    if not isinstance(data, dict):
        return f"the top level is a JSON {type(data).__name__}, not an object"
    if data.get("tool", "vllm-doctor") != "vllm-doctor":
        return f'its "tool" is {data.get("tool")!r}'
    if "findings" not in data or "target" not in data:
        return 'no "target" and "findings"'
    findings = data["findings"]
    if not isinstance(findings, list):
        return '"findings" is not a list'
    for i, f in enumerate(findings):
        if not isinstance(f, dict) or not isinstance(f.get("code"), str):
            return f"findings[{i}] has no code"
    for key in ("environment", "facts", "profiles", "timings", "summary"):
        if key in data and not isinstance(data[key], dict):
            return f'"{key}" is not an object'
    return ""

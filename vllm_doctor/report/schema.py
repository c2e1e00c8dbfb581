"""docs/report-schema.json, generated: the report's frame written here, its engine sections
declared by their records (:mod:`vllm_doctor.analysis.records`, through :func:`wire.json_schema`).

``python -m vllm_doctor.report.schema --write docs/report-schema.json`` writes it again after a
record changed; ``--check docs/report-schema.json`` (and the unit test) says when it is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vllm_doctor.analysis.records import LISTS, SECTIONS
from vllm_doctor.model import SCHEMA_VERSION

COMMAND = "python -m vllm_doctor.report.schema --write docs/report-schema.json"
# the sections the static stage writes as null where it has none (no class resolved)
NULLABLE = {("facts", "resolved"), ("facts", "import_pass"), ("facts", "engine_mode")}

REQUIRED = ("schema_version", "tool", "target", "environment", "summary", "findings", "timings", "facts", "profiles")
FINDING: dict[str, Any] = {
    "type": "object",
    "required": ["code", "outcome", "severity", "message", "subject", "evidence", "hint"],
    "properties": {
        "code": {"type": "string", "pattern": "^VD[0-9]{3}$"},
        "outcome": {"enum": ["pass", "fail", "warn", "skip", "not_applicable", "crash"]},
        "severity": {"enum": ["error", "warn", "info"]},
        "message": {"type": "string"},
        "subject": {
            "type": "string",
            "description": (
                "what the finding is about: config.json:architectures[0], a parameter name, worker 1 / cuda:1"
            ),
        },
        "evidence": {
            "type": "object",
            "description": "expected vs actual, tracebacks, vLLM's own error text (vllm_error)",
        },
        "hint": {"type": "string", "description": "the fix"},
    },
}

FACTS = (
    "probe snapshots: resolved class, plugins, import pass, weights mapping, engine anatomy (engine), the engine "
    "stage's execution mode (engine_mode: requested, enforce_eager, compilation_mode, cudagraph_mode, summary; "
    "engine_mode_text: the line the front ends print), what vLLM said when it could not start or run the model or "
    "why the stage did not start it (engine_failure), engine_log"
)
PROFILES = (
    "profiler output from the engine stage: engine (steps, phases, layers, KV usage, memory, roofline, time "
    "accounting), workload; with profile --twin also twin, the A/B against vLLM's in-tree twin (or none: one line "
    "why), docs/engine-stage.md"
)


def report_schema() -> dict[str, Any]:
    """The JSON schema of report.json (``Report.to_dict()``)."""
    sections: dict[str, dict[str, Any]] = {"facts": {}, "profiles": {}}
    defs: dict[str, Any] = {"finding": FINDING}
    for (section, key), record in SECTIONS.items():  # the records the report's sections hold
        defs[record.__name__] = record.json_schema()
        ref = {"$ref": f"#/$defs/{record.__name__}"}
        sections[section][key] = {"anyOf": [ref, {"type": "null"}]} if (section, key) in NULLABLE else ref
    for (section, key), record in LISTS.items():  # the sections that hold a list of records
        defs[record.__name__] = record.json_schema()
        sections[section][key] = {"type": "array", "items": {"$ref": f"#/$defs/{record.__name__}"}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"vllm-doctor/report-schema/{SCHEMA_VERSION}",
        "title": "vllm-doctor report",
        "description": (
            "The one report format written by `vllm-doctor check --json`, the pytest plugin, `vllm-doctor profile` "
            "(report.json) and read back by the HTML report and `vllm-doctor view`. Unknown keys may be added in "
            "minor versions; consumers must ignore them. Generated from the doctor's records: "
            f"`{COMMAND}`."
        ),
        "type": "object",
        "required": [*REQUIRED],
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "tool": {"const": "vllm-doctor"},
            "target": {"type": "string", "description": "the model directory (resolved) or engine checked"},
            "environment": {
                "type": "object",
                "description": (
                    "versions (vllm_doctor, python, vllm, torch, transformers, torchvision), platform, devices"
                ),
            },
            "summary": {
                "type": "object",
                "description": "count of findings per outcome",
                "additionalProperties": {"type": "integer"},
            },
            "findings": {"type": "array", "items": {"$ref": "#/$defs/finding"}},
            "timings": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": "seconds: static_pass_s, import_pass_s, total_s, ...",
            },
            "facts": {"type": "object", "description": FACTS, "properties": sections["facts"]},
            "profiles": {"type": "object", "description": PROFILES, "properties": sections["profiles"]},
        },
        "$defs": defs,
    }


def schema_text() -> str:
    return json.dumps(report_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_doctor.report.schema", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", metavar="PATH", help="write the schema to PATH")
    action.add_argument("--check", metavar="PATH", help="exit 1 when PATH is not the schema the records declare")
    args = parser.parse_args(argv)
    text = schema_text()
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
        return 0
    if args.check:
        if Path(args.check).read_text(encoding="utf-8") != text:
            print(f"{args.check} is stale: the records changed; run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

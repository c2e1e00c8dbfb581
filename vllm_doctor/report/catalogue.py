"""Render the check catalogue as markdown (the README's table): python -m vllm_doctor.report.catalogue"""

from __future__ import annotations

from vllm_doctor.checks import CATALOGUE


def markdown() -> str:
    lines = ["| code | name | severity | stage | what it finds |", "|---|---|---|---|---|"]
    for code in sorted(CATALOGUE):
        m = CATALOGUE[code].meta
        lines.append(f"| {m.code} | `{m.name}` | {m.severity.value} | {m.stage.value} | {m.summary.replace('|', '/')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())

"""Render the check catalogue as markdown (the README's table).

python -m vllm_doctor.report.catalogue               # print it
python -m vllm_doctor.report.catalogue --write README.md   # replace the marked block
"""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_doctor.checks import CATALOGUE

START, END = "<!-- catalogue:start -->", "<!-- catalogue:end -->"


def markdown() -> str:
    lines = ["| code | name | severity | stage | topic | what it finds |", "|---|---|---|---|---|---|"]
    for code in sorted(CATALOGUE):
        m = CATALOGUE[code].meta
        lines.append(
            f"| {m.code} | `{m.name}` | {m.severity_text} | {m.stage.value} | {m.topic} "
            f"| {m.summary.replace('|', '/')} |"
        )
    return "\n".join(lines)


def write_into(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    start = text.index(START) + len(START)
    end = text.index(END)
    path.write_text(text[:start] + "\n" + markdown() + "\n" + text[end:], encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write_into(Path(sys.argv[2]))
    else:
        print(markdown())

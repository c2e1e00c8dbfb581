"""Nothing the repository ships names a path outside it: a user's checkout has none of the
folders its authors keep beside it (their design notes). A fact the code relies on is stated
where it is used, or in a page under docs/."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("vllm_doctor", "docs", "bench", "examples", "tests", "README.md")
# spelled in pieces so that this file does not name them itself
OUTSIDE = ("../" + "shared", "shared/" + "design/")


def outside_paths(root: Path) -> list[str]:
    """``file:line: text`` for each line of a text file under ``root`` (a file or a folder) that
    names a path outside the repository."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    files = [p for p in files if "__pycache__" not in p.parts]  # compiled: the source is scanned
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # not text
        for number, line in enumerate(text.splitlines(), 1):
            if any(name in line for name in OUTSIDE):
                found.append(
                    f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}: {line.strip()}"
                )
    return found


@pytest.mark.parametrize("part", SCANNED)
def test_nothing_shipped_names_a_path_outside_the_repository(part: str) -> None:
    root = ROOT / part
    if not root.exists():
        pytest.skip(f"{part} is not in this checkout")
    assert outside_paths(root) == []


def test_the_scan_finds_a_citation_outside_the_repository(tmp_path: Path) -> None:
    cited = "../" + "shared/" + "design/NOTES.md"
    (tmp_path / "mod.py").write_text(f'"""as measured ({cited})"""\nx = 1\n')
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")  # not text: skipped
    assert outside_paths(tmp_path) == [f'{tmp_path / "mod.py"}:1: """as measured ({cited})"""']

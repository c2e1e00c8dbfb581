"""The README's catalogue is generated from the metadata; keep them in sync."""

from __future__ import annotations

from pathlib import Path

from vllm_doctor.report.catalogue import markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_catalogue_matches_the_check_metadata() -> None:
    text = README.read_text()
    start = text.index("<!-- catalogue:start -->") + len("<!-- catalogue:start -->")
    end = text.index("<!-- catalogue:end -->")
    assert text[start:end].strip() == markdown(), "run `make catalogue` and paste its output into README.md"

"""examples/make_examples.py: each variant's site/ is a real plugin distribution, builds repeat.

No engine here: these check the fixtures themselves (tests/engine/test_ground_truth.py
checks what vLLM does with them).
"""

from __future__ import annotations

import filecmp
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
VARIANTS = sorted(["ok", *(p.name for p in (EXAMPLES / "broken").iterdir() if p.is_dir())])
CODE_PATTERN = r"VD\d{3}"


def _plugin_entry_points(site: Path) -> list[tuple[str, str, str]]:
    """(distribution, entry point name, value) in vllm.general_plugins, found only in `site`."""
    found = []
    for dist in importlib.metadata.distributions(path=[str(site)]):
        for ep in dist.entry_points:
            if ep.group == "vllm.general_plugins":
                found.append((dist.metadata["Name"], ep.name, ep.value))
    return found


def test_every_variant_is_built(examples_dir: Path) -> None:
    assert sorted(p.name for p in examples_dir.iterdir() if p.is_dir()) == VARIANTS


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_layout(examples_dir: Path, name: str) -> None:
    out = examples_dir / name
    meta = json.loads((out / "variant.json").read_text())
    assert meta["name"] == name
    assert meta["engine_mode"] in ("inprocess", "multiprocess", "script")
    if name == "ok":
        assert meta["expect_code"] is None
    else:
        assert re.fullmatch(CODE_PATTERN, meta["expect_code"])
        assert (EXAMPLES / "broken" / name / "README.md").read_text().strip()
    if meta["engine_mode"] == "script":
        assert (out / meta["script"]).is_file()
    model = out / "model"
    for filename in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model / filename).is_file(), filename


@pytest.mark.parametrize("name", VARIANTS)
def test_site_is_a_discoverable_distribution(examples_dir: Path, name: str) -> None:
    site = examples_dir / name / "site"
    package = "tiny_doctor_model" if name == "ok" else "tiny_doctor_" + name.replace("-", "_")
    assert (site / package / "__init__.py").is_file()
    entry_points = _plugin_entry_points(site)
    if name == "script-only-registration":
        assert entry_points == []  # registered by serve.py only
    elif name == "entry-point-typo":
        assert entry_points == [(package.replace("_", "-"), "tiny_doctor", f"{package}:regsiter")]
    else:
        assert entry_points == [(package.replace("_", "-"), "tiny_doctor", f"{package}:register")]


def test_pythonpath_site_shows_the_entry_point_like_an_install(examples_dir: Path) -> None:
    """What vLLM does: importlib.metadata.entry_points(group=...) with site/ on PYTHONPATH."""
    code = (
        "import importlib.metadata as m\n"
        "print(sorted(e.value for e in m.entry_points(group='vllm.general_plugins')))"
    )
    env = dict(os.environ, PYTHONPATH=str(examples_dir / "ok" / "site"))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert "tiny_doctor_model:register" in proc.stdout


def test_ok_site_is_the_example_package_unchanged(examples_dir: Path) -> None:
    source = EXAMPLES / "tiny_model_plugin" / "tiny_doctor_model"
    copied = examples_dir / "ok" / "site" / "tiny_doctor_model"
    names = sorted(p.name for p in source.glob("*.py"))
    _same, mismatch, errors = filecmp.cmpfiles(source, copied, names, shallow=False)
    assert (mismatch, errors) == ([], [])


def test_builds_are_deterministic(examples_dir: Path, tmp_path: Path) -> None:
    rebuilt = ["ok", "transformers-backend-fallback", "hf-style-init"]
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_examples.py"), str(tmp_path), "--only", *rebuilt],
        check=True,
        capture_output=True,
    )
    for name in rebuilt:
        for path in sorted((examples_dir / name).rglob("*")):
            if path.is_file():
                again = tmp_path / name / path.relative_to(examples_dir / name)
                assert again.read_bytes() == path.read_bytes(), path


def test_unknown_variant_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "make_examples.py"), str(tmp_path), "--only", "nope"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "unknown variant(s) ['nope']" in proc.stderr

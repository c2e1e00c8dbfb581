"""The distribution: its name, its two commands, its entry points, the files the wheel must carry.

``.ci/wheel_check.sh`` builds and installs the real wheel; these tests keep pyproject.toml and
the package agreeing about the names first, in well under a second.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from vllm_doctor import __version__
from vllm_doctor.constants import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# what --version must print without vLLM, torch or transformers (a venv with only the doctor)
BLOCKED = ("vllm", "torch", "transformers", "safetensors", "textual", "rich", "pynvml")
VERSION_WITHOUT_VLLM = f"""
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
        return None

sys.meta_path.insert(0, Blocked())
from vllm_doctor.cli import main
sys.exit(main(["--version"]))
"""


def test_the_distribution_is_vllm_model_doctor_with_both_commands() -> None:
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION == "vllm-model-doctor"
    assert project["scripts"] == {"vllm-model-doctor": "vllm_doctor.cli:main", "vllm-doctor": "vllm_doctor.cli:main"}


def test_the_entry_points_keep_their_names() -> None:
    entry_points = PYPROJECT["project"]["entry-points"]
    assert entry_points["pytest11"] == {"vllm_doctor": "vllm_doctor.pytest_plugin.plugin"}
    assert entry_points["vllm.general_plugins"] == {
        "vllm_doctor": "vllm_doctor.plugins:register",  # the worker side (engine/plugin.py)
        "vllm_doctor_metrics": "vllm_doctor.plugins:register_metrics",  # the doctor's series in /metrics
    }


def test_the_version_is_written_once_in_the_package() -> None:
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vllm_doctor.__version__"}


def test_the_package_data_globs_match_files() -> None:
    """Every package-data glob matches a file (one that matches nothing builds a wheel without
    it, silently). The HTML report has no template file: report/html.py writes it."""
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["vllm_doctor"]
    assert globs == ["py.typed"]
    assert not list((ROOT / "vllm_doctor").rglob("*.html"))
    for pattern in globs:
        assert list((ROOT / "vllm_doctor").glob(pattern)), pattern


def test_version_needs_no_vllm_torch_or_transformers() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", VERSION_WITHOUT_VLLM], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"vllm-doctor {__version__} (vllm-model-doctor)\n"
    assert proc.stderr == ""

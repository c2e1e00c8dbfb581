"""One answer per question on a GPU: a model whose CUDA-graph capture fails (``.item()`` in forward)
fails the same way through ``vllm-doctor check --engine``, ``vllm_doctor.check_engine`` and the
pytest fixture's ``assert_on_device``, because all three run vLLM's default mode through one stage.
Before, the API and the fixture ran eagerly and ``assert_on_device`` passed this model.

Run with ``pytest -m gpu tests/gpu``; skipped without CUDA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.test_engine_gpu import GPU_DIMS, REPO_ROOT, _cuda, _doctor_check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(not _cuda(), reason="no CUDA device"),
]
ENGINE_ARGS = {"gpu_memory_utilization": 0.15}
AUTHOR_TEST = """
def test_on_device(vllm_doctor):
    vllm_doctor.assert_on_device(max_model_len=512, engine_args={"gpu_memory_utilization": 0.15})
"""


@pytest.fixture(scope="module")
def item_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.engine_models import build_llama_dir

    return build_llama_dir(tmp_path_factory.mktemp("item") / "item", ["DoctorItemLlama"], GPU_DIMS)


def _env(tmp: Path) -> dict[str, str]:
    from tests.fixtures.capture_models import capture_site

    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_V2_MODEL_RUNNER")}
    site = capture_site(tmp / "capture-site")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _verdict(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((f["code"], f["subject"], f["outcome"]) for f in report["findings"] if f["code"][:3] in ("VD4", "VD5"))


def _fixture_run(model: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    from tests.fixtures.entry_points import doctor_entry_point, entry_point_installed

    (tmp / "test_author.py").write_text(AUTHOR_TEST)
    plugin = [] if entry_point_installed("pytest11") else ["-p", doctor_entry_point("pytest11")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, str(tmp / "test_author.py"),
         "--vllm-doctor-model", str(model), *args],
        env=_env(tmp), capture_output=True, text=True, timeout=1200, cwd=tmp, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_cli_and_api_fail_a_model_that_cannot_be_captured_with_the_same_findings(
    item_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm_doctor

    code, cli, stderr = _doctor_check(item_model, tmp_path)
    assert code == 1, stderr[-4000:]
    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    api = vllm_doctor.check_engine(str(item_model), max_model_len=512, engine_args=ENGINE_ARGS, select=["VD4", "VD5"])
    data = api.to_dict()
    assert [f["outcome"] for f in cli["findings"] if f["code"] == "VD500"] == ["fail"]
    assert _verdict(data) == _verdict(cli)
    assert data["facts"]["engine_mode"] == cli["facts"]["engine_mode"]
    assert data["facts"]["engine_mode"]["requested"] == "vllm-default"
    assert data["facts"]["engine_failure"] == cli["facts"]["engine_failure"]
    assert "graph capture" in data["facts"]["engine_failure"]
    print(json.dumps({"cli": _verdict(cli), "mode": cli["facts"]["engine_mode_text"]}))


def test_the_pytest_fixture_fails_assert_on_device_in_default_mode_and_passes_eagerly(
    item_model: Path, tmp_path: Path
) -> None:
    default = _fixture_run(item_model, tmp_path)
    assert default.returncode == 1, default.stdout[-6000:]
    assert "VD500" in default.stdout and "graph capture" in default.stdout, default.stdout[-6000:]
    assert "(vLLM's default; --eager forces eager); re-run eagerly to find the cause: it ran" in default.stdout
    eager = _fixture_run(item_model, tmp_path, "--vllm-doctor-eager")
    assert eager.returncode == 0, eager.stdout[-6000:]  # eagerly the model runs and its tensors sit on cuda:0
    assert "execution mode: eager (enforce_eager)" in eager.stdout, eager.stdout[-3000:]

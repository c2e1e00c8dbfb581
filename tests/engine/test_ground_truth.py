"""Ground truth: what a real vLLM engine does with the working example and each broken variant.

Every variant of examples/ is built once (examples/make_examples.py), then each runs on a
real engine in a fresh subprocess (tests/engine_harness.py), two at a time, from one
session-scoped fixture. The tests pin what vLLM itself does: the exact error the user sees,
or, where vLLM does not fail, which class really ran. The doctor's checks are judged
against these facts.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.engine_harness import PIP_INSTALLED, examples_jobs, install_plugin_with_pip
from tests.fixtures import ground_truth as truth_data

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]

UNSUPPORTED = "are not supported for now. Supported architectures: dict_keys(["
NOT_INSPECTED = (
    "Model architectures ['TinyDoctorForCausalLM'] failed to be inspected. Please check the logs for more details."
)
NO_RUNNER_GENERATE = "This model does not support `--runner generate`."
UNKNOWN_MODEL_TYPE = (
    "The checkpoint you are trying to load has model type `tiny_doctor` but Transformers "
    "does not recognize this architecture."
)


@dataclass(frozen=True)
class Expected:
    """What vLLM 0.32 (CPU) was seen to do with a variant."""

    ok: bool
    error: str | None = None  # substring of the caller's exception chain
    log: tuple[str, ...] = ()  # substrings of the engine's log (all processes)
    model_class: str | None = None  # the class that really ran, when ok


def custom_class(package: str) -> str:
    return f"{package}.model.TinyDoctorForCausalLM"


EXPECTED: dict[str, Expected] = {
    "ok": Expected(ok=True, model_class=custom_class("tiny_doctor_model")),
    # VD101
    "arch-typo": Expected(ok=False, error=f"Model architectures ['TinyDoctorForCausalLm'] {UNSUPPORTED}"),
    # VD102: the caller passes validation; the worker process cannot resolve the class
    "script-only-registration": Expected(
        ok=False,
        error="Engine core initialization failed. See root cause above.",
        log=(f"ValueError: Model architectures ['TinyDoctorForCausalLM'] {UNSUPPORTED}",),
    ),
    # VD103
    "registered-under-model-type": Expected(
        ok=False, error=f"Model architectures ['TinyDoctorForCausalLM'] {UNSUPPORTED}"
    ),
    # VD104
    "config-not-registered": Expected(ok=False, error=UNKNOWN_MODEL_TYPE),
    # VD105
    "auto-map-without-trust-remote-code": Expected(
        ok=False,
        error="contains custom code which must be executed to correctly load the model.",
    ),
    # VD106: the ImportError is only in the log, the user's error says "check the logs"
    "model-module-import-error": Expected(
        ok=False,
        error=NOT_INSPECTED,
        log=("ModuleNotFoundError: No module named 'vllm.model_executor.layers.layer_norm'",),
    ),
    # VD107: no error; vLLM runs its Transformers backend, the plugin's class never runs
    "transformers-backend-fallback": Expected(
        ok=True,
        model_class="vllm.model_executor.models.transformers.TransformersForCausalLM",
        log=("Using Transformers modeling backend.",),
    ),
    # VD108
    "architectures-missing": Expected(ok=False, error="No model architectures are specified"),
    "architectures-string": Expected(
        ok=False,
        error="architectures\n  Input should be a valid list [type=list_type, "
        "input_value='TinyDoctorForCausalLM', input_type=str]",
    ),
    # VD109: the plugin fails to load (logged), so its config is unknown
    "entry-point-typo": Expected(
        ok=False,
        error=UNKNOWN_MODEL_TYPE,
        log=(
            "Failed to load plugin tiny_doctor",
            "AttributeError: module 'tiny_doctor_entry_point_typo' has no attribute 'regsiter'",
        ),
    ),
    # VD110: no error and no warning; the custom class replaces vLLM's Llama
    "shadows-builtin-arch": Expected(ok=True, model_class=custom_class("tiny_doctor_shadows_builtin_arch")),
    # VD201-VD204, VD206: one message for all of them, the cause is not named
    "hf-style-init": Expected(ok=False, error=NO_RUNNER_GENERATE),
    # VD202: runs (the vllm_config constructor is kept; only the base class changed)
    "pretrained-model-subclass": Expected(ok=True, model_class=custom_class("tiny_doctor_pretrained_model_subclass")),
    "forward-without-positions": Expected(ok=False, error=NO_RUNNER_GENERATE),
    "compute-logits-renamed": Expected(ok=False, error=NO_RUNNER_GENERATE),
    # VD205: runs; returning None only switches vLLM's missing-weight check off
    "load-weights-returns-none": Expected(ok=True, model_class=custom_class("tiny_doctor_load_weights_returns_none")),
    "no-embed-input-ids": Expected(ok=False, error=NO_RUNNER_GENERATE),
    # VD207 on a CPU-only torch: the import fails in vLLM's inspection subprocess
    "cuda-at-import": Expected(
        ok=False,
        error=NOT_INSPECTED,
        log=("AssertionError: Torch not compiled with CUDA enabled",),
    ),
}


@pytest.fixture(scope="session")
def pip_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin_with_pip(tmp_path_factory.mktemp("pip"))


@pytest.fixture(scope="session")
def examples_truth(examples_dir: Path, pip_site: Path, tmp_path_factory: pytest.TempPathFactory) -> truth_data.Truth:
    """Every variant's answer: the family's live ones on a real engine now, two at a time, the
    others as recorded for this vLLM (tests/fixtures/ground_truth.py; all live without a recording).

    `examples_dir` (tests/conftest.py) is examples/make_examples.py's output."""
    jobs = examples_jobs(examples_dir, pip_site)
    truth = truth_data.gather(truth_data.FAMILIES["examples"], tmp_path_factory.getbasetemp(), jobs=jobs)
    summary = tmp_path_factory.getbasetemp() / "ground_truth.json"
    summary.write_text(
        json.dumps({k: {n: v for n, v in r.items() if n != "log"} for k, r in truth.answers.items()}, indent=2)
    )
    return truth


@pytest.fixture(scope="session")
def ground_truth(examples_truth: truth_data.Truth) -> dict[str, dict[str, Any]]:
    return examples_truth.answers


def test_the_live_variants_answer_as_recorded(examples_truth: truth_data.Truth) -> None:
    """vLLM still does with the live variants what it did when the family was recorded (none
    recorded for this vLLM: every variant ran live, nothing to compare)."""
    truth_data.assert_as_recorded("examples", examples_truth)


def _describe(result: dict[str, Any]) -> str:
    shown = {k: v for k, v in result.items() if k != "log_tail"}
    return json.dumps(shown, indent=2) + "\n--- log tail ---\n" + result["log_tail"][-3000:]


def test_every_variant_has_an_expectation() -> None:
    built = {"ok", *(p.name for p in (EXAMPLES / "broken").iterdir() if p.is_dir())}
    assert built == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vllm_behaviour(name: str, ground_truth: dict[str, dict[str, Any]]) -> None:
    result = ground_truth[name]
    expected = EXPECTED[name]
    assert result["error_type"] != "HarnessError", _describe(result)
    assert result["ok"] is expected.ok, _describe(result)
    if expected.ok:
        assert result["generated_text"], _describe(result)  # non-empty text came back
        assert result["model_class"] == expected.model_class, _describe(result)
    else:
        assert expected.error is not None
        assert expected.error in result["error_message"], _describe(result)
    full_log = Path(result["log_path"]).read_text()
    for needle in expected.log:
        assert needle in full_log, f"{needle!r} not in the engine log\n" + _describe(result)


def test_shadowing_a_builtin_is_silent(ground_truth: dict[str, dict[str, Any]]) -> None:
    """vLLM 0.32 overwrites LlamaForCausalLM with the plugin's class at DEBUG level only."""
    log = Path(ground_truth["shadows-builtin-arch"]["log_path"]).read_text()
    assert "already registered" not in log
    assert "LlamaForCausalLM" not in "\n".join(line for line in log.splitlines() if " WARNING " in line)


def test_pip_installed_plugin_generates_in_multiprocess_engine(
    pip_site: Path, ground_truth: dict[str, dict[str, Any]]
) -> None:
    """pyproject.toml is right: pip installs the package and the entry point, and vLLM's
    engine core and worker processes (spawned) load the plugin from the installed metadata."""
    dist_infos = sorted(p.name for p in pip_site.glob("tiny_doctor_model-*.dist-info"))
    assert dist_infos == ["tiny_doctor_model-0.1.0.dist-info"]
    entry_points = (pip_site / dist_infos[0] / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]\ntiny_doctor = tiny_doctor_model:register" in entry_points
    assert (pip_site / "tiny_doctor_model" / "model.py").is_file()

    result = ground_truth[PIP_INSTALLED]
    assert result["ok"] is True, _describe(result)
    assert result["generated_text"], _describe(result)
    assert result["model_class"] == custom_class("tiny_doctor_model"), _describe(result)
    # the same weights, greedy: the same text as the in-process run of the "ok" variant
    assert result["generated_text"] == ground_truth["ok"]["generated_text"]

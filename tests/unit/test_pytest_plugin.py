"""The pytest plugin itself, through ``pytester``: options, help, marker, skips, failure output,
session scope, terminal summary and the JSON report. Static checks run with ``--vllm-doctor-fast``
(no vLLM import); the engine assertions are run for real in tests/engine/test_pytest_for_model_authors.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, make_examples

pytest_plugins = ["pytester"]

ENGINE_DEFAULTS = {
    "device": "auto", "eager": False, "diagnose": True, "max_model_len": None, "kv_cache_memory_bytes": None,
    "multiprocess": False, "engine_timeout": 600.0, "max_memory": "default", "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1, "enable_expert_parallel": False, "trust_remote_code": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("plugin-examples"), "ok", "architectures-missing")


def run_with_site(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, models: Path, name: str, *args: str
) -> pytest.RunResult:
    """pytest in a subprocess that sees variant ``name``'s plugin, as if it were installed."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(models / name / "site"), str(REPO)]))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_help_documents_every_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    assert "vllm-doctor: runtime assertions about a vLLM model" in text
    for option in (
        "--vllm-doctor-model=DIR",
        "--vllm-doctor-fail-on={error,warn,info}",
        "--vllm-doctor-device={auto,cpu,cuda}",
        "--vllm-doctor-report=FILE",
        "--vllm-doctor-fast",
    ):
        assert option in text, option
    assert "where vLLM runs (and a parity check's reference): cpu" in text


def test_the_marker_is_registered_and_selects_the_fixtures_users(pytester: pytest.Pytester) -> None:
    assert "@pytest.mark.vllm_doctor:" in pytester.runpytest("--markers").stdout.str()
    pytester.makepyfile("def test_uses(vllm_doctor):\n    pass\n\ndef test_plain():\n    pass\n")
    result = pytester.runpytest("-m", "not vllm_doctor")
    result.assert_outcomes(passed=1, deselected=1)


def test_no_model_is_a_skip_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "def test_parity(vllm_doctor):\n    vllm_doctor.assert_logprobs_close()\n\n"
        "def test_gone(vllm_doctor):\n    vllm_doctor.assert_checks_pass('/nonexistent/model')\n"
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*vllm-doctor: no model given (pass a directory or --vllm-doctor-model DIR)*",
            "*vllm-doctor: model directory /nonexistent/model does not exist*",
        ]
    )


def test_vllm_missing_is_a_skip_with_the_reason(pytester: pytest.Pytester, models: Path) -> None:
    # sys.modules[name] = None is how Python blocks an import; in a subprocess, so it stays there
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None\n")
    pytester.makepyfile(
        "def test_device(vllm_doctor):\n    vllm_doctor.assert_on_device()\n\n"
        "def test_parity(vllm_doctor):\n    vllm_doctor.assert_logprobs_close()\n"
    )
    result = pytester.runpytest_subprocess("-rs", "--vllm-doctor-model", str(models / "ok" / "model"))
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*vllm-doctor: vllm is not installed (the runtime assertions start a real vLLM engine)*"])


def test_cuda_asked_without_a_gpu_is_a_skip(pytester: pytest.Pytester, models: Path) -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA GPU")
    pytester.makepyfile("def test_device(vllm_doctor):\n    vllm_doctor.assert_on_device()\n")
    result = pytester.runpytest("-rs", "--vllm-doctor-model", str(models / "ok" / "model"), "--vllm-doctor-device", "cuda")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--vllm-doctor-device cuda, but this machine shows no NVIDIA GPU*"])


def test_a_finding_fails_with_the_doctors_message_and_no_traceback(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, models: Path
) -> None:
    broken = models / "architectures-missing" / "model"
    pytester.makepyfile(f"def test_static(vllm_doctor):\n    vllm_doctor.assert_checks_pass({str(broken)!r})\n")
    result = run_with_site(pytester, monkeypatch, models, "architectures-missing", "--vllm-doctor-fast")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert f"vllm-doctor: error-level findings ({broken}):" in text
    assert "VD108 [error]" in text and "fix:" in text
    assert "Traceback" not in text and "def test_static" not in text  # pytrace=False: the message only
    result.stdout.fnmatch_lines(["*= vllm-doctor =*", f"FAIL checks_pass *{broken}  1 finding(s): VD108*"])


def test_answers_are_cached_for_the_session_and_reported(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, models: Path
) -> None:
    model = models / "ok" / "model"
    pytester.makepyfile(
        "import pytest\n\n"
        "@pytest.mark.parametrize('n', range(3))\n"
        "def test_static(vllm_doctor, n):\n    vllm_doctor.assert_checks_pass()\n    vllm_doctor.assert_weights_cover()\n"
    )
    report = pytester.path / "out" / "doctor.json"
    result = run_with_site(
        pytester, monkeypatch, models, "ok",
        "--vllm-doctor-fast", "--vllm-doctor-model", str(model), "--vllm-doctor-report", str(report),
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    data = json.loads(report.read_text())
    assert data["runs"] == {"check": 1}  # six assertions, one static check
    assert [o["assertion"] for o in data["outcomes"]] == ["checks_pass", "weights_cover"] * 3
    assert all(o["ok"] and o["model"] == str(model) for o in data["outcomes"])
    engine = data["options"].pop("engine")  # every engine option, as the session runs the engine assertions
    assert data["options"] == {"model": str(model), "device": "auto", "fail_on": "error", "eager": False}
    assert engine == {**ENGINE_DEFAULTS, "engine_args": {}}
    result.stdout.fnmatch_lines(["*= vllm-doctor =*", f"PASS checks_pass *{model}  no finding*", f"report: {report}"])


def test_fail_on_option_is_used_and_validated(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, models: Path
) -> None:
    pytester.makepyfile("def test_static(vllm_doctor):\n    vllm_doctor.assert_checks_pass()\n")
    model = str(models / "architectures-missing" / "model")
    failed = run_with_site(pytester, monkeypatch, models, "architectures-missing", "--vllm-doctor-fast",
                           "--vllm-doctor-model", model, "--vllm-doctor-fail-on", "error")  # fmt: skip
    failed.assert_outcomes(failed=1)
    bad = pytester.runpytest("--vllm-doctor-fail-on", "nope")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--vllm-doctor-fail-on: invalid choice: 'nope'*"])


def test_assertion_options_holding_a_dict_are_one_cache_entry() -> None:
    """``assert_on_device(engine_args={...})``: the options are a cache key (a dict is not hashable;
    found on the H200, where the tests pass gpu_memory_utilization this way), and the same options
    in another order are the same entry."""
    from vllm_doctor.pytest_plugin.session import DoctorSession, frozen

    session = DoctorSession()
    first = frozen({"engine_args": {"gpu_memory_utilization": 0.15, "max_num_seqs": 4}, "trust_remote_code": False})
    again = frozen({"trust_remote_code": False, "engine_args": {"max_num_seqs": 4, "gpu_memory_utilization": 0.15}})
    assert session.cached(("engine", "/m", first), lambda: "report") == "report"
    assert session.cached(("engine", "/m", again), lambda: pytest.fail("computed twice")) == "report"
    assert session.runs == {"engine": 1}

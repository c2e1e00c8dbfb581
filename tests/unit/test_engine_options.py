"""The engine options are declared once (``vllm_doctor.stages.options.EngineOptions``): the command
line's flags, the API's keywords and the pytest plugin's options are the same set, and every one of
them reaches the engine stage from every front end. The front ends' other options are spelled the
same way in every verb; the old spellings still work for one release and say so on stderr.

The engine stage itself is replaced here (``diagnose_engine``, at the front ends' side) to read the
options it is given: what a real engine does with them is tested in tests/engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_examples
from vllm_doctor.cli import build_parser, main
from vllm_doctor.model import Report
from vllm_doctor.stages.options import EngineOptions, option_names, specs

pytest_plugins = ["pytester"]

# every engine option at a value that is not its default: what each front end is given ...
NOT_DEFAULT: dict[str, Any] = {
    "device": "cpu",
    "eager": True,
    "diagnose": False,
    "max_model_len": 77,
    "kv_cache_memory_bytes": 64 * 2**20,
    "engine_args": {"seed": 3, "dtype": "float32"},
    "multiprocess": True,
    "engine_timeout": 12.5,
    "max_memory": None,  # --max-memory none: no limit (a value, not "not given")
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 3,
    "enable_expert_parallel": True,
    "trust_remote_code": True,
}
# ... and the same as command-line words (the pytest plugin's: the same with --vllm-doctor- in front)
WORDS: dict[str, list[str]] = {
    "device": ["--device", "cpu"],
    "eager": ["--eager"],
    "diagnose": ["--no-diagnosis"],
    "max_model_len": ["--max-model-len", "77"],
    "kv_cache_memory_bytes": ["--kv-cache-memory", "64M"],
    "engine_args": ["--engine-arg", "seed=3", "--engine-arg", "dtype=float32"],
    "multiprocess": ["--multiprocess"],
    "engine_timeout": ["--engine-timeout", "12.5"],
    "max_memory": ["--max-memory", "none"],
    "tensor_parallel_size": ["--tensor-parallel-size", "2"],
    "pipeline_parallel_size": ["--pipeline-parallel-size", "3"],
    "enable_expert_parallel": ["--enable-expert-parallel"],
    "trust_remote_code": ["--trust-remote-code"],
}
CLI_ARGS = [word for words in WORDS.values() for word in words]
PYTEST_ARGS = [f"--vllm-doctor-{w[2:]}" if w.startswith("--") else w for w in CLI_ARGS]


def verbs() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def given(options: EngineOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in option_names()}


# ---- one set ------------------------------------------------------------------------------


def test_the_declared_options_are_the_engine_options() -> None:
    declared = {f.name for f in dataclasses.fields(EngineOptions) if "option" in f.metadata}
    assert declared == set(option_names()) == set(NOT_DEFAULT) == set(WORDS)
    assert all(NOT_DEFAULT[name] != getattr(EngineOptions(), name) for name in NOT_DEFAULT)


@pytest.mark.parametrize("verb", ["check", "profile"])
def test_the_command_line_offers_every_engine_option_under_its_name(verb: str) -> None:
    actions = verbs()[verb]._option_string_actions
    for spec in specs():
        assert actions[f"--{spec.flag}"].dest == spec.name, spec
    run = {"workload", "layers", "sample_every", "step_clock", "probe", "deep_dir"}  # the verb's own: --prompts, --step-clock, ...
    engine_dests = {a.dest for a in set(actions.values())} & {f.name for f in dataclasses.fields(EngineOptions)}
    assert engine_dests - run == set(option_names())


def test_the_api_takes_every_engine_option_as_a_keyword_and_no_other(stage_calls: list[EngineOptions]) -> None:
    import vllm_doctor.api as api

    for function in (api.check_engine, api.profile):
        params = inspect.signature(function).parameters
        assert params["options"].kind is inspect.Parameter.VAR_KEYWORD
        assert not set(params) & set(option_names()), "an engine option spelled twice"
        for name in option_names():  # the docstring lists each, from the same declaration
            assert f"``{name}``" in (function.__doc__ or ""), name
    assert api.engine_option_names() == option_names()


def test_the_pytest_plugin_offers_every_engine_option(pytester: pytest.Pytester) -> None:
    text = pytester.runpytest("--help").stdout.str()
    offered = set(re.findall(r"--vllm-doctor-([a-z-]+)", text)) - {"model", "fail-on", "report", "fast"}
    assert offered == {spec.flag for spec in specs()}
    ini = set(re.findall(r"^  vllm_doctor_([a-z_]+) ", text, re.MULTILINE))  # the same as ini keys
    assert ini == {spec.flag.replace("-", "_") for spec in specs()}


# ---- each reaches the engine stage --------------------------------------------------------


@pytest.fixture
def stage_calls(monkeypatch: pytest.MonkeyPatch) -> list[EngineOptions]:
    """The options each front end hands the engine stage (``diagnose_engine``, replaced)."""
    import vllm_doctor.api
    import vllm_doctor.stages.engine

    calls: list[EngineOptions] = []

    def stage(model: str, options: EngineOptions, static: Report | None = None, **_: Any) -> Report:
        calls.append(options)
        report = static or Report(target=model)
        report.facts["engine_failure"] = "not started: the test reads the options only"
        return report

    monkeypatch.setattr(vllm_doctor.stages.engine, "diagnose_engine", stage)
    monkeypatch.setattr(vllm_doctor.api, "diagnose_engine", stage)
    return calls


def test_check_engine_passes_every_option(stage_calls: list[EngineOptions], monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm_doctor.stages.static
    from vllm_doctor.stages.static import CheckOptions

    static: list[CheckOptions] = []
    monkeypatch.setattr(
        vllm_doctor.stages.static, "diagnose", lambda model, options, progress=None: static.append(options) or Report(target=model)
    )  # fmt: skip
    assert main(["check", "/m", "--engine", "-q", *CLI_ARGS]) == 0
    (options,) = stage_calls
    assert given(options) == NOT_DEFAULT
    # the options that also govern the static passes reach them too
    (check,) = static
    assert (check.tensor_parallel_size, check.pipeline_parallel_size, check.enable_expert_parallel, check.max_memory,
            check.trust_remote_code) == (2, 3, True, None, True)  # fmt: skip


def test_api_check_takes_the_parallel_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """api.check's static checks get the split VD305 checks, as the command line's flags give it."""
    import vllm_doctor.api
    from vllm_doctor.stages.static import CheckOptions

    static: list[CheckOptions] = []
    monkeypatch.setattr(vllm_doctor.api, "diagnose", lambda model, options: static.append(options) or Report(target=model))
    vllm_doctor.api.check("/m", fast=True, tensor_parallel_size=2, pipeline_parallel_size=3, enable_expert_parallel=True)
    (check,) = static
    assert (check.tensor_parallel_size, check.pipeline_parallel_size, check.enable_expert_parallel) == (2, 3, True)


def test_profile_passes_every_option(
    stage_calls: list[EngineOptions], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import vllm_doctor.cli.profile

    monkeypatch.setattr(vllm_doctor.cli.profile, "write_reports", lambda out, report: [])
    assert main(["profile", "/m", "--out", str(tmp_path), "-q", "--prompts", "3", *CLI_ARGS]) == 1  # engine_failure
    (options,) = stage_calls
    assert given(options) == NOT_DEFAULT
    assert options.workload.prompts == 3


def test_the_api_passes_every_option(stage_calls: list[EngineOptions]) -> None:
    import vllm_doctor

    vllm_doctor.check_engine("/m", **NOT_DEFAULT)
    vllm_doctor.profile("/m", prompts=3, layers=False, **NOT_DEFAULT)
    assert [given(o) for o in stage_calls] == [NOT_DEFAULT, NOT_DEFAULT]
    assert (stage_calls[1].workload.prompts, stage_calls[1].layers) == (3, False)
    vllm_doctor.check_engine("/m")
    assert stage_calls[2] == EngineOptions()


def test_the_pytest_plugin_passes_every_option(stage_calls: list[EngineOptions], pytester: pytest.Pytester) -> None:
    """``--vllm-doctor-device`` among them: it used to reach the cache key, not the engine stage."""
    model = pytester.mkdir("model")
    pytester.makepyfile(
        f"def test_device(vllm_doctor):\n    vllm_doctor.assert_on_device({str(model)!r})\n\n"
        f"def test_own(vllm_doctor):\n    vllm_doctor.assert_on_device({str(model)!r}, eager=False, max_model_len=99)\n"
    )
    pytester.runpytest(*PYTEST_ARGS).assert_outcomes(passed=2)
    session, own = stage_calls
    assert given(session) == NOT_DEFAULT
    assert given(own) == {**NOT_DEFAULT, "eager": False, "max_model_len": 99}  # an assertion's keyword wins


def test_the_pytest_ini_keys_pass_every_option_and_the_command_line_wins(
    stage_calls: list[EngineOptions], pytester: pytest.Pytester
) -> None:
    model = pytester.mkdir("model")
    lines = []
    for spec in specs():
        words = WORDS[spec.name]
        key = "vllm_doctor_" + spec.flag.replace("-", "_")
        if spec.kind == "pairs":
            lines.append(f"{key} =\n" + "".join(f"    {v}\n" for v in words[1::2]))
        else:
            lines.append(f"{key} = {words[1] if len(words) > 1 else 'true'}\n")
    ini = "[pytest]\n" + "".join(lines)
    pytester.makeini(ini)
    pytester.makepyfile(f"def test_device(vllm_doctor):\n    vllm_doctor.assert_on_device({str(model)!r})\n")
    pytester.runpytest().assert_outcomes(passed=1)
    pytester.runpytest("--vllm-doctor-max-model-len", "88").assert_outcomes(passed=1)
    assert [given(o) for o in stage_calls] == [NOT_DEFAULT, {**NOT_DEFAULT, "max_model_len": 88}]
    pytester.makeini("[pytest]\nvllm_doctor_device = gpu\n")
    bad = pytester.runpytest()
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "vllm_doctor_device in " in bad.stderr.str() and "expected one of auto, cpu, cuda, got 'gpu'" in bad.stderr.str()


def test_an_unknown_keyword_is_a_type_error_naming_the_options(stage_calls: list[EngineOptions]) -> None:
    import vllm_doctor

    with pytest.raises(TypeError, match=r"check_engine\(\) got an unexpected keyword argument 'max_model_length'; "
                       r"engine options: device, eager, .*max_model_len"):  # fmt: skip
        vllm_doctor.check_engine("/m", max_model_length=512)
    assert stage_calls == []


def test_the_old_api_keyword_timeout_warns_and_is_the_engine_timeout(stage_calls: list[EngineOptions]) -> None:
    import vllm_doctor

    with pytest.warns(DeprecationWarning, match=r"check_engine\(\): timeout= is deprecated; use engine_timeout="):
        vllm_doctor.check_engine("/m", timeout=30.0)
    assert stage_calls[0].engine_timeout == 30.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vllm_doctor.check_engine("/m", engine_timeout=30.0)


def test_cuda_asked_without_a_gpu_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before anything starts: the engine stage is replaced by a failure."""
    import vllm_doctor.stages.engine as stage
    from vllm_doctor.errors import DoctorInputError

    monkeypatch.setattr(stage, "run_engine_stage", lambda *a, **k: pytest.fail("the engine stage started"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DoctorInputError, match="device cuda was asked for, but this machine shows no NVIDIA GPU"):
        stage.diagnose_engine("/m", EngineOptions(device="cuda"))


# ---- one spelling per thing across the verbs ----------------------------------------------

OLD = {"--seconds", "--output", "-o", "--timeout"}


def test_no_verb_shows_an_old_spelling_and_each_server_is_named_by_url() -> None:
    for name, parser in verbs().items():
        shown = {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
        assert not shown & OLD, (name, shown & OLD)
        help_text = parser.format_help()
        assert not re.search(r"(?<![\w-])(--seconds|--output|--timeout)(?![\w-])", help_text), name
        positionals = [a.dest for a in parser._actions if not a.option_strings and a.help != argparse.SUPPRESS]
        assert "url" not in positionals, name
    for name in ("attach", "top", "stacks", "cpu-profile"):
        assert "--url" in verbs()[name]._option_string_actions, name
    for name in ("check", "profile", "attach", "cpu-profile"):
        assert "--out" in verbs()[name]._option_string_actions, name
    for name in ("attach", "top", "cpu-profile"):
        assert "--duration" in verbs()[name]._option_string_actions, name


OLD_SPELLINGS = [
    # (argv, the new option's dest, its value, the note's words)
    (["check", "/m", "-o", "r.json"], "out", "r.json", "-o is deprecated and will be removed; use --out"),
    (["check", "/m", "--output", "r.json"], "out", "r.json", "--output is deprecated and will be removed; use --out"),
    (["check", "/m", "--timeout", "5"], "import_timeout", 5.0, "--timeout is deprecated and will be removed; use --import-timeout"),
    (["attach", "--url", "u", "--seconds", "7"], "duration", 7.0, "--seconds is deprecated and will be removed; use --duration"),
    (["attach", "--url", "u", "--timeout", "3"], "request_timeout", 3.0, "--timeout is deprecated and will be removed; use --request-timeout"),
    (["top", "--url", "u", "--seconds", "9"], "duration", 9.0, "--seconds is deprecated and will be removed; use --duration"),
    (["stacks", "--pid", "1", "--timeout", "4"], "pyspy_timeout", 4.0, "--timeout is deprecated and will be removed; use --pyspy-timeout"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "dest", "value", "note"), OLD_SPELLINGS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_each_old_spelling_still_works_and_warns(
    argv: list[str], dest: str, value: Any, note: str, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert capsys.readouterr().err == f"vllm-doctor: warning: {note}\n"  # one line
    at = next(i for i, w in enumerate(argv) if w in OLD)
    new = build_parser().parse_args(argv[:at] + argv[at + 2 :])  # without the old flag: the default, no note
    assert getattr(new, dest) != value and capsys.readouterr().err == ""


@pytest.mark.parametrize("verb", ["attach", "top"])
def test_a_positional_url_still_works_and_warns(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The server is named by --url; ``top URL`` / ``attach URL`` still run (here: against a port with
    no server, exit 2), with the one-line note first."""
    url = "http://127.0.0.1:9"  # discard: nothing answers
    assert main([verb, url, *(["--once"] if verb == "top" else ["--duration", "0"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"vllm-doctor: warning: the positional URL (vllm-doctor {verb} URL) is deprecated and will be removed; "
        f"use vllm-doctor {verb} --url URL\n"
    )
    assert main([verb, "--url", url, *(["--once"] if verb == "top" else ["--duration", "0"])]) == 2
    assert "deprecated" not in capsys.readouterr().err
    assert main([verb]) == 2
    assert "no server given" in capsys.readouterr().err


def test_check_o_still_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_examples(tmp_path / "ex", "ok") / "ok" / "model"
    out = tmp_path / "out.json"
    code = main(["check", str(model), "--fast", "-q", "--out", str(out)])
    findings = [f["code"] for f in json.loads(out.read_text())["findings"]]
    assert findings and "deprecated" not in capsys.readouterr().err
    for old in ("-o", "--output"):
        out = tmp_path / f"{old.strip('-')}.json"
        assert main(["check", str(model), "--fast", "-q", old, str(out)]) == code
        assert [f["code"] for f in json.loads(out.read_text())["findings"]] == findings
        assert capsys.readouterr().err == f"vllm-doctor: warning: {old} is deprecated and will be removed; use --out\n"


def test_docs_options_lists_every_engine_option() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "options.md").read_text(encoding="utf-8")
    for spec in specs():
        assert f"| `{spec.name}` | `--{spec.flag}" in text and f"`--vllm-doctor-{spec.flag}`" in text, spec.name


def test_the_step_clock_reaches_the_engine_stage_from_the_cli_and_the_api(
    stage_calls: list[EngineOptions], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One option, one path: ``profile --step-clock`` and ``vllm_doctor.profile(step_clock=)`` hand
    the engine stage the same EngineOptions field (the child attaches with it); the process
    environment is left alone."""
    import vllm_doctor.api
    import vllm_doctor.cli.profile
    from vllm_doctor.constants import STEP_CLOCK_ENV
    from vllm_doctor.errors import DoctorInputError

    monkeypatch.delenv(STEP_CLOCK_ENV, raising=False)
    monkeypatch.setattr(vllm_doctor.cli.profile, "write_reports", lambda out, report: [])
    assert main(["profile", "/m", "--out", str(tmp_path), "-q", "--step-clock", "every"]) == 1  # engine_failure
    vllm_doctor.api.profile("/m", step_clock="every")
    main(["profile", "/m", "--out", str(tmp_path), "-q"])
    assert [o.step_clock for o in stage_calls] == ["every", "every", None]
    assert STEP_CLOCK_ENV not in os.environ
    with pytest.raises(DoctorInputError, match="step_clock must be one of sampled, every"):
        vllm_doctor.api.profile("/m", step_clock="sometimes")
    with pytest.raises(SystemExit) as exited:
        main(["profile", "/m", "--out", str(tmp_path), "--step-clock", "sometimes"])
    assert exited.value.code == 2

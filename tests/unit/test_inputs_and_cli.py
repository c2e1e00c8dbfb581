"""Bad input gives one clear line and exit 2, never a traceback; output contracts of the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.cli import build_parser, main
from vllm_doctor.files import write_json_atomic
from vllm_doctor.model import Finding, Outcome, Report, Severity
from vllm_doctor.probes.script_scan import scan_script


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True, timeout=120,
                          env=env or dict(os.environ), stdin=subprocess.DEVNULL)


def model(tmp_path: Path, raw: bytes | None) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    if raw is not None:
        (d / "config.json").write_bytes(raw)
    return d


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: str(p / "nope"), "no such file or directory"),
        (lambda p: str(model(p, b"{}") / "config.json"), "is a file, not a model directory"),
        (lambda p: str(model(p, None)), "no config.json in this directory"),
        (lambda p: str(model(p, b'{"architectures": ["X"],}')), "invalid JSON at line 1"),
        (lambda p: str(model(p, b'{"model_type": "\xff\xfe"}')), "not UTF-8 text"),
        (lambda p: str(model(p, b"[1, 2]")), "expected a JSON object, found list"),
        (lambda p: "some-org/some-model-not-cached", "no copy in the local Hugging Face cache"),
    ],
)
def test_bad_input_is_one_clear_message_and_exit_2(tmp_path: Path, make, expected: str) -> None:
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"))
    proc = cli("check", make(tmp_path), "--fast", env=env)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("vllm-doctor: error: ")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = cli("--debug", "check", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_hub_id_resolves_from_the_local_hf_cache(tmp_path: Path) -> None:
    snap = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    proc = cli("check", "org/tiny", "--fast", "--json", "-q", env=dict(os.environ, HF_HOME=str(tmp_path / "hf")))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["target"] == str(snap.resolve())


def test_config_that_parses_but_is_wrong_is_a_finding_not_an_input_error(tmp_path: Path) -> None:
    proc = cli("check", str(model(tmp_path, b'{"model_type": "llama"}')), "--fast", "--json", "-q")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert [(f["code"], f["subject"]) for f in data["findings"] if f["outcome"] == "fail"] == [
        ("VD108", "config.json:architectures")]


def test_fail_on_threshold_sets_the_exit_code(tmp_path: Path) -> None:
    d = model(tmp_path, b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    assert cli("check", str(d), "--fast", "-q").returncode == 0
    # VD110-style info findings do not exist here; a warn does: Olmo resolves to the Transformers backend
    (d / "config.json").write_text('{"architectures": ["OlmoForCausalLM"], "model_type": "olmo"}')
    assert cli("check", str(d), "--fast", "-q").returncode == 0
    assert cli("check", str(d), "--fast", "-q", "--fail-on", "warn").returncode == 1


def test_rules_and_rule_render_from_the_metadata() -> None:
    rules = json.loads(cli("rules", "--json").stdout)
    assert [r["code"] for r in rules][:4] == ["VD100", "VD101", "VD102", "VD103"]
    text = cli("rule", "VD103").stdout
    assert text.startswith("VD103 registered-under-wrong-name (error, static stage)")
    assert "Fix\n" in text and "vllm-project/vllm#11229" in text
    assert cli("rule", "architecture-not-registered").stdout.startswith("VD101")
    bad = cli("rule", "VD000")
    assert bad.returncode == 2 and "no check named 'VD000'" in bad.stderr


def test_help_explains_passes_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["check", "--help"])
    out = capsys.readouterr().out
    for needle in ("fast pass", "import pass", "exit codes: 0", "--fail-on", "--trust-remote-code", "--script"):
        assert needle in out
    assert main([]) == 2


def test_report_json_round_trips_and_matches_the_documented_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    report = Report(target="/m", findings=[Finding("VD101", Outcome.FAIL, Severity.ERROR, "msg", "config.json:architectures[0]", {"k": 1}, "fix")])
    data = report.to_dict()
    assert Report.from_dict(data).to_dict() == data
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "report-schema.json").read_text())
    jsonschema.validate(data, schema)


def test_json_reports_are_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.json"
    target.write_text('{"old": true}')

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_json_atomic(target, {"new": True})
    assert json.loads(target.read_text()) == {"old": True}
    assert list(tmp_path.iterdir()) == [target]


def test_script_scan_tells_module_level_from_main_guard_and_functions(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(
        "from vllm import ModelRegistry\n"
        "ModelRegistry.register_model('A', 'a:A')\n"
        "def main():\n    ModelRegistry.register_model('B', 'b:B')\n"
        "if __name__ == '__main__':\n    ModelRegistry.register_model('C', 'c:C')\n"
    )
    scopes = {r["arch"]: r["scope"] for r in scan_script(script)}
    assert scopes == {"A": "module", "B": "function main()", "C": "the `if __name__ == '__main__':` block"}


def test_atomic_reports_get_ordinary_file_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = write_json_atomic(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644

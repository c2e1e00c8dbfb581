"""What the doctor hands to vLLM (issue 47, items 15-17): the model directory's files vetted before any
child gets it (VD113: links out, FIFOs, oversized settings files; nothing opened), the bounds of
config.json everywhere (VD309: a hybrid's layer pattern, the vision tower's sizes) and regular
expressions from the user's quantization config run only within a bound (VD316). Each stops the
children that would hand vLLM what the doctor refused, with the reason; no vLLM import here (the
children's side: tests/integration/test_hostile_children.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.weights import write_raw_safetensors
from vllm_doctor.checks import run_checks
from vllm_doctor.checks.config_sizes import config_size_problems
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Outcome
from vllm_doctor.probes.model_files import refused_files

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": False}
TENSORS = {
    "model.embed_tokens.weight": ("BF16", [64, 16]),
    "model.norm.weight": ("BF16", [16]),
    "lm_head.weight": ("BF16", [64, 16]),
}
QUANT_TENSORS = {
    **TENSORS,
    "model.layers.0.mlp.down_proj.weight": ("U8", [16, 32]),
    "model.layers.0.mlp.down_proj.weight_scale": ("F32", [16, 1]),
}
REDOS = "re:(.|.)*Z"


def model(tmp_path: Path, config: dict[str, Any] | None = None, name: str = "m",
          tensors: dict[str, Any] | None = None) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config if config is not None else LLAMA))
    write_raw_safetensors(d / "model.safetensors", tensors or TENSORS)
    return d


def check_fast(d: Path, *args: str, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "check", str(d), "--fast", "--json", "-q", *args],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def problems(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code and f["outcome"] == "fail"]


# --- item 15: files of the model directory that link out, block or are oversized ----------------------


def test_a_processor_file_linking_out_is_vd113_naming_where_it_points_and_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "outside-fifo")  # opening it would block: the run finishing shows it was not opened
    (tmp_path / "secret.txt").write_text("root:x:0:0")
    d = model(tmp_path)
    (d / "processor_config.json").symlink_to(tmp_path / "outside-fifo")
    (d / "preprocessor_config.json").symlink_to("../secret.txt")
    code, report = check_fast(d, timeout=30)
    assert code == 1
    found = {f["subject"]: f for f in problems(report, "VD113")}
    assert sorted(found) == ["preprocessor_config.json", "processor_config.json"]
    assert found["processor_config.json"]["message"].startswith(
        f"processor_config.json is a symlink to {tmp_path / 'outside-fifo'}, outside the model directory: "
    )
    assert f"a symlink to {tmp_path / 'secret.txt'}" in found["preprocessor_config.json"]["message"]
    assert "does not hand the directory to vLLM" in found["preprocessor_config.json"]["message"]
    assert found["processor_config.json"]["evidence"]["kind"] == "links-outside"


def test_refused_files_lists_links_out_fifos_and_oversized_settings_and_allows_the_rest(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_text("{}")
    d = model(tmp_path)
    (d / "generation_config.json").write_text("{}")
    (d / "chat_template.jinja").symlink_to("generation_config.json")  # a link inside the directory: fine
    os.mkfifo(d / "tokenizer_config.json")
    with open(d / "preprocessor_config.json", "wb") as fh:  # 1 GiB, sparse: no disk, but a reader's memory
        fh.truncate(1 << 30)
    (d / "sub").mkdir()
    (d / "sub" / "vocab.json").symlink_to(tmp_path / "elsewhere.json")
    (d / "shard.safetensors").symlink_to(tmp_path / "elsewhere.json")
    got = {r.name: (r.kind, r.checkpoint) for r in refused_files(d)}
    assert got == {
        "preprocessor_config.json": ("too-large", False),
        "shard.safetensors": ("links-outside", True),
        "sub/vocab.json": ("links-outside", False),
        "tokenizer_config.json": ("not-regular", False),
    }
    (big,) = [r for r in refused_files(d) if r.kind == "too-large"]
    assert big.describe() == "preprocessor_config.json is 1,024.0 MiB, over vllm-doctor's limit of 16 MiB for this file"


def test_a_hugging_face_snapshot_linking_into_its_blobs_is_not_refused(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (repo / "blobs" / "c0nf1g").write_text(json.dumps(LLAMA))
    (repo / "blobs" / "pr0c").write_text("{}")
    (snap / "config.json").symlink_to("../../blobs/c0nf1g")
    (snap / "processor_config.json").symlink_to("../../blobs/pr0c")
    assert refused_files(snap) == []


def test_a_refused_file_stops_the_weights_pass_and_the_import_pass_verdict(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.probes.import_probe import handover_refusal
    from vllm_doctor.stages import weights as weights_stage
    from vllm_doctor.stages.static import CheckOptions

    d = model(tmp_path)
    assert handover_refusal(str(d)) is None
    (tmp_path / "elsewhere.json").write_text("{}")
    (d / "processor_config.json").symlink_to(tmp_path / "elsewhere.json")
    why = handover_refusal(str(d))  # the import pass's child asks this before vLLM sees the directory
    assert why == (
        f"vllm-doctor does not hand the model directory to vLLM: processor_config.json is a symlink to "
        f"{tmp_path / 'elsewhere.json'}, outside the model directory (see VD113)"
    )
    monkeypatch.setattr(weights_stage, "ChildJob", lambda *a, **k: pytest.fail("the weights child was started"))
    facts = Facts(model_dir=str(d), config=dict(LLAMA))
    assert weights_stage.start_weights_pass(facts, CheckOptions(fast=False), ["VD301", "VD113"]) is None
    assert facts.weight_load_error == why
    (finding,) = run_checks(facts, ["VD301"])
    assert finding.outcome is Outcome.SKIP and "see VD113" in finding.message


def test_a_refused_file_stops_the_engine_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_doctor.cli import main
    from vllm_doctor.stages import engine as engine_stage

    d = model(tmp_path)
    (tmp_path / "elsewhere.json").write_text("{}")
    (d / "preprocessor_config.json").symlink_to(tmp_path / "elsewhere.json")
    monkeypatch.setattr(engine_stage, "run_engine_stage", lambda *a, **k: pytest.fail("the engine was started"))
    assert main(["check", str(d), "--fast", "--engine", "--json", "-q"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["facts"]["engine_failure"] == (
        "the engine stage was not started: a file of the model directory links outside it, blocks or is oversized "
        "(VD113)"
    )


# --- item 17: the bounds config.json has, everywhere -----------------------------------------------------


def test_a_layer_pattern_of_a_million_layers_is_vd309_and_no_model_is_built(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.stages import weights as weights_stage
    from vllm_doctor.stages.static import CheckOptions

    config = {**LLAMA, "num_hidden_layers": 4, "hybrid_override_pattern": "M" * 10**6}
    (finding,) = run_checks(Facts(model_dir="/m", config=config), ["VD309"])
    assert finding.outcome is Outcome.FAIL and finding.subject == "config.json:hybrid_override_pattern"
    assert finding.hint == "write one entry per layer the model has (num_hidden_layers of them) in hybrid_override_pattern"
    assert finding.message.endswith(
        ": names 1,000,000 layers: over 10,000, vllm-doctor's plausibility limit for num_hidden_layers"
    )
    listed = {**LLAMA, "text_config": {"layer_types": ["full_attention"] * 20_000}}
    assert [p["key"] for p in config_size_problems(listed)] == ["text_config.layer_types"]
    d = model(tmp_path, config)
    monkeypatch.setattr(weights_stage, "ChildJob", lambda *a, **k: pytest.fail("the weights child was started"))
    facts = Facts(model_dir=str(d), config=config)
    assert weights_stage.start_weights_pass(facts, CheckOptions(fast=False), ["VD301"]) is None
    assert "hybrid_override_pattern = " in str(facts.weight_load_error) and "see VD309" in str(facts.weight_load_error)


@pytest.mark.parametrize(
    ("vision", "subject", "why"),
    [
        ({"image_size": 10**6, "patch_size": 14}, "vision_config.image_size",
         "is over 8,192, vllm-doctor's plausibility limit for image_size"),
        ({"image_size": 8000, "patch_size": 1}, "vision_config.patch_size",
         "cuts an image of 8,000 pixels a side into 64,000,000 patches (over 262,144, vllm-doctor's plausibility "
         "limit)"),
        ({"hidden_size": 1 << 30}, "vision_config.hidden_size",
         "is over 65,536, vllm-doctor's plausibility limit for hidden_size"),
        ({"num_hidden_layers": 0}, "vision_config.num_hidden_layers", "must be at least 1"),
    ],
)  # fmt: skip
def test_vision_tower_sizes_are_bounded(tmp_path: Path, vision: dict[str, Any], subject: str, why: str) -> None:
    from vllm_doctor.probes.import_probe import handover_refusal

    config = {**LLAMA, "vision_config": {"hidden_size": 64, **vision}}
    (finding,) = run_checks(Facts(model_dir="/m", config=config), ["VD309"])
    assert finding.subject == f"config.json:{subject}" and finding.message.endswith(f": {why}")
    d = model(tmp_path, config)
    assert f"vision tower sizes are over vllm-doctor's bounds ({subject} = " in str(handover_refusal(str(d)))


def test_plausible_vision_sizes_and_pairs_pass() -> None:
    config = {**LLAMA, "vision_config": {"hidden_size": 1152, "image_size": [896, 896], "patch_size": 14,
                                         "num_hidden_layers": 27, "num_attention_heads": 16}}  # fmt: skip
    assert config_size_problems(config) == []


# --- item 16: regular expressions from the user's quantization config ------------------------------------


def test_a_catastrophic_ignore_pattern_is_never_run_in_the_doctors_process() -> None:
    """Before: ``re.match('(.|.)*Z', name)`` ran in the doctor's process (337 s in the issue). A child
    runs the matching so that a hang is a time-out here (Python cannot interrupt a match)."""
    code = (
        "from vllm_doctor.facts.quant_checkpoint import checkpoint_quant\n"
        "from vllm_doctor.facts.quant import QuantFacts, QuantLayer\n"
        f"cfg = {{'quantization_config': {{'quant_method': 'compressed-tensors', 'ignore': ['lm_head', {REDOS!r}]}}}}\n"
        "ckq = checkpoint_quant(cfg, [])\n"
        "name = 'model.language_model.layers.17.mlp.experts.down_proj'\n"
        "assert ckq.ignored(name) is None and ckq.ignored('model.lm_head') == 'lm_head'\n"
        f"quant = QuantFacts(method='compressed-tensors', ignore=[{REDOS!r}])\n"
        "assert not quant.ignored(QuantLayer(name=name))\n"
        "print(ckq.unbounded)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "quantization_config.ignore[1]" in proc.stdout and "alternatives inside a repetition" in proc.stdout


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("(.|.)*Z", "it has alternatives inside a repetition"),
        (r"(\w+\.)*Z", "it has a repetition inside a repetition"),
        ("(a+)+b", "it has a repetition inside a repetition"),
        (r"(a)\1", "it has a backreference"),
        (".*.*.*.*Z", "it has 4 unbounded repetitions (vllm-doctor runs at most 3"),
        ("x" * 300, "it is 300 characters long (vllm-doctor runs at most 256)"),
        (".*lm_head", None),
        (r".*self_attn\.(q|k|v)_proj$", None),
        (r"model\.layers\.\d+\.mlp\.(gate|up)_proj$", None),
        (r".*layers\.\d+\..*", None),
    ],
)
def test_pattern_bounds(pattern: str, problem: str | None) -> None:
    from vllm_doctor.facts.user_regex import bounded_match, pattern_problem

    got = pattern_problem(pattern)
    assert (got is None) if problem is None else (got is not None and got.startswith(problem)), got
    if problem is None:
        assert bounded_match(pattern, "model.layers.3.self_attn.q_proj") is not None


def test_an_unbounded_pattern_is_vd316_and_stops_the_weights_pass_and_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_doctor.cli import main
    from vllm_doctor.stages import engine as engine_stage
    from vllm_doctor.stages import weights as weights_stage
    from vllm_doctor.stages.static import CheckOptions

    qconfig = {"quant_method": "compressed-tensors", "ignore": ["lm_head", REDOS],
               "config_groups": {"g": {"targets": ["Linear"], "weights": {"type": "int", "num_bits": 8}}}}  # fmt: skip
    config = {**LLAMA, "quantization_config": qconfig}
    d = model(tmp_path, config, tensors=QUANT_TENSORS)
    code, report = check_fast(d, "--select", "VD316", timeout=30)
    assert code == 1
    (finding,) = problems(report, "VD316")
    assert finding["subject"] == "config.json:quantization_config.ignore[1]"
    assert finding["message"].startswith(
        "quantization_config.ignore[1] = 're:(.|.)*Z': a regular expression vllm-doctor does not run: it has "
        "alternatives inside a repetition"
    )
    monkeypatch.setattr(weights_stage, "ChildJob", lambda *a, **k: pytest.fail("the weights child was started"))
    facts = Facts(model_dir=str(d), config=config)
    assert weights_stage.start_weights_pass(facts, CheckOptions(fast=False), ["VD301"]) is None
    assert "see VD316): the model was not built" in str(facts.weight_load_error)
    monkeypatch.setattr(engine_stage, "run_engine_stage", lambda *a, **k: pytest.fail("the engine was started"))
    assert main(["check", str(d), "--fast", "--engine", "--json", "-q"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert "regular expression vllm-doctor does not run (VD316)" in data["facts"]["engine_failure"]


def test_a_method_mismatch_alone_does_not_stop_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only VD316's pattern findings block; a method mismatch is what the engine stage shows."""
    from vllm_doctor.model import Finding, Report, Severity
    from vllm_doctor.stages.engine import blocking_findings

    mismatch = Finding("VD316", Outcome.FAIL, Severity.ERROR, "m", "config.json:quantization_config", {"config_method": "fp8"})
    pattern = Finding("VD316", Outcome.FAIL, Severity.ERROR, "m", "x", {"kind": "unbounded-pattern"})
    report = Report(target="/m")
    report.findings = [mismatch]
    assert blocking_findings(report) == []
    report.findings = [mismatch, pattern]
    assert blocking_findings(report) == [pattern]


def test_fp8_ignored_layers_and_modules_to_not_convert_are_the_ignore_list() -> None:
    """VD314 reads the config's own ignore list under each method's key (vLLM's fp8 reads ignored_layers)."""
    from vllm_doctor.facts.quant_checkpoint import checkpoint_quant

    fp8 = {"quantization_config": {"quant_method": "fp8", "ignored_layers": ["model.layers.0.mlp.down_proj"]}}
    assert checkpoint_quant(fp8, []).ignored("model.layers.0.mlp.down_proj") == "model.layers.0.mlp.down_proj"
    bnb = {"quantization_config": {"quant_method": "awq", "modules_to_not_convert": ["visual"]}}
    assert checkpoint_quant(bnb, []).ignored("visual") == "visual"


def test_the_parity_check_refuses_the_directory_before_either_side_gets_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """compare_with_reference / the pytest plugin's parity: vLLM's side and transformers' side both
    open the directory's files; neither child is started for a directory VD113 refuses."""
    from vllm_doctor.stages import parity

    d = model(tmp_path)
    (tmp_path / "elsewhere.json").write_text("{}")
    (d / "processor_config.json").symlink_to(tmp_path / "elsewhere.json")
    monkeypatch.setattr(parity, "ChildJob", lambda *a, **k: pytest.fail("a parity child was started"))
    with pytest.raises(parity.ParityUnavailable, match=r"processor_config\.json is a symlink to .*see VD113"):
        parity.run_parity(str(d), parity.ParityOptions())
    with pytest.raises(parity.ParityUnavailable, match="see VD113"):
        parity.ParityEngine(str(d), {})

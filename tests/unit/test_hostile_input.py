"""Hostile and odd model directories: one clear message, the right exit code, and no path opened
outside the model directory (a FIFO outside it stands in for a file the doctor must not open:
opening it would block, so a test that opens it times out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.weights import write_raw_safetensors
from vllm_doctor.checks import run_checks
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Outcome
from vllm_doctor.probes.model_dir import find_in_hf_cache, resolve_model_dir
from vllm_doctor.probes.paths import model_roots
from vllm_doctor.probes.safetensors_header import read_checkpoint

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": False}
TENSORS = {
    "model.embed_tokens.weight": ("BF16", [64, 16]),
    "model.norm.weight": ("BF16", [16]),
    "lm_head.weight": ("BF16", [64, 16]),
}


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_doctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or dict(os.environ),
        stdin=subprocess.DEVNULL,
    )


def finishes(fn: Any, timeout: float = 10) -> Any:
    """fn() must return (or raise) within timeout: opening a FIFO for reading would block."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not finish within {timeout} s (it opened something it should not)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def input_error(fn: Any) -> DoctorInputError:
    with pytest.raises(DoctorInputError) as info:
        finishes(fn)
    return info.value


def model(tmp_path: Path, config: dict[str, Any] | None = None, name: str = "m") -> Path:
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


def hf_cache(tmp_path: Path, repo: str = "org--tiny", rev: str = "abc123") -> tuple[Path, Path]:
    """A Hugging Face cache repo laid out as huggingface_hub writes it: snapshot files are
    symlinks to ../../blobs/<hash>. Returns (HF_HOME, snapshot dir)."""
    home = tmp_path / "hf"
    repo_dir = home / "hub" / f"models--{repo}"
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / rev
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(rev)
    (blobs / "c0nf1g").write_text(json.dumps(LLAMA))
    write_raw_safetensors(blobs / "we1ght", TENSORS)
    (blobs / "1ndex").write_text(json.dumps({"weight_map": {k: "model.safetensors" for k in TENSORS}}))
    for name, blob in (("config.json", "c0nf1g"), ("model.safetensors", "we1ght"), ("model.safetensors.index.json", "1ndex")):
        (snap / name).symlink_to(Path("../../blobs") / blob)
    return home, snap


# --- 1. symlinks out of the model directory; the Hugging Face cache layout --------------------------


def test_config_symlink_out_of_the_dir_is_refused_without_opening_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "outside-fifo")
    d = model(tmp_path)
    (d / "config.json").symlink_to(tmp_path / "outside-fifo")
    err = input_error(lambda: resolve_model_dir(str(d)))
    assert "is a symlink to" in err.message and "outside the model directory" in err.message
    assert str(tmp_path / "outside-fifo") in err.message
    # a readable, valid file outside is refused the same way (it is not read either)
    (tmp_path / "outside.json").write_text(json.dumps(LLAMA))
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("../outside.json")
    assert "outside the model directory" in input_error(lambda: resolve_model_dir(str(d))).message


def test_config_symlink_out_of_the_dir_exits_2_on_the_cli(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "outside-fifo")
    d = model(tmp_path)
    (d / "config.json").symlink_to(tmp_path / "outside-fifo")
    proc = cli("check", str(d), "--fast", timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("vllm-doctor: error: ") and "outside the model directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_symlink_inside_the_dir_is_followed(tmp_path: Path) -> None:
    d = model(tmp_path)
    (d / "real").mkdir()
    (d / "real" / "config.json").write_text(json.dumps(LLAMA))
    (d / "config.json").symlink_to("real/config.json")
    assert resolve_model_dir(str(d)).config == LLAMA


def test_dangling_and_looping_config_symlinks_are_input_errors(tmp_path: Path) -> None:
    d = model(tmp_path)
    (d / "config.json").symlink_to("missing.json")
    assert "dangling symlink" in input_error(lambda: resolve_model_dir(str(d))).message
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("config.json")
    assert "config.json" in input_error(lambda: resolve_model_dir(str(d))).message


def test_hf_snapshot_links_into_its_own_blobs_are_allowed(tmp_path: Path) -> None:
    _home, snap = hf_cache(tmp_path)
    assert model_roots(snap) == (str(snap.resolve()), str((snap.parent.parent / "blobs").resolve()))
    assert resolve_model_dir(str(snap)).config == LLAMA
    ck = read_checkpoint(snap)
    assert ck.problems == [] and ck.complete and len(ck.tensors) == 3
    facts = Facts(model_dir=str(snap), config=LLAMA, checkpoint=ck)
    outcomes = {f.code: f.outcome for f in run_checks(facts, ["VD306", "VD308"])}
    assert outcomes == {"VD306": Outcome.PASS, "VD308": Outcome.PASS}


def test_hf_cache_check_passes_on_the_cli(tmp_path: Path) -> None:
    home, snap = hf_cache(tmp_path)
    proc = cli("check", "org/tiny", "--fast", "--json", "-q", env=dict(os.environ, HF_HOME=str(home)))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["target"] == str(snap.resolve())
    outcomes = {f["code"]: f["outcome"] for f in data["findings"] if f["code"] in ("VD306", "VD308")}
    assert outcomes == {"VD306": "pass", "VD308": "pass"}


def test_hf_snapshot_links_into_another_repo_or_out_of_the_cache_are_refused(tmp_path: Path) -> None:
    _home, snap = hf_cache(tmp_path)
    _other_home, other = hf_cache(tmp_path / "other", repo="org--other")
    os.mkfifo(tmp_path / "outside-fifo")
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(other / "config.json")  # resolves into ANOTHER repo's blobs
    assert "outside the model directory" in input_error(lambda: resolve_model_dir(str(snap))).message
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(Path("../../blobs/c0nf1g"))
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(tmp_path / "outside-fifo")
    (snap / "model.safetensors.index.json").unlink()
    (snap / "model.safetensors.index.json").symlink_to(tmp_path / "outside-fifo")
    ck = finishes(lambda: read_checkpoint(snap))
    assert sorted(p.kind for p in ck.problems) == ["file-outside-dir", "index-outside-dir"], ck.problems
    findings = run_checks(Facts(model_dir=str(snap), config=LLAMA, checkpoint=ck), ["VD306"])
    assert {f.outcome for f in findings} == {Outcome.FAIL}


def test_a_plain_dir_named_like_a_snapshot_gets_no_blobs_allowance(tmp_path: Path) -> None:
    d = tmp_path / "not-a-cache" / "snapshots" / "x"
    d.mkdir(parents=True)
    assert model_roots(d) == (str(d.resolve()),)


@pytest.mark.parametrize("ref", ["../../..", "..", "../../../elsewhere", "a/b", "/etc", ""])
def test_hf_ref_that_is_not_a_plain_revision_is_not_followed(tmp_path: Path, ref: str) -> None:
    home, _snap = hf_cache(tmp_path)
    (home / "hub" / "models--org--tiny" / "refs" / "main").write_text(ref)
    elsewhere = tmp_path / "hf" / "hub" / "elsewhere"  # what ../../../elsewhere would reach
    elsewhere.mkdir()
    os.mkfifo(elsewhere / "config.json")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(home))
        mp.delenv("HF_HUB_CACHE", raising=False)
        err = input_error(lambda: find_in_hf_cache("org/tiny"))
    assert "not a revision name" in err.message


def test_hf_ref_symlink_out_of_the_repo_is_not_read(tmp_path: Path) -> None:
    home, _snap = hf_cache(tmp_path)
    os.mkfifo(tmp_path / "outside-fifo")
    ref = home / "hub" / "models--org--tiny" / "refs" / "main"
    ref.unlink()
    ref.symlink_to(tmp_path / "outside-fifo")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(home))
        mp.delenv("HF_HUB_CACHE", raising=False)
        err = input_error(lambda: find_in_hf_cache("org/tiny"))
    assert "outside the cache entry" in err.message


def test_hf_snapshot_dir_linking_out_of_the_cache_is_not_used(tmp_path: Path) -> None:
    home, snap = hf_cache(tmp_path)
    outside = model(tmp_path, LLAMA, name="outside-model")
    snapshots = snap.parent
    (snapshots / "evil").symlink_to(outside, target_is_directory=True)
    (home / "hub" / "models--org--tiny" / "refs" / "main").write_text("evil")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(home))
        mp.delenv("HF_HUB_CACHE", raising=False)
        err = input_error(lambda: find_in_hf_cache("org/tiny"))
        assert "outside the cache's snapshots directory" in err.message
        (home / "hub" / "models--org--tiny" / "refs" / "main").unlink()  # no ref: the newest usable snapshot
        os.utime(snapshots / "evil", follow_symlinks=False)
        assert find_in_hf_cache("org/tiny") == snap


# --- 2. config.json that is a directory or a FIFO; a model path that starts with '-' -----------------


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda c: c.mkdir(), "config.json is a directory, not a regular file"),
        (lambda c: os.mkfifo(c), "config.json is a FIFO (named pipe), not a regular file; vllm-doctor did not open it"),
    ],
)
def test_config_that_is_not_a_regular_file_says_what_it_is(tmp_path: Path, make: Any, expected: str) -> None:
    d = model(tmp_path)
    make(d / "config.json")
    assert expected in input_error(lambda: resolve_model_dir(str(d))).message
    proc = cli("check", str(d), "--fast", timeout=30)
    assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr
    assert "no config.json in this directory" not in proc.stderr


def test_model_path_that_is_a_fifo_says_so(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    err = input_error(lambda: resolve_model_dir(str(tmp_path / "pipe")))
    assert err.message.endswith("is a FIFO (named pipe), not a model directory")


def test_index_that_is_a_fifo_is_reported_not_opened(tmp_path: Path) -> None:
    d = model(tmp_path, LLAMA)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    os.mkfifo(d / "model.safetensors.index.json")
    ck = finishes(lambda: read_checkpoint(d))
    (problem,) = ck.problems
    assert problem.kind == "index-unreadable" and "is a FIFO (named pipe), not a regular file" in problem.message


def test_model_path_starting_with_a_dash_gets_the_double_dash_hint(tmp_path: Path) -> None:
    d = tmp_path / "-weird-dir"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "check", "-weird-dir", "--fast"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "the following arguments are required: model" in proc.stderr
    assert "put it after '--' (vllm-doctor check --fast -- -weird-dir) or write it as ./-weird-dir" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "check", "--fast", "-q", "--", "-weird-dir"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
    )
    assert ok.returncode == 0, ok.stderr


def test_the_dash_hint_is_not_given_for_real_options(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_doctor.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["check", "--fast", "--json"])
    err = capsys.readouterr().err
    assert "required: model" in err and "hint" not in err


# --- 3. size caps, deep nesting, huge numbers, NUL bytes -------------------------------------------------

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"architectures": ' + DEEP + "}", "nests deeper than Python's json parser allows"),
        ('{"a": ' + "[" * 100 + "]" * 100 + "}", "nests more than 64 levels deep"),
        ('{"vocab_size": ' + "7" * 5000 + "}", "holds an integer with more than 4300 digits"),
    ],
)
def test_hostile_config_json_is_one_line_and_exit_2(tmp_path: Path, raw: str, expected: str) -> None:
    d = model(tmp_path)
    (d / "config.json").write_text(raw)
    assert expected in input_error(lambda: resolve_model_dir(str(d))).message
    proc = cli("check", str(d), "--fast", timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    first, *rest = proc.stderr.splitlines()
    assert first.startswith("vllm-doctor: error: ") and expected in first
    assert all(line.startswith("  hint: ") for line in rest)


def test_huge_config_json_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = model(tmp_path)
    with open(d / "config.json", "wb") as fh:
        fh.truncate(17 << 20)  # sparse: 17 MiB apparent
    reads: list[int] = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    err = input_error(lambda: resolve_model_dir(str(d)))
    assert "config.json is 17.0 MiB; vllm-doctor reads at most 16 MiB" in err.message
    assert reads == []


def _header_file(path: Path, header: bytes) -> None:
    path.write_bytes(len(header).to_bytes(8, "little") + header)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b'{"w": ' + DEEP.encode() + b"}", "header nests deeper than Python's json parser allows"),
        (b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}', "more than 4300 digits"),
        (b'{"w": {"dtype": "F\x0032", "shape": [1], "data_offsets": [0, 4]}}', "is not valid JSON (Invalid control character"),
        (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 0]}}\x00\x00\x00\x00', "is not valid JSON (Extra data"),
    ],
)
def test_hostile_safetensors_header_is_a_vd308_finding_and_the_run_goes_on(tmp_path: Path, header: bytes, expected: str) -> None:
    d = model(tmp_path, LLAMA)
    _header_file(d / "model.safetensors", header)
    ck = read_checkpoint(d)
    (problem,) = ck.problems
    assert problem.kind == "header-not-json" and expected in problem.message, problem.message
    proc = cli("check", str(d), "--fast", "--json", "-q", timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    failed = [(f["code"], f["subject"]) for f in json.loads(proc.stdout)["findings"] if f["outcome"] == "fail"]
    assert failed == [("VD308", "model.safetensors")]


def test_long_values_in_a_bad_header_entry_are_cut_in_the_message(tmp_path: Path) -> None:
    d = model(tmp_path, LLAMA)
    shape = [*range(100_000), -1]
    _header_file(d / "model.safetensors", json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4]}}).encode())
    (problem,) = read_checkpoint(d).problems
    assert problem.kind == "bad-entry" and len(problem.message) < 400 and "characters)" in problem.message
    assert len(json.dumps(problem.evidence)) < 1000


@pytest.mark.parametrize(
    ("index", "kind", "expected"),
    [
        ('{"weight_map": ' + DEEP + "}", "index-unreadable", "nests deeper than Python's json parser allows"),
        ('{"weight_map": {"w": "model\x00.safetensors"}}', "index-unreadable", "Invalid control character"),
        ('{"weight_map": {"w": "model\\u0000.safetensors"}}', "index-path-invalid", "(it holds a NUL byte)"),
        ('{"weight_map": {"w": ""}}', "index-path-invalid", "which is not a file name"),
        ('{"weight_map": {"w": "model.safetensors"}, "n": ' + "1" * 5000 + "}", "index-unreadable", "more than 4300 digits"),
    ],
)
def test_hostile_index_is_a_vd306_finding_and_the_run_goes_on(tmp_path: Path, index: str, kind: str, expected: str) -> None:
    d = model(tmp_path, LLAMA)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    (d / "model.safetensors.index.json").write_text(index)
    ck = read_checkpoint(d)
    (problem,) = ck.problems
    assert problem.kind == kind and expected in problem.message, problem.message
    proc = cli("check", str(d), "--fast", "--json", "-q", timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    failed = {f["code"] for f in json.loads(proc.stdout)["findings"] if f["outcome"] == "fail"}
    assert failed == {"VD306"}


# --- 4. absurd model sizes: VD309, and nothing is built from them --------------------------------------


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("num_hidden_layers", "0", "num_hidden_layers = 0: must be at least 1"),
        ("hidden_size", "-4096", "hidden_size = -4096: is negative"),
        ("num_attention_heads", "32.0", "num_attention_heads = 32.0: is a float, not a whole number (write 32)"),
        ("num_attention_heads", "32.5", "num_attention_heads = 32.5: is a float, not a whole number"),
        ("intermediate_size", '"11008"', 'intermediate_size = "11008": is a string, not a whole number'),
        ("num_key_value_heads", "true", "num_key_value_heads = true: is a boolean, not a whole number"),
        ("vocab_size", "[32000]", "vocab_size = [32000]: is a list, not a whole number"),
        ("hidden_size", "NaN", "hidden_size = NaN: is not a number"),
        ("hidden_size", "Infinity", "hidden_size = Infinity: is not a number"),
        ("vocab_size", "-Infinity", "vocab_size = -Infinity: is not a number"),
        ("num_hidden_layers", "1000000000000000000",
         "num_hidden_layers = 1000000000000000000: is over 10,000, vllm-doctor's plausibility limit for num_hidden_layers"),
    ],
)
def test_absurd_sizes_are_vd309_findings(tmp_path: Path, key: str, raw: str, expected: str) -> None:
    config = '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "' + key + '": ' + raw + "}"
    d = model(tmp_path)
    (d / "config.json").write_text(config)
    facts = Facts(model_dir=str(d), config=resolve_model_dir(str(d)).config)
    (finding,) = run_checks(facts, ["VD309"])
    assert finding.outcome is Outcome.FAIL and finding.message == expected
    assert finding.subject == f"config.json:{key}"
    json.dumps(finding.evidence, allow_nan=False)  # evidence is strict JSON even for NaN


def test_sizes_inside_text_config_and_their_product_are_checked() -> None:
    config = {"architectures": ["X"], "text_config": {"hidden_size": 0, "num_hidden_layers": 32},
              "vision_config": {"hidden_size": -1}}
    found = run_checks(Facts(model_dir="/m", config=config), ["VD309"])
    # the vision tower's sizes have bounds of their own (issue 47 item 17)
    assert [f.subject for f in found] == ["config.json:text_config.hidden_size", "config.json:vision_config.hidden_size"]
    huge = {"architectures": ["X"], "hidden_size": 1 << 20, "num_hidden_layers": 10_000, "vocab_size": 1 << 20}
    (finding,) = run_checks(Facts(model_dir="/m", config=huge), ["VD309"])
    assert finding.subject == "config.json:sizes" and "parameters (over 1e+15)" in finding.message


def test_a_size_per_layer_is_a_list_of_sizes() -> None:
    """Gemma 3n gives intermediate_size per layer (vLLM runs it): each item is a size; a bad item is named."""
    per_layer = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": [256, 512], "vocab_size": 512}
    (finding,) = run_checks(Facts(model_dir="/m", config=per_layer), ["VD309"])
    assert finding.outcome is Outcome.PASS
    (finding,) = run_checks(Facts(model_dir="/m", config={**per_layer, "intermediate_size": [256, -1]}), ["VD309"])
    assert finding.outcome is Outcome.FAIL and finding.message == "intermediate_size[1] = -1: is negative"


def test_plausible_sizes_pass_and_missing_ones_are_not_applicable() -> None:
    llama8b = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 128256, "intermediate_size": 14336}
    (finding,) = run_checks(Facts(model_dir="/m", config=llama8b), ["VD309"])
    assert finding.outcome is Outcome.PASS
    (finding,) = run_checks(Facts(model_dir="/m", config={"num_key_value_heads": None}), ["VD309"])
    assert finding.outcome is Outcome.NOT_APPLICABLE


def test_absurd_sizes_stop_the_weights_pass_before_its_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.stages import weights as weights_stage
    from vllm_doctor.stages.static import CheckOptions

    d = model(tmp_path, {**LLAMA, "num_hidden_layers": 10**18})
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    monkeypatch.setattr(weights_stage, "ChildJob", lambda *a, **k: pytest.fail("the weights child was started"))
    facts = Facts(model_dir=str(d), config={**LLAMA, "num_hidden_layers": 10**18})
    assert weights_stage.start_weights_pass(facts, CheckOptions(fast=False), ["VD301", "VD309"]) is None
    assert facts.weight_load_error is not None
    assert "num_hidden_layers = 1000000000000000000; see VD309): the model was not built" in facts.weight_load_error
    (finding,) = run_checks(facts, ["VD301"])
    assert finding.outcome is Outcome.SKIP and "see VD309" in finding.message


def test_absurd_sizes_stop_the_engine_stage_and_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The engine stage's guard (stages/engine.py, the one owner) stops both verbs the same way: the
    VD309 finding, the reason in facts.engine_failure, exit 1; no engine is started."""
    from vllm_doctor.cli import main
    from vllm_doctor.stages import engine as engine_stage

    d = model(tmp_path, {**LLAMA, "vocab_size": 0})
    monkeypatch.setattr(engine_stage, "run_engine_stage", lambda *a, **k: pytest.fail("the engine was started"))
    assert main(["check", str(d), "--fast", "--engine", "--json", "-q"]) == 1
    data = json.loads(capsys.readouterr().out)
    why = "the engine stage was not started: config.json has model sizes no model can be built from (VD309)"
    assert data["facts"]["engine_failure"] == why
    assert main(["profile", str(d), "--out", str(tmp_path / "out"), "-q"]) == 1
    out = capsys.readouterr().out
    assert why in out and "FAIL  VD309 vocab_size = 0: must be at least 1" in out
    profiled = json.loads((tmp_path / "out" / "report.json").read_text())
    assert profiled["facts"]["engine_failure"] == why
    assert [(f["code"], f["outcome"]) for f in profiled["findings"]] == [("VD309", "fail")]


def test_nan_in_config_keeps_the_json_report_strict(tmp_path: Path) -> None:
    d = model(tmp_path)
    (d / "config.json").write_text('{"architectures": [NaN], "model_type": "llama", "hidden_size": NaN}')
    proc = cli("check", str(d), "--fast", "--json", "-q", timeout=30)
    assert proc.returncode == 1, proc.stderr

    def strict(token: str) -> None:
        raise AssertionError(f"bare {token} in the JSON report")

    data = json.loads(proc.stdout, parse_constant=strict)
    assert {f["code"] for f in data["findings"] if f["outcome"] == "fail"} == {"VD108", "VD309"}


# --- 5. output linear in the input ------------------------------------------------------------------------


def test_ten_thousand_architectures_keep_the_fast_pass_fast_and_the_report_linear(tmp_path: Path) -> None:
    archs = [f"Arch{i}ForCausalLM" for i in range(10_000)]
    d = model(tmp_path, {"architectures": archs, "model_type": "llama"})
    config_bytes = (d / "config.json").stat().st_size
    start = time.monotonic()
    proc = cli("check", str(d), "--fast", "--json", "-q", timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert took < 20, f"{took:.1f} s"  # was over a minute (and 2 GB of JSON) before the lists were capped
    data = json.loads(proc.stdout)
    assert len(proc.stdout) < 4 * config_bytes + 200_000  # the full list once (facts), findings capped
    assert max(len(json.dumps(f)) for f in data["findings"]) < 10_000
    vd101 = [f for f in data["findings"] if f["code"] == "VD101"]
    summary = {f["subject"]: f["message"] for f in vd101}["config.json:architectures[20:]"]
    assert len(vd101) == 21 and summary == "... and 9980 more architecture(s) of config.json, none registered with vLLM"
    assert all("... (9980 more)" in f["evidence"]["vllm_error"] for f in vd101)
    text = cli("check", str(d), "--fast", "-q", timeout=60)
    assert text.returncode == 1 and len(text.stdout) < 50_000


def test_ten_thousand_missing_shards_give_findings_of_bounded_size(tmp_path: Path) -> None:
    d = model(tmp_path, LLAMA)
    write_raw_safetensors(d / "model.safetensors", {"a": ("BF16", [4])})
    weight_map = {f"t{i}": f"missing-{i}.safetensors" for i in range(10_000)} | {"a": "model.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ck = read_checkpoint(d)
    assert len(ck.problems) == 10_000
    assert max(len(json.dumps(p.vllm_error)) for p in ck.problems) < 5_000  # not the 10,000 paths each
    assert ck.problems[0].vllm_error.endswith("(and 9980 more)")
    findings = run_checks(Facts(model_dir=str(d), config=LLAMA, checkpoint=ck), ["VD306"])
    assert len(findings) == 21 and findings[-1].message.startswith("... and 9980 more shard index problems")


def test_read_regular_never_opens_a_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.probes import paths

    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setattr(os, "open", lambda *a, **k: pytest.fail("opened"))
    with pytest.raises(paths.NotRegular, match="is a FIFO"):
        paths.read_regular(tmp_path / "fifo", 100)


def test_expert_counts_are_sizes_and_top_k_fits_in_them() -> None:
    """A mixture-of-experts config's expert count, top-k and expert MLP size are VD309's sizes where
    config.json sets them (zero experts: the model is not built); top-k over the count is named."""
    from vllm_doctor.checks.config_sizes import config_size_problems

    assert config_size_problems({"hidden_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2}) == []
    assert config_size_problems({"num_local_experts": 0}) == [
        {"key": "num_local_experts", "value": "0", "why": "must be at least 1"}
    ]
    assert config_size_problems({"text_config": {"num_experts": 4, "num_experts_per_tok": 6}}) == [
        {"key": "text_config.num_experts_per_tok", "value": "6", "why": "routes each token to more experts than the 4 there are"}
    ]
    assert config_size_problems({"moe_intermediate_size": 2.5})[0]["why"] == "is a float, not a whole number"

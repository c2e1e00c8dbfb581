"""VD305-VD308 and the safetensors header reader: pure logic, no vLLM, no torch, seconds.

Each defect of a checkpoint file or shard index must become exactly one clear problem (never a
traceback, never a hang), and no byte of tensor data may be read.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.weights import write_raw_safetensors
from vllm_doctor.checks import run_checks
from vllm_doctor.checks.parallel_sizes import tp_problems, working_tp_sizes
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Outcome, Severity
from vllm_doctor.probes import safetensors_header
from vllm_doctor.probes.safetensors_header import read_checkpoint

TENSORS = {
    "model.embed_tokens.weight": ("BF16", [64, 16]),
    "model.norm.weight": ("BF16", [16]),
    "lm_head.weight": ("BF16", [64, 16]),
}
LLAMA3_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256}


def model_dir(tmp_path: Path, config: dict[str, Any] | None = None) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config or {"architectures": ["X"], "tie_word_embeddings": False}))
    return d


def run(code: str, d: Path, config: dict[str, Any] | None = None, tp: int = 1) -> list[Finding]:
    cfg = config or json.loads((d / "config.json").read_text())
    facts = Facts(model_dir=str(d), config=cfg, checkpoint=read_checkpoint(d), tensor_parallel_size=tp)
    return run_checks(facts, [code])


def problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.is_problem]


def index(d: Path, weight_map: dict[str, str]) -> None:
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def finishes(fn: Any, timeout: float = 10) -> Any:
    """fn() must return within timeout (a FIFO opened for reading would block forever)."""
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not finish within {timeout} s (it opened something it should not)"
    return box["value"]


# --- the reader ---------------------------------------------------------------------------


def test_reads_names_shapes_dtypes_like_the_safetensors_library(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    ck = read_checkpoint(d)
    assert ck.format == "safetensors" and ck.complete and not ck.problems
    got = {t.name: (t.dtype, t.shape) for t in ck.tensors}
    assert got == {k: (v[0], v[1]) for k, v in TENSORS.items()}
    assert [t.name for t in ck.tensors] == sorted(TENSORS)  # safe_open(...).keys() order, as vLLM iterates


def test_reads_no_tensor_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = model_dir(tmp_path)
    raw = write_raw_safetensors(d / "model.safetensors", TENSORS)
    read_bytes: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, f: Any) -> None:
            self.f = f

        def read(self, n: int = -1) -> bytes:
            assert n >= 0, "an unbounded read"
            data = self.f.read(n)
            read_bytes.append(len(data))
            return data

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *a: object) -> None:
            self.f.close()

    monkeypatch.setattr(safetensors_header, "open", lambda p, m="r", *a, **k: Counting(real_open(p, m, *a, **k)), raising=False)
    ck = read_checkpoint(d, library=False)
    assert ck.complete
    assert sum(read_bytes) == 8 + len(raw)  # the length field and the header, nothing else


def test_sparse_8b_sized_shard_is_instant(tmp_path: Path) -> None:
    """A 4 GB (apparent) shard: only its header is touched."""
    d = model_dir(tmp_path)
    big = {f"model.layers.{i}.mlp.up_proj.weight": ("BF16", [14336, 4096]) for i in range(16)}
    path = d / "model.safetensors"
    header: dict[str, Any] = {}
    off = 0
    for name, (dtype, shape) in big.items():
        n = 2 * shape[0] * shape[1]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hdr = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hdr)) + hdr)
        fh.truncate(8 + len(hdr) + off)
    assert path.stat().st_size > 1.8e9 and path.stat().st_blocks * 512 < 1e6  # sparse
    ck = finishes(lambda: read_checkpoint(d), 10)
    assert ck.complete and len(ck.tensors) == 16 and ck.seconds < 5


def _cut_tail(path: Path, n: int) -> None:
    write_raw_safetensors(path, TENSORS)
    path.write_bytes(path.read_bytes()[:-n])


@pytest.mark.parametrize(
    ("name", "make", "kind"),
    [
        ("shorter-than-8-bytes", lambda p: p.write_bytes(b"\x10\x00"), "truncated-header"),
        ("cut-inside-header", lambda p: write_raw_safetensors(p, TENSORS, cut_to=60), "truncated-header"),
        ("length-past-eof", lambda p: write_raw_safetensors(p, TENSORS, header_length=10**7), "header-past-eof"),
        ("header-not-json", lambda p: p.write_bytes(struct.pack("<Q", 8) + b"not json" + bytes(8)), "header-not-json"),
        ("data-cut-short", lambda p: _cut_tail(p, 100), "data-past-eof"),
        ("trailing-bytes", lambda p: write_raw_safetensors(p, TENSORS, extra_bytes=64), "trailing-bytes"),
    ],
)
def test_broken_file_is_one_clear_problem(tmp_path: Path, name: str, make: Any, kind: str) -> None:
    d = model_dir(tmp_path)
    make(d / "model.safetensors")
    ck = read_checkpoint(d)
    assert [p.kind for p in ck.problems] == [kind]
    (problem,) = ck.problems
    assert problem.scope == "file" and problem.subject == "model.safetensors"
    assert "Traceback" not in problem.message
    # the safetensors library (vLLM's reader) rejects the same file: its words are kept
    assert "SafetensorError" in problem.vllm_error or "Error" in problem.vllm_error
    (finding,) = problems(run("VD308", d))
    assert finding.outcome is Outcome.FAIL and finding.subject == "model.safetensors"
    assert finding.evidence["kind"] == kind


def test_bad_entries(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    hdr = json.dumps({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + bytes(4))
    assert [p.kind for p in read_checkpoint(d).problems] == ["bad-entry"]
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode()  # needs 8 bytes
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + bytes(4))
    (problem,) = read_checkpoint(d).problems
    assert problem.kind == "bad-entry" and "needs 8 bytes" in problem.message


def test_fifo_is_never_opened(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    os.mkfifo(d / "model.safetensors")
    ck = finishes(lambda: read_checkpoint(d))
    assert [p.kind for p in ck.problems] == ["not-a-regular-file"]


# --- the shard index ----------------------------------------------------------------------


def sharded(tmp_path: Path) -> Path:
    d = model_dir(tmp_path)
    write_raw_safetensors(d / "model-00001-of-00002.safetensors", {"model.embed_tokens.weight": TENSORS["model.embed_tokens.weight"]})
    write_raw_safetensors(d / "model-00002-of-00002.safetensors", {k: TENSORS[k] for k in ("model.norm.weight", "lm_head.weight")})
    return d


def test_good_index(tmp_path: Path) -> None:
    d = sharded(tmp_path)
    index(d, {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", "model.norm.weight": "model-00002-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"})
    ck = read_checkpoint(d)
    assert ck.complete and len(ck.tensors) == 3 and ck.index is not None and ck.index["entries"] == 3
    (f,) = run("VD306", d)
    assert f.outcome is Outcome.PASS


@pytest.mark.parametrize(
    ("entry", "kind"),
    [
        ("model-00003-of-00002.safetensors", "index-file-missing"),
        ("../outside.safetensors", "index-path-outside-dir"),
        ("/etc/outside.safetensors", "index-path-outside-dir"),
        ("sub/model-00002-of-00002.safetensors", "index-path-not-top-level"),
    ],
)
def test_broken_index_entry(tmp_path: Path, entry: str, kind: str) -> None:
    d = sharded(tmp_path)
    (d / "sub").mkdir()
    (d / "sub" / "model-00002-of-00002.safetensors").write_bytes((d / "model-00002-of-00002.safetensors").read_bytes())
    (tmp_path / "outside.safetensors").write_bytes(b"")
    index(d, {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", "model.norm.weight": entry, "lm_head.weight": entry})
    ck = read_checkpoint(d)
    (problem,) = [p for p in ck.problems if p.scope == "index"]
    assert problem.kind == kind
    assert problem.subject == f"model.safetensors.index.json:{entry}"
    assert "Weight files referenced in index but missing" in problem.vllm_error  # what vLLM 0.32 raises
    assert sorted(ck.unread_tensors) == ["lm_head.weight", "model.norm.weight"]
    (finding,) = problems(run("VD306", d))
    assert finding.subject == f"model.safetensors.index.json:{entry}" and finding.severity is Severity.ERROR


def test_index_path_outside_is_never_opened(tmp_path: Path) -> None:
    d = sharded(tmp_path)
    os.mkfifo(tmp_path / "outside.safetensors")  # opening it would block
    (d / "escape.safetensors").symlink_to(tmp_path / "outside.safetensors")
    index(d, {"model.embed_tokens.weight": "../outside.safetensors", "lm_head.weight": "escape.safetensors"})
    ck = finishes(lambda: read_checkpoint(d))
    kinds = sorted(p.kind for p in ck.problems)
    assert kinds == ["file-outside-dir", "index-path-outside-dir"], ck.problems


def test_index_unreadable_and_without_weight_map(tmp_path: Path) -> None:
    d = sharded(tmp_path)
    (d / "model.safetensors.index.json").write_text("{not json")
    assert [p.kind for p in read_checkpoint(d).problems] == ["index-unreadable"]
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    assert [p.kind for p in read_checkpoint(d).problems] == ["index-no-weight-map"]


def test_index_tensor_not_in_file_and_duplicates(tmp_path: Path) -> None:
    d = sharded(tmp_path)
    write_raw_safetensors(d / "model-00003-of-00003.safetensors", {"lm_head.weight": TENSORS["lm_head.weight"]})
    index(d, {
        "model.embed_tokens.weight": "model-00002-of-00002.safetensors",  # it is in shard 1
        "model.norm.weight": "model-00002-of-00002.safetensors",
        "lm_head.weight": "model-00003-of-00003.safetensors",
        "x": "model-00001-of-00002.safetensors",
    })
    ck = read_checkpoint(d)
    kinds = sorted((p.kind, p.subject) for p in ck.problems)
    assert ("duplicate-tensor", "lm_head.weight") in kinds
    assert ("index-tensor-not-in-file", "model.safetensors.index.json:x") in kinds
    findings = problems(run("VD306", d))
    assert {f.outcome for f in findings} == {Outcome.WARN}


def test_shards_in_natural_order(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    for i in (10, 2, 1):
        write_raw_safetensors(d / f"model-{i}.safetensors", {f"t{i}": ("F32", [1])})
    assert [f.file for f in read_checkpoint(d).files] == ["model-1.safetensors", "model-2.safetensors", "model-10.safetensors"]


def test_pickle_checkpoints_are_not_read(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    ck = read_checkpoint(d)
    assert ck.format == "bin" and not ck.files
    (f,) = run("VD301", d)
    assert f.outcome is Outcome.SKIP and "safetensors headers only" in f.message


# --- VD307 tie_word_embeddings --------------------------------------------------------------


@pytest.mark.parametrize(
    ("tie", "with_head", "outcome"),
    [(False, True, Outcome.PASS), (True, False, Outcome.PASS), (False, False, Outcome.FAIL), (True, True, Outcome.WARN)],
)
def test_tie_word_embeddings(tmp_path: Path, tie: bool, with_head: bool, outcome: Outcome) -> None:
    d = model_dir(tmp_path, {"architectures": ["X"], "tie_word_embeddings": tie})
    tensors = dict(TENSORS) if with_head else {k: v for k, v in TENSORS.items() if k != "lm_head.weight"}
    write_raw_safetensors(d / "model.safetensors", tensors)
    (f,) = run("VD307", d)
    assert f.outcome is outcome and f.subject == "config.json:tie_word_embeddings"


def test_tie_unknown_without_the_weights_pass_is_a_skip(tmp_path: Path) -> None:
    d = model_dir(tmp_path, {"architectures": ["X"]})
    write_raw_safetensors(d / "model.safetensors", {k: v for k, v in TENSORS.items() if k != "lm_head.weight"})
    (f,) = run("VD307", d)
    assert f.outcome is Outcome.SKIP


# --- VD305 tensor-parallel divisibility (pure arithmetic) ----------------------------------------


def test_llama3_8b_splits_over_1_2_4_8() -> None:
    assert [n for n in working_tp_sizes(LLAMA3_8B) if n <= 8] == [1, 2, 4, 8]
    assert not [p for p in tp_problems(LLAMA3_8B, 8) if p["severity"] == "error"]


def test_qwen2_7b_like_28_heads() -> None:
    cfg = {"num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064}
    keys = {p["key"] for p in tp_problems(cfg, 8) if p["severity"] == "error"}
    assert keys == {"num_attention_heads"}
    assert working_tp_sizes(cfg, 8) == [1, 2, 4]


def test_kv_heads_fewer_than_ranks_are_replicated() -> None:
    cfg = dict(LLAMA3_8B, num_key_value_heads=8)
    assert not [p for p in tp_problems(cfg, 16) if p["key"] == "num_key_value_heads"]  # 16 % 8 == 0
    cfg = dict(LLAMA3_8B, num_attention_heads=48, num_key_value_heads=3)
    (kv,) = [p for p in tp_problems(cfg, 2) if p["key"] == "num_key_value_heads"]
    assert "3 KV heads cannot be split" in kv["why"]


def test_vd305_subjects_and_nested_text_config(tmp_path: Path) -> None:
    cfg = {"architectures": ["X"], "text_config": {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 512}}
    d = model_dir(tmp_path, cfg)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    subjects = {f.subject: f for f in problems(run("VD305", d, tp=3))}
    assert {s for s, f in subjects.items() if f.severity is Severity.ERROR} == {
        "config.json:num_attention_heads", "config.json:num_key_value_heads", "config.json:intermediate_size", "config.json:vocab_size",
    }
    heads = subjects["config.json:num_attention_heads"]
    assert heads.evidence["vllm_error"] == "ValueError: Total number of attention heads (4) must be divisible by tensor parallel size (3)."
    assert heads.evidence["working_sizes"] == [1, 2, 4]
    assert not problems(run("VD305", d, tp=2))


# Mixtral-8x7B's, Qwen1.5-MoE-A2.7B's and DeepSeek-V2-Lite's config.json (the sizes VD305 reads)
MIXTRAL = {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
           "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}  # fmt: skip
QWEN2_MOE = {"num_attention_heads": 16, "num_key_value_heads": 16, "hidden_size": 2048, "intermediate_size": 5632,
             "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "vocab_size": 151936,
             "num_experts": 60, "num_experts_per_tok": 4}  # fmt: skip
DEEPSEEK_V2_LITE = {"num_attention_heads": 16, "num_key_value_heads": 16, "hidden_size": 2048, "intermediate_size": 10944,
                    "moe_intermediate_size": 1408, "n_shared_experts": 2, "n_routed_experts": 64, "vocab_size": 102400,
                    "num_experts_per_tok": 6}  # fmt: skip


def test_moe_tensor_parallel_only_slices_every_expert() -> None:
    """FusedMoE without expert parallelism: each rank holds a slice of every expert (FusedMoEConfig asserts
    intermediate_size % tp_size == 0); the expert count need not divide."""
    assert [n for n in working_tp_sizes(MIXTRAL) if n <= 8] == [1, 2, 4, 8]
    # Qwen1.5-MoE: 16 heads, experts 1408 wide (1408 = 2^7 * 11), shared expert 5632
    assert working_tp_sizes(QWEN2_MOE) == [1, 2, 4, 8, 16]
    (expert,) = [p for p in tp_problems(dict(QWEN2_MOE, num_attention_heads=12, num_key_value_heads=12), 3)
                 if p["key"] == "moe_intermediate_size"]  # fmt: skip
    assert expert["severity"] == "error" and "FusedMoEConfig" in expert["vllm_error"]
    # 60 experts on 8 ranks: not an error, an explanation (each rank holds 1/8 of every expert)
    (count,) = [p for p in tp_problems(QWEN2_MOE, 8) if p["key"] == "num_experts"]
    assert count["severity"] == "info" and "7 + 7 + 7 + 7 + 8" not in count["why"] and "8 + 8 + 8 + 8 + 7" in count["why"]
    # Mixtral's experts are intermediate_size wide: one finding, worded for the experts
    (inter,) = [p for p in tp_problems(dict(MIXTRAL, intermediate_size=14335), 2) if p["severity"] == "error"]
    assert inter["key"] == "intermediate_size" and "every expert's 14335" in inter["why"]


def test_moe_expert_parallel_divides_experts_unevenly_without_an_error() -> None:
    """--enable-expert-parallel: determine_expert_map gives each rank num_experts // ep (the first
    num_experts % ep one more) and does not slice them."""
    cfg = dict(MIXTRAL, num_local_experts=3)
    (uneven,) = [p for p in tp_problems(cfg, 2, ep=True) if p["key"] == "num_local_experts"]
    assert uneven["severity"] == "info" and "(2 + 1," in uneven["why"]
    (idle,) = [p for p in tp_problems(cfg, 4, ep=True) if p["key"] == "num_local_experts"]
    assert idle["severity"] == "warn" and "rank 3 holds no expert" in idle["why"] and "1 + 1 + 1 + 0)" in idle["why"]
    (idle,) = [p for p in tp_problems(cfg, 8, ep=True) if p["key"] == "num_local_experts"]
    assert "ranks 3 to 7 hold no expert" in idle["why"]
    assert not [p for p in tp_problems(MIXTRAL, 8, ep=True) if p["key"] == "num_local_experts"]
    # the experts are not sliced: an expert MLP size that TP could not split is fine with EP
    assert not [p for p in tp_problems(dict(MIXTRAL, intermediate_size=14335), 2, ep=True) if p["severity"] == "error"]
    # a shared expert is a dense MLP: sliced by TP either way (DeepSeek: n_shared_experts * moe_intermediate_size)
    (shared,) = [p for p in tp_problems(dict(DEEPSEEK_V2_LITE, moe_intermediate_size=1407), 4, ep=True)
                 if p["severity"] == "error"]  # fmt: skip
    assert shared["key"] == "n_shared_experts" and shared["vllm_error"] == "AssertionError: 2814 is not divisible by 4"


def test_moe_wna16_groups_must_not_cross_a_tensor_parallel_slice() -> None:
    quant = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}, "input_activations": None}}}  # fmt: skip
    cfg = dict(QWEN2_MOE, quantization_config=quant)
    assert not [p for p in tp_problems(cfg, 1) if p["severity"] == "error"]
    # 1408 / 2 = 704 = 5.5 groups of 128: vLLM's compressed-tensors WNA16 MoE refuses it
    (groups,) = [p for p in tp_problems(cfg, 2) if p["severity"] == "error"]
    assert groups["vllm_error"].startswith("ValueError: CompressedTensors WNA16 MoE with static group scales")
    assert "(704) to be divisible by group_size (128)" in groups["vllm_error"]
    assert not [p for p in tp_problems(cfg, 2, ep=True) if p["severity"] == "error"]


def test_vd305_says_what_expert_parallelism_does(tmp_path: Path) -> None:
    cfg = {"architectures": ["X"], **dict(MIXTRAL, num_local_experts=3)}
    d = model_dir(tmp_path, cfg)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    facts = Facts(model_dir=str(d), config=cfg, checkpoint=read_checkpoint(d), tensor_parallel_size=2,
                  enable_expert_parallel=True)  # fmt: skip
    (info,) = problems(run_checks(facts, ["VD305"]))
    assert (info.severity, info.subject) == (Severity.INFO, "config.json:num_local_experts")
    assert info.evidence["enable_expert_parallel"] is True
    assert info.hint == "expert-parallel sizes that divide the 3 experts evenly: 1"  # 3 does not divide 32 heads
    ok = [f for f in run_checks(facts, ["VD305"]) if f.outcome is Outcome.PASS]
    assert "3 experts divided 2 + 1 (expert parallelism)" in ok[0].message
    # without expert parallelism: nothing to fix, and what --enable-expert-parallel would need
    facts.enable_expert_parallel = False
    (info,) = problems(run_checks(facts, ["VD305"]))
    assert info.hint.startswith("nothing to fix for tensor parallelism") and info.evidence["working_sizes"][:4] == [1, 2, 4, 8]


def test_load_checks_skip_with_the_reason_when_the_model_was_not_built(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    facts = Facts(model_dir=str(d), config={"architectures": ["X"]}, checkpoint=read_checkpoint(d))
    facts.weight_load_error = "failed while building the model class on the meta device: RuntimeError: boom"
    for code in ("VD301", "VD302", "VD303"):
        (f,) = run_checks(facts, [code])
        assert f.outcome is Outcome.SKIP and "RuntimeError: boom" in f.message

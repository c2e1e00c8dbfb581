"""Multi-rank engines on two GPUs (``pytest -m gpu tests/gpu/test_multirank_gpu.py``; skipped
without two CUDA devices): tensor parallel 2 in vLLM's default mode (torch.compile + CUDA graphs)
and pipeline parallel 2, through vLLM's multiprocessing executor and the doctor's extension
reached by ``collective_rpc`` on every rank.

- TP=2 on a tiny Llama: placement, devices and KV per rank (``rank 1 / cuda:1``), the ranks hold
  the same model (VD406 against the shapes built at TP=1), KV bytes per rank equal to torch's
  storages (VD504 per rank);
- TP=2 on ``DoctorRankFaultsLlama`` (tests/fixtures/capture_models.py): a CPU buffer on rank 1
  only (VD401 names rank 1) and a loader that gives rank 1 rank 0's slice (VD406 names rank 1);
- PP=2, eager: one profile per rank with its own layers, one Perfetto track per rank.

NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1).
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

REPO_ROOT = Path(__file__).resolve().parents[2]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA devices"),
]
DIMS = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=2048)


def doctor(tmp: Path, *args: str) -> tuple[int, str, str]:
    from tests.fixtures.capture_models import capture_site

    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "CUDA_VISIBLE_DEVICES")}
    env.update(NO_MULTICAST)
    site = capture_site(tmp / "capture-site")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "vllm_doctor", *args, "--max-model-len", "512",
           "--engine-arg", "gpu_memory_utilization=0.2"]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout, proc.stderr


def findings(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.fixtures.engine_models import build_llama_dir

    root = tmp_path_factory.mktemp("multirank")
    return {
        "llama": build_llama_dir(root / "llama", ["LlamaForCausalLM"], DIMS),
        "faults": build_llama_dir(root / "faults", ["DoctorRankFaultsLlama"], DIMS),
    }


def test_tensor_parallel_2_in_vllms_default_mode(models: dict[str, Path], tmp_path: Path) -> None:
    code, out, err = doctor(tmp_path, "check", str(models["llama"]), "-tp", "2", "--engine", "--json")
    assert code == 0, err[-6000:]
    report = json.loads(out)
    assert report["facts"]["engine_mode"]["requested"] == "vllm-default"
    assert sorted((f["outcome"], f["subject"]) for f in findings(report, "VD401")) == [
        ("pass", "rank 0 / cuda:0"), ("pass", "rank 1 / cuda:1")]
    assert sorted((f["outcome"], f["subject"]) for f in findings(report, "VD402")) == [
        ("pass", "rank 0 / cuda:0"), ("pass", "rank 1 / cuda:1")]
    (vd406,) = findings(report, "VD406")
    assert vd406["outcome"] == "pass" and "shapes against tensor-parallel size 1" in vd406["message"], vd406
    assert [f["outcome"] for f in findings(report, "VD504")] == ["pass", "pass"]  # KV bytes = torch's, per rank
    per_rank = report["profiles"]["engine"]["per_rank"]
    assert [(r["rank"], r["tp_rank"], r["device"]) for r in per_rank] == [(0, 0, "cuda:0"), (1, 1, "cuda:1")]
    assert per_rank[0]["kv_storage_bytes"] == per_rank[1]["kv_storage_bytes"] > 0


def test_rank_faults_are_named_by_rank(models: dict[str, Path], tmp_path: Path) -> None:
    code, out, err = doctor(tmp_path, "check", str(models["faults"]), "-tp", "2", "--engine", "--json")
    assert code == 1, err[-6000:]
    report = json.loads(out)
    assert [f["outcome"] for f in findings(report, "VD500")] == ["pass"]  # vLLM serves it without a word
    vd401 = [f["subject"] for f in findings(report, "VD401") if f["outcome"] == "fail"]
    assert vd401 == ["rank 1 / cuda:1 / rank_scale"], vd401
    vd406 = [f for f in findings(report, "VD406") if f["outcome"] == "fail"]
    assert [f["subject"] for f in vd406] == ["rank 1 / cuda:1 / model.layers.1.mlp.down_proj.weight"], vd406
    assert vd406[0]["evidence"]["same_as_rank"] == 0


def test_pipeline_parallel_2_profile_per_rank(models: dict[str, Path], tmp_path: Path) -> None:
    out_dir = tmp_path / "pp2"
    code, out, err = doctor(tmp_path, "profile", str(models["llama"]), "-pp", "2", "--eager", "--out", str(out_dir))
    assert code == 0, err[-6000:]
    profile = json.loads((out_dir / "report.json").read_text())["profiles"]["engine"]
    assert profile["clock"] == "cuda_events"
    ranks = profile["per_rank"]
    assert [(r["rank"], r["pp_rank"], r["device"]) for r in ranks] == [(0, 0, "cuda:0"), (1, 1, "cuda:1")]
    assert [[x["layer"] for x in r["by_layer"]] for r in ranks] == [[0, 1], [2, 3]]
    trace = json.loads((out_dir / "trace.json").read_text())
    tracks = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name")
    assert tracks == ["rank 0 (cuda:0)", "rank 1 (cuda:1)"]
    print(out)  # the per-rank table, for the closing note


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed")
def test_ray_executor_reaches_every_rank(models: dict[str, Path], tmp_path: Path) -> None:
    """vLLM's Ray executor (vLLM starts a local Ray cluster): the doctor's probes reach both ranks
    through collective_rpc, as with the multiprocessing executor."""
    code, out, err = doctor(tmp_path, "check", str(models["faults"]), "-tp", "2", "--engine", "--json",
                            "--engine-arg", "distributed_executor_backend=ray")
    assert code == 1, err[-6000:]
    report = json.loads(out)
    assert report["facts"]["engine"]["executor"]["backend"] == "ray", report["facts"]["engine"]["executor"]
    assert sorted(f["subject"] for f in findings(report, "VD402")) == ["rank 0 / cuda:0", "rank 1 / cuda:1"]
    assert [f["subject"] for f in findings(report, "VD401") if f["outcome"] == "fail"] == ["rank 1 / cuda:1 / rank_scale"]
    assert [f["subject"] for f in findings(report, "VD406") if f["outcome"] == "fail"] == [
        "rank 1 / cuda:1 / model.layers.1.mlp.down_proj.weight"]

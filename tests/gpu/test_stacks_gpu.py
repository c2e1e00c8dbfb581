"""`vllm-doctor stacks` against a served engine on an NVIDIA GPU (``pytest -m gpu tests/gpu``).

The forward-blocks example (tests/fixtures/variants) served on cuda:0 without the doctor's
plugin: idle first, then held inside TinyDoctorMLP.forward. With one GPU vLLM may run the
model inside the EngineCore process (no separate worker): whichever process holds the
forward must be found there, labelled by its role, with the model's file:line.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tests.gpu.test_engine_gpu import _cuda
from tests.served import BlockingEngine, blocking_engine, by_role, hung, stacks_json

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(not _cuda(), reason="no CUDA device"),
]
GPU_ENGINE = ["--enforce-eager", "--max-model-len", "256", "--gpu-memory-utilization", "0.3"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlockingEngine]:
    with blocking_engine(tmp_path_factory.mktemp("stacks-gpu"), GPU_ENGINE) as served:
        yield served


def test_stacks_reads_a_gpu_engine_idle_then_hung_in_the_model(engine: BlockingEngine) -> None:
    code, idle = stacks_json("--url", engine.base)
    roles = by_role(idle)
    assert code == 0 and idle["verdict"]["kind"] == "idle", idle["verdict"]
    (api,) = roles["api-server"]
    (core,) = roles["engine-core"]
    assert api["pid"] == engine.api_pid and core["ppid"] == api["pid"] and core["title"].endswith("::EngineCore")
    workers = roles.get("worker", [])
    assert sorted(w["rank"] for w in workers) == list(range(len(workers)))
    assert all(p["state"] == "idle" for p in idle["processes"] if p["role"] != "other"), idle["processes"]

    with hung(engine) as done:
        code, report = stacks_json("--url", engine.base, "--samples", "2", "--interval", "1")
        assert code == 1 and report["verdict"]["kind"] == "stuck in the model", report["verdict"]
        (holder,) = [p for p in report["processes"] if p["state"] == "model"]
        assert holder["role"] in ("engine-core", "worker") and holder["did_not_move"] is True
        assert (holder["where"], holder["function"]) == (engine.hang_line, "TinyDoctorMLP.forward")
        assert report["verdict"]["pids"] == [holder["pid"]]
    assert done and done[0]["choices"][0]["text"]

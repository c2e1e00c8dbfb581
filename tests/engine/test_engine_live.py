"""The doctor attached to REAL vLLM engines (CPU here; the same code runs on CUDA workers).

One session-scoped single-process engine (2-4 s to start) serves most tests: it runs
``DoctorFaultyLlamaForCausalLM`` (tests/fixtures/engine_models.py), vLLM's Llama with a meta
buffer, a float32 parameter, ``.item()``/``nonzero`` and meta-device tensors in one MLP. One
test starts a multiprocess engine in a fresh process to cross real process boundaries.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.engine_models import FAULTY_ARCH, build_llama_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]
PROMPTS = ["hello world", "the doctor is in my name", "a of and to in is the"]
MAX_TOKENS = 12


@dataclass
class Engine:
    llm: Any
    model_dir: Path
    torch_dir: Path


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    tmp = tmp_path_factory.mktemp("engine")
    model_dir = build_llama_dir(tmp / "faulty-llama", [FAULTY_ARCH])
    from tests.fixtures.engine_models import register_faulty_model
    from vllm_doctor.compat.llm import (
        FAST_ENGINE_KWARGS,
        shutdown,
        start_engine,
        torch_profiler_kwargs,
    )

    register_faulty_model()
    llm = start_engine(str(model_dir), max_model_len=256, **FAST_ENGINE_KWARGS, **torch_profiler_kwargs(str(tmp / "torch")))
    yield Engine(llm, model_dir, tmp / "torch")
    shutdown(llm)
    if saved is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def generate(llm: Any) -> list[list[int]]:
    from vllm_doctor.compat.llm import greedy

    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy(MAX_TOKENS, ignore_eos=True))]


@dataclass
class Run:
    base: list[list[int]]
    during: list[list[int]]
    after: list[list[int]]
    report: Any
    prompt_lens: list[int]
    status_before: dict[str, Any]
    status_during: dict[str, Any]
    status_after: dict[str, Any]


@pytest.fixture(scope="session")
def doctored(engine: Engine) -> Run:
    """The workload without, with (profiler per step + per layer + probe) and after the doctor."""
    import vllm_doctor
    from vllm_doctor.compat.llm import EngineHandle, greedy

    handle = EngineHandle(engine.llm)
    base = generate(engine.llm)
    before = handle.rpc("doctor_status")[0]["data"]
    with vllm_doctor.attach(engine.llm) as doc:
        during = generate(engine.llm)
        status_during = handle.rpc("doctor_status")[0]["data"]
    after = generate(engine.llm)
    status_after = handle.rpc("doctor_status")[0]["data"]
    outs = engine.llm.generate(PROMPTS, greedy(1))
    return Run(base, during, after, doc.report(), [len(o.prompt_token_ids) for o in outs], before, status_during, status_after)


def outcomes(report: Any, code: str) -> list[tuple[str, str]]:
    return [(f.outcome.value, f.subject) for f in report.findings if f.code == code]


def test_outputs_are_bit_identical_with_and_without_the_doctor(doctored: Run) -> None:
    assert doctored.base == doctored.during == doctored.after
    assert all(len(t) == MAX_TOKENS for t in doctored.base)
    assert doctored.report.to_dict()["profiles"]["engine"]["layers_on"] is True  # per-layer hooks were on
    assert [s["phase"] for s in doctored.report.to_dict()["facts"]["engine"]["workers"][:0]] == []
    assert doctored.status_during["wrapped_methods"] == ["execute_model", "sample_tokens"]


def test_detach_restores_every_hook_and_method(engine: Engine, doctored: Run) -> None:
    # no hooks at all: the timing forwards exist only while a sampled step runs, none between steps
    assert doctored.status_during["model_hook_counts"] == doctored.status_before["model_hook_counts"]
    assert doctored.status_after["model_hook_counts"] == doctored.status_before["model_hook_counts"]
    # root model + logits processor + lm_head
    assert doctored.status_during["timers"] == 3 and doctored.status_during["armed"] == 0
    assert doctored.status_after["wrapped_methods"] == []
    assert doctored.status_during["layer_wrappers"] > 0 and doctored.status_during["doctor_forwards"] == 0
    assert doctored.status_after["doctor_forwards"] == 0
    model = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    assert not any("forward" in vars(m) for m in model.modules())
    worker = engine.llm.llm_engine.model_executor.driver_worker.worker
    runner = worker.model_runner
    assert "execute_model" not in vars(runner) and "sample_tokens" not in vars(runner)
    assert runner.execute_model.__func__ is type(runner).execute_model
    assert "_vllm_doctor_session" not in vars(worker) or not vars(worker)["_vllm_doctor_session"].profiler


def test_faulty_model_findings(doctored: Run) -> None:
    r = doctored.report
    assert outcomes(r, "VD401") == [("fail", "rank 0 / cpu / model.layers.0.mlp.stray_meta")]
    assert outcomes(r, "VD405") == [("warn", "logit_gain")]
    vd404 = {(f.evidence["op"], f.subject) for f in r.by_code("VD404")}
    assert vd404 == {("Tensor.item", "model.layers.1.mlp"), ("aten.nonzero.default", "model.layers.1.mlp")}
    vd403 = {(f.evidence["kind"], f.subject, f.evidence["device"]) for f in r.by_code("VD403")}
    assert vd403 == {("wrong_device_create", "model.layers.1.mlp", "meta"), ("cross_device_copy", "model.layers.1.mlp", "meta")}
    assert all(f.evidence["count"] == 2 for f in r.by_code("VD403"))  # one prefill + one decode step probed
    assert outcomes(r, "VD402") == [("not_applicable", "rank 0 / cpu")]
    for code in ("VD208", "VD400", "VD501", "VD503", "VD504"):
        assert [o for o, _ in outcomes(r, code)] == ["pass"], (code, r.by_code(code))


def test_kv_facts_count_shared_storage_once(doctored: Run) -> None:
    vd504 = doctored.report.by_code("VD504")[0].evidence
    assert vd504["attention_layers"] == 2
    assert vd504["storage_bytes"] == vd504["planned_bytes"] == 64 * 2**20
    assert vd504["view_bytes"] == vd504["storage_bytes"]  # on CPU both layers split one storage
    vd501 = doctored.report.by_code("VD501")[0].evidence
    assert vd501["max_model_len"] == 256 and vd501["largest_length"] >= 256
    mem = doctored.report.by_code("VD503")[0].evidence
    assert mem["parts"]["kv_cache"] == 64 * 2**20 and mem["parts"]["peak_activations"] is None
    assert mem["total"] > mem["parts"]["kv_cache"] + mem["parts"]["weights"]


def test_step_profile_matches_the_workload(doctored: Run) -> None:
    prof = doctored.report.to_dict()["profiles"]["engine"]
    steps = prof["steps"]
    assert prof["clock"] == "wall_clock"
    assert steps[0]["phase"] == "prefill" and steps[0]["prefill_tokens"] == sum(doctored.prompt_lens)
    assert steps[0]["num_reqs"] == len(PROMPTS)
    decode = [s for s in steps if s["phase"] == "decode"]
    assert len(decode) == MAX_TOKENS - 1 and all(s["decode_tokens"] == len(PROMPTS) for s in decode)
    # forward and logits are timed on the samples; every step has its wall-clock time
    assert all(s["forward_s"] > 0 and s["logits_s"] > 0 and s["step_s"] >= s["forward_s"] for s in steps if s["sampled"])
    unsampled = [s for s in steps if not s["sampled"]]
    assert unsampled and all(s["forward_s"] is None and s["logits_s"] is None for s in unsampled)
    assert all(s["step_clock"] == "wall_clock" and s["step_s"] >= s["host_execute_s"] > 0 for s in steps)
    block = prof["kv_block_size"]
    assert steps[0]["kv_blocks_used"] == sum(math.ceil(n / block) for n in doctored.prompt_lens)
    kinds = prof["layers"]["by_kind"]
    assert set(kinds) == {"embedding", "attention", "mlp", "norm", "logits", "other"}
    assert [e["layer"] for e in prof["layers"]["by_layer"]] == [0, 1]
    # per-layer samples: the first 8 steps of each phase, then every 8th (decode steps 8 .. 10 -> 8)
    timed = [s["index"] for s in steps if s["layers_timed"]]
    decode_idx = [s["index"] for s in decode]
    assert timed == [steps[0]["index"], *decode_idx[:8], decode_idx[8]]
    layer0 = next(m for m in prof["layers"]["modules"] if m["name"] == "model.layers.0")
    assert (layer0["prefill_calls"], layer0["decode_calls"]) == (1, 9)
    assert prof["layers"]["timed_steps"] == 10 and prof["layers"]["sample_every"] == 8
    # nested timings: the layers, embedding and final norm lie inside the timed forward
    assert 0 < prof["layers"]["timed_fraction"] <= 1.0
    assert prof["trace"] and prof["trace"][0]["layers"]


def test_anatomy_of_a_single_process_engine(doctored: Run) -> None:
    a = doctored.report.to_dict()["facts"]["engine"]
    pid = os.getpid()
    assert a["front_end"]["pid"] == pid and a["front_end"]["engine_core_in_process"] is True
    assert [w["pid"] for w in a["workers"]] == [pid]
    assert a["model"]["origin"] == "plugin" and a["model"]["class"].endswith("DoctorFaultyLlamaForCausalLM")
    assert a["model_runner"]["kind"] == "v1" and a["executor"]["backend"] == "uni"
    assert a["kv_cache"]["num_layers"] == 2 and a["kv_cache"]["num_storages"] == 1


def test_a_probe_that_raises_is_a_crash_finding_and_the_engine_keeps_serving(engine: Engine, doctored: Run) -> None:
    import vllm_doctor
    from tests.fixtures.faults import inject_fault

    # no worker method injects a fault (nothing a served engine's /collective_rpc reaches):
    # the test hands vLLM's collective_rpc the function itself
    for where in ("layers", "probe", "rpc:doctor_kv"):
        assert where in engine.llm.collective_rpc(inject_fault, args=(where,))[0]["faults"]
    with vllm_doctor.attach(engine.llm) as doc:
        during = generate(engine.llm)
        report = doc.report()
    assert during == doctored.base
    crashed = {(f.code, f.evidence.get("component")) for f in report.findings if f.outcome.value == "crash"}
    assert {("VD400", "layers"), ("VD400", "probe"), ("VD501", None), ("VD504", None), ("VD208", None)} <= crashed
    assert report.to_dict()["profiles"]["engine"]["steps"]  # per-step timing survived the layer-hook crash
    assert generate(engine.llm) == doctored.base  # detached: faults gone with the session
    # a crashing step wrapper: vLLM's own execute_model still runs, every step
    engine.llm.collective_rpc(inject_fault, args=("steps",))
    with vllm_doctor.attach(engine.llm, probe=False) as doc:
        assert generate(engine.llm) == doctored.base
    assert any(f.code == "VD400" and f.evidence.get("component") == "steps" for f in doc.report().findings)


def test_missing_extension_is_explained_on_a_real_engine(engine: Engine) -> None:
    from vllm_doctor.compat.llm import EngineHandle, ExtensionMissing

    with pytest.raises(ExtensionMissing, match="worker_extension_cls"):
        EngineHandle(engine.llm).ensure_extension("doctor_no_such_method")


def test_vllms_torch_profiler_deep_dive(engine: Engine) -> None:
    from vllm_doctor.compat.llm import EngineHandle

    handle = EngineHandle(engine.llm)
    assert handle.torch_profiler_dir() == str(engine.torch_dir)
    handle.start_torch_profile()
    generate(engine.llm)
    handle.stop_torch_profile()
    traces = [p for p in engine.torch_dir.rglob("*") if p.is_file()]
    assert traces, "vLLM's torch profiler wrote nothing"


def test_multiprocess_engine_attach(tmp_path: Path) -> None:
    """Engine core and worker in their own processes: every call crosses process boundaries.

    The same run opts in to the doctor's vllm.general_plugins entry point (VLLM_DOCTOR=1):
    every vLLM process records itself.
    """
    model_dir = build_llama_dir(tmp_path / "llama", ["LlamaForCausalLM"])
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_PLUGINS")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(VLLM_DOCTOR="1", VLLM_DOCTOR_DIR=str(tmp_path / "procs"))
    proc = subprocess.run([sys.executable, "-m", "tests.fixtures.mp_attach_child", str(model_dir), str(out)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same"] is True
    workers = result["anatomy"]["workers"]
    front = result["anatomy"]["front_end"]
    assert workers[0]["pid"] != front["pid"] and front["engine_core_in_process"] is False
    assert result["anatomy"]["model"]["origin"] == "built-in"
    # requests reach a separate engine core one by one: the first step may hold only one of them
    steps = result["steps"]
    assert sum(s["prefill_tokens"] for s in steps) == sum(result["prompt_lens"])
    assert sum(s["decode_tokens"] for s in steps) == 2 * 7 and result["layers_on"] is True
    codes = {(c, o) for c, o, _ in result["findings"]}
    assert ("VD401", "pass") in codes and ("VD504", "pass") in codes and ("VD404", "pass") in codes
    assert result["status_after"][0]["data"]["model_hook_counts"] == {"forward_pre_hooks": 0, "forward_hooks": 0}
    assert result["missing_message"] and "worker_extension_cls" in result["missing_message"]
    # every process recorded itself while the engine ran, and no record is left once it stopped
    assert {front["pid"], workers[0]["pid"], *front["engine_core_pids"]} <= set(result["recorded"])
    assert not list((tmp_path / "procs").glob("proc-*.json"))


def test_the_roofline_of_a_real_cpu_worker(doctored: Run) -> None:
    """The worker sends the config's sizes (MLP, vocabulary, tied embeddings) and its device; on
    CPU the rates come without a share (no honest peak), and none is flagged above a peak."""
    prof = doctored.report.to_dict()["profiles"]["engine"]
    roof = prof["roofline"]
    assert roof["available"], roof.get("reason")
    hf = doctored.report.to_dict()["facts"]["engine"]["kv_cache"]
    assert roof["model"]["layers"] == hf["num_layers"] == 2
    assert roof["model"]["vocab"] > 0 and roof["model"]["intermediate"] > 0
    assert roof["device"]["bandwidth_bytes_s"] is None and roof["device"]["flops_s"] is None
    decode = roof["phases"]["decode"]
    assert decode["workload"]["seqs"] == len(PROMPTS) and decode["workload"]["tokens"] == len(PROMPTS)
    assert decode["bytes_per_s"] > 0 and decode["bandwidth_share"] is None and not decode["above_peak"]
    assert decode["step_s"] == prof["phases"]["decode"]["step_s_mean"]
    assert {x["phase"] for x in roof["layers"]} == {"prefill", "decode"} and not roof["above_peak"]

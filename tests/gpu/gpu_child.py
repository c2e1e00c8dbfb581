"""One GPU engine run for tests/gpu/test_engine_gpu.py, in a fresh process per runner kind.

    python -m tests.gpu.gpu_child MODEL_DIR OUT_JSON {v2|v1|graphs}

v2: vLLM's default model runner (V2 on vLLM >= 0.26), eager; v1: VLLM_USE_V2_MODEL_RUNNER=0,
eager; graphs: default runner, no torch.compile, FULL CUDA graphs for decode (per-layer timing at the
attention calls, events captured into the graphs); budget: as graphs, 64 tokens a prompt, with the
doctor's own budget as the environment leaves it (the parent sets VLLM_DOCTOR_OWN_BUDGET=0 for the
other modes, whose tests count the cadence's samples);
plugin: VLLM_DOCTOR=1 and a plain ``LLM(...)`` (no worker_extension_cls) with the engine core
in its own process: the opt-in plugin must add the extension (the parent puts the doctor's
entry point on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import sys


def main(model_dir: str, out: str, mode: str) -> None:
    if mode == "plugin":
        plugin_main(model_dir, out)
        return
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if mode == "v1":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    import torch
    from vllm import LLM

    import vllm_doctor
    from vllm_doctor.compat.llm import greedy
    from vllm_doctor.report.profile import render_profile

    graphs = mode in ("graphs", "budget")
    kwargs = vllm_doctor.engine_kwargs(enforce_eager=not graphs, gpu_memory_utilization=0.15, max_model_len=512)
    if graphs:
        kwargs["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    llm = LLM(model=model_dir, **kwargs)
    prompts = ["hello world", "the capital of france is", "my name is"]
    params = greedy(64 if mode == "budget" else 16, ignore_eos=True)
    base = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    with vllm_doctor.attach(llm) as doc:
        during = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    after = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    report = doc.report()
    worker = llm.llm_engine.model_executor.driver_worker.worker
    kv = worker.model_runner.kv_caches
    kv_list = list(kv.values()) if isinstance(kv, dict) else list(kv)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kv_list}
    planned = sum(int(t.size) for t in worker.model_runner.kv_cache_config.kv_cache_tensors)
    result = {
        "mode": mode,
        "same": base == during == after,
        "report": report.to_dict(),
        "report_text": render_profile(report.profiles["engine"]),
        "torch_kv_storage_bytes": sum(storages.values()),
        "vllm_planned_kv_bytes": planned,
        "torch_allocated": torch.cuda.memory_allocated(),
        "runner_module": type(worker.model_runner).__module__,
    }
    with open(out, "w") as fh:
        json.dump(result, fh, default=str)


def plugin_main(model_dir: str, out: str) -> None:
    os.environ["VLLM_DOCTOR"] = "1"
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    from vllm import LLM

    import vllm_doctor
    from vllm_doctor.compat.llm import greedy

    llm = LLM(model=model_dir, enforce_eager=True, gpu_memory_utilization=0.15, max_model_len=512)
    prompts = ["hello world", "the capital of france is", "my name is"]
    params = greedy(16, ignore_eos=True)
    base = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    with vllm_doctor.attach(llm) as doc:
        during = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    report = doc.report()
    result = {
        "mode": "plugin",
        "same": base == during,
        "report": report.to_dict(),
        "front_end_pid": os.getpid(),
        "worker_extension_cls": llm.llm_engine.vllm_config.parallel_config.worker_extension_cls,
    }
    with open(out, "w") as fh:
        json.dump(result, fh, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])

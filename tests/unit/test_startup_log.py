"""compat.startup.root_cause_from_log: the cause of a failure in another vLLM process, read from
the engine log (the line shapes are vLLM 0.32's, as in a real engine.log; the real-engine test is
tests/engine/test_weights_engine.py::test_a_worker_that_fails_in_its_own_process_is_named_with_the_models_line)."""

from __future__ import annotations

from vllm_doctor.compat.startup import is_wrapper_error, root_cause_from_log

SITE = "/venv/lib/python3.11/site-packages"
LOG = f"""\
(EngineCore pid=10) INFO 11-30 19:28:04 [core.py:100] starting
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700] WorkerProc failed to start.
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700] Traceback (most recent call last):
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700]   File "{SITE}/vllm/v1/worker/gpu_worker.py", line 250, in load_model
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700]     self.model_runner.load_model()
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700]   File "/home/me/my_model/model.py", line 61, in __init__
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700]     self.factor = config.rope_scaling["factor"]
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700]   File "{SITE}/torch/nn/modules/module.py", line 9, in __getattr__
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700]     raise x
(Worker_TP1 pid=12) ERROR 11-30 19:28:05 [multiproc_executor.py:700] KeyError: 'factor'
(EngineCore pid=10) ERROR 11-30 19:28:06 [core.py:1510] EngineCore failed to start.
(EngineCore pid=10) ERROR 11-30 19:28:06 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=10) ERROR 11-30 19:28:06 [core.py:1510]   File "{SITE}/vllm/v1/engine/core.py", line 1482, in run_engine_core
(EngineCore pid=10) ERROR 11-30 19:28:06 [core.py:1510]     engine_core = EngineCoreProc(*args)
(EngineCore pid=10) ERROR 11-30 19:28:06 [core.py:1510] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
Traceback (most recent call last):
  File "/app/serve.py", line 3, in <module>
    LLM(model)
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}
"""


def test_the_workers_traceback_is_the_cause() -> None:
    assert is_wrapper_error("RuntimeError: Engine core initialization failed. See root cause above.")
    root = root_cause_from_log(LOG)
    assert root == {
        "process": "Worker_TP1",
        "error": "KeyError: 'factor'",
        "phase": "load",
        "function": "load_model (vllm/v1/worker/gpu_worker.py:250)",
        "where": "/home/me/my_model/model.py:61 in __init__",
    }


def test_the_engine_cores_own_failure_when_no_worker_failed() -> None:
    core_only = "\n".join(line for line in LOG.splitlines() if "Worker_TP1" not in line)
    # the core's own traceback is a pointer to a background process here: nothing else to report
    assert root_cause_from_log(core_only) is None
    numa = (
        "(EngineCore pid=1) ERROR 11-30 19:28:04 [core.py:1510] Traceback (most recent call last):\n"
        f'(EngineCore pid=1) ERROR 11-30 19:28:04 [core.py:1510]   File "{SITE}/vllm/utils/omp.py", line 217, in bind\n'
        "(EngineCore pid=1) ERROR 11-30 19:28:04 [core.py:1510]     assert ok\n"
        "(EngineCore pid=1) ERROR 11-30 19:28:04 [core.py:1510] AssertionError: Not enough allowed NUMA nodes\n"
    )
    root = root_cause_from_log(numa)
    assert root is not None and root["process"] == "EngineCore" and root["where"] is None
    assert root["error"] == "AssertionError: Not enough allowed NUMA nodes" and root["phase"] is None


def test_logs_without_a_traceback_or_garbage_give_nothing() -> None:
    assert root_cause_from_log("") is None
    assert root_cause_from_log("Traceback (most recent call last):\n") is None
    assert root_cause_from_log("\x00\xff" * 1000 + "\n(x pid=) junk") is None

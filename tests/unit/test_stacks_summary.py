"""The stack summariser on py-spy dumps recorded from a real vLLM 0.32 CPU engine.

tests/fixtures/pyspy/*.json are `py-spy dump --json` of the served example (the
forward-blocks variant: tests/fixtures/variants) while it started, idled, and hung in
TinyDoctorMLP.forward. The collective and busy cases are those recordings with frames
changed (said where), since a CPU engine with one worker has no collective to hang in.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_doctor.analysis.stacks import Judged, classify, did_not_move, is_model_code, verdict
from vllm_doctor.facts.stacks import Frame, ProcessDump, threads_from_pyspy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pyspy"
MODEL_LINE = "tiny_doctor_forward_blocks/model.py:55"


def load(name: str) -> ProcessDump:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return ProcessDump(pid=data[0]["pid"], threads=threads_from_pyspy(data))


def with_frames(dump: ProcessDump, frames: list[Frame]) -> ProcessDump:
    main = dump.main_thread()
    assert main is not None
    return ProcessDump(pid=dump.pid, threads=[replace(main, frames=tuple(frames))])


@pytest.mark.parametrize(
    ("name", "role", "state", "summary"),
    [
        ("idle-api-server", "api-server", "idle", "serving HTTP (event loop waiting)"),
        ("idle-engine-core", "engine-core", "idle", "idle, waiting for requests"),
        ("idle-worker", "worker", "idle", "idle, waiting for work"),
        ("stuck-worker", "worker", "model", f"inside the model's forward at {MODEL_LINE} (TinyDoctorMLP.forward)"),
        (
            "stuck-engine-core",
            "engine-core",
            "waiting",
            "waiting for the workers in EngineCore.step (vllm/v1/engine/core.py:674)",
        ),
        (
            "startup-worker-load-model",
            "worker",
            "startup",
            "starting up: load_model at vllm/model_executor/model_loader/base_loader.py:92",
        ),
        (
            "startup-engine-core-wait-for-ready",
            "engine-core",
            "startup",
            "starting up: wait_for_ready at vllm/v1/executor/multiproc_executor.py:799",
        ),
        (
            "startup-worker-importing",
            "worker",
            "startup",
            "starting up: importing modules (at vllm/platforms/__init__.py:51)",
        ),
        (
            "startup-api-server",
            "api-server",
            "startup",
            "starting up: wait_for_engine_startup at vllm/v1/engine/utils.py:1398",
        ),
    ],
)
def test_each_recorded_process_is_read_right(name: str, role: str, state: str, summary: str) -> None:
    got = classify(load(name), role)
    assert (got.state, got.summary) == (state, summary)


def test_the_hung_forward_names_its_file_and_line() -> None:
    got = classify(load("stuck-worker"), "worker")
    assert (got.where, got.function, got.active) == (MODEL_LINE, "TinyDoctorMLP.forward", False)


def _judged(pid: int, label: str, role: str, name: str, still: bool | None) -> Judged:
    return Judged(pid, label, role, classify(load(name), role), still)


def test_verdicts_from_recorded_engines() -> None:
    idle = [
        _judged(1, "API server", "api-server", "idle-api-server", True),
        _judged(2, "EngineCore", "engine-core", "idle-engine-core", True),
        _judged(3, "worker 0", "worker", "idle-worker", True),
    ]
    assert verdict(idle, 1.0).kind == "idle"
    hung = [
        idle[0],
        _judged(2, "EngineCore", "engine-core", "stuck-engine-core", True),
        _judged(3, "worker 0", "worker", "stuck-worker", True),
    ]
    got = verdict(hung, 2.0)
    assert got.kind == "stuck in the model" and got.pids == (3,)
    assert got.text == f"stuck in the model: worker 0 did not move at {MODEL_LINE} (TinyDoctorMLP.forward) for 2.0 s"
    # the same stacks, moving: busy, led by the worker in the model (not the waiting engine core)
    moving = [replace(p, still=False) for p in hung]
    assert verdict(moving, 2.0).kind == "busy" and verdict(moving, 2.0).text.startswith("busy: worker 0 inside")
    one_sample = [replace(p, still=None) for p in hung]
    assert verdict(one_sample, 0.0).kind == "busy" and "one sample" in verdict(one_sample, 0.0).text
    starting = [
        _judged(2, "EngineCore", "engine-core", "startup-engine-core-wait-for-ready", True),
        _judged(3, "worker 0", "worker", "startup-worker-load-model", True),
    ]
    assert verdict(starting, 1.0).kind == "stuck in start-up"
    assert verdict([replace(p, still=False) for p in starting], 1.0).kind == "busy"


def _collective(dump: ProcessDump) -> ProcessDump:
    """The recorded hung worker, inside an all-reduce called from its MLP (as a TP rank would be)."""
    main = dump.main_thread()
    assert main is not None
    frames = list(main.frames)
    allreduce = [
        Frame("all_reduce", "/x/torch/distributed/distributed_c10d.py", "torch/distributed/distributed_c10d.py", 2800),
        Frame(
            "GroupCoordinator.all_reduce",
            "/x/vllm/distributed/parallel_state.py",
            "vllm/distributed/parallel_state.py",
            500,
        ),
        Frame(
            "tensor_model_parallel_all_reduce",
            "/x/vllm/distributed/communication_op.py",
            "vllm/distributed/communication_op.py",
            14,
        ),
        Frame(
            "RowParallelLinear.forward",
            "/x/vllm/model_executor/layers/linear.py",
            "vllm/model_executor/layers/linear.py",
            1400,
        ),
    ]
    return with_frames(dump, allreduce + frames)


def test_a_collective_called_from_the_model_is_a_collective() -> None:
    got = classify(_collective(load("stuck-worker")), "worker")
    assert got.state == "collective"
    assert got.summary == (
        "in a collective: tensor_model_parallel_all_reduce, waiting at torch/distributed/distributed_c10d.py:2800 "
        "(all_reduce), "
        f"called from the model at {MODEL_LINE} (TinyDoctorMLP.forward)"
    )


def test_a_rank_in_its_forward_outranks_ranks_waiting_in_a_collective() -> None:
    in_collective = Judged(4, "worker 1", "worker", classify(_collective(load("stuck-worker")), "worker"), True)
    assert verdict([in_collective], 3.0).kind == "stuck in a collective"
    in_model = _judged(3, "worker 0", "worker", "stuck-worker", True)
    got = verdict([in_collective, in_model], 3.0)
    assert got.kind == "stuck in the model" and got.pids == (3,)


def test_did_not_move_compares_main_thread_stacks() -> None:
    a, b = load("stuck-worker"), load("stuck-worker-2")
    assert did_not_move([a, b]) is True
    main = b.main_thread()
    assert main is not None
    moved = with_frames(b, [replace(main.frames[0], line=56), *main.frames[1:]])
    assert did_not_move([a, moved]) is False
    assert did_not_move([a]) is None
    assert did_not_move([a, ProcessDump(pid=a.pid, error="gone")]) is None


def test_model_code_is_the_users_and_vllms_model_files_not_libraries() -> None:
    def frame(short: str) -> Frame:
        return Frame("f", "/site/" + short, short, 1)

    assert is_model_code(frame("my_model/model.py")) and is_model_code(frame("my_model.py"))
    assert is_model_code(frame("vllm/model_executor/models/llama.py"))
    assert not is_model_code(frame("vllm/model_executor/layers/linear.py"))
    assert not is_model_code(frame("torch/nn/modules/module.py")) and not is_model_code(frame("threading.py"))
    assert not is_model_code(frame("<frozen runpy>"))


def test_errors_and_malformed_dumps() -> None:
    assert classify(ProcessDump(pid=1, error="py-spy may not read process 1"), "worker").state == "error"
    assert (
        verdict([Judged(1, "worker 0", "worker", classify(ProcessDump(pid=1, error="x"), "worker"), None)], 0).kind
        == "unknown"
    )
    with pytest.raises(ValueError, match="not a list"):
        threads_from_pyspy({"frames": []})
    with pytest.raises(ValueError, match="without frames"):
        threads_from_pyspy([{"thread_id": 1}])


def test_native_frames_do_not_hide_what_the_python_stack_says() -> None:
    """`stacks --native` dumps (recorded): C frames on top of the Python ones change no state."""
    got = classify(load("stuck-worker-native"), "worker")
    assert (got.state, got.where) == ("model", MODEL_LINE)
    main = load("stuck-worker-native").main_thread()
    assert main is not None and main.frames[0].native and main.frames[0].name == "clock_nanosleep"
    assert did_not_move([load("stuck-worker"), load("stuck-worker-native")]) is True  # Python frames compared
    assert classify(load("idle-api-server-native"), "api-server").state == "idle"


def test_a_native_nccl_frame_under_the_model_is_a_collective() -> None:
    dump = load("stuck-worker-native")
    main = dump.main_thread()
    assert main is not None
    nccl = Frame("ncclGroupEnd", "/usr/lib/libnccl.so.2", "libnccl.so.2", 0)
    got = classify(with_frames(dump, [nccl, *main.frames[2:]]), "worker")
    assert got.state == "collective" and got.where == "libnccl.so.2:0"
    assert got.summary.endswith(f"called from the model at {MODEL_LINE} (TinyDoctorMLP.forward)")


def test_a_single_process_engine_is_judged_and_a_stranger_is_unknown() -> None:
    """LLM(...) with VLLM_ENABLE_V1_MULTIPROCESSING=0: the model runs in the user's own process."""
    dump = load("stuck-worker")
    main = dump.main_thread()
    assert main is not None
    script = Frame("main", "/home/me/run.py", "run.py", 12)
    steps = [f for f in main.frames if "worker_busy_loop" not in f.name and "spawn" not in f.short]
    inline = with_frames(dump, [*steps[:-6], script])
    state = classify(inline, "other")
    assert (state.state, state.where) == ("model", MODEL_LINE)
    assert verdict([Judged(1, "run.py", "other", state, True)], 1.0).kind == "stuck in the model"
    stranger = with_frames(dump, [script])
    got = verdict([Judged(1, "run.py", "other", classify(stranger, "other"), True)], 1.0)
    assert got.kind == "unknown" and "no vLLM engine loop" in got.text

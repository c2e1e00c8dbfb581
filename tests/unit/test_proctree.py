"""live/proctree: discovery of an engine's processes from /proc, and their roles and ranks."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_doctor.errors import DoctorInputError
from vllm_doctor.live.proctree import ProcInfo, RawProc, discover, label, read_proc

TREE = Path(__file__).resolve().parents[1] / "fixtures" / "titled_tree.py"
SPAWN = "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork"


def raw(pid: int, ppid: int, cmdline: str, comm: str = "python") -> RawProc:
    return RawProc(pid=pid, ppid=ppid, comm=comm, cmdline=cmdline)


def test_a_served_engine_is_labelled_from_titles_and_command_lines() -> None:
    procs = label([
        raw(10, 1, "python -m vllm.entrypoints.openai.api_server --model m --port 8000"),
        raw(11, 10, "VLLM::EngineCore", comm="VLLM::EngineCor"),
        raw(12, 10, "python -c from multiprocessing.resource_tracker import main;main(4)"),
        raw(13, 11, "VLLM::Worker_PP1_TP0", comm="VLLM::Worker_PP"),
        raw(14, 11, "VLLM::Worker_PP0_TP1", comm="VLLM::Worker_PP"),
        raw(15, 11, "VLLM::Worker_PP0_TP0", comm="VLLM::Worker_PP"),
        raw(16, 11, "VLLM::Worker_PP1_TP1", comm="VLLM::Worker_PP"),
    ])
    got = {p.pid: (p.role, p.rank, p.title) for p in procs}
    assert got == {
        10: ("api-server", None, "python"),
        11: ("engine-core", None, "VLLM::EngineCore"),
        12: ("other", None, "python"),
        # pp-major ranks, as vLLM numbers them, whatever the spawn order
        15: ("worker", 0, "VLLM::Worker_PP0_TP0"),
        14: ("worker", 1, "VLLM::Worker_PP0_TP1"),
        13: ("worker", 2, "VLLM::Worker_PP1_TP0"),
        16: ("worker", 3, "VLLM::Worker_PP1_TP1"),
    }
    assert [p.label() for p in procs][:2] == ["API server", "EngineCore"]
    assert procs[3].label() == "worker 2"
    (late,) = [p for p in label([raw(20, 1, "VLLM::EngineCore"), raw(21, 20, "VLLM::Worker_TP1"), raw(22, 20, SPAWN)]) if p.pid == 22]
    assert (late.role, late.rank, late.label()) == ("worker", None, "worker ?")


def test_untitled_spawned_children_take_their_role_from_the_parent() -> None:
    """Between spawn and setproctitle a child shows multiprocessing's command line."""
    procs = label([raw(20, 1, "vllm serve ./m"), raw(21, 20, SPAWN), raw(22, 21, SPAWN), raw(23, 21, SPAWN)])
    assert [(p.role, p.rank) for p in procs] == [("api-server", None), ("engine-core", None), ("worker", 0), ("worker", 1)]


def test_a_truncated_comm_title_still_names_the_role_and_a_custom_prefix_is_kept() -> None:
    (core,) = label([raw(30, 1, "", comm="VLLM::EngineCor")])
    assert (core.role, core.title) == ("engine-core", "VLLM::EngineCor")
    (dp,) = label([raw(31, 1, "myapp::EngineCore_DP1", comm="myapp::EngineCo")])
    assert (dp.role, dp.rank, dp.label()) == ("engine-core", 1, "EngineCore DP1")
    (coord,) = label([raw(32, 1, "VLLM::DPCoordinator")])
    assert coord.role == "other" and coord.label() == "VLLM::DPCoordinator"


def test_procinfo_is_frozen() -> None:
    info = ProcInfo(1, 0, "worker", 0, "VLLM::Worker", "VLLM::Worker")
    with pytest.raises(AttributeError):
        info.rank = 1  # type: ignore[misc]


def test_read_proc_reads_this_process() -> None:
    me = read_proc(os.getpid())
    assert me is not None and me.ppid == os.getppid() and "python" in me.cmdline.lower()
    assert read_proc(2**22 + 7) is None  # above pid_max: no such process


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give either a URL or a pid"),
        ({"url": "http://127.0.0.1:1", "pid": 1}, "give either a URL or a pid"),
        ({"pid": 2**22 + 7}, "no process with pid"),
        ({"url": "http://10.1.2.3:8000"}, "10.1.2.3 is not this machine"),
        ({"url": "http://127.0.0.1:99999"}, "not a server URL"),
    ],
)
def test_bad_targets_are_input_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(DoctorInputError, match=message):
        discover(**kwargs)


def test_nobody_listening_is_an_input_error() -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago and is not listened on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DoctorInputError, match=f"no process of this machine listens on port {port}"):
        discover(url=f"127.0.0.1:{port}")


@dataclass
class Tree:
    root: int
    core: int
    workers: list[int]  # [TP1, TP0, untitled]


@pytest.fixture(scope="module")
def tree() -> Iterator[tuple[Tree, int]]:
    if importlib.util.find_spec("setproctitle") is None:
        pytest.skip("setproctitle (a vLLM dependency) is not installed")
    proc = subprocess.Popen([sys.executable, str(TREE)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        fields = proc.stdout.readline().split()
        assert fields and fields[0] == "PORT", fields
        port, core, *workers = (int(f) for f in fields[1:])
        for pid in (core, *workers[:2]):  # until each child has set its title (or died)
            while (me := read_proc(pid)) is not None and not me.cmdline.startswith("VLLM::"):
                time.sleep(0.05)
        yield Tree(proc.pid, core, workers), port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _expected(t: Tree) -> list[tuple[int, int, str, int | None, str]]:
    tp1, tp0, untitled = t.workers
    return [
        (t.root, os.getpid(), "other", None, "python"),
        (t.core, t.root, "engine-core", None, "VLLM::EngineCore"),
        (tp1, t.core, "worker", 1, "VLLM::Worker_TP1"),
        (tp0, t.core, "worker", 0, "VLLM::Worker_TP0"),
        (untitled, t.core, "worker", None, "python"),
    ]


def _seen(procs: list[ProcInfo]) -> list[tuple[int, int, str, int | None, str]]:
    return [(p.pid, p.ppid, p.role, p.rank, p.title[: len("python")] if p.role == "other" else p.title) for p in procs]


def test_discover_by_url_finds_the_listener_and_its_descendants(tree: tuple[Tree, int]) -> None:
    t, port = tree
    procs = discover(url=f"http://127.0.0.1:{port}")
    assert _seen(procs) == _expected(t)
    assert procs[1].cmdline == "VLLM::EngineCore" and str(TREE) in procs[0].cmdline


@pytest.mark.parametrize("which", ["root", "core", "worker"])
def test_discover_by_pid_walks_up_to_the_root(tree: tuple[Tree, int], which: str) -> None:
    t, _ = tree
    pid = {"root": t.root, "core": t.core, "worker": t.workers[0]}[which]
    assert _seen(discover(pid=pid)) == _expected(t)

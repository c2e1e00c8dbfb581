"""The janitor of vllm_doctor/stages/tempdirs.py on real processes (issue 24, item 6.1).

A doctor-like script makes directories and starts a child from a thread (the kernel's
parent-death signal does not cover such a child); SIGKILLed, it can clean nothing itself: the
janitor kills the child's process group and removes every directory not handed over with keep().
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

from tests.unit.test_child import REPO, wait_gone

SCRIPT = """
    import json, os, threading, time
    from vllm_doctor.stages import tempdirs
    from vllm_doctor.stages.child import ChildJob
    kept, gone = tempdirs.make("vllm-doctor-kept-"), tempdirs.make("vllm-doctor-gone-")
    tempdirs.keep(kept)
    jobs = []
    thread = threading.Thread(target=lambda: jobs.append(ChildJob(
        "selftest", {{"sleep": 600, "pid_file": {pid_file!r}}}, timeout=600, what="the self-test")))
    thread.start(); thread.join()
    while not os.path.exists({pid_file!r}):
        time.sleep(0.05)
    print(json.dumps({{"kept": kept, "gone": gone, "job": jobs[0]._tmp}}), flush=True)
    time.sleep(600)
"""


def run_script(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, str], int]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid_file = tmp_path / "pids.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.format(pid_file=str(pid_file)))],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    dirs = json.loads(proc.stdout.readline())
    return proc, dirs, json.loads(pid_file.read_text())["child"]


def test_after_a_sigkill_the_janitor_kills_the_children_and_removes_all_but_kept_dirs(tmp_path: Path) -> None:
    proc, dirs, child = run_script(tmp_path)
    assert all(os.path.isdir(p) for p in dirs.values())
    assert all(Path(p).parent == tmp_path / "tmp" for p in dirs.values())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert wait_gone([child], 30) == []  # no parent-death signal for a thread's child: the janitor's kill
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (os.path.exists(dirs["gone"]) or os.path.exists(dirs["job"])):
        time.sleep(0.05)
    assert not os.path.exists(dirs["gone"]) and not os.path.exists(dirs["job"])
    assert os.path.isdir(dirs["kept"])


def test_directories_are_private_and_removed_at_exit(tmp_path: Path) -> None:
    code = (
        "import os, stat; from vllm_doctor.stages import tempdirs\n"
        "p = tempdirs.make('vllm-doctor-x-'); print(p, oct(stat.S_IMODE(os.stat(p).st_mode)), flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)},
    ).stdout.split()  # fmt: skip
    assert out[1] == "0o700" and Path(out[0]).parent == tmp_path
    assert os.listdir(tmp_path) == []  # gone when the process exited, before run() returned


def test_a_forked_process_leaves_the_doctors_directories_alone(tmp_path: Path) -> None:
    code = (
        "import os, sys; from vllm_doctor.stages import tempdirs\n"
        "p = tempdirs.make('vllm-doctor-x-')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # runs the atexit handlers it inherited\n"
        "os.waitpid(pid, 0); print(os.path.isdir(p), flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.stdout.strip() == "True", out.stderr
    assert os.listdir(tmp_path) == []

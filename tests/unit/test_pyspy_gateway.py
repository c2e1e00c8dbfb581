"""compat/pyspy on real processes: dumps, refusals mapped to a fix, time limits; the CLI's exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_doctor
from vllm_doctor.compat.pyspy import PySpy, PySpyError, _run, find_pyspy, parse_version
from vllm_doctor.model import Report
from vllm_doctor.report.html import CPU_BEGIN, link_cpu_profile, render_html

needs_pyspy = pytest.mark.skipif(find_pyspy() is None, reason="py-spy is not installed")
SLEEPER = textwrap.dedent(
    """\
    import sys, time
    def wait_here():
        print("ready", flush=True)
        time.sleep(600)  # line 4
    wait_here()
    """
)


@pytest.fixture(scope="module")
def sleeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    script = tmp_path_factory.mktemp("sleeper") / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc.pid
    proc.kill()
    proc.wait(timeout=30)


@needs_pyspy
def test_dump_reads_a_real_python_process(sleeper: int) -> None:
    spy = PySpy()
    assert spy.version >= (0, 4, 0)
    dump = spy.dump(sleeper)
    main = dump.main_thread()
    assert main is not None and main.os_thread_id == sleeper and main.active is False
    assert [(f.name, f.short, f.line) for f in main.frames] == [
        ("wait_here", "sleeper.py", 4),
        ("<module>", "sleeper.py", 5),
    ]


@needs_pyspy
def test_a_process_that_is_not_python_or_gone_is_said_so() -> None:
    spy = PySpy()
    sleep = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.2)
        with pytest.raises(PySpyError) as err:
            spy.dump(sleep.pid)
        assert err.value.kind == "not-python" and str(err.value) == f"process {sleep.pid} is not a Python process py-spy can read"
    finally:
        sleep.kill()
        sleep.wait()
    with pytest.raises(PySpyError) as err:
        spy.dump(sleep.pid)
    assert err.value.kind == "gone" and err.value.message == f"process {sleep.pid} is gone"


@needs_pyspy
def test_recording_an_idle_process_says_there_were_no_samples(sleeper: int, tmp_path: Path) -> None:
    with pytest.raises(PySpyError) as err:
        PySpy().record(sleeper, tmp_path / "idle.svg", "flamegraph", duration=1)
    assert err.value.kind == "no-samples" and "--idle" in err.value.hint
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind
    PySpy().record(sleeper, tmp_path / "idle.speedscope.json", "speedscope", duration=1, idle=True)
    assert (tmp_path / "idle.speedscope.json").read_text().startswith('{"$schema"')


BUSY = textwrap.dedent(
    """\
    import sys, threading, time
    def spin():
        while True:
            sum(range(1000))
            time.sleep(0.001)
    def deep(n):
        spin() if n == 0 else deep(n - 1)
    for _ in range(200):
        threading.Thread(target=deep, args=(40,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(600)
    """
)


@needs_pyspy
def test_a_recording_lasts_its_seconds_when_py_spy_falls_behind(tmp_path: Path) -> None:
    """py-spy's own --duration counts sampling intervals: at 1000 Hz on 200 threads 40 frames deep
    it cannot keep up, and `--duration 3` takes minutes here (the old gateway gave up at its 63 s
    limit: a PySpyError). The gateway stops it by the clock instead, with the samples it took,
    and says how far it fell behind."""
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    busy = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline().strip() == "ready"
        result = PySpy().record(busy.pid, tmp_path / "busy.svg", "flamegraph", duration=3, rate=1000)
    finally:
        busy.kill()
        busy.wait(timeout=30)
    svg = (tmp_path / "busy.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "spin" in svg
    assert result.samples and result.behind_s >= 1.0, result
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_missing_and_too_old_py_spy_are_input_errors(tmp_path: Path) -> None:
    env = dict(os.environ, VLLM_DOCTOR_PY_SPY=str(tmp_path / "no-such-py-spy"))
    proc = run_doctor(["stacks", "--pid", str(os.getpid())], env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"vllm-doctor: error: py-spy at {tmp_path / 'no-such-py-spy'} cannot run:")
    old = tmp_path / "py-spy"
    old.write_text("#!/bin/sh\necho 'py-spy 0.3.14'\n")
    old.chmod(0o755)
    proc = run_doctor(["cpu-profile", "--pid", str(os.getpid()), "--out", str(tmp_path / "p")],
                      env=dict(os.environ, VLLM_DOCTOR_PY_SPY=str(old)), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"vllm-doctor: error: py-spy 0.3.14 at {old} is too old (vllm-doctor needs 0.4.0 or newer)",
        "  hint: `pip install -U 'py-spy>=0.4.0'`",
    ]
    assert parse_version("py-spy 0.4.3\n") == (0, 4, 3) and parse_version("nothing") is None


def test_a_call_past_its_limit_is_killed_with_its_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        _run(["sh", "-c", f"echo $$ > {pidfile}; sleep 60 & sleep 60"], timeout=1.0)
    group = int(pidfile.read_text())
    time.sleep(0.2)
    assert _living_members(group) == []  # the shell and its background sleep are gone (zombies at most)


def _living_members(group: int) -> list[int]:
    living = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and int(fields[2]) == group and fields[0] != "Z":
            living.append(int(entry.name))
    return living


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stacks", "--pid", "1", "--rounds", "2"], "--rounds needs --watch"),
        (["stacks", "--pid", "1", "--samples", "0"], "--samples must be >= 1"),
        (["stacks", "--url", "http://10.0.0.9:8000"], "10.0.0.9 is not this machine"),
        (["cpu-profile", "--pid", "1", "--out", "x", "--rate", "0"], "--rate must be between 1 and 1000 Hz"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], message: str) -> None:
    proc = run_doctor(args, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cpu_profile_section_is_put_into_a_report_once() -> None:
    index = {
        "duration_s": 3,
        "rate_hz": 100,
        "processes": [
            {"label": "worker 0", "pid": 7, "title": "VLLM::Worker", "flamegraph": "cpu-worker0-7.svg",
             "speedscope": "cpu-worker0-7.speedscope.json", "error": None},
            {"label": "EngineCore", "pid": 6, "title": "VLLM::EngineCore", "flamegraph": None, "speedscope": None,
             "error": "process 6 ran no Python code in 3 s (idle: no samples)"},
        ],
    }
    html = link_cpu_profile(render_html(Report("t")), index)
    assert html.count(CPU_BEGIN) == 1 and html.rstrip().endswith("</body></html>")
    assert '<a href="cpu-worker0-7.svg">flamegraph</a>' in html and "idle: no samples" in html
    again = link_cpu_profile(html, {**index, "processes": index["processes"][:1]})
    assert again.count(CPU_BEGIN) == 1 and "idle: no samples" not in again
    assert '<a href="cpu-worker0-7.svg">' in render_html(Report("t"), index)


@pytest.mark.parametrize(
    ("owner", "caps", "scope", "container", "message", "hint"),
    [
        (0, 0, "1", False, "it belongs to uid 0 and vllm-doctor runs as uid 1000",
         "run vllm-doctor as the engine's user (uid 0): `sudo -u '#0' vllm-doctor ...`, or as root"),
        (1000, 0, "1", False, "kernel.yama.ptrace_scope is 1 (",
         "allow it until the next reboot: `sudo sysctl -w kernel.yama.ptrace_scope=0` (or run vllm-doctor as root)"),
        (1000, 0, "3", False, "kernel.yama.ptrace_scope is 3 (",
         "ptrace_scope 3 cannot be lowered until a reboot: run vllm-doctor as root"),
        (1000, 0, "0", True, "this container lacks the SYS_PTRACE capability",
         "start the container with `docker run --cap-add SYS_PTRACE ...` "
         "(Kubernetes: securityContext.capabilities.add: [SYS_PTRACE])"),
        (1000, 1 << 19, "1", True, "permission denied", "run vllm-doctor as the engine's user or as root"),
    ],
)
def test_each_ptrace_refusal_gets_its_own_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, owner: int, caps: int, scope: str, container: bool,
    message: str, hint: str,
) -> None:
    """Which rule refused ptrace, from the facts the gateway reads (uid, CapEff, Yama, container)."""
    from vllm_doctor.compat import pyspy

    (tmp_path / "ptrace_scope").write_text(scope + "\n")
    monkeypatch.setattr(pyspy, "PTRACE_SCOPE", tmp_path / "ptrace_scope")
    monkeypatch.setattr(pyspy, "_capabilities", lambda: caps)
    monkeypatch.setattr(pyspy, "_uid_of", lambda pid: owner)
    monkeypatch.setattr(pyspy, "_in_container", lambda: container)
    monkeypatch.setattr(pyspy.os, "geteuid", lambda: 1000)
    got_message, got_hint = pyspy.diagnose_permission(42)
    assert got_message.startswith("py-spy may not read process 42: ") and message in got_message
    assert got_hint == hint


def test_a_profile_report_written_after_cpu_profile_keeps_the_links(tmp_path: Path) -> None:
    from vllm_doctor.files import write_json_atomic
    from vllm_doctor.model import Report
    from vllm_doctor.report.write import cpu_profile_index, write_reports

    assert cpu_profile_index(tmp_path) is None
    write_json_atomic(tmp_path / "index.json", {"kind": "vllm-doctor cpu-profile", "duration_s": 2, "rate_hz": 100,
                                                "processes": [{"label": "worker 0", "pid": 7, "title": "VLLM::Worker",
                                                               "flamegraph": "cpu-worker0-7.svg", "speedscope": None}]})
    write_reports(tmp_path, Report(target="m"))
    assert '<a href="cpu-worker0-7.svg">flamegraph</a>' in (tmp_path / "report.html").read_text()
    (tmp_path / "index.json").write_text('{"kind": "something else"}')
    assert cpu_profile_index(tmp_path) is None

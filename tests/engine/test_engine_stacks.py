"""`vllm-doctor stacks` and `cpu-profile` against a real served vLLM CPU engine.

One server (API server + EngineCore + worker processes) serves the forward-blocks variant of
the example (tests/fixtures/variants: TinyDoctorMLP.forward waits while a file of this test
exists). The server runs WITHOUT the doctor's plugin: a hung engine must be readable as it is.
The tests run in file order: idle, then hung in the forward, then released and profiled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_doctor
from tests.served import REPO_ROOT, BlockingEngine, blocking_engine, by_role, complete, hung, stacks_json

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlockingEngine]:
    with blocking_engine(tmp_path_factory.mktemp("stacks")) as served:
        yield served


def test_an_idle_server_is_idle_and_every_process_is_labelled(engine: BlockingEngine) -> None:
    code, report = stacks_json("--url", engine.base)
    assert code == 0 and report["verdict"]["kind"] == "idle", report["verdict"]
    roles = by_role(report)
    # the multiprocess engine as it really is on CPU: API server -> EngineCore -> one worker
    (api,) = roles["api-server"]
    (core,) = roles["engine-core"]
    (worker,) = roles["worker"]
    assert api["pid"] == engine.api_pid and core["ppid"] == api["pid"] and worker["ppid"] == core["pid"]
    assert (core["title"], core["label"]) == ("VLLM::EngineCore", "EngineCore")
    assert (worker["title"], worker["rank"], worker["label"]) == ("VLLM::Worker", 0, "worker 0")
    assert [p["summary"] for p in (api, core, worker)] == [
        "serving HTTP (event loop waiting)", "idle, waiting for requests", "idle, waiting for work"]
    assert all(p["state"] == "idle" and p["threads"] for p in (api, core, worker))

    # any pid of the tree finds the same tree (a worker's pid walks up to the API server)
    code, from_worker = stacks_json("--pid", str(worker["pid"]), "--samples", "1")
    assert {p["pid"] for p in from_worker["processes"]} == {api["pid"], core["pid"], worker["pid"]}


def test_a_forward_that_hangs_is_found_at_its_line(engine: BlockingEngine) -> None:
    with hung(engine) as done:
        code, report = stacks_json("--url", engine.base, "--samples", "2", "--interval", "1")
        assert code == 1, report["verdict"]
        worker = by_role(report)["worker"][0]
        core = by_role(report)["engine-core"][0]
        assert report["verdict"]["kind"] == "stuck in the model" and report["verdict"]["pids"] == [worker["pid"]]
        assert (worker["state"], worker["where"], worker["function"]) == ("model", engine.hang_line, "TinyDoctorMLP.forward")
        assert worker["did_not_move"] is True
        assert core["state"] == "waiting" and core["summary"].startswith("waiting for the workers")
        assert report["verdict"]["text"].startswith(f"stuck in the model: worker 0 did not move at {engine.hang_line}")

        text = run_doctor(["stacks", "--url", engine.base], timeout=180)
        assert text.returncode == 1, text.stderr
        assert f"worker 0    pid {worker['pid']:<7} inside the model's forward at {engine.hang_line}" in text.stdout
        assert "verdict: stuck in the model: worker 0" in text.stdout

        watched = run_doctor(["stacks", "--url", engine.base, "--watch", "1", "--rounds", "2"], timeout=180)
        assert watched.returncode == 1, watched.stderr
        second = watched.stdout.split("\n\n")[1]
        assert "did not move since the last round: EngineCore (1 round(s)), worker 0 (1 round(s))" in second
    assert done and done[0]["choices"][0]["text"], "the request completes once the forward is released"


def test_cpu_profile_records_the_engine_core_and_the_worker(engine: BlockingEngine, tmp_path: Path) -> None:
    from vllm_doctor.model import Report
    from vllm_doctor.report.html import render_html

    out = tmp_path / "prof"
    out.mkdir()
    (out / "report.html").write_text(render_html(Report("served")))  # a profile report to link from
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            complete(engine, 16)

    load = threading.Thread(target=traffic, daemon=True)
    load.start()
    try:
        # above the doctor's own bounds (py-spy's attach 60 s + 3 s + its write 60 s, the four
        # recordings side by side, and the doctor's start): CI's loaded 2 cores once printed the
        # whole index at 180 s and were killed on their way out
        proc = run_doctor(["cpu-profile", "--url", engine.base, "--duration", "3", "--out", str(out), "--json"],
                          timeout=400)
    finally:
        stop.set()
        load.join(timeout=120)
    assert proc.returncode == 0, proc.stderr
    index = json.loads(proc.stdout)
    assert json.loads((out / "index.json").read_text()) == index
    assert {p["role"] for p in index["processes"]} == {"engine-core", "worker"}
    worker = next(p for p in index["processes"] if p["role"] == "worker")
    assert worker["error"] is None and worker["flamegraph"] == f"cpu-worker0-{worker['pid']}.svg"
    assert worker["samples"] > 0 and worker["behind_s"] >= 0, worker  # py-spy's count, and how far it lagged
    svg = (out / worker["flamegraph"]).read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    speedscope = json.loads((out / worker["speedscope"]).read_text())
    assert speedscope["profiles"] and sum(len(p["samples"]) for p in speedscope["profiles"]) > 0
    html = (out / "report.html").read_text()
    assert f'href="{worker["flamegraph"]}"' in html and f'href="{worker["speedscope"]}"' in html
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def _python_for_nobody() -> tuple[list[str], str] | None:
    """(setpriv prefix, python) that lets uid nobody run the doctor from this checkout, or None."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    prefix = [setpriv, "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]
    for python in dict.fromkeys([os.path.realpath(sys.executable), shutil.which("python3") or "", "/usr/bin/python3"]):
        if not python:
            continue
        probe = subprocess.run([*prefix, "env", f"PYTHONPATH={REPO_ROOT}", python, "-c", "import vllm_doctor.cli"],
                               capture_output=True, timeout=60)
        if probe.returncode == 0:
            return prefix, python
    return None


def test_py_spy_refused_says_why_and_how_to_fix_it(engine: BlockingEngine) -> None:
    """uid nobody may not ptrace root's engine: the real refusal, mapped to its fix, exit 2."""
    from vllm_doctor.compat.pyspy import find_pyspy

    found = _python_for_nobody()
    pyspy = find_pyspy()
    if found is None or pyspy is None:
        pytest.skip("needs root, setpriv and a Python that uid nobody can run")
    prefix, python = found
    env = ["env", "HOME=/tmp", f"PYTHONPATH={REPO_ROOT}", f"VLLM_DOCTOR_PY_SPY={pyspy}"]
    refused = subprocess.run([*prefix, *env, python, "-m", "vllm_doctor", "stacks", "--pid", str(engine.api_pid)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        f"vllm-doctor: error: py-spy may not read process {engine.api_pid}: it belongs to uid 0 and vllm-doctor "
        f"runs as uid {int(subprocess.check_output([*prefix, 'id', '-u']))}",
        "  hint: run vllm-doctor as the engine's user (uid 0): `sudo -u '#0' vllm-doctor ...`, or as root",
    ]
    by_url = subprocess.run([*prefix, *env, python, "-m", "vllm_doctor", "stacks", "--url", engine.base],
                            capture_output=True, text=True, timeout=120)
    assert by_url.returncode == 2 and "is held by a process of uid 0" in by_url.stderr, by_url.stderr

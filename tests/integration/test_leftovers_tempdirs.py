"""Nothing is left behind in the temporary directory (issue 24, item 6.1): no ``vllm-doctor-*``
entry remains after a pass hits its deadline, after SIGTERM of the doctor, or after SIGKILL of
the doctor (the janitor of vllm_doctor/stages/tempdirs.py removes them then).

A real ``python -m vllm_doctor check DIR`` with TMPDIR set to a fresh directory, on a tiny Llama
checkpoint: the import pass and the weights pass each import vLLM in a child (many seconds), so
a short ``--import-timeout`` forces the deadline and a signal lands mid-pass. The weights pass's gloo
rendezvous directory (``vllm-doctor-dist-*``, made by the child) is seen before the end, so the
case where a killed child cannot clean up is the one tested.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.weights import TINY_LLAMA_CONFIG, TINY_LLAMA_TENSORS, write_raw_safetensors

# the doctor's passes import the real vLLM (no engine is started): the integration tier

CONFIG = TINY_LLAMA_CONFIG
TENSORS = TINY_LLAMA_TENSORS


def model(tmp_path: Path) -> tuple[Path, Path]:
    """(model dir, a fresh TMPDIR)."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return d, tmp


def doctor(d: Path, tmp: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "check", str(d), "--json", "-q", *args],
        env={**os.environ, "TMPDIR": str(tmp), "HF_HUB_OFFLINE": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: "the process and its group ended" can be checked
    )


def entries(tmp: Path) -> set[str]:
    """Every directory below ``tmp``, relative to it."""
    return {str(Path(dp, n).relative_to(tmp)) for dp, dns, _ in os.walk(tmp) for n in dns}


def watch(proc: subprocess.Popen[str], tmp: Path, until: set[str] | None = None, timeout: float = 120) -> set[str]:
    """What appeared below ``tmp`` while ``proc`` ran, until the process ended or every prefix of
    ``until`` (``vllm-doctor-import-`` ...) had been seen."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= entries(tmp)
        names = {Path(e).name for e in seen}
        if until and all(any(n.startswith(prefix) for n in names) for prefix in until):
            break
        time.sleep(0.02)
    return seen


def group_gone(pgid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def left(tmp: Path, timeout: float = 0.0) -> list[str]:
    """``vllm-doctor-*`` entries of ``tmp``, after waiting up to ``timeout`` s for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(n for n in os.listdir(tmp) if n.startswith("vllm-doctor-"))
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


PASSES = {"vllm-doctor-import-", "vllm-doctor-weights-", "vllm-doctor-dist-"}


def test_nothing_is_left_when_both_passes_hit_their_deadline(tmp_path: Path) -> None:
    d, tmp = model(tmp_path)
    proc = doctor(d, tmp, "--import-timeout", "4")
    seen = watch(proc, tmp)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert {Path(e).name[: len(p)] for e in seen for p in PASSES if Path(e).name.startswith(p)} == PASSES, seen
    vd100 = [f["message"] for f in json.loads(out)["findings"] if f["code"] == "VD100" and f["outcome"] == "fail"]
    assert sorted(m.split(":")[0] for m in vd100) == ["the import pass did not complete", "the weights pass did not complete"]
    assert all("did not finish within 4 s" in m for m in vd100)
    assert group_gone(proc.pid)
    assert left(tmp) == []  # at once: the doctor removed them before it exited


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_nothing_is_left_when_the_doctor_is_killed_mid_pass(tmp_path: Path, how: str) -> None:
    d, tmp = model(tmp_path)
    proc = doctor(d, tmp)
    seen = watch(proc, tmp, until=PASSES)
    assert proc.poll() is None, f"the doctor ended before both passes were under way: {proc.communicate()}"
    os.kill(proc.pid, getattr(signal, how))
    proc.communicate(timeout=60)
    assert proc.returncode == -getattr(signal, how)
    assert group_gone(proc.pid)
    if how == "SIGTERM":
        assert left(tmp) == []  # at once: the signal handler removed them
    else:
        assert left(tmp, timeout=30) == [], f"left behind after SIGKILL (seen: {sorted(seen)})"

"""The full check's children on a model directory whose processor files link out of it (issue 47
item 15): the import pass and the weights pass import vLLM, and vLLM / transformers open
``processor_config.json`` and ``preprocessor_config.json`` by name; the doctor refuses the
directory before they get it (VD113), so no child opens them. Before: both children opened them
(16 opens), VD111 blamed config.json for the broken processor file.

The outside target of one link is a FIFO: a child that opened it would block until the pass's
time limit (VD100). Where strace runs, every ``open``/``openat`` of the doctor and its children
is read back too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]


def _strace_works() -> bool:
    exe = shutil.which("strace")
    if exe is None:
        return False
    proc = subprocess.run([exe, "-f", "-qq", "-e", "trace=openat", "-o", os.devnull, "true"], capture_output=True)
    return proc.returncode == 0


def test_processor_files_linking_out_are_refused_before_any_child_opens_them(tmp_path: Path) -> None:
    from tests.fixtures.in_tree_vlm import build_llava_dir

    d = build_llava_dir(tmp_path / "llava")
    (d / "preprocessor_config.json").unlink()
    (tmp_path / "secret.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.mkfifo(tmp_path / "outside-fifo")
    (d / "preprocessor_config.json").symlink_to(tmp_path / "secret.txt")
    (d / "processor_config.json").symlink_to(tmp_path / "outside-fifo")
    trace = tmp_path / "trace.txt"
    cmd = [sys.executable, "-m", "vllm_doctor", "check", str(d), "--json", "-q", "--import-timeout", "300"]
    traced = _strace_works()
    if traced:
        cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat", "-o", str(trace), *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    by_code: dict[str, list[dict]] = {}
    for f in report["findings"]:
        by_code.setdefault(f["code"], []).append(f)
    refused = {f["subject"]: f["message"] for f in by_code["VD113"] if f["outcome"] == "fail"}
    assert sorted(refused) == ["preprocessor_config.json", "processor_config.json"]
    assert refused["preprocessor_config.json"].startswith(
        f"preprocessor_config.json is a symlink to {tmp_path / 'secret.txt'}, outside the model directory"
    )
    assert [f["outcome"] for f in by_code["VD100"]] == ["pass"]  # no pass blocked on the FIFO
    assert [f["outcome"] for f in by_code["VD111"]] == ["skip"]  # config.json is not blamed
    assert "does not hand the model directory to vLLM" in report["facts"]["weights"]["load_error"]
    if traced:
        opened = [
            line
            for line in trace.read_text(errors="replace").splitlines()
            if "secret.txt" in line or "outside-fifo" in line or "processor_config.json" in line
        ]
        assert opened == []

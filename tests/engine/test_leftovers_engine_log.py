"""``check --engine`` keeps exactly one directory in the temporary directory: the engine log's,
which the report names (``facts.engine_log`` in --json, an ``engine log:`` line in the text);
everything else the doctor made there is gone (issue 24, item 6.1). Starts a real engine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, make_examples
from vllm_doctor.model import Report
from vllm_doctor.report.text import render

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]


def test_check_engine_keeps_only_the_engine_log_it_names(tmp_path: Path) -> None:
    example = make_examples(tmp_path / "examples", "ok") / "ok"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env.update(PYTHONPATH=os.pathsep.join([str(example / "site"), str(REPO)]), TMPDIR=str(tmp), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "check", str(example / "model"), "--engine", "--eager", "--json", "-q"],
        env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = Path(json.loads(proc.stdout)["facts"]["engine_log"])
    left = sorted(n for n in os.listdir(tmp) if n.startswith("vllm-doctor-"))
    assert left == [log.parent.name] and log.parent.parent == tmp and left[0].startswith("vllm-doctor-engine-")
    assert log.is_file() and log.stat().st_size > 0


def test_the_text_report_names_the_engine_log() -> None:
    report = Report(target="/m")
    report.facts["engine_log"] = "/tmp/vllm-doctor-engine-abc/engine.log"
    assert render(report).splitlines()[-1] == "  engine log: /tmp/vllm-doctor-engine-abc/engine.log"
    assert "engine log" not in render(Report(target="/m"))

"""VD100: a doctor pass that does not complete is a failure, never a silent skip.

The import pass (a doctor child that imports vLLM) cut off by its time limit, and stopped by the
memory watchdog while it imports vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ), stdin=subprocess.DEVNULL)


def model(tmp_path: Path, raw: bytes) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_bytes(raw)
    return d


def test_a_pass_that_does_not_complete_is_a_finding_not_a_silent_skip(tmp_path: Path) -> None:
    """The import pass cut off by its time limit: VD100 fails (exit 1), never '0 problem(s)'."""
    d = model(tmp_path, json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode())
    proc = cli("check", str(d), "--json", "-q", "--import-timeout", "0.2")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    findings = json.loads(proc.stdout)["findings"]
    (f,) = [f for f in findings if f["code"] == "VD100"]
    assert f["outcome"] == "fail" and f["subject"] == "the import pass"
    assert "the import pass did not complete: the import pass did not finish within 0 s" in f["message"]
    # the checks that needed it say why they skipped
    assert all(x["outcome"] == "skip" for x in findings if x["code"] in ("VD106", "VD201"))


def test_a_model_type_unknown_when_the_plugins_did_not_run_says_so(tmp_path: Path) -> None:
    """With the import pass cut off, no plugin ran: VD104's "registered by no plugin" is a read of
    their source only, and its message says so and points at VD100 (CI once saw a plugin that
    refuses this vLLM reported as merely unregistered when its import pass ran out of time)."""
    d = model(tmp_path, json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "no_such_type"}).encode())
    proc = cli("check", str(d), "--json", "-q", "--import-timeout", "0.2")
    findings = {f["code"]: f for f in json.loads(proc.stdout)["findings"]}
    assert findings["VD100"]["outcome"] == "fail", findings["VD100"]
    f = findings["VD104"]
    assert f["outcome"] == "fail", f
    assert f["message"] == (
        "model_type 'no_such_type' is unknown to transformers and no plugin registers it as far as their source "
        "reads (the import pass that runs them did not complete: VD100)"
    )


def test_a_pass_stopped_at_the_memory_limit_is_a_finding(tmp_path: Path) -> None:
    """--max-memory below what importing vLLM takes: both passes are stopped by the watchdog and
    each is a VD100 failure naming the limit (exit 1); a bad size is a usage error (exit 2)."""
    d = model(tmp_path, json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode())
    proc = cli("check", str(d), "--json", "-q", "--max-memory", "40M")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (f,) = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "VD100"]
    assert f["subject"] == "the import pass"
    assert "the import pass was stopped: its processes held " in f["message"]
    assert "over the limit of 40.00 MiB (--max-memory, or VLLM_DOCTOR_MAX_MEMORY)" in f["message"]
    assert "raise --max-memory" in f["hint"]
    bad = cli("check", str(d), "--max-memory", "lots")
    assert bad.returncode == 2 and "expected bytes like" in bad.stderr and "Traceback" not in bad.stderr

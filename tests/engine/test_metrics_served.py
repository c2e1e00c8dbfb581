"""The doctor's series in vLLM's own ``/metrics`` on a real ``vllm serve`` (VLLM_DOCTOR=1 and
VLLM_DOCTOR_METRICS=1, no dev mode; vllm_doctor.live.exporter): the API server attaches to its
workers through the private channel at its start, before any scrape (the operator's choice, no
request's side effect), and the series count what the engine ran, beside vLLM's own.

The exporter is a reader with its own window of the workers' records: ``top --once`` attaching,
reading and detaching in the middle takes no step from it (the decode tokens it counts equal
vLLM's own count exactly). The server is this module's own (the session's has the series off,
so that the other tests' scrapes do not attach the exporter beside their readers).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.served import ServedEngine
from vllm_doctor.live.exporter import SCRAPE_TIMESTAMP as SCRAPE_TS
from vllm_doctor.live.proctree import discover
from vllm_doctor.live.prom import Exposition, parse

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]
MAX_TOKENS = 8
TOP_LIMIT_S = 600  # top --once's own start, attach and --interval, on a loaded machine


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedEngine]:
    with ServedEngine(tmp_path_factory.mktemp("metrics"), metrics=True).serving() as served:
        yield served


def _scrape(server: ServedEngine) -> Exposition:
    with urllib.request.urlopen(f"{server.base}/metrics", timeout=60) as resp:
        return parse(resp.read().decode())


def _value(expo: Exposition, family: str, **labels: str) -> float:
    fam = expo.families.get(family)
    if fam is None:
        return 0.0
    return sum(s.value for s in fam.samples if all(s.label(k) == v for k, v in labels.items()))


def _scrape_until(server: ServedEngine, done: threading.Event, every_s: float = 10.0) -> None:
    while not done.wait(every_s):
        with contextlib.suppress(OSError):
            _scrape(server)


def _until(server: ServedEngine, ok: object, timeout: float = 120) -> Exposition:
    deadline = time.monotonic() + timeout
    while True:
        expo = _scrape(server)
        if ok(expo) or time.monotonic() > deadline:  # type: ignore[operator]
            return expo
        time.sleep(1.0)


def test_metrics_carry_the_doctors_series_and_they_count_what_vllm_counts(
    metrics_server: ServedEngine, tmp_path: Path
) -> None:
    server = metrics_server
    # attached from the server's start, before any scrape: the workers profile (the exporter's reader)
    deadline = time.monotonic() + 120
    while not server.rpc("doctor_status")[0]["data"]["profiling"] and time.monotonic() < deadline:
        time.sleep(1.0)
    assert server.rpc("doctor_status")[0]["data"]["profiling"] is True
    first = _until(server, lambda e: _value(e, "vllm_doctor_up") == 1.0)
    info = first.families["vllm_doctor_info"].samples[0]
    assert _value(first, "vllm_doctor_up") == 1.0, info
    # labelled as vLLM labels its own series: the served model's name
    vllm_names = {s.label("model_name") for s in first.families["vllm:num_requests_running"].samples}
    assert info.label("model_name") in vllm_names, (info, vllm_names)
    assert info.label("clock") and (info.label("model_class") or "").endswith("TinyDoctorForCausalLM"), info
    # each answer carries the API server's clock as it was rendered (issue 47 item 8): inside this
    # scrape's bracket (the same machine's clock), and later in a later answer
    sent = time.time()
    stamped = _scrape(server)
    read = time.time()
    (stamp,) = stamped.families[SCRAPE_TS].samples
    assert stamped.families[SCRAPE_TS].type == "gauge" and sent <= stamp.value <= read, (sent, stamp, read)
    before = {
        "doctor_decode": _value(first, "vllm_doctor_tokens", phase="decode"),
        "doctor_prefill_steps": _value(first, "vllm_doctor_steps", phase="prefill"),
        "generated": _value(first, "vllm:generation_tokens"),
    }
    # requests one at a time (a prefill step, then decode steps: no mixed step), while top --once
    # attaches, reads its own window and detaches; then two more. Traffic for as long as top runs (its window is its last --interval seconds, whenever its start
    # and attach end on a loaded machine: CI once saw top outlast a fixed 120 s of traffic)
    # and /metrics scraped every 10 s meanwhile, as Prometheus does (a scrape only copies: the
    # exporter reads the workers whether scraped or not)
    done = threading.Event()
    scraper = threading.Thread(target=_scrape_until, args=(server, done), daemon=True)
    scraper.start()
    try:
        top, took, requests = server.doctor_beside_traffic(
            tmp_path, "top", "--once", "--json", "--interval", "6", "--no-devices",
            limit_s=TOP_LIMIT_S, max_tokens=MAX_TOKENS, prompt="count me",
        )  # fmt: skip
    finally:
        done.set()
        scraper.join(timeout=120)
    assert top.returncode == 0, (took, top.stderr[-2000:])
    body = json.loads(top.stdout)
    model = body.get("model") or {}
    # top's rates are over the server's own time between its two scrapes: exact, not a bound
    assert (body["rate_clock"], body["rates_lower_bound"]) == ("server", False), body
    # top's window had steps of its own
    assert model.get("available") and model.get("steps"), (f"top ran {took:.0f} s, {requests} requests", model)
    assert "attached to the workers" in top.stderr, top.stderr  # its progress lines say where its time went
    for _ in range(2):
        server.complete(f"count me {requests}", MAX_TOKENS)
        requests += 1
    generated = _value(_scrape(server), "vllm:generation_tokens") - before["generated"]
    assert generated == requests * MAX_TOKENS
    # each request's first token comes from its prefill step, the others from one decode step each
    want_decode = generated - requests
    after = _until(
        server, lambda e: _value(e, "vllm_doctor_tokens", phase="decode") - before["doctor_decode"] >= want_decode
    )
    # where a count falls short, say what the exporter knew: steps it was told were let go in the
    # workers, and why it last stopped reading (a detach between scrapes counts nothing)
    why = (
        f"dropped steps {_value(after, 'vllm_doctor_dropped_steps')}, top's window dropped "
        f"{model.get('dropped_steps')}, info {after.families['vllm_doctor_info'].samples}, top ran {took:.0f} s, "
        f"the server's doctor lines {[x for x in server.log.read_text().splitlines() if 'vllm-doctor' in x][-5:]}"
    )
    assert _value(after, "vllm_doctor_tokens", phase="decode") - before["doctor_decode"] == want_decode, why
    assert _value(after, "vllm_doctor_steps", phase="prefill") - before["doctor_prefill_steps"] == requests
    for phase in ("prefill", "decode"):
        steps = _value(after, "vllm_doctor_steps", phase=phase)
        seconds = _value(after, "vllm_doctor_step_seconds", phase=phase)
        forward = _value(after, "vllm_doctor_forward_seconds", phase=phase)
        forward_steps = _value(after, "vllm_doctor_forward_steps", phase=phase)
        assert steps > 0 and seconds > 0 and 0 < forward_steps <= steps, (phase, steps, seconds, forward_steps)
        # the forward is timed on sampled steps only (the first ones, then every Nth: slower, with the
        # doctor's marks), so its mean is not bounded by every step's mean; its sum by their sum is,
        # and by the step time of those same steps
        forward_step = _value(after, "vllm_doctor_forward_step_seconds", phase=phase)
        assert 0 < forward <= forward_step <= seconds, (phase, forward, forward_step, seconds)
    # the doctor's own cost is counted: in the workers, and the exporter's CPU in the API server
    assert _value(after, "vllm_doctor_own_seconds", part="wrappers") > 0
    assert _value(after, "vllm_doctor_own_seconds", part="exporter") > 0
    assert after.families["vllm_doctor_own_ratio"].samples, "the doctor's share of the workers' time"
    # vLLM's own KV capacity, asked of vLLM in the worker (a served engine's worker has its own config)
    assert _value(after, "vllm_doctor_kv_capacity_tokens") > 0 and _value(after, "vllm_doctor_kv_max_concurrency") > 0
    assert _value(after, SCRAPE_TS) > stamp.value  # the server's clock moved on between the scrapes
    # the counters are Prometheus counters (the _total suffix on the wire), typed as such
    assert after.families["vllm_doctor_steps"].type == "counter"
    # the exporter opened no TCP socket: only the channel's Unix sockets (audit hook in each process)
    records = []
    for proc in discover(url=server.base):
        path = server.audit_dir / f"{proc.pid}.jsonl"
        if path.exists():
            records += [json.loads(line) for line in path.read_text().splitlines()]
    assert records and {r["family"] for r in records} == {1}, records  # AF_UNIX

"""The /metrics exporter's arithmetic and exposition (vllm_doctor.live.exporter), on plain window
summaries; and the example Grafana dashboard asks only for series the exporter publishes. The
exporter against a real server: tests/engine/test_metrics_served.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_doctor.analysis.records import (
    DoctorOverhead,
    KvSummary,
    LayerTotal,
    PhaseSummary,
    Roofline,
    RooflinePhase,
)
from vllm_doctor.live.exporter import ExportState, families
from vllm_doctor.live.prom import parse
from vllm_doctor.live.sources import ModelSummary

pytest.importorskip("prometheus_client")
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-vllm-doctor.json"


def _window(decode_steps: int, step_s: float, forward_s: float, share: float | None = 0.4) -> ModelSummary:
    return ModelSummary(
        available=True,
        clock="cuda_events",
        model_class="MyForCausalLM",
        steps=decode_steps + 1,
        phases={
            "prefill": PhaseSummary(steps=1, tokens=12, step_s_mean=0.02, forward_s_mean=0.015, forward_steps=1),
            "decode": PhaseSummary(
                steps=decode_steps,
                tokens=decode_steps * 4,
                step_s_mean=step_s,
                forward_s_mean=forward_s,
                forward_steps=decode_steps - 1,
                forward_steps_step_s_mean=step_s * 1.5,  # the sampled steps, slower than the mean step
            ),
        },
        slowest_layers=[LayerTotal(layer=3, total_s=0.03), LayerTotal(layer=0, total_s=0.01)],
        layers_forward_s=0.1,
        doctor=DoctorOverhead(host_s={"wrappers": 0.002, "timers": 0.001}, rpc_s=0.0005, worker_share=0.0035),
        roofline=Roofline(available=True, phases={"decode": RooflinePhase(bandwidth_share=share, compute_share=0.01)}),
        kv=KvSummary(capacity_tokens=52_428, max_concurrency=102.4, max_model_len=512),
    )


def _exposition(state: ExportState) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            return families(state)

    registry = CollectorRegistry()
    registry.register(One())
    return generate_latest(registry).decode()


def test_windows_add_up_to_counters_and_the_last_window_sets_the_ratios() -> None:
    state = ExportState(model_name="my-model", up=True, reason="", ranks={"read": 2, "unreachable": 2})
    state.add(_window(10, 0.010, 0.008))
    state.add(_window(20, 0.012, 0.009, share=None))  # a window without a roofline share keeps the last
    state.add(ModelSummary(available=True))  # an idle window adds nothing
    state.add(ModelSummary(available=True, dropped_steps=7))  # steps whose records the workers let go
    expo = parse(_exposition(state))

    def value(name: str, **labels: str) -> float:
        fam = expo.families[name]
        return sum(s.value for s in fam.samples if all(s.label(k) == v for k, v in labels.items()))

    assert value("vllm_doctor_steps", phase="decode") == 30
    assert value("vllm_doctor_tokens", phase="decode") == 120
    assert value("vllm_doctor_step_seconds", phase="decode") == pytest.approx(10 * 0.010 + 20 * 0.012)
    assert value("vllm_doctor_forward_seconds", phase="decode") == pytest.approx(9 * 0.008 + 19 * 0.009)
    assert value("vllm_doctor_forward_steps", phase="decode") == 28
    # the forward's own steps' time: its share of them, not of every step's mean
    assert value("vllm_doctor_forward_step_seconds", phase="decode") == pytest.approx(9 * 0.015 + 19 * 0.018)
    forward_steps_time = expo.families["vllm_doctor_forward_step_seconds"].samples
    assert not [s for s in forward_steps_time if s.label("phase") == "prefill"]  # unknown there: no sample
    assert value("vllm_doctor_steps", phase="prefill") == 2
    assert value("vllm_doctor_dropped_steps") == 7 and expo.families["vllm_doctor_dropped_steps"].type == "counter"
    assert value("vllm_doctor_roofline_bandwidth_ratio", phase="decode") == 0.4
    assert value("vllm_doctor_layer_forward_ratio", layer="3") == pytest.approx(0.3)
    assert value("vllm_doctor_own_seconds", part="wrappers") == pytest.approx(0.004)  # two windows ran steps
    assert value("vllm_doctor_own_seconds", part="channel") == pytest.approx(0.001)
    assert value("vllm_doctor_own_ratio") == pytest.approx(0.0035)
    assert value("vllm_doctor_up") == 1
    # vLLM's own KV capacity, as its start-up line gives it
    assert (value("vllm_doctor_kv_capacity_tokens"), value("vllm_doctor_kv_max_concurrency")) == (52_428, 102.4)
    assert (value("vllm_doctor_ranks", state="read"), value("vllm_doctor_ranks", state="unreachable")) == (2, 2)
    assert expo.families["vllm_doctor_steps"].type == "counter"
    assert {s.label("model_name") for f in expo.families.values() for s in f.samples} == {"my-model"}
    (info,) = expo.families["vllm_doctor_info"].samples
    assert (info.label("clock"), info.label("model_class"), info.label("reason")) == (
        "cuda_events",
        "MyForCausalLM",
        "",
    )


def test_a_down_exporter_says_why_and_publishes_no_counter_it_has_not_read() -> None:
    expo = parse(_exposition(ExportState(model_name="m", up=False, reason="no process has a channel")))
    assert expo.families["vllm_doctor_up"].samples[0].value == 0
    assert expo.families["vllm_doctor_info"].samples[0].label("reason") == "no process has a channel"
    assert not expo.families.get("vllm_doctor_steps") or not expo.families["vllm_doctor_steps"].samples


def test_an_exporter_that_read_windows_without_dropped_steps_publishes_a_zero() -> None:
    """Issue 47 item 14: ``vllm_doctor_dropped_steps_total`` had no sample line until a step was
    dropped; a counter the exporter reads is published from its first window, 0 included."""
    state = ExportState(model_name="m", up=True, reason="")
    state.add(_window(10, 0.010, 0.008))
    text = _exposition(state)
    assert 'vllm_doctor_dropped_steps_total{model_name="m"} 0.0' in text.splitlines()
    (sample,) = parse(text).families["vllm_doctor_dropped_steps"].samples
    assert sample.value == 0


def test_the_example_dashboard_asks_only_for_series_the_exporter_publishes() -> None:
    dash = json.loads(DASHBOARD.read_text())
    state = ExportState(model_name="m", up=True, reason="")
    state.add(_window(10, 0.01, 0.008))
    published = {s.name for f in parse(_exposition(state)).families.values() for s in f.samples}
    labels = {k for f in parse(_exposition(state)).families.values() for s in f.samples for k, _ in s.labels}
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10 and len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    asked = {name for e in exprs for name in re.findall(r"vllm_doctor_[a-z_]+", e)}
    assert asked <= published, asked - published
    assert {"vllm_doctor_forward_seconds_total", "vllm_doctor_roofline_bandwidth_ratio"} <= asked
    by = {lab for e in exprs for lab in re.findall(r"by \(([a-z_]+)\)", e)}
    legends = {
        lab
        for p in dash["panels"]
        for t in p.get("targets", [])
        for lab in re.findall(r"{{(\w+)}}", t.get("legendFormat", ""))
    }
    assert by | legends <= labels, (by | legends) - labels


def test_each_answer_carries_the_servers_clock_as_it_is_rendered() -> None:
    """Issue 47 item 8: ``vllm_doctor_scrape_timestamp_seconds``, a gauge of the API server's
    ``time.time()`` read as the collector renders (the registry's answer), so that ``top`` can
    divide vLLM's counters' changes by the server's own time between two scrapes. A gauge, not
    the exposition's sample timestamp: Prometheus stores a scrape at its own time."""
    import time

    from prometheus_client import CollectorRegistry, generate_latest

    from vllm_doctor.live.derive import server_time
    from vllm_doctor.live.exporter import DoctorCollector

    collector = DoctorCollector(pid=1)  # not started: collect() only copies its state
    registry = CollectorRegistry()
    registry.register(collector)
    stamps = []
    for _ in range(2):
        before = time.time()
        text = generate_latest(registry).decode()
        after = time.time()
        expo = parse(text)
        fam = expo.families["vllm_doctor_scrape_timestamp_seconds"]
        assert fam.type == "gauge" and fam.help
        (sample,) = fam.samples
        assert before <= sample.value <= after
        line = next(x for x in text.splitlines() if x.startswith("vllm_doctor_scrape_timestamp_seconds{"))
        assert len(line.split()) == 2  # name{labels} value: no sample timestamp on the wire
        stamps.append(server_time(expo.families))
        time.sleep(0.01)
    assert stamps[0] is not None and stamps[1] is not None and stamps[1] > stamps[0]
    # the plain rows of a state carry it only where the render's clock is given
    assert "vllm_doctor_scrape_timestamp_seconds" not in _exposition(ExportState(model_name="m"))

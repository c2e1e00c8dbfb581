"""The live data layer on plain text: the Prometheus parser, the name table, derived numbers, recordings."""

from __future__ import annotations

import gzip
import math
import tracemalloc
from pathlib import Path

import pytest

from vllm_doctor.compat.metrics import BY_KEY, resolve
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.live.derive import WINDOW_RING, Deriver, snapshot
from vllm_doctor.live.prom import histogram_of, parse
from vllm_doctor.live.record import Recorder, ReplaySource, read_recording
from vllm_doctor.live.sources import Frame

DATA = Path(__file__).resolve().parent.parent / "data" / "top"

E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0)


def exposition(
    prompt: float = 100,
    gen: float = 1000,
    requests: float = 10,
    e2e: tuple[float, ...] = (5, 5, 5, 5),
    start: float = 1.7e9,
    kv_name: str = "vllm:kv_cache_usage_perc",
    prefix: str = "vllm:prefix_cache",
    hits: float = 0,
    queries: float = 0,
) -> str:
    """A vLLM 0.32-like /metrics answer (labels as the real server writes them)."""
    labels = 'engine="0",model_name="/tmp/m"'
    lines = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {start}",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} 2.0",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} 1.0",
        f"# TYPE {kv_name} gauge",
        f"{kv_name}{{{labels}}} 0.25",
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="512"} 1.0',
        "# HELP vllm:prompt_tokens Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens counter",
        f"vllm:prompt_tokens_total{{{labels}}} {prompt}",
        f"vllm:prompt_tokens_created{{{labels}}} 1.7e9",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{labels}}} {gen}",
        "# TYPE vllm:request_success counter",
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {requests}',
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} 0.0',
        f"# TYPE {prefix}_queries counter",
        f"{prefix}_queries_total{{{labels}}} {queries}",
        f"# TYPE {prefix}_hits counter",
        f"{prefix}_hits_total{{{labels}}} {hits}",
        "# TYPE vllm:e2e_request_latency_seconds histogram",
    ]
    for bound, count in zip(E2E_BUCKETS, e2e, strict=True):
        lines.append(f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="{bound}"}} {count}')
    lines += [
        f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} {e2e[-1]}',
        f"vllm:e2e_request_latency_seconds_count{{{labels}}} {e2e[-1]}",
        f"vllm:e2e_request_latency_seconds_sum{{{labels}}} {e2e[-1] * 0.1}",
    ]
    return "\n".join(lines) + "\n"


# -- parser ------------------------------------------------------------------------------------
def test_parser_reads_types_help_escaped_labels_and_special_values() -> None:
    text = (
        "# HELP x_total A \\\\ help\\nline\n# TYPE x counter\n"
        'x_total{path="C:\\\\dir",q="say \\"hi\\"",nl="a\\nb"} 3 1700000000000\n'
        "y NaN\nz +Inf\nw -Inf\n"
    )
    expo = parse(text)
    assert expo.errors == 0
    fam = expo.families["x"]
    assert fam.type == "counter" and fam.help == "A \\ help\nline"
    (s,) = fam.samples
    assert dict(s.labels) == {"path": "C:\\dir", "q": 'say "hi"', "nl": "a\nb"} and s.value == 3
    assert math.isnan(expo.families["y"].samples[0].value)
    assert expo.families["z"].samples[0].value == math.inf and expo.families["w"].samples[0].value == -math.inf


def test_parser_groups_histogram_samples_and_sums_label_sets() -> None:
    text = (
        "# TYPE h histogram\n"
        'h_bucket{a="1",le="0.5"} 1\nh_bucket{a="1",le="+Inf"} 2\nh_sum{a="1"} 0.9\nh_count{a="1"} 2\n'
        'h_bucket{a="2",le="0.5"} 3\nh_bucket{a="2",le="+Inf"} 3\nh_sum{a="2"} 0.3\nh_count{a="2"} 3\n'
    )
    hist = histogram_of(parse(text).families["h"])
    assert hist is not None
    assert hist.buckets == ((0.5, 4.0), (math.inf, 5.0)) and hist.count == 5 and hist.sum == pytest.approx(1.2)


@pytest.mark.parametrize(
    "garbage",
    [
        "\x00\xff{{{ not metrics",
        'x{a="unterminated} 1\n',
        "x{a=1} 2\n",
        "x 1 2 3\n",
        "# TYPE x sometype\n",
        "x notanumber\n",
        "{}\n",
        "\n\n\n",
        "",
    ],
)
def test_parser_never_raises_and_counts_bad_lines(garbage: str) -> None:
    expo = parse(garbage + "# TYPE ok gauge\nok 1\n")
    assert expo.families["ok"].samples[0].value == 1
    assert expo.errors == (0 if garbage.strip() == "" else 1)


def test_a_truncated_answer_keeps_every_whole_line_and_drops_the_cut_one() -> None:
    full = exposition(prompt=1234)
    cut = full[: full.index("vllm:prompt_tokens_total") + len("vllm:prompt_tokens_total{engine=\"0\",model_name=\"/tmp/m\"} 12")]
    expo = parse(cut)
    assert expo.errors == 1 and "truncated" in expo.first_error
    assert "vllm:prompt_tokens" in expo.families and not expo.families["vllm:prompt_tokens"].samples
    assert expo.families["vllm:num_requests_running"].samples[0].value == 2.0


def test_a_histogram_without_its_inf_bucket_is_not_used() -> None:
    expo = parse('# TYPE h histogram\nh_bucket{le="0.5"} 1\nh_sum 0.1\nh_count 1\n')
    assert histogram_of(expo.families["h"]) is None


# -- the name table ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "old", "new"),
    [
        ("kv_usage", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
        ("prefix_queries", "vllm:gpu_prefix_cache_queries", "vllm:prefix_cache_queries"),
        ("prefix_hits", "vllm:gpu_prefix_cache_hits", "vllm:prefix_cache_hits"),
        ("itl", "vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"),
    ],
)
def test_renamed_families_resolve_to_the_name_the_server_publishes(key: str, old: str, new: str) -> None:
    assert resolve({old}) == {key: old}
    assert resolve({new}) == {key: new}
    assert resolve({old, new}) == {key: new}  # a deprecation period publishes both: the new one wins
    assert BY_KEY[key].names[0] == new


def test_an_old_servers_names_give_the_same_numbers() -> None:
    new = snapshot(0.0, exposition(hits=5, queries=10))
    old = snapshot(0.0, exposition(hits=5, queries=10, kv_name="vllm:gpu_cache_usage_perc",
                                   prefix="vllm:gpu_prefix_cache"))
    assert old.values == new.values and old.values["kv_usage"] == 0.25 and old.values["prefix_hits"] == 5
    assert old.names["kv_usage"] == "vllm:gpu_cache_usage_perc"


def test_the_table_knows_every_name_the_installed_vllm_publishes() -> None:
    """Each name of the table's newest column is defined by the vLLM wheel installed here (0.32)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM not installed")
    source = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    for metric in BY_KEY.values():
        if metric.names[0].startswith("vllm:"):
            assert f'"{metric.names[0]}"' in source, metric.names[0]


def test_a_real_vllm_0_26_scrape_resolves_every_key_and_gives_its_numbers() -> None:
    """/metrics of a vLLM 0.26.0 server on an H200 under load (saved by the GPU run of top)."""
    text = gzip.open(DATA / "metrics-vllm-0.26.0-h200.txt.gz", "rt").read()
    snap = snapshot(0.0, text)
    assert set(snap.names) == set(BY_KEY)  # every key the doctor reads, under its 0.26 name
    assert snap.parse_errors == 0
    assert snap.names["itl"] == "vllm:inter_token_latency_seconds"
    assert snap.names["kv_usage"] == "vllm:kv_cache_usage_perc"
    assert snap.values["generation_tokens"] > 0 and snap.values["running"] > 0
    assert set(snap.histograms) == {"ttft", "itl", "e2e", "queue"}
    assert snap.info["block_size"] == "16" and int(snap.info["num_gpu_blocks"]) > 0


def test_the_parser_cache_gives_the_same_families_as_a_fresh_parse() -> None:
    text = gzip.open(DATA / "metrics-vllm-0.26.0-h200.txt.gz", "rt").read()
    from vllm_doctor.live.derive import ALL_NAMES

    heads: dict = {}
    fresh = parse(text, ALL_NAMES)
    for _ in range(2):  # the second time from the cache
        cached = parse(text, ALL_NAMES, heads)
        assert {k: (f.type, f.samples) for k, f in cached.families.items()} == {
            k: (f.type, f.samples) for k, f in fresh.families.items()
        }
    assert heads and all(v is None or v[0].startswith(("vllm:", "process_")) for v in heads.values())
    everything = parse(text)  # unfiltered: every family, _created samples included
    assert "python_gc_objects_collected" in everything.families
    assert everything.families["vllm:num_requests_running"].samples == fresh.families[
        "vllm:num_requests_running"].samples


# -- derived numbers -----------------------------------------------------------------------------
def test_rates_are_counter_differences_over_time_and_one_shot_is_exact() -> None:
    d = Deriver(window_s=60)
    first = d.update(100.0, exposition(prompt=100, gen=1000, requests=10))
    assert first.rates == {"prompt_tps": None, "gen_tps": None, "req_ps": None, "preempt_ps": None}
    second = d.update(102.0, exposition(prompt=300, gen=1100, requests=14))
    assert second.rates["prompt_tps"] == 100.0 and second.rates["gen_tps"] == 50.0 and second.rates["req_ps"] == 2.0
    assert second.values["requests"] == 14  # summed over finish reasons


def test_a_restart_by_counters_going_back_is_counted_marked_and_never_a_negative_rate() -> None:
    d = Deriver()
    d.update(0.0, exposition(gen=1000))
    d.update(1.0, exposition(gen=1100))
    after = d.update(2.0, exposition(gen=5))
    assert after.restarts == 1 and after.restart_now and after.rates["gen_tps"] is None
    assert after.history["gen_tps"][-1] is None and after.history_restarts[-1] is True
    nxt = d.update(3.0, exposition(gen=25))
    assert nxt.rates["gen_tps"] == 20.0 and not nxt.restart_now
    assert all(v is None or v >= 0 for v in nxt.history["gen_tps"])


def test_a_restart_by_a_new_start_time_is_seen_even_when_counters_grew() -> None:
    d = Deriver()
    d.update(0.0, exposition(gen=10, start=1.7e9))
    after = d.update(1.0, exposition(gen=5000, start=1.7e9 + 60))  # a busy new server: no phantom 4990 tok/s
    assert after.restarts == 1 and after.rates["gen_tps"] is None


def test_a_failed_scrape_is_stale_frozen_and_leaves_a_gap() -> None:
    d = Deriver()
    d.update(0.0, exposition(gen=0))
    good = d.update(1.0, exposition(gen=40))
    stale = d.update(4.0, None, "cannot reach http://x: refused")
    assert stale.stale and not stale.ok and stale.age_s == 3.0 and "refused" in stale.error
    assert stale.values == good.values and stale.rates == good.rates  # frozen (the UI greys them)
    assert stale.history["gen_tps"][-2:] == (40.0, None)  # a gap, not a repeated value
    assert stale.history["running"][-1] is None


def test_an_answer_without_vllm_metrics_is_stale_with_the_reason() -> None:
    frame = Deriver().update(0.0, "<html>not metrics</html>\n")
    assert frame.stale and "no vLLM metrics in the answer (it starts '<html>not metrics</html>')" in frame.error


def test_latency_over_the_window_with_n_and_first_bucket_resolution() -> None:
    d = Deriver(window_s=10)
    d.update(0.0, exposition(e2e=(5, 5, 5, 5)))
    d.update(5.0, exposition(e2e=(5, 5, 5, 5)))
    quiet = d.update(10.0, exposition(e2e=(5, 5, 5, 5)))
    stat = quiet.latency["e2e"]
    assert stat is not None and stat.n == 0 and stat.quantiles == ()  # never lifetime buckets as "recent"
    fast = d.update(15.0, exposition(e2e=(9, 9, 9, 9)))  # 4 requests, all under 300 ms
    stat = fast.latency["e2e"]
    assert stat is not None and stat.n == 4 and stat.span_s == 10.0
    assert [q.text() for q in stat.quantiles] == ["< 300 ms", "< 300 ms", "< 300 ms"]
    slow = d.update(25.0, exposition(e2e=(9, 9, 11, 13)))  # since t=15: 2 in (0.5, 0.8], 2 in (0.8, 1.0]
    stat = slow.latency["e2e"]
    assert stat is not None and stat.n == 4
    p50, p90, _ = stat.quantiles
    assert (p50.lo, p50.hi) == (0.5, 0.8) and p50.estimate == pytest.approx(0.8)
    assert (p90.lo, p90.hi) == (0.8, 1.0) and p90.text() == "960 ms"
    assert slow.latency["ttft"] is None  # not in this exposition


def test_prefix_hit_rate_over_the_window() -> None:
    d = Deriver(window_s=60)
    d.update(0.0, exposition(hits=10, queries=100))
    frame = d.update(1.0, exposition(hits=40, queries=200))
    assert frame.prefix_hit_rate == pytest.approx(0.3)
    assert frame.kv_blocks == 512 and frame.block_size == 16


def test_memory_is_bounded() -> None:
    d = Deriver(window_s=5, history_len=50)
    for i in range(3000):
        d.update(float(i), exposition(gen=i * 10.0))
    assert len(d.ring) <= 1200 and all(len(h) == 50 for h in d.history.values())



def test_a_kept_scrape_is_small_so_the_window_ring_fills_without_looking_like_a_leak() -> None:
    """top keeps WINDOW_RING scrapes for its latency windows (20 minutes at 1 Hz). Kept as tuples
    of (bound, count) pairs with every value, a real vLLM scrape took 12.8 KB: 15 MB once full,
    growing through every 10-minute run. The ring keeps the histograms compactly and only the
    values a window reads."""
    text = gzip.open(DATA / "metrics-vllm-0.26.0-h200.txt.gz", "rt").read()
    d = Deriver(window_s=60)
    for i in range(200):
        d.update(float(i), text)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200, WINDOW_RING):
            frame = d.update(float(i), text)
        per_scrape = (tracemalloc.get_traced_memory()[0] - before) / (WINDOW_RING - 200)
    finally:
        tracemalloc.stop()
    assert len(d.ring) == WINDOW_RING and frame.latency["e2e"] is not None
    assert per_scrape < 4000, per_scrape
    assert WINDOW_RING * per_scrape < 5 * 2**20


# -- recordings ----------------------------------------------------------------------------------
def _record(path: Path, texts: list[str | None]) -> None:
    rec = Recorder(path, {"url": "http://127.0.0.1:1", "interval_s": 1.0, "window_s": 60.0})
    d = Deriver()
    for i, text in enumerate(texts):
        m = d.update(float(i), text, "" if text else "refused")
        rec.write(Frame(seq=i + 1, t=float(i), url="http://127.0.0.1:1", interval_s=1.0, metrics=m, raw=text))
    rec.close()


def test_a_recording_replays_the_same_numbers_and_seeks(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl.gz"
    _record(path, [exposition(gen=g) for g in (0, 10, 30)] + [None] + [exposition(gen=50)])
    src = ReplaySource(path)
    frames = [src.poll() for _ in range(5)]
    assert [f.metrics.rates["gen_tps"] for f in frames] == [None, 10.0, 20.0, 20.0, 10.0]
    assert frames[3].metrics.stale and frames[3].metrics.error == "refused"
    assert src.at_end and src.poll() is frames[-1]
    src.seek(2)
    again = src.poll()
    assert again.metrics.rates["gen_tps"] == 20.0 and again.replay == {"index": 2, "count": 5, "speed": 1.0}


def test_a_recording_cut_short_reads_up_to_its_last_flushed_refresh(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl.gz"
    _record(path, [exposition(gen=g) for g in (0, 10, 20)])
    data = path.read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) - 30])  # no gzip trailer, as a killed top leaves it
    header, records, _ = read_recording(tmp_path / "cut.jsonl.gz")
    assert header.url == "http://127.0.0.1:1" and len(records) >= 2


@pytest.mark.parametrize("content", [b"not gzip at all", gzip.compress(b'{"format": "other"}\n'), gzip.compress(b"")])
def test_a_file_that_is_not_a_recording_is_an_input_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.gz"
    path.write_bytes(content)
    with pytest.raises(DoctorInputError, match="not a vllm-doctor recording"):
        ReplaySource(path)

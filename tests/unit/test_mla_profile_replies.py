"""``profile`` of the MLA port example (examples/tiny_mla_plugin), eager, on its engine's recorded
reply (tests/fixtures/engine_replies.py, case ``mla-ok-eager``, recorded on a vLLM CPU engine by
``tools/record_engine_replies.py``): its MLA layers are timed as ``mla``, its KV cache is one latent
head, and no false alarm (the default mode's ``profile`` of mla-ok times the same layers at
``MLAAttention.forward_impl``: docs/attention-kinds.md)."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures import engine_replies


def test_profile_times_the_mla_layers_as_mla(tmp_path: Path) -> None:
    proc = engine_replies.replay("mla-ok-eager", tmp_path)
    assert proc.rc == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = proc.report()
    alarms = [(f["code"], f["message"]) for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")]
    assert not alarms, alarms
    layers = report["profiles"]["engine"]["layers"]
    kinds = {m["name"]: m["kind"] for m in layers["modules"]}
    assert (kinds["model.layers.0.self_attn"], kinds["model.layers.1.self_attn"]) == ("mla", "mla"), kinds
    assert "mla" in layers["by_kind"]
    groups = report["facts"]["engine"]["kv_cache"]["groups"]
    assert [g["kind"] for g in groups] == ["mla"], groups
    assert "one latent head x 576" in proc.stdout

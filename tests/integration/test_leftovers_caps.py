"""VD302 through the real weights pass: a checkpoint with 5,000 tensors vLLM's LlamaForCausalLM
has no parameter for gives 20 findings and ONE summary that names the other 4,980 (issue 24,
item 6.4). Imports vLLM in the doctor's children (the import and weights passes); no engine."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_doctor
from tests.fixtures.weights import write_raw_safetensors

N = 5_000


def test_5000_checkpoint_tensors_no_parameter_takes_give_20_vd302_findings_and_a_summary(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": False,
        "num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 64, "intermediate_size": 32, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (d / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": ("BF16", [64, 16]), "model.norm.weight": ("BF16", [16]),
               "lm_head.weight": ("BF16", [64, 16])}  # fmt: skip
    tensors |= {f"model.extra.{i:04d}.weight": ("BF16", [4]) for i in range(N)}
    write_raw_safetensors(d / "model.safetensors", tensors)
    proc = run_doctor(["check", str(d), "--json", "-q"])
    assert proc.returncode == 1, proc.stderr
    vd302 = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "VD302"]
    assert len(vd302) == 21
    (summary,) = [f for f in vd302 if f["subject"] == "(4980 more)"]
    assert summary["message"] == "... and 4980 more checkpoint tensors not consumed (see the JSON report's evidence)"
    assert (summary["outcome"], summary["severity"]) == ("fail", "error")
    assert summary["evidence"]["not_shown"] == 4980 and summary["evidence"]["severities"] == {"error": 4980}
    named = set(summary["evidence"]["subjects"]) | {f["subject"] for f in vd302 if f is not summary}
    assert named == {f"model.extra.{i:04d}.weight" for i in range(N)}
    shown = [f for f in vd302 if f is not summary]
    assert all(f["message"].startswith("load_weights raises ValueError: There is no module or parameter named 'extra'")
               for f in shown)  # fmt: skip

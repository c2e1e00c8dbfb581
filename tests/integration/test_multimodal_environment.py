"""vLLM's in-tree multimodal classes import torchvision (through transformers' image processors):
with the CPU torchvision `make setup` builds (tools/install_cpu_torchvision.sh) Llava imports and
the doctor passes VD106; without one, VD106 says the environment lacks torchvision instead of a bare
import error. docs/multimodal-environment.md."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, run_doctor

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")

LLAVA_CONFIG = {
    "architectures": ["LlavaForConditionalGeneration"],
    "model_type": "llava",
    "image_token_index": 32000,
    "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                    "num_hidden_layers": 2, "num_key_value_heads": 4, "vocab_size": 32064},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_attention_heads": 4, "num_hidden_layers": 2, "image_size": 32, "patch_size": 8,
                      "projection_dim": 32},
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "projector_hidden_act": "gelu",
}


def test_llava_imports_with_the_environments_torchvision_or_the_doctor_says_it_lacks_one(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAVA_CONFIG))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH")] if p))
    env.pop("VLLM_PLUGINS", None)
    proc = run_doctor(["check", str(tmp_path), "--json", "-q", "--select", "VD106,VD100"], env)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    findings = {f["code"]: f for f in report["findings"]}
    if importlib.util.find_spec("torchvision") is not None:
        import torch
        import torchvision

        kept = torchvision.ops.nms(torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]), torch.tensor([1.0, 0.5]), 0.5)
        assert kept.tolist() == [0]
        assert report["environment"]["torchvision"] == torchvision.__version__
        assert findings["VD106"]["outcome"] == "pass", findings["VD106"]["message"]
        assert findings["VD100"]["outcome"] == "pass", findings["VD100"]["message"]
    else:
        assert report["environment"]["torchvision"] is None
        finding = findings["VD106"]
        assert finding["outcome"] == "fail" and "this environment has no torchvision" in finding["message"]
        assert finding["evidence"]["environment"]["state"] == "missing"

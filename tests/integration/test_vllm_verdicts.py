"""Where vLLM's own code gives a verdict, the doctor asks it (issue 10, section 3).

Each test takes the ground truth itself in a fresh process (``EngineArgs.create_model_config``,
the way ``vllm serve`` loads a model directory) and checks that the doctor says the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

TRUTH = """
import json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.engine.arg_utils import EngineArgs
try:
    mc = EngineArgs(model=sys.argv[1]).create_model_config()
    print(json.dumps({"ok": True, "architectures": list(mc.architectures), "model_type": mc.hf_config.model_type}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


def _env(*paths: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in paths), str(REPO)])
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    return env


def vllm_truth(model: Path, *paths: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", TRUTH, str(model)], env=_env(*paths), capture_output=True, text=True,
                          timeout=300, cwd=model.parent)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def doctor(model: Path, *args: str, paths: tuple[Path, ...] = ()) -> dict:
    proc = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", str(model), "--json", "-q", *args],
                          env=_env(*paths), capture_output=True, text=True, timeout=600, cwd=model.parent)
    assert proc.stdout.startswith("{"), proc.stderr[-3000:]
    return json.loads(proc.stdout)


def finding(report: dict, code: str) -> dict:
    (f,) = [f for f in report["findings"] if f["code"] == code]
    return f


def test_a_config_class_in_vllms_own_registry_is_known(tmp_path: Path) -> None:
    """A plugin that registers its config in vLLM's _CONFIG_REGISTRY instead of transformers'
    AutoConfig: vLLM loads the model; VD104 must not be a false positive, fast pass or not."""
    subprocess.run([sys.executable, str(REPO / "examples" / "make_examples.py"), str(tmp_path), "--only", "ok"],
                   check=True, capture_output=True, timeout=300)
    site, model = tmp_path / "ok" / "site", tmp_path / "ok" / "model"
    init = site / "tiny_doctor_model" / "__init__.py"
    source = init.read_text()
    old = '    from transformers import AutoConfig\n\n    from .configuration import TinyDoctorConfig\n\n    AutoConfig.register("tiny_doctor", TinyDoctorConfig, exist_ok=True)\n'
    assert old in source
    init.write_text(source.replace(old, (
        "    from vllm.transformers_utils.config import _CONFIG_REGISTRY\n\n"
        "    from .configuration import TinyDoctorConfig\n\n"
        '    _CONFIG_REGISTRY["tiny_doctor"] = TinyDoctorConfig\n'
    )))
    truth = vllm_truth(model, site)
    assert truth == {"ok": True, "architectures": ["TinyDoctorForCausalLM"], "model_type": "tiny_doctor"}, truth
    full = finding(doctor(model, "--select", "VD1", paths=(site,)), "VD104")
    assert full["outcome"] == "pass" and "vLLM loaded config.json" in full["message"], full
    assert full["evidence"]["vllm_verdict"]["ok"] is True
    fast = finding(doctor(model, "--select", "VD104", "--fast", paths=(site,)), "VD104")
    assert fast["outcome"] == "pass" and "vLLM's own config registry" in fast["message"], fast


def test_missing_architectures_says_what_this_vllm_builds(tmp_path: Path) -> None:
    """vLLM 0.32 does not refuse a Llama config without `architectures`: it builds the
    model_type's base class. VD108 says so, from vLLM's own verdict."""
    from tests.fixtures.engine_models import build_llama_dir

    model = build_llama_dir(tmp_path / "no-archs")
    config = json.loads((model / "config.json").read_text())
    config.pop("architectures", None)
    (model / "config.json").write_text(json.dumps(config))
    truth = vllm_truth(model)
    f = finding(doctor(model, "--select", "VD108"), "VD108")
    assert f["outcome"] == "fail"
    if truth["ok"]:
        assert f"builds {truth['architectures']}" in f["message"], (truth, f["message"])
    else:
        assert "refuses it" in f["message"], (truth, f["message"])
    assert f["evidence"]["vllm_verdict"]["ok"] is truth["ok"]

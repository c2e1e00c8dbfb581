"""Real out-of-tree model plugins from PyPI as a permanent test corpus (issue 10, section 4).

Each plugin is a pinned wheel (exact version + sha256), fetched with ``pip download --no-deps``
and unzipped into its own site directory on PYTHONPATH: its ``.dist-info/entry_points.txt`` is
what vLLM's plugin loader reads, so nothing is installed into the venv. For each plugin a model
directory names one architecture it registers; the ground truth is vLLM itself in a fresh
process (``load_general_plugins``, ``EngineArgs.create_model_config``,
``ModelRegistry.resolve_model_cls``, ``is_text_generation_model``) and the doctor must agree:
no error-severity VD1xx/VD2xx fail where vLLM resolves a text generation model, and a fail that
carries the real cause where vLLM refuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("vllm")

_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "head_dim": 16,
    "torch_dtype": "float32",
}

# name, version, wheel sha256, architecture, model_type, extra config keys
PLUGINS: list[tuple[str, str, str, str, str, dict]] = [
    (
        "aleph-alpha-inference",
        "1.0.0",
        "5a0ca118e67924f10c4f9c04dd64bef117007a17dd820233a8841b9cb8d6f211",
        "Kolibri1ForCausalLM",
        "kolibri1",
        {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
    ),
    (
        "exionos-vllm",
        "0.1.0",
        "571b702d3c5ec42318b920fcf119924c67a9997d3ea771cc57fae1642e73cbf6",
        "ExionosX1ForConditionalGeneration",
        "exionos_x1",
        {"text_config": dict(_TINY), "vision_config": {}},
    ),
    (
        "vllm-iquest-q1",
        "0.1.1",
        "142b36b3331915cd1689baa762d78eec518e7eba6dc30ceb6c6199946ca8e159",
        "IQuestQ1ForCausalLM",
        "iquest_q1",
        {},
    ),
    (
        "vllm-spark2-5-plugin",
        "0.1.0",
        "d6aaae51f7ed793ce5a17a49f1e47fcae35cc2a454ec5c40789394df9f2e5b2d",
        "Spark2_5ForCausalLM",
        "spark2_5",
        {},
    ),
    (
        "qwerky-vllm-models",
        "0.2.71",
        "762a7c0df1627dfaa5892ab86d4fabf2a8ccb6948236e657a2d8b5bed085868d",
        "MambaInLlamaMambaForCausalLM",
        "mambainllama_mamba",
        {},
    ),
    (
        "vllm-plugin-meralion2",
        "0.3.0",
        "97a016896f813e831e56f92f128e549fd1c5c7330baf5ca8ee6f0ef23e08cbd8",
        "MERaLiON2ForConditionalGeneration",
        "meralion2",
        {},
    ),
    (
        "fp4local-abliterated",
        "0.1.0",
        "9937a2d5b448fec6aa80e4af8f3c7d4a27bd3356b1f685dea5b810e281d0a3e6",
        "AbliteratedQwen4ExpForCausalLM",
        "qwen4_exp",
        {},
    ),
    (
        "vllm-canon",
        "0.1.0",
        "475ae62e9d95128dfe5716bc1a4ff29125122eb21f1e9f9917775a8b5708c0f9",
        "LlamaCanonForCausalLM",
        "llama",
        {},
    ),
]

IMPORT_LIMIT = ["--import-timeout", "540"]  # within this test's own 600 s per call

# Known doctor/vLLM disagreements: plugin name -> the precise disagreement.
XFAIL: dict[str, str] = {}  # plugin -> the doctor/vLLM disagreement, while it stands

TRUTH = r"""
import importlib, json, sys, traceback
out = {}
try:
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models import ModelRegistry
    mc = EngineArgs(model=sys.argv[1], trust_remote_code=False).create_model_config()
    archs = list(mc.architectures)
    cls, arch = ModelRegistry.resolve_model_cls(archs, mc)
    out = {"ok": True, "arch": arch, "cls": f"{cls.__module__}.{cls.__qualname__}",
           "text_generation": bool(ModelRegistry.is_text_generation_model(archs, mc))}
except BaseException as exc:
    out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:3000]}
    # "failed to be inspected" only says "check the logs": import the registered class here
    # to name the real cause.
    try:
        from vllm.model_executor.models import ModelRegistry
        entry = ModelRegistry.models.get(sys.argv[2])
        if entry is not None and hasattr(entry, "module_name"):
            getattr(importlib.import_module(entry.module_name), entry.class_name)
    except BaseException as cause:
        out["cause"] = str(cause)[:1000]
print("TRUTH " + json.dumps(out))
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cache = tmp_path_factory.mktemp("plugin-wheels")
    specs = [f"{name}=={version}" for name, version, *_ in PLUGINS]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(cache), *specs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.skip(f"pip download of the plugin wheels failed: {proc.stderr.strip()[-500:]}")
    out: dict[str, Path] = {}
    for name, version, sha, *_ in PLUGINS:
        stem = f"{name.replace('-', '_')}-{version}-"
        wheels = [w for w in cache.glob("*.whl") if w.name.lower().startswith(stem)]
        if len(wheels) != 1:
            pytest.skip(f"{name}=={version}: expected one wheel, pip gave {[w.name for w in cache.iterdir()]}")
        if _sha256(wheels[0]) != sha:
            pytest.skip(f"{name}=={version}: wheel sha256 {_sha256(wheels[0])} differs from the pinned {sha}")
        site = cache / "sites" / name
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(site)
        out[name] = site
    return out


def _env(site: Path) -> dict[str, str]:
    drop = ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    return env


def _model_dir(root: Path, arch: str, model_type: str, extra: dict) -> Path:
    root.mkdir(parents=True)
    config = {**_TINY, **extra, "architectures": [arch], "model_type": model_type}
    (root / "config.json").write_text(json.dumps(config))
    return root


def _truth(model: Path, arch: str, site: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", TRUTH, str(model), arch],
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=model.parent,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("TRUTH ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("TRUTH ") :])


def _doctor(model: Path, site: Path, select: str = "VD1,VD2") -> dict:
    proc = subprocess.run(
        # the import pass's limit as high as this call's own: on CI's loaded 2-core machine a plugin's
        # import pass once took over the default 180 s (the finding was VD100, not the plugin's)
        [sys.executable, "-m", "vllm_doctor", "check", str(model), "--json", "-q", "--select", select, *IMPORT_LIMIT],
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=model.parent,
    )
    assert proc.stdout.startswith("{"), proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def verdicts(sites: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict]]:
    """vLLM's own verdict and one ``check --select VD1,VD2,VD6`` per plugin (the registry and
    contract checks, and the performance lint: one doctor run, one import pass, per plugin). The
    meta-device build the lint reads needs a safetensors checkpoint to start, so each directory
    gets one tensor no parameter takes (the VD1/VD2 verdicts do not read the checkpoint)."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("plugin-models")
    jobs = {}
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores on CI, beside the engine stream
        for name, _version, _sha, arch, model_type, extra in PLUGINS:
            model = _model_dir(root / name, arch, model_type, extra)
            save_file({"doctor.unused": torch.zeros(1)}, str(model / "model.safetensors"))
            jobs[name] = (pool.submit(_truth, model, arch, sites[name]),
                          pool.submit(_doctor, model, sites[name], "VD1,VD2,VD6"))  # fmt: skip
        return {name: (t.result(), d.result()) for name, (t, d) in jobs.items()}


def _gist(message: str) -> str:
    """The informative part of vLLM's message: pydantic wraps it in 'Value error, ... [type='."""
    for line in message.splitlines():
        if "Value error, " in line:
            return line.split("Value error, ", 1)[1].split(" [type=", 1)[0][:100]
    return message.splitlines()[0].split(": ", 1)[-1][:100]


def _param(name: str) -> object:
    if name in XFAIL:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=XFAIL[name]))
    return name


@pytest.mark.parametrize("name", [_param(p[0]) for p in PLUGINS])
def test_doctor_agrees_with_vllm_on_a_real_plugin(name: str, verdicts: dict[str, tuple[dict, dict]]) -> None:
    truth, report = verdicts[name]
    fails = [f for f in report["findings"] if f["outcome"] == "fail" and f["code"][:3] in ("VD1", "VD2")]
    errors = [f for f in fails if f.get("severity") == "error"]
    if truth["ok"] and truth["text_generation"]:
        assert not errors, (truth, errors)
        return
    assert errors, f"vLLM refuses ({truth}) but the doctor reports no error: {report['findings']}"
    text = json.dumps(errors)
    key = [_gist(c) for c in (truth.get("cause"), truth.get("error")) if c]
    if truth["ok"]:
        key = ["text generation"]
    assert any(k in text or json.dumps(k)[1:-1] in text for k in key), (truth, errors)


# --- the performance lint on the same plugins ---------------------------------------------------

# plugin -> the VD6xx codes its model gets, checked against the plugin's source by hand; the
# others do not build here (vLLM refuses them: test_doctor_agrees_with_vllm_on_a_real_plugin)
PERF_EXPECTED: dict[str, set[str]] = {
    # MambaInLlama: vLLM's layers, @support_torch_compile, a vLLM Sampler module in its tree (library code)
    "qwerky-vllm-models": set(),
}


@pytest.mark.parametrize("name", [p[0] for p in PLUGINS])
def test_the_performance_lint_on_a_real_plugin(name: str, verdicts: dict[str, tuple[dict, dict]]) -> None:
    report = verdicts[name][1]
    findings = [f for f in report["findings"] if f["code"].startswith("VD6")]
    assert findings, report["findings"]
    problems = {f["code"] for f in findings if f["outcome"] in ("warn", "fail", "crash")}
    if name not in PERF_EXPECTED:  # no model to read: every lint says why, none crashes
        assert {f["outcome"] for f in findings} == {"skip"}, findings
        assert all("module tree was not read" in f["message"] for f in findings)
        return
    assert problems == PERF_EXPECTED[name], findings
    assert report["facts"]["perf"]["model_classes"], "the lint read the plugin's classes"

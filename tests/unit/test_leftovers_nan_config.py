"""config.json with NaN / Infinity is a VD309 finding in ``check --fast`` too (issue 24, item 6.2).

VD309 (config-size-invalid, static, read in the fast pass without importing vLLM) is the code: it
already reads config.json's numbers; VD111 is vLLM's own verdict in the import pass, and vLLM 0.32
loads ``"rope_theta": Infinity`` and ``"rms_norm_eps": NaN`` without a word.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.weights import TINY_LLAMA_CONFIG
from vllm_doctor.checks.config_sizes import config_non_finite

CONFIG = TINY_LLAMA_CONFIG


def fast_check(tmp_path: Path, **literals: str) -> tuple[int, dict[str, Any]]:
    """check --fast --json on a config.json whose ``literals`` are written as raw JSON tokens."""
    parts = [f'"{k}": {json.dumps(v)}' for k, v in CONFIG.items() if k not in literals]
    parts += [f'"{k}": {v}' for k, v in literals.items()]
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{" + ", ".join(parts) + "}")
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "check", str(d), "--fast", "--json", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert "Traceback" not in proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def problems(report: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    return [
        (f["code"], f["outcome"], f["severity"], f["subject"], f["message"])
        for f in report["findings"]
        if f["outcome"] in ("fail", "warn", "crash")
    ]


@pytest.mark.parametrize(
    ("literals", "expected"),
    [
        ({"hidden_size": "NaN"}, ("fail", "config.json:hidden_size", "hidden_size = NaN: is not a number")),
        (
            {"rope_theta": "Infinity"},
            (
                "fail",
                "config.json:rope_theta",
                "rope_theta = Infinity: is not a finite number: rope_theta must be one (the model would compute "
                "inf/NaN)",
            ),
        ),
        (
            {"rms_norm_eps": "NaN"},
            ("fail", "config.json:rms_norm_eps", "rms_norm_eps = NaN: is not a number: every computation it enters gives NaN"),
        ),
        (
            {"rope_scaling": '{"rope_type": "linear", "factor": -Infinity}'},
            (
                "fail",
                "config.json:rope_scaling.factor",
                "rope_scaling.factor = -Infinity: is not a finite number: factor must be one (the model would compute "
                "inf/NaN)",
            ),
        ),
    ],
)
def test_nan_and_infinity_are_vd309_in_the_fast_pass(
    tmp_path: Path, literals: dict[str, str], expected: tuple[str, str, str]
) -> None:
    rc, report = fast_check(tmp_path, **literals)
    outcome, subject, message = expected
    assert rc == 1
    assert problems(report) == [("VD309", outcome, "error", subject, message)]
    (finding,) = [f for f in report["findings"] if f["code"] == "VD309"]
    assert finding["evidence"]["key"] == subject.removeprefix("config.json:")
    assert finding["evidence"]["value"] in ("NaN", "Infinity", "-Infinity")


def test_infinity_outside_a_float_setting_is_a_warning(tmp_path: Path) -> None:
    rc, report = fast_check(tmp_path, max_position_embeddings="Infinity")
    assert rc == 0  # a warning: under --fail-on error
    assert problems(report) == [
        (
            "VD309",
            "warn",
            "warn",
            "config.json:max_position_embeddings",
            "max_position_embeddings = Infinity: is not a finite number; check it is meant (strict JSON readers "
            "reject config.json)",
        )
    ]


def test_config_non_finite_walks_every_level_in_file_order_and_leaves_sizes_and_architectures() -> None:
    nan, inf = float("nan"), float("inf")
    config = {
        "architectures": [nan],  # VD108's
        "hidden_size": nan,  # a size: config_size_problems'
        "text_config": {"vocab_size": inf, "layer_norm_eps": nan, "layer_types": [1.0, -inf]},
        "rope_theta": inf,
    }
    assert [(p["key"], p["value"], p["severity"]) for p in config_non_finite(config)] == [
        ("text_config.layer_norm_eps", "NaN", "error"),
        ("text_config.layer_types[1]", "-Infinity", "warn"),
        ("rope_theta", "Infinity", "error"),
    ]
    assert config_non_finite(CONFIG) == []

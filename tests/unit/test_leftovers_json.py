"""Every JSON the doctor writes is valid UTF-8 without a lone surrogate (issue 24, item 6.5).

A model directory or shard file whose name holds bytes that are not UTF-8 reaches Python as
surrogate-escaped text (``b"\\xff"`` -> ``"\\udcff"``); json.dumps would write that as the escape
``\\udcff``, which strict readers reject. The doctor writes the byte's escape text ``\\xff``
instead (the name stays recognisable), end to end through ``check --fast --json``.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures.weights import TINY_LLAMA_CONFIG
from vllm_doctor.files import json_text, without_surrogates, write_json_atomic

CONFIG = TINY_LLAMA_CONFIG


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (strings(k) + strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def strict(raw: bytes) -> Any:
    """Parse as a strict reader would: UTF-8 (strict) and no surrogate code point in any string."""
    data = json.loads(raw.decode("utf-8", "strict"))
    bad = [s for s in strings(data) if any(0xD800 <= ord(c) <= 0xDFFF for c in s)]
    assert not bad, f"lone surrogates in {bad[:3]}"
    return data


def test_check_json_names_undecodable_paths_without_lone_surrogates(tmp_path: Path) -> None:
    model = os.path.join(os.fsencode(tmp_path), b"model-\xff")
    os.mkdir(model)
    with open(os.path.join(model, b"config.json"), "w") as fh:
        json.dump(CONFIG, fh)
    with open(os.path.join(model, b"shard-\xfe.safetensors"), "wb") as fh:  # cut inside its header
        fh.write(struct.pack("<Q", 200) + b'{"w": {"dtype": "F32", ')
    out = os.path.join(os.fsencode(tmp_path), b"report-\xfd.json")
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "check", model, "--fast", "--json", "-q", "--out", out],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1, proc.stderr
    for raw in (proc.stdout, Path(os.fsdecode(out)).read_bytes()):
        assert b"\\udc" not in raw
        report = strict(raw)
        assert report["target"] == str(tmp_path / "model-\\xff")
        vd308 = [f for f in report["findings"] if f["code"] == "VD308" and f["outcome"] == "fail"]
        assert [f["subject"] for f in vd308] == ["shard-\\xfe.safetensors"]
        assert vd308[0]["message"].startswith("shard-\\xfe.safetensors ends inside its header")


def test_json_text_escapes_lone_surrogates_in_keys_values_and_objects(tmp_path: Path) -> None:
    data = {
        "m\udcff": ["a\udcfeb", ("\ud800",), Path("/x/\udcff")],
        "ok": "caf\u00e9 \U0001f600",  # valid non-ASCII text is kept (as JSON escapes)
        "nan": float("nan"),
    }
    text = json_text(data)
    assert strict(text.encode()) == {
        "m\\xff": ["a\\xfeb", ["\\ud800"], "/x/\\xff"],
        "ok": "caf\u00e9 \U0001f600",
        "nan": "NaN",
    }
    write_json_atomic(tmp_path / "r.json", data)
    assert strict((tmp_path / "r.json").read_bytes())["m\\xff"][0] == "a\\xfeb"
    # the doctor's own hand-over to its children keeps the exact strings (a path must still open)
    assert json.loads(json_text(data, exact_strings=True))["m\udcff"][0] == "a\udcfeb"
    assert without_surrogates("plain") == "plain"
    assert without_surrogates(os.fsdecode(b"x\x80\xff")) == "x\\x80\\xff"

"""The JSON nesting bound is measured on the text, at C speed (issue 24, item 6.3), and still
protects: thousands of nested brackets and huge integers are the same clear problem as before,
never a RecursionError or a hang. The speed itself is measured by bench/bench_header.py, not here.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from vllm_doctor.probes.paths import MAX_JSON_DEPTH, BadJSON, json_depth_over, parse_json
from vllm_doctor.probes.safetensors_header import parse_header


def depth(value: Any) -> int:
    """Containers nested in ``value``, the slow way (the reference)."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def nested(levels: int, leaf: Any = 1) -> Any:
    doc = leaf
    for i in range(levels):
        doc = {"k": doc} if i % 2 else [doc]
    return doc


STRINGS = ["", "a", "[", "]]", "{[", '"', '\\', '\\"[', 'x"}"', "\u00e9[", "\U0001f600{"]


def random_doc(rng: random.Random, levels: int) -> Any:
    if levels == 0 or rng.random() < 0.2:
        return rng.choice([*STRINGS, 1, -2.5, True, None])
    if rng.random() < 0.5:
        return [random_doc(rng, levels - 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(STRINGS) + str(i): random_doc(rng, levels - 1) for i in range(rng.randrange(0, 4))}


def test_json_depth_over_agrees_with_walking_the_document() -> None:
    rng = random.Random(7)
    for _ in range(400):
        doc = random_doc(rng, rng.randrange(0, 9))
        for text in (json.dumps(doc), json.dumps(doc, ensure_ascii=False, indent=1)):
            d = depth(doc)
            for limit in (max(0, d - 1), d, d + 1):
                assert json_depth_over(text, limit) is (d > limit), (text, limit)
                assert json_depth_over(text.encode(), limit) is (d > limit)


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 500])
def test_parse_json_refuses_exactly_the_documents_nested_deeper_than_the_limit(levels: int) -> None:
    text = json.dumps({"a": nested(levels - 1)})
    if levels <= MAX_JSON_DEPTH:
        assert depth(parse_json(text)) == levels
    else:
        with pytest.raises(BadJSON, match=f"nests more than {MAX_JSON_DEPTH} levels deep"):
            parse_json(text)


def test_brackets_inside_names_are_not_nesting() -> None:
    name = "w" + "[" * 5000 + '\\"{' * 100
    assert parse_json(json.dumps({name: {"shape": [1]}})) == {name: {"shape": [1]}}


def header_file(tmp_path: Path, raw: bytes, data: bytes = b"") -> Path:
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"w": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "nests deeper than Python's json parser allows (about 1000 levels)"),
        (b'{"w": ' + b"[" * 65 + b"]" * 65 + b"}", "nests more than 64 levels deep"),
        (b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}',
         "holds an integer with more than 4300 digits (Python's limit for reading one)"),
    ],
)  # fmt: skip
def test_hostile_headers_are_still_one_header_not_json_problem(tmp_path: Path, raw: bytes, message: str) -> None:
    header, problems = parse_header(header_file(tmp_path, raw), "model.safetensors")
    assert not header.ok
    assert [(p.kind, p.message) for p in problems] == [("header-not-json", f"model.safetensors: header {message}")]


def test_a_header_of_many_tensors_is_read_whole(tmp_path: Path) -> None:
    n = 20_000
    entries = {f"t.{i:05d}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
    raw = json.dumps(entries).encode()
    raw += b" " * (-len(raw) % 8)
    path = header_file(tmp_path, raw, bytes(4 * n))
    header, problems = parse_header(path, "model.safetensors")
    assert problems == [] and header.ok
    assert [t.name for t in header.tensors] == sorted(entries)
    assert header.tensors[-1].offsets == (4 * (n - 1), 4 * n) and header.tensors[-1].shape == [1]


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}, "has unknown dtype ['F32']"),
        ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "has an invalid shape [True]"),
        ({"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}, "has an invalid shape [1.0]"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}, "has invalid data_offsets [0, 4.0]"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "has invalid data_offsets [4, 0]"),
    ],
)
def test_bad_entries_are_named(tmp_path: Path, entry: dict[str, Any], why: str) -> None:
    raw = json.dumps({"w": entry}).encode()
    raw += b" " * (-len(raw) % 8)
    _, problems = parse_header(header_file(tmp_path, raw, bytes(4)), "model.safetensors")
    assert [(p.kind, p.message) for p in problems] == [("bad-entry", f"model.safetensors: tensor 'w' {why}")]

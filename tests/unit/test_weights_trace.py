"""The weights pass's bookkeeping (stages/weights_trace.py) on plain data: storage ranges of
strided views, interval merges, coverage and consumption accounting, which tensor an error is
about, tensor statuses and the assembled result. No vLLM, no torch: the hooks in
compat/weights.py report exactly these events during a real load (tests/test_weights.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_doctor.stages.weights_trace import (
    MAX_RUNS_FOR_EXACT_COVERAGE,
    LoadLedger,
    clip_to,
    covered_elements,
    loaded_shards,
    loader_error_kind,
    looked_up_name,
    merge_intervals,
    nearest_params,
    pick_culprit,
    storage_runs,
    tensor_status,
)

# ---- storage ranges of a view: (numel, storage offset, shape, stride, contiguous) ----


def test_a_contiguous_view_is_one_range_from_its_offset() -> None:
    assert storage_runs(12, 5, [3, 4], [4, 1], True) == [(5, 17)]


def test_an_empty_view_covers_nothing() -> None:
    assert storage_runs(0, 7, [0, 4], [4, 1], False) == []


def test_columns_of_a_row_major_matrix_are_one_range_per_row() -> None:
    # x[:, 2:5] of a [4, 8] matrix: shape [4, 3], stride [8, 1], offset 2
    assert storage_runs(12, 2, [4, 3], [8, 1], False) == [(2, 5), (10, 13), (18, 21), (26, 29)]


def test_every_other_column_is_one_element_per_range() -> None:
    # x[:, ::2] of a [2, 4] matrix: shape [2, 2], stride [4, 2]
    assert storage_runs(4, 0, [2, 2], [4, 2], False) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_a_transposed_matrix_covers_its_whole_storage() -> None:
    # x.t() of a [2, 3] matrix: shape [3, 2], stride [1, 3]: every element, in another order
    assert storage_runs(6, 0, [3, 2], [1, 3], False) == [(0, 6)]


def test_size_one_dimensions_do_not_split_ranges() -> None:
    # x[1:3, None, :2] of a [4, 4] matrix: shape [2, 1, 2], any stride for the size-1 dim
    assert storage_runs(4, 4, [2, 1, 2], [4, 99, 1], False) == [(4, 6), (8, 10)]


def test_a_contiguous_inner_block_is_joined_into_longer_ranges() -> None:
    # x[:, 1:3] of a [2, 4, 5] tensor: the two inner dims [2, 5] are one run of 10 per outer step
    assert storage_runs(20, 5, [2, 2, 5], [20, 5, 1], False) == [(5, 15), (25, 35)]


def test_too_many_ranges_to_list_is_none() -> None:
    n = MAX_RUNS_FOR_EXACT_COVERAGE + 1
    assert storage_runs(n, 0, [n, 1], [2, 1], False) is None


# ---- intervals ----


@pytest.mark.parametrize(
    ("intervals", "merged"),
    [
        ([], []),
        ([(0, 4)], [(0, 4)]),
        ([(4, 8), (0, 4)], [(0, 8)]),  # touching, unsorted
        ([(0, 5), (3, 9), (20, 30)], [(0, 9), (20, 30)]),  # overlapping, and a gap
        ([(0, 10), (2, 3)], [(0, 10)]),  # nested
        ([(5, 6), (5, 6), (0, 1)], [(0, 1), (5, 6)]),  # duplicates
    ],
)
def test_merge_intervals(intervals: list[tuple[int, int]], merged: list[tuple[int, int]]) -> None:
    assert merge_intervals(intervals) == merged


def test_covered_elements_counts_each_element_once() -> None:
    assert covered_elements([(0, 5), (3, 9), (20, 30), (20, 25)]) == 19
    assert covered_elements([]) == 0


def test_clip_to_keeps_the_part_inside_a_parameter_relative_to_its_start() -> None:
    # a parameter at elements [10, 20) of a shared storage
    assert clip_to([(0, 5), (8, 12), (15, 16), (19, 40), (20, 30)], 10, 20) == [(0, 2), (5, 6), (9, 10)]


# ---- what an error is about ----

ORDER = ["model.embed.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"]


def test_the_culprit_is_the_last_fed_tensor_the_message_names() -> None:
    text = "model.layers.0.mlp.gate_proj.weight: bad, and then model.embed.weight"
    assert pick_culprit(ORDER, [0, 1, 2], text, None) == 1


def test_a_quoted_module_name_points_at_the_tensor_under_it() -> None:
    assert pick_culprit(ORDER, [0, 1, 2], "no module named 'model.layers.0.mlp'", None) == 2
    # a KeyError's key under a tensor's name (a scale the model looks up for it)
    assert pick_culprit(ORDER, [0, 1, 2, 3], "KeyError", "model.layers.0.mlp.up_proj.weight_scale") == 2


def test_a_name_inside_a_longer_one_is_not_the_culprit() -> None:
    """vLLM's "no module or parameter named 'model'" lists the model's parameters: the checkpoint's
    lm_head.weight is not named by 'language_model.lm_head.weight' in that list."""
    order = ["lm_head.weight", "model.language_model.norm.weight", "model.vision_tower.x.weight"]
    text = (
        "There is no module or parameter named 'model' in Tiny. The available parameters belonging to  (Tiny) are: "
        "{'language_model.lm_head.weight', 'vision_tower.x.weight'}"
    )
    assert pick_culprit(order, [0, 1, 2], text, None) == 2


def test_without_a_name_the_culprit_is_the_last_tensor_fed_and_none_when_none_was() -> None:
    assert pick_culprit(ORDER, [2, 3], "something broke", None) == 3
    assert pick_culprit(ORDER, [], "model.embed.weight", None) is None


def test_looked_up_name() -> None:
    assert looked_up_name("'a.b'", "a.b", False) == "a.b"
    assert looked_up_name("There is no module or parameter named 'x.y' in M", None, True) == "x.y"
    assert looked_up_name("There is no module or parameter named 'x.y' in M", None, False) is None
    assert looked_up_name("invalid literal", None, True) is None


@pytest.mark.parametrize(
    ("text", "want", "got", "shape_like", "kind"),
    [
        ("ValueError: whatever", [4, 2], [2, 4], False, "shape"),  # the shapes differ
        ("AssertionError: param size mismatch", [4, 2], [4, 2], True, "shape"),
        ("RuntimeError: start (0) + length (256) exceeds dimension size (128).", None, [256], True, "shape"),
        ("ValueError: size mismatch", None, None, False, "raised"),  # not how size checks fail
        ("NotImplementedError: Cannot copy out of meta tensor", [4], [4], False, "meta-limitation"),
        ("RuntimeError: shape of meta tensors", None, None, True, "shape"),  # a size check wins
        ("KeyError: 'x'", [4], [4], False, "raised"),
    ],
)
def test_loader_error_kind(text: str, want: list[int] | None, got: list[int] | None, shape_like: bool, kind: str) -> None:
    assert loader_error_kind(text, want, got, shape_like) == kind


def _rec(**kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"errors": [], "consumed": 0, "written": [], "handed_to": [], "numel": 8, "broadcast": False}
    rec.update(kw)
    return rec


@pytest.mark.parametrize(
    ("rec", "status"),
    [
        (_rec(errors=[{"kind": "raised"}, {"kind": "shape"}]), "shape_mismatch"),
        (_rec(errors=[{"kind": "meta-limitation"}, {"kind": "raised"}]), "raised"),
        (_rec(errors=[{"kind": "meta-limitation"}], consumed=8, written=["p"]), "unverifiable"),
        (_rec(), "skipped"),
        (_rec(handed_to=[{"param": "p"}]), "handed_not_written"),
        (_rec(consumed=4, written=["p"]), "partial"),
        (_rec(consumed=8, written=["p"], broadcast=True), "broadcast"),
        (_rec(consumed=8, written=["p"]), "loaded"),
        (_rec(consumed=0, written=["p"]), "loaded"),  # written by fill_/an op with no copied count
    ],
)
def test_tensor_status(rec: dict[str, Any], status: str) -> None:
    assert tensor_status(rec) == status


def test_loaded_shards() -> None:
    assert loaded_shards(["q", "k", "v"], ["q", "v"]) == ["q", "v"]
    assert loaded_shards(["q", "k", "v"], [None]) == ["q", "k", "v"]  # loaded whole
    assert loaded_shards(None, [1, 0, 1]) == [0, 1]


def test_nearest_params() -> None:
    params = ["model.layers.1.mlp.gate_up_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight"]
    near = nearest_params(["model.layers.1.mlp.gate_up_projection.weight", "zzz"], params)
    assert near == {"model.layers.1.mlp.gate_up_projection.weight": params[:2], "zzz": []}  # best first


# ---- the ledger: a small load, event by event ----

QKV = "layers.0.qkv.weight"
NORM = "layers.0.norm.weight"
HEADERS = [
    {"name": "layers.0.q.weight", "shape": [4, 2], "dtype": "BF16"},
    {"name": "layers.0.k.weight", "shape": [2, 2], "dtype": "BF16"},
    {"name": "layers.0.v.weight", "shape": [2, 2], "dtype": "BF16"},
    {"name": "layers.0.norm.weight", "shape": [2], "dtype": "BF16"},
    {"name": "layers.0.extra.weight", "shape": [1], "dtype": "F32"},
]


def _facts(name: str, shape: list[int], shards: list[Any] | None = None, **kw: Any) -> dict[str, Any]:
    numel = 1
    for d in shape:
        numel *= d
    facts = {
        "shape": shape, "dtype": "bfloat16", "numel": numel, "replaced": False, "replaced_sources": [],
        "shards_expected": shards, "module": "QKVParallelLinear" if shards else "RMSNorm",
    }  # fmt: skip
    facts.update(kw)
    return facts


PARAMS = {QKV: _facts(QKV, [8, 2], ["q", "k", "v"]), NORM: _facts(NORM, [2])}
QKV_OWNER = [(QKV, 0, 16)]  # qkv has its own storage, norm another


def _load(ledger: LoadLedger, tensor: str, shard: Any, rows: tuple[int, int], numel: int) -> None:
    """What vLLM's qkv loader does: one call, one copy_ into rows [a, b) of the [8, 2] parameter."""
    ledger.current = tensor
    call = ledger.begin_call(QKV, shard, [tensor], "QKVParallelLinear.weight_loader")
    a, b = rows
    ledger.record_write("copy_", QKV_OWNER, ((b - a) * 2, a * 2, [b - a, 2], [2, 1], True), {tensor}, numel)
    assert call["writes"] == 1
    ledger.end_call()


def _ledger() -> LoadLedger:
    return LoadLedger(HEADERS, list(PARAMS))


def test_a_fused_parameter_missing_a_shard_is_partly_covered() -> None:
    ledger = _ledger()
    ledger.begin_load_weights()
    _load(ledger, "layers.0.q.weight", "q", (0, 4), 8)
    _load(ledger, "layers.0.k.weight", "k", (4, 6), 4)
    ledger.returned_names({QKV})
    out = ledger.results(PARAMS, set(), lambda p, s: None, [])
    qkv = out["params"][QKV]
    assert (qkv["covered"], qkv["written"]) == (12, False)
    assert qkv["shards_loaded"] == ["k", "q"] and qkv["shards_missing"] == ["v"]
    assert qkv["sources"] == ["layers.0.k.weight", "layers.0.q.weight"] and qkv["in_returned"] is True
    assert out["params"][NORM]["covered"] == 0 and out["params"][NORM]["in_returned"] is False
    statuses = {n: t["status"] for n, t in out["tensors"].items()}
    assert statuses == {
        "layers.0.q.weight": "loaded", "layers.0.k.weight": "loaded", "layers.0.v.weight": "skipped",
        "layers.0.norm.weight": "skipped", "layers.0.extra.weight": "skipped",
    }  # fmt: skip
    assert out["tensors"]["layers.0.q.weight"]["handed_to"] == [
        {"param": QKV, "shard": "q", "loader": "QKVParallelLinear.weight_loader"}
    ]
    assert out["tensors"]["layers.0.q.weight"]["params"] == [QKV]
    assert out["load_weights"] == {
        "returned": "set", "returned_count": 1, "returned_approximate": False, "restarts": 0, "global_errors": [],
    }  # fmt: skip


def test_every_shard_written_covers_the_parameter_once_even_when_written_twice() -> None:
    ledger = _ledger()
    _load(ledger, "layers.0.q.weight", "q", (0, 4), 8)
    _load(ledger, "layers.0.k.weight", "k", (4, 6), 4)
    _load(ledger, "layers.0.v.weight", "v", (6, 8), 4)
    _load(ledger, "layers.0.v.weight", "v", (6, 8), 4)
    qkv = ledger.results(PARAMS, set(), lambda p, s: None, [])["params"][QKV]
    assert (qkv["covered"], qkv["written"], qkv["shards_missing"]) == (16, True, [])


def test_a_tensor_narrowed_to_its_shard_is_partial_with_the_shape_the_parameter_wanted() -> None:
    ledger = _ledger()
    # a [6, 2] q tensor (12 elements) of which the loader copies the 8 its shard holds
    headers = [{**HEADERS[0], "shape": [6, 2]}, *HEADERS[1:]]
    ledger = LoadLedger(headers, list(PARAMS))
    _load(ledger, "layers.0.q.weight", "q", (0, 4), 8)
    asked: list[tuple[str, Any]] = []

    def expected(param: str, shard: Any) -> list[int]:
        asked.append((param, shard))
        return [4, 2]

    t = ledger.results(PARAMS, set(), expected, [])["tensors"]["layers.0.q.weight"]
    assert (t["status"], t["consumed"], t["numel"], t["expected_shape"]) == ("partial", 8, 12, [4, 2])
    assert asked == [(QKV, "q")]


def test_a_small_tensor_spread_over_a_larger_region_is_broadcast() -> None:
    ledger = _ledger()
    call = ledger.begin_call(NORM, None, ["layers.0.extra.weight"], "default_weight_loader")
    # its 1 element copied over the norm's 2 elements
    ledger.record_write("copy_", [(NORM, 0, 2)], (2, 0, [2], [1], True), {"layers.0.extra.weight"}, 1)
    ledger.end_call()
    assert call["writes"] == 1
    out = ledger.results(PARAMS, set(), lambda p, s: [2], [])
    t = out["tensors"]["layers.0.extra.weight"]
    assert (t["status"], t["consumed"], t["expected_shape"]) == ("broadcast", 1, [2])
    assert out["params"][NORM]["written"] is True


def test_a_fill_without_a_source_marks_the_parameter_fill_only_and_not_written() -> None:
    ledger = _ledger()
    ledger.record_write("fill_", [(NORM, 0, 2)], (2, 0, [2], [1], True), set(), 0)
    norm = ledger.results(PARAMS, set(), lambda p, s: None, [])["params"][NORM]
    assert (norm["covered"], norm["written"], norm["fill_only"], norm["sources"]) == (2, False, True, [])


def test_a_copy_inside_a_loader_call_is_credited_to_the_tensor_it_was_handed() -> None:
    """The loader built the data itself (no known origin): the call's tensor is the source."""
    ledger = _ledger()
    ledger.current = "layers.0.norm.weight"
    ledger.begin_call(NORM, None, [], "default_weight_loader")
    ledger.record_write("copy_", [(NORM, 0, 2)], (2, 0, [2], [1], True), set(), 2)
    ledger.end_call()
    out = ledger.results(PARAMS, set(), lambda p, s: None, [])
    assert out["params"][NORM]["written"] is True and out["params"][NORM]["sources"] == ["layers.0.norm.weight"]
    assert out["tensors"]["layers.0.norm.weight"]["status"] == "loaded"


def test_writes_without_listed_ranges_count_as_unplaced_elements() -> None:
    ledger = _ledger()
    n = MAX_RUNS_FOR_EXACT_COVERAGE + 1  # a storage shared by a huge strided view
    ledger.record_write("copy_", QKV_OWNER, (n, 0, [n, 1], [2, 1], False), {"layers.0.q.weight"}, 8)
    qkv = ledger.results(PARAMS, set(), lambda p, s: None, [])["params"][QKV]
    assert qkv["covered"] == 16  # capped at the parameter's size


def test_a_write_outside_a_parameter_of_the_same_storage_does_not_count_for_it() -> None:
    ledger = _ledger()
    owners = [(QKV, 0, 16), (NORM, 16, 18)]  # (not how vLLM lays them out, but a storage may be shared)
    ledger.record_write("copy_", owners, (4, 16, [4], [1], True), {"layers.0.k.weight"}, 4)
    params = ledger.results(PARAMS, set(), lambda p, s: None, [])["params"]
    assert (params[QKV]["covered"], params[QKV]["sources"]) == (0, [])
    assert (params[NORM]["covered"], params[NORM]["sources"]) == (2, ["layers.0.k.weight"])


def test_a_parameter_replaced_by_assignment_is_covered_by_the_new_data() -> None:
    ledger = _ledger()
    params = {**PARAMS, NORM: _facts(NORM, [2], replaced=True, replaced_sources=["layers.0.norm.weight"])}
    out = ledger.results(params, {NORM}, lambda p, s: None, ["x"])
    norm = out["params"][NORM]
    assert (norm["covered"], norm["written"], norm["replaced_by_assignment"]) == (2, True, True)
    assert norm["sources"] == ["layers.0.norm.weight"] and norm["vllm_exempt"] is True
    assert out["moved_to_meta"] == ["x"]


def test_a_loader_error_lands_on_its_tensor_and_its_parameter() -> None:
    ledger = _ledger()
    call = ledger.begin_call(QKV, "q", ["layers.0.q.weight"], "QKVParallelLinear.weight_loader")
    ledger.loader_failed(call, "AssertionError: size", "Traceback ...", want=[4, 2], got=[2, 4], shape_like=True)
    ledger.end_call()
    orphan = ledger.begin_call(NORM, None, ["a", "b"], "default_weight_loader")  # two origins: no single tensor
    ledger.loader_failed(orphan, "RuntimeError: boom", "", want=None, got=None, shape_like=True)
    ledger.end_call()
    out = ledger.results(PARAMS, set(), lambda p, s: None, [])
    t = out["tensors"]["layers.0.q.weight"]
    assert t["status"] == "shape_mismatch" and t["expected_shape"] == [4, 2]
    assert t["errors"][0]["kind"] == "shape" and t["errors"][0]["actual_shape"] == [2, 4]
    assert out["params"][QKV]["failed_from"] == ["layers.0.q.weight"]
    assert [e["error"] for e in out["load_weights"]["global_errors"]] == ["RuntimeError: boom"]


def test_load_weights_raising_restarts_after_the_culprit_and_keeps_what_was_written() -> None:
    ledger = _ledger()
    ledger.begin_load_weights()
    _load(ledger, "layers.0.q.weight", "q", (0, 4), 8)
    restart = ledger.load_weights_failed(
        "'layers.0.k.weight'", "KeyError: 'layers.0.k.weight'", "tb", yielded=[0, 1], key="layers.0.k.weight", value_error=False
    )
    assert restart == 2 and ledger.restarts == 1
    ledger.begin_load_weights()
    _load(ledger, "layers.0.v.weight", "v", (6, 8), 4)
    ledger.returned_names({QKV})
    stop = ledger.load_weights_failed("no tensor here", "ValueError: no tensor here", "", yielded=[], key=None, value_error=True)
    assert stop is None
    out = ledger.results(PARAMS, set(), lambda p, s: None, [])
    assert out["load_weights"]["returned_approximate"] is True and out["load_weights"]["restarts"] == 1
    assert out["params"][QKV]["in_returned"] is True
    k = out["tensors"]["layers.0.k.weight"]
    assert k["status"] == "raised" and k["errors"][0]["looked_up"] == "layers.0.k.weight"
    assert out["load_weights"]["global_errors"][0]["error"] == "ValueError: no tensor here"
    near = ledger.nearest(out["tensors"], list(out["params"]))
    assert near["layers.0.k.weight"][0] == QKV and set(near) == {
        "layers.0.k.weight", "layers.0.norm.weight", "layers.0.extra.weight",
    }  # fmt: skip


def test_what_load_weights_returned() -> None:
    ledger = _ledger()
    ledger.returned_not_iterable("int")
    assert ledger.results(PARAMS, set(), lambda p, s: None, [])["load_weights"]["returned"] == "int"
    ledger = _ledger()
    ledger.returned_none()
    ledger.returned_names({QKV})  # a later call's names cannot bring a None back
    out = ledger.results(PARAMS, set(), lambda p, s: None, [])
    assert out["load_weights"]["returned"] == "none" and out["load_weights"]["returned_count"] is None
    assert out["params"][QKV]["in_returned"] is None


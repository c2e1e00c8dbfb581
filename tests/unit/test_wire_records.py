"""The workers' replies as records: one decoder per part, tolerant of older and newer doctors.

Plain data (the dicts a worker sends); the real producer runs against real engines in
tests/test_engine_live.py, tests/test_engine_cli.py and tests/test_multirank.py.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from vllm_doctor.analysis.engine import anatomy, memory_breakdown
from vllm_doctor.analysis.records import KvGroupSummary
from vllm_doctor.facts.anatomy import Anatomy, CompileState, WorkerIdentity
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts, facts_from_dict, facts_to_dict
from vllm_doctor.facts.kv import AttentionLayer, HfShape, KvCache, KvGroup, KvSpec, KvTensor, PlannedTensor
from vllm_doctor.facts.memory import CudaMemory, MemoryFacts
from vllm_doctor.facts.placement import DevicePlace, Placement, PlacementCounts, Shard, TensorPlace
from vllm_doctor.facts.wire import VERSION_KEY
from vllm_doctor.facts.wire import rules as wire_rules
from vllm_doctor.live.attach import merge_replies

IDENTITY = WorkerIdentity(pid=7, ppid=1, rank=1, local_rank=1, device="cuda:1", model_class="m.M", tensor_parallel_size=2,
                          tp_rank=1, pp_rank=0, process_title="VLLM::Worker_TP1")
PLACEMENT = Placement(
    worker=IDENTITY,
    device=DevicePlace(device="cuda:1", type="cuda", index=1, local_rank=1, hostname="h", uuid="GPU-b", device_count=2),
    model_dtype="torch.bfloat16",
    model="m.M",
    counts=PlacementCounts(parameters=3, buffers=1, misplaced=1, dtype_mismatch=0),
    misplaced=[TensorPlace("inv_freq", "buffer", "cpu", "torch.float32", [4], 16, "Rotary", False)],
    float64=[TensorPlace("gain", "buffer", "cpu", "torch.float64", [8], module_class="MyLlama")],
    by_device={"cuda:1": 3, "cpu": 1},
    by_dtype={"torch.bfloat16": 3, "torch.float32": 1},
    shards={"w": Shard([4, 8], 0, fingerprint=[1.0, 2.5]), "packed": Shard([0], 1, repacked=True)},
)
KV = KvCache(
    num_tensors=2,
    layers=[KvTensor([2, 11, 16, 2, 32], "torch.bfloat16", "cuda:1", 1000, 0)],
    num_storages=1,
    storage_bytes=1000,
    view_bytes=2000,
    num_blocks=11,
    planned_tensors=[PlannedTensor(1000, ["a", "b"])],
    planned_bytes=1000,
    layout="NHD",
    groups=[KvGroup(["a", "b"], KvSpec(type="FullAttentionSpec", block_size=16, num_kv_heads=2, head_size=32))],
    max_model_len=64,
    tensor_parallel_size=2,
    hf_config=HfShape(num_attention_heads=4, num_key_value_heads=2, head_dim=32, model_type="llama"),
    attention_layers=[AttentionLayer("a", num_kv_heads=2, head_size=32, module_paths=["a"], kv_cache_shape=[2, 11])],
)
MEMORY = MemoryFacts(pid=7, device="cuda:1", parameter_bytes=100, kv_bytes=500, vllm={"peak_activation_memory": 50},
                     host={"VmRSS": 9}, cuda=CudaMemory(700, 800, 750, 790, 8_000, 10_000),
                     compile=CompileState(enforce_eager=True, cudagraphs=False, eager=True))


def test_each_record_reads_back_what_it_sends_through_json() -> None:
    for record in (PLACEMENT, KV, MEMORY, Anatomy(IDENTITY, CompileState(eager=True))):
        wire = json.loads(json.dumps(record.to_json()))
        assert wire[VERSION_KEY] == 1
        assert type(record).of(wire) == record


def test_an_older_reply_without_a_version_or_newer_fields_reads_with_defaults() -> None:
    """A doctor from before the records: no wire_version, no float64 / shards / by_device, no
    misplaced count (VD401 then counts the list)."""
    old = {"model": "m.M", "model_dtype": "torch.float16", "device": {"device": "cpu", "type": "cpu", "index": None},
           "counts": {"parameters": 3, "buffers": 1},
           "misplaced": [{"name": "x", "kind": "buffer", "device": "meta", "dtype": "torch.float32", "shape": [2],
                          "bytes": 8, "module_class": "M", "vllm_builtin": False}]}
    p = Placement.of(old)
    assert p.wire_version == 0 and p.worker is None and p.float64 == [] and p.shards == {}
    assert p.counts == PlacementCounts(parameters=3, buffers=1, misplaced=None, dtype_mismatch=None)
    assert p.misplaced[0].device == "meta" and p.misplaced[0].shape == [2]
    assert Placement.of({}) == Placement(wire_version=0)
    kv = KvCache.of({"num_blocks": 11, "groups": [{"layer_names": ["a"]}]})
    assert kv.groups == [KvGroup(["a"], KvSpec())] and kv.tensor_parallel_size == 1 and kv.attention_layers == []
    assert kv.block_size is None
    a = Anatomy.of({"pid": 5, "device": "cpu"})
    assert a.compile is None and a.identity.pid == 5 and a.identity.tp_rank is None


def test_unknown_fields_are_ignored_and_a_newer_version_is_read_for_the_fields_known() -> None:
    newer = PLACEMENT.to_json() | {VERSION_KEY: 99, "from_the_future": {"x": 1}}
    newer["device"]["nvlink"] = ["GPU-a"]
    newer["misplaced"][0]["stride"] = [1]
    p = Placement.of(newer)
    assert p.wire_version == 99
    assert p.device == PLACEMENT.device and p.misplaced == PLACEMENT.misplaced and p.shards == PLACEMENT.shards
    kv = KV.to_json() | {VERSION_KEY: 2, "swap_space": 4}
    kv["groups"][0]["spec"]["mla"] = True
    assert KvCache.of(kv).groups == KV.groups


def test_fields_of_another_type_read_as_missing() -> None:
    p = Placement.of({"device": "cuda:0", "counts": [], "misplaced": [{"name": "a", "shape": "4x4"}, "junk"],
                             "shards": {"w": {"shape": [4, None], "dim": "0"}, "v": 3}, "by_device": {"cpu": "1"}})
    assert p.device == DevicePlace() and p.counts == PlacementCounts()
    assert p.misplaced == [TensorPlace(name="a")] and p.shards == {"w": Shard()} and p.by_device == {}
    kv = KvCache.of({"num_blocks": "11", "max_model_len": True, "hf_config": {"num_key_value_heads": "8"}})
    assert kv.num_blocks is None and kv.max_model_len is None and kv.hf_config == HfShape()
    m = MemoryFacts.of({"cuda": {}, "host": {"VmRSS": 3.5}, "vllm_peak_activation_memory": "big"})
    assert m.cuda is None and m.host == {} and m.measured("peak_activation_memory") is None


def test_the_report_keeps_the_kv_groups_as_vllm_exposed_them() -> None:
    """report.facts["engine"]["kv_cache"]["groups"] has the spec fields the worker sent; the others
    are None (not exposed), never invented."""
    facts = EngineFacts(workers=[WorkerFacts(rank=0, parts={"kv": KV.to_json(), "anatomy": Anatomy(IDENTITY).to_json()})])
    kv = anatomy(facts).kv_cache
    assert kv.groups == [KvGroupSummary(2, KvSpec(type="FullAttentionSpec", block_size=16, num_kv_heads=2, head_size=32))]
    assert kv.to_json()["groups"] == [{"layers": 2, "type": "FullAttentionSpec", "block_size": 16, "num_kv_heads": 2,
                                       "head_size": 32}]  # fmt: skip
    assert (kv.block_size, kv.tensor_shape, kv.num_layers) == (16, [2, 11, 16, 2, 32], 2)
    assert anatomy(facts).workers[0].compile is None


def test_memory_breakdown_reads_the_record() -> None:
    b = memory_breakdown(MEMORY)
    assert b["parts"]["peak_activations"] == 50 and b["parts"]["cuda_graphs"] == 0
    assert b["torch"]["max_reserved"] == 790 and b["total"] == 800  # no NVML: torch's reserved bytes


def _envelope(rank: int, data: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "method": "doctor_placement", "rank": rank, "pid": 7, "data": data}


def test_replies_are_read_once_where_they_enter_and_the_raw_reply_is_kept() -> None:
    facts = EngineFacts()
    wire = PLACEMENT.to_json()
    merge_replies(facts, "placement", [_envelope(0, wire)])
    w = facts.workers[0]
    assert w.get("placement") is wire and w.placement == PLACEMENT
    assert w.placement is w.placement  # decoded once, not per read
    again = facts_from_dict(json.loads(json.dumps(facts_to_dict(facts))))
    assert again.workers[0].parts == {"placement": wire} and again.workers[0].placement == PLACEMENT
    later = WorkerFacts(rank=0)
    later.carry("placement", w)
    assert later.placement is w.placement  # an earlier snapshot's part comes with its record
    w.parts["placement"] = {"model": None}  # a reply put in directly is read when first asked for
    assert w.placement is not None and w.placement.model is None
    assert WorkerFacts(rank=0).kv is None


def test_cuda_graph_bytes_are_the_private_pools_measured() -> None:
    """VD503: under CUDA graphs the graph pool's segments are the cuda_graphs part (vLLM's own
    estimate is 0 when it did not profile); without a readable snapshot the estimate stands."""
    graphs_on = CompileState(compiled=True, cudagraphs=True, cudagraph_mode="FULL_AND_PIECEWISE")
    cuda = dataclasses.replace(MEMORY.cuda, graph_pool_bytes=687_865_856)
    measured = dataclasses.replace(MEMORY, cuda=cuda, compile=graphs_on, vllm={"cudagraph_memory_estimate": 0})
    assert memory_breakdown(measured)["parts"]["cuda_graphs"] == 687_865_856
    again = MemoryFacts.of(measured.to_json())
    assert again.cuda is not None and again.cuda.graph_pool_bytes == 687_865_856
    unread = dataclasses.replace(measured, cuda=dataclasses.replace(cuda, graph_pool_bytes=None),
                                 vllm={"cudagraph_memory_estimate": 400})
    assert memory_breakdown(unread)["parts"]["cuda_graphs"] == 400


@dataclasses.dataclass(frozen=True)
class _Inner:
    """An inner record."""

    n: int | None = None
    values: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Outer:
    inner: _Inner
    by_name: dict[str, _Inner] = dataclasses.field(default_factory=dict)
    count: int = 3
    share: float | None = dataclasses.field(default=None, metadata={"doc": "a share"})


def test_a_record_is_read_from_its_declaration_leniently_and_written_back() -> None:
    from vllm_doctor.facts import wire

    got = wire.read(_Outer, {"inner": {"n": "x", "values": [1, "q", 2.5, True]}, "by_name": {"a": {"n": 2}, "b": 5},
                             "count": True, "share": 2, "unknown": 1})
    # a wrong type reads as the default, a list keeps its numbers (a bool is none), an int is a float
    assert got == _Outer(_Inner(None, [1, 2.5]), {"a": _Inner(2)}, 3, 2)
    assert wire.read(_Outer, "not a dict") == _Outer(_Inner())  # a required record reads as its empty self
    assert wire.read(_Outer, json.loads(json.dumps(wire.write(got)))) == got
    schema = wire.json_schema(_Outer)
    assert schema["properties"]["share"] == {"anyOf": [{"type": "number"}, {"type": "null"}], "description": "a share"}
    assert schema["properties"]["by_name"]["additionalProperties"]["description"] == "An inner record."
    assert schema["properties"]["inner"]["properties"]["values"] == {"type": "array", "items": {"type": "number"}}


@dataclasses.dataclass(frozen=True)
class _Named:
    class_name: str | None = dataclasses.field(default=None, metadata={"key": "class"})
    inner: _Inner | None = None


def test_a_field_whose_key_is_not_a_python_name_reads_and_writes_under_its_key() -> None:
    from vllm_doctor.facts import wire

    named = wire.read(_Named, {"class": "pkg.Model", "class_name": "ignored", "inner": _Inner(4)})
    assert named == _Named("pkg.Model", _Inner(4))  # a record in place of its JSON is taken as it is
    assert wire.write(named) == {"class": "pkg.Model", "inner": {"n": 4, "values": []}}
    assert wire.read(_Named, named) is named
    assert set(wire.json_schema(_Named)["properties"]) == {"class", "inner"}


@dataclasses.dataclass(frozen=True)
class _Optional:
    none: str | None = dataclasses.field(default=None, metadata={"omit_none": True})
    kept: str | None = None


def test_a_none_the_record_omits_is_no_key_in_the_json() -> None:
    from vllm_doctor.facts import wire

    assert wire.write(_Optional()) == {"kept": None}
    assert wire.write(_Optional("why")) == {"none": "why", "kept": None}
    assert wire.read(_Optional, {"kept": "x"}) == _Optional(None, "x")


@dataclasses.dataclass(frozen=True)
class _Shaped:
    WIRE_SPARSE: typing.ClassVar[bool] = True

    inner: _Inner = dataclasses.field(default_factory=_Inner, metadata=wire_rules(inline=True))
    cls_name: str | None = dataclasses.field(default=None, metadata=wire_rules(key="class"))
    shape: list[int] = dataclasses.field(default_factory=list, metadata=wire_rules(whole=True))
    sub: _Inner | None = dataclasses.field(default=None, metadata=wire_rules(empty_none=True))
    measures: dict[str, int] = dataclasses.field(default_factory=dict, metadata=wire_rules(prefix="m_"))
    flag: bool = dataclasses.field(default=False, metadata=wire_rules(omit_default=True))
    wire_version: int = 1


def test_the_field_rules_map_a_record_onto_a_reply_of_an_older_shape() -> None:
    from vllm_doctor.facts import wire

    got = wire.read(_Shaped, {"n": 4, "class": "C", "shape": [2, "x"], "sub": {}, "m_a": 1, "m_b": "no", "flag": True})
    assert got == _Shaped(_Inner(4), "C", [], None, {"a": 1}, True, wire_version=0)  # no version sent: 0
    assert wire.read(_Shaped, {"shape": [2, 3], "sub": {"n": 1}, VERSION_KEY: 3}) == _Shaped(
        shape=[2, 3], sub=_Inner(1), wire_version=3
    )
    # the inner fields beside the owner's, "class", "m_<name>"; None and a default flag left out
    assert wire.write(_Shaped(_Inner(4), "C", measures={"a": 1})) == {
        "n": 4, "values": [], "class": "C", "shape": [], "m_a": 1, "wire_version": 1
    }
    assert list(wire.versioned(_Shaped(flag=True), 2)) == ["wire_version", "values", "shape", "flag"]
    assert wire.versioned(_Shaped(), 2)["wire_version"] == 2
    assert set(wire.json_schema(_Shaped)["properties"]) == {"n", "values", "class", "shape", "sub", "flag", "wire_version"}


def test_every_record_shares_one_base_and_one_pair_of_method_names() -> None:
    """The workers' records and the report's (analysis.records) are one kind of thing: each a
    wire.Record, read with ``of`` and written with ``to_json``; no module keeps a second pair
    (``from_wire`` / ``to_wire``) beside it."""
    import importlib
    import pkgutil

    import vllm_doctor
    from vllm_doctor.facts.wire import Record

    records: list[type] = []
    for info in pkgutil.walk_packages(vllm_doctor.__path__, "vllm_doctor."):
        if info.name.startswith(("vllm_doctor.facts.", "vllm_doctor.analysis.")):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if isinstance(value, type) and value.__module__ == info.name and dataclasses.is_dataclass(value):
                    assert not hasattr(value, "from_wire") and not hasattr(value, "to_wire"), value
                    if issubclass(value, Record):
                        records.append(value)
    names = {r.__name__ for r in records}
    # the wire records (facts) and the report's records (analysis.records) alike
    assert {"KvCache", "Placement", "MemoryFacts", "Anatomy", "QuantFacts", "PerfAnatomy", "ImportPass"} <= names
    assert {"EngineProfile", "EngineAnatomy", "TwinAB", "WorkloadRun"} <= names
    assert KvCache.of(KV.to_json()) == KV and KvGroupSummary.of(KvGroupSummary().to_json()) == KvGroupSummary()

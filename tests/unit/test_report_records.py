"""A report holds records inside the process: the engine's anatomy and profile, the workload, the
A/B and the performance lint's module tree are records from where they are built to where the
report is written (``Report.to_dict``) or read back (``read_report``); report.json keeps its keys.

Plain data: the engine's facts as a worker's replies would hold them; the recorded reports under
tests/fixtures/reports (written by earlier doctors) are read as they are.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from vllm_doctor.analysis.records import LISTS, SECTIONS, EngineAnatomy, EngineProfile, TwinAB, WorkloadRun, read_report
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.live.attach import build_engine_report
from vllm_doctor.model import Report

ROOT = Path(__file__).resolve().parents[2]
# the recorded reports whose findings this doctor reads (older_minimal's has an outcome it retired)
RECORDED = [p for p in sorted((ROOT / "tests" / "fixtures" / "reports").glob("*.json")) if p.stem != "older_minimal"]


def _engine_report_facts() -> EngineFacts:
    steps = [
        {"index": i, "t": 0.01 * i, "phase": "prefill" if i == 0 else "decode", "total_tokens": 4, "num_reqs": 2,
         "prefill_tokens": 4 if i == 0 else 0, "decode_tokens": 0 if i == 0 else 2, "step_s": 0.01, "forward_s": 0.008,
         "kv_blocks_used": 2}
        for i in range(4)
    ]  # fmt: skip
    profile = {"profiling": True, "clock": "wall_clock", "layers_on": True, "steps": steps, "num_blocks": 11}
    anatomy = {"rank": 0, "pid": 5, "device": "cpu", "model_class": "p.M"}
    facts = EngineFacts(
        front_end={"pid": 5, "engine_core_in_process": True, "engine_core_pids": [5]},
        workers=[WorkerFacts(rank=0, parts={"profile": profile, "anatomy": anatomy})],
    )
    return facts


def _engine_report() -> Report:
    return build_engine_report(_engine_report_facts(), "/models/x")


def test_the_engine_report_holds_records_and_writes_their_json() -> None:
    report = _engine_report()
    assert isinstance(report.profiles["engine"], EngineProfile)
    assert isinstance(report.facts["engine"], EngineAnatomy)
    assert report.profiles["engine"].phases["decode"].steps == 3  # read by attribute, no JSON between
    data = report.to_dict()
    assert data["profiles"]["engine"] == report.profiles["engine"].to_json()
    assert data["facts"]["engine"] == report.facts["engine"].to_json()
    assert json.loads(json.dumps(data)) == data  # JSON-able as it is


def test_a_report_read_back_holds_the_same_records_and_writes_the_same_json() -> None:
    report = _engine_report()
    report.profiles["workload"] = WorkloadRun(prompts=2, generated_tokens=8, wall_s=0.5)
    report.profiles["twin"] = TwinAB(none="no in-tree twin")
    data = json.loads(json.dumps(report.to_dict()))
    again = read_report(data)
    assert again.profiles == report.profiles and again.facts == report.facts
    assert again.to_dict() == data
    assert "images_per_prompt" not in data["profiles"]["workload"]  # a text model's workload, as before


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_a_recorded_report_reads_into_records(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    report = read_report(data)
    held = 0
    for (section, key), record in SECTIONS.items():
        if data.get(section, {}).get(key):  # an empty section ({}, null) stays as it is
            assert isinstance(getattr(report, section)[key], record), (section, key)
            held += 1
    assert held or not (data.get("profiles") or data["facts"].get("engine"))
    for (section, key), record in LISTS.items():  # the sections that hold a list of records
        assert all(isinstance(v, record) for v in getattr(report, section).get(key) or []), (section, key)
    for section in ("facts", "profiles"):  # the entries without a record stay as report.json has them
        for key, value in data.get(section, {}).items():
            if (section, key) not in SECTIONS and (section, key) not in LISTS:
                assert getattr(report, section)[key] == value


def test_the_workload_keeps_a_multimodal_runs_keys() -> None:
    sent = {"prompts": 2, "input_len": 16, "output_len": 4, "generated_tokens": 8, "wall_s": 0.5,
            "host_start_s": 1.0, "output_tokens_per_s": 16.0, "images_per_prompt": 1, "image_size": [64, 48]}  # fmt: skip
    assert WorkloadRun.of(sent).to_json() == sent
    failed = {**sent, "images_per_prompt": None, "image_size": None, "images_error": "PIL missing"}
    assert WorkloadRun.of(failed).to_json() == {k: v for k, v in failed.items() if v is not None}


def test_the_engine_stage_puts_the_time_accounting_into_the_profile_record() -> None:
    """stages/engine.engine_report adds the workload and the time accounting to the profile it
    built: as records (the profile replaced with its accounting), written once in report.json."""
    from vllm_doctor.stages.engine import EngineStageResult, engine_report

    facts = _engine_report_facts()
    workload = {"prompts": 2, "input_len": 4, "output_len": 2, "generated_tokens": 4, "wall_s": 0.1,
                "host_start_s": 1.0, "output_tokens_per_s": 40.0}  # fmt: skip
    result = EngineStageResult(facts=facts, workload=workload, timings={}, log_path=None, engine_kwargs={})
    report = engine_report(result, "/models/x")
    profile, run = report.profiles["engine"], report.profiles["workload"]
    assert isinstance(profile, EngineProfile) and isinstance(run, WorkloadRun)
    assert profile.time_accounting is not None and profile.time_accounting.steps_s == pytest.approx(0.04)
    data = report.to_dict()
    assert data["profiles"]["workload"] == workload
    assert data["profiles"]["engine"]["time_accounting"]["steps_s"] == pytest.approx(0.04)


def test_a_frame_holds_records_and_a_recording_gives_them_back(tmp_path: Path) -> None:
    """top's frame holds the devices and the model panel's summary as records; the recorder
    writes their JSON (the edge) and a replay reads the same records back."""
    import gzip

    from vllm_doctor.live.derive import Deriver
    from vllm_doctor.live.devices import DevicesFrame, GpuProcess, GpuSample, ProcSample
    from vllm_doctor.live.record import Recorder, ReplaySource
    from vllm_doctor.live.sources import Frame, ModelSummary, model_summary

    gpu = GpuSample(0, "H200", "GPU-a", 50.0, 10.0, 2**30, 2**34, 300.0, 700.0, 60.0, 1980, 2619,
                    (GpuProcess(7, 2**29, "python"),))  # fmt: skip
    devices = DevicesFrame(1.0, True, "", (gpu,), (ProcSample(7, "worker 0", 99.0, 2**28, 12),))
    model = model_summary(_engine_report())
    assert isinstance(model, ModelSummary) and model.phases["decode"].steps == 3
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    frame = Frame(seq=1, t=1.0, url="http://127.0.0.1:1", interval_s=1.0, metrics=Deriver().update(1.0, text),
                  devices=devices, model=model, raw=text)  # fmt: skip
    path = tmp_path / "r.jsonl.gz"
    rec = Recorder(path, {"url": frame.url, "interval_s": 1.0})
    rec.write(frame)
    rec.close()
    line = json.loads(gzip.open(path).read().splitlines()[1])
    assert line["devices"] == devices.to_json() and line["model"] == model.to_json()
    again = ReplaySource(path).poll()
    assert again.devices == devices and again.model == model


# ---- the rule, held: JSON only at the edges ------------------------------------------------------

PACKAGE = ROOT / "vllm_doctor"
# where a record becomes JSON: the worker's side of the wire (compat sends its replies), the recorder,
# `top --once --json`, top's own metrics frame (no record), and a finding's evidence (report.json's)
TO_JSON_EDGES = {
    "compat": "the worker's side of the wire: a reply is the record's JSON",
    "live/record.py": "the recorder writes a frame's records",
    "cli/top.py": "top --once --json prints them",
    "live/derive.py": "the metrics frame's own JSON (no record)",
    "checks/kv_cache.py": "a finding's evidence is JSON",
    "analysis/engine.py": "memory_breakdown: the memory check's evidence",
}
SECTION_KEYS = sorted({key for _, key in SECTIONS})
KEYS = "|".join(SECTION_KEYS)
# a section's entry: report.profiles["engine"], data["profiles"].get("engine"), _dict(report.get("profiles")).get("engine")
HELD = r"""report\w*\.(profiles|facts)\b|['"](profiles|facts)['"]"""  # a report's sections, held or as JSON
SECTION = rf"""(profiles|facts)['"]?\)*(\[['"]({KEYS})['"]\]|\.get\(['"]({KEYS})['"]\))"""


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _edge(rel: str) -> bool:
    return any(rel == edge or rel.startswith(edge + "/") for edge in TO_JSON_EDGES)


def test_no_reader_writes_a_record_back_to_json_mid_process() -> None:
    found = [
        f"{rel}:{node.lineno}: {ast.unparse(node)}"
        for rel, tree in _modules()
        if not _edge(rel)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to_json"
        and not node.args
    ]  # fmt: skip
    why = "a record turned into JSON outside the edges (Report.to_dict, the wire, the recorder):\n"
    assert found == [], why + "\n".join(found)


def test_no_reader_indexes_a_sections_json_or_reads_a_held_record_again() -> None:
    """A report's section that has a record is read by attribute: never ``profiles["engine"]["steps"]``
    (the record's JSON indexed by key), nor ``EngineProfile.of(report.profiles...)`` (a record the
    report already holds read again); a report's JSON is read into records where it is read back
    (read_report, view's ``viewed``)."""
    indexed = re.compile(SECTION + r"""(\[|\.get\()""")
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Subscript, ast.Call)) else ""
            if isinstance(node, ast.Subscript) and indexed.search(text):
                found.append(f"{rel}:{node.lineno}: {text}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "of"
                  and any(re.search(HELD, ast.unparse(a)) for a in node.args)):  # fmt: skip
                found.append(f"{rel}:{node.lineno}: {text}")
    assert found == [], "a section that has a record read as JSON:\n" + "\n".join(sorted(set(found)))


# ---- the weights pass's reply as records ---------------------------------------------------------


def test_the_weights_pass_reply_is_read_once_into_records_and_the_checks_read_attributes() -> None:
    """VD301-VD304 read the weights pass's reply as its record (Facts.usable_weights): the same
    findings and evidence as the reply's JSON gives; a finding's evidence stays JSON."""
    from vllm_doctor.checks import run_checks
    from vllm_doctor.facts.checkpoint import CheckpointFacts, FileHeader, TensorHeader
    from vllm_doctor.facts.static import Facts, HandedTo, ParamLoad, TensorLoad, WeightLoad

    names = ["w.weight", "v.weight", "u.weight"]
    f = Facts(model_dir="/nonexistent", config={"architectures": ["X"]})
    headers = [TensorHeader(n, "BF16", [2, 2], "model.safetensors", (0, 8)) for n in names]
    f.checkpoint = CheckpointFacts("/nonexistent", "safetensors", [FileHeader("model.safetensors", 8, 8, headers, ok=True)])
    handed = [{"param": "w.weight", "shard": None, "loader": "default"}]
    f.weight_load = {
        "params": {"w.weight": {"shape": [2, 2], "dtype": "torch.bfloat16", "numel": 4, "covered": 0, "written": False,
                                "sources": [], "shards_expected": None, "shards_loaded": None, "shards_missing": None,
                                "failed_from": [], "in_returned": True, "vllm_exempt": False}},
        "tensors": {
            "w.weight": {"status": "handed_not_written", "shape": [2, 2], "dtype": "BF16", "params": [],
                         "handed_to": handed, "consumed": 0, "numel": 4, "errors": []},
            "v.weight": {"status": "shape_mismatch", "shape": [4, 1], "dtype": "BF16", "params": [],
                         "handed_to": [{"param": "w.weight", "shard": 0, "loader": "default"}], "consumed": 0,
                         "numel": 4, "errors": [], "expected_shape": [1, 4]},
            "u.weight": {"status": "raised", "shape": [2, 2], "dtype": "BF16", "params": [], "handed_to": [],
                         "consumed": 0, "numel": 4, "errors": [{"where": "load_weights", "error": "KeyError: 'u.weight'",
                         "kind": "raised", "looked_up": "u.weight", "traceback": "tb"}]},
        },
        "load_weights": {"returned": "set", "returned_count": 1, "returned_approximate": False, "restarts": 1,
                         "global_errors": []},
        "nearest": {"u.weight": ["w.weight"]},
    }  # fmt: skip
    got = f.usable_weights()
    assert isinstance(got, WeightLoad) and got is f.usable_weights()  # read once per reply
    assert isinstance(got.tensors["w.weight"], TensorLoad) and isinstance(got.params["w.weight"], ParamLoad)
    assert got.tensors["w.weight"].handed_to == [HandedTo("w.weight", None, "default")]
    by_code = {x.code: x for x in run_checks(f, ["VD301", "VD302", "VD303"]) if x.outcome.value in ("fail", "warn")}
    assert by_code["VD301"].subject == "w.weight" and by_code["VD301"].evidence["load_weights_reports_it"] is True
    raised = next(x for x in run_checks(f, ["VD302"]) if x.subject == "u.weight")
    assert raised.evidence["nearest_parameters"] == ["w.weight"] and raised.evidence["traceback"] == "tb"
    written = next(x for x in run_checks(f, ["VD302"]) if x.subject == "w.weight")
    assert written.evidence["handed_to"] == handed  # the reply's JSON, as before
    shape = by_code["VD303"]
    assert (shape.evidence["expected_shape"], shape.evidence["actual_shape"], shape.evidence["transposed"]) == (
        [1, 4], [4, 1], True
    )


def test_the_static_stage_resolves_into_a_record_and_the_text_reads_it() -> None:
    from vllm_doctor.analysis.records import ResolvedClass
    from vllm_doctor.report.text import render

    data = json.loads((ROOT / "tests" / "fixtures" / "reports" / "check_engine.json").read_text(encoding="utf-8"))
    report = read_report(data)
    resolved = report.facts["resolved"]
    assert isinstance(resolved, ResolvedClass) and report.to_dict()["facts"]["resolved"] == data["facts"]["resolved"]
    assert f"  resolves to: {resolved.architecture} -> {resolved.target}" in render(report).splitlines()


def _weights_json_before(facts: Any) -> dict[str, Any] | None:
    """report.facts["weights"] as the doctor wrote it before the record (stages/weights.py at 6646de5)."""
    if facts.checkpoint is None:
        return None
    out: dict[str, Any] = {"checkpoint": facts.checkpoint.to_dict(), "tensor_parallel_size": facts.tensor_parallel_size}
    data = facts.weight_load
    if facts.weight_load_error:
        out["load_error"] = facts.weight_load_error
    if data is not None:
        out["model"] = data.get("model")
        out["timings"] = {**(data.get("timings") or {}), "probe_wall_s": facts.weight_load_seconds}
        if "tensors" in data:
            out["load_weights"] = data.get("load_weights")
            out["mapping"] = {
                name: {
                    "status": t["status"], "params": t["params"],
                    "shards": sorted({str(h["shard"]) for h in t["handed_to"] if h["shard"] is not None}),
                    "shape": t["shape"], "dtype": t["dtype"],
                    **({"error": t["errors"][0]["error"]} if t["errors"] else {}),
                    **({"looked_up": t["errors"][0]["looked_up"]} if t["errors"] and t["errors"][0].get("looked_up") else {}),
                }
                for name, t in data["tensors"].items()
            }  # fmt: skip
            keys = ("shape", "dtype", "written", "covered", "numel", "sources", "shards_expected", "shards_missing",
                    "loader", "in_returned", "vllm_exempt")  # fmt: skip
            out["params"] = {name: {k: p[k] for k in keys} for name, p in data["params"].items()}
            if data.get("tracer_errors"):
                out["tracer_errors"] = data["tracer_errors"]
    return out


def test_the_weights_section_is_a_record_that_writes_what_the_report_had() -> None:
    """report.facts["weights"] (WeightsReport): the same JSON as before it was a record, whether the
    pass loaded, raised, failed before building or did not run; stages/engine reads its parameters'
    shapes by attribute (VD406's reference)."""
    from vllm_doctor.analysis.records import WeightsReport
    from vllm_doctor.facts.checkpoint import CheckpointFacts, FileHeader, TensorHeader
    from vllm_doctor.facts.static import Facts
    from vllm_doctor.stages.engine import _reference_shapes
    from vllm_doctor.stages.weights import weights_report

    f = Facts(model_dir="/m", config={"architectures": ["X"]})
    assert weights_report(f) is None  # no checkpoint read
    headers = [TensorHeader("w.weight", "BF16", [2, 2], "model.safetensors", (0, 8))]
    f.checkpoint = CheckpointFacts("/m", "safetensors", [FileHeader("model.safetensors", 8, 8, headers, ok=True)])
    param = {"shape": [2, 2], "dtype": "torch.bfloat16", "numel": 4, "covered": 4, "written": True, "fill_only": False,
             "sources": ["w.weight"], "shards_expected": [0, 1], "shards_loaded": [0, 1], "shards_missing": [],
             "loader": "default", "module": "Linear", "replaced_by_assignment": False, "failed_from": [],
             "in_returned": True, "vllm_exempt": False}  # fmt: skip
    error = {"where": "load_weights", "error": "KeyError: 'u'", "kind": "raised", "looked_up": "u", "traceback": ""}
    replies: list[dict[str, Any] | None] = [
        None,
        {"error": {"stage": "build", "summary": "no"}, "model": {"dtype": "bfloat16"}, "timings": {"config_s": 0.1}},
        {"model": {"dtype": "bfloat16", "class": "m.M"}, "timings": {"build_s": 0.2},
         "params": {"w.weight": param},
         "tensors": {"w.weight": {"status": "loaded", "shape": [2, 2], "dtype": "BF16", "params": ["w.weight"],
                                  "handed_to": [{"param": "w.weight", "shard": 0, "loader": "default"}],
                                  "consumed": 4, "numel": 4, "errors": []},
                     "u.weight": {"status": "raised", "shape": [2], "dtype": "BF16", "params": [], "handed_to": [],
                                  "consumed": 0, "numel": 2, "errors": [error]}},
         "load_weights": {"returned": "set", "returned_count": 1, "returned_approximate": False, "restarts": 1,
                          "global_errors": []},
         "tracer_errors": ["a hook failed"]},
    ]  # fmt: skip
    for reply, failed in zip(replies, (None, "failed while building", None), strict=True):
        f.weight_load, f.weight_load_error, f.weight_load_seconds = reply, failed, 1.5
        record = weights_report(f)
        assert isinstance(record, WeightsReport)
        assert json.loads(json.dumps(record.to_json())) == _weights_json_before(f)
        assert WeightsReport.of(record.to_json()).to_json() == record.to_json()
    assert _reference_shapes(Report("/m", facts={"weights": record})) == {"w.weight": [2, 2]}

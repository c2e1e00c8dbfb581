"""Checks are pure functions over Facts: test their logic on plain data."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_doctor.checks import CATALOGUE, run_checks
from vllm_doctor.checks.base import Check
from vllm_doctor.checks.registry import nearest_names
from vllm_doctor.facts.plugins import PluginInfo, Registration
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import CheckMeta, Explanation, Outcome, Severity, Stage
from vllm_doctor.stages.static import CheckOptions, selected_codes

BUILTIN = {"LlamaForCausalLM": "vllm.model_executor.models.llama:LlamaForCausalLM",
           "OlmoForCausalLM": "vllm.model_executor.models.transformers:TransformersForCausalLM"}


def facts(config: dict, **kw) -> Facts:
    f = Facts(model_dir=kw.pop("model_dir", "/nonexistent"), config=config, builtin_archs=dict(BUILTIN),
              transformers_model_types={"llama", "olmo"}, transformers_class_names={"LlamaForCausalLM", "OlmoForCausalLM"})
    f.registry = dict(BUILTIN)
    for k, v in kw.items():
        setattr(f, k, v)
    return f


def problems(f: Facts, code: str) -> list:
    return [x for x in run_checks(f, [code]) if x.is_problem]


def plugin(*regs: tuple[str, str], config_regs=(), allowed=True, problem=None) -> PluginInfo:
    return PluginInfo(name="p", value="p:register", distribution="p", allowed=allowed, function_found=problem is None,
                      registrations=[Registration(a, t, True, "p/__init__.py:3") for a, t in regs],
                      config_registrations=list(config_regs), problem=problem)


def test_nearest_names_prefers_case_and_underscore_near_misses() -> None:
    assert nearest_names("TinyDoctorForCausalLm", ["TinyDoctorForCausalLM", "LlamaForCausalLM"])[0] == "TinyDoctorForCausalLM"
    assert nearest_names("tiny_doctor", ["TinyDoctor", "Other"]) == ["TinyDoctor"]
    assert nearest_names("Zzz", ["LlamaForCausalLM"]) == []


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model_type": "llama"}, "config.json has no `architectures`"),
        ({"architectures": "LlamaForCausalLM"}, "`architectures` is a str, not a list"),
        ({"architectures": []}, "`architectures` is an empty list"),
        ({"architectures": [1]}, "`architectures` holds non-string entries"),
    ],
)
def test_vd108_reports_each_malformed_architectures(config: dict, message: str) -> None:
    found = problems(facts(config), "VD108")
    assert [f.subject for f in found] == ["config.json:architectures"]
    assert found[0].message.startswith(message)


def test_vd101_suggests_the_plugin_registered_name() -> None:
    f = facts({"architectures": ["MyForCausalLm"], "model_type": "my"},
              plugins=[plugin(("MyForCausalLM", "my.model:MyForCausalLM"))])
    f.registry = dict(BUILTIN, MyForCausalLM="my.model:MyForCausalLM")
    (found,) = problems(f, "VD101")
    assert found.subject == "config.json:architectures[0]"
    assert found.evidence["nearest_registered"][0] == "MyForCausalLM"
    assert found.hint.startswith("did you mean 'MyForCausalLM'?")


def test_vd101_passes_when_the_transformers_fallback_applies() -> None:
    f = facts({"architectures": ["LlamaForQuestionAnswering"], "model_type": "llama"})
    f.transformers_class_names = {"LlamaForQuestionAnswering"}
    assert problems(f, "VD101") == []
    (warned,) = problems(f, "VD107")
    assert "fall back to its Transformers backend" in warned.message


def test_vd103_names_the_model_type_registration() -> None:
    f = facts({"architectures": ["MyForCausalLM"], "model_type": "my"},
              plugins=[plugin(("my", "my.model:MyForCausalLM"))])
    f.registry = dict(BUILTIN, my="my.model:MyForCausalLM")
    (found,) = problems(f, "VD103")
    assert found.subject == "p/__init__.py:3"
    assert "model_type string 'my'" in found.message


def test_vd104_counts_plugin_autoconfig_registrations_in_the_fast_pass() -> None:
    cfg = {"architectures": ["MyForCausalLM"], "model_type": "my"}
    assert [f.code for f in problems(facts(cfg), "VD104")] == ["VD104"]
    ok = facts(cfg, plugins=[plugin(("MyForCausalLM", "m:M"), config_regs=[("my", "MyConfig")])])
    assert problems(ok, "VD104") == []


def test_vd105_reports_missing_auto_map_file_and_trust(tmp_path: Path) -> None:
    cfg = {"architectures": ["MyForCausalLM"], "model_type": "my", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}}
    found = problems(facts(cfg, model_dir=str(tmp_path)), "VD105")
    assert sorted(f.subject for f in found) == ["config.json:auto_map", "config.json:auto_map.AutoConfig"]
    (tmp_path / "configuration_my.py").write_text("")
    assert problems(facts(cfg, model_dir=str(tmp_path), trust_remote_code=True), "VD105") == []


def test_vd109_reports_vllm_plugins_exclusion() -> None:
    f = facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
              plugins=[plugin(("X", "x:X"), allowed=False)], vllm_plugins_env="other")
    (found,) = problems(f, "VD109")
    assert "excluded by VLLM_PLUGINS='other'" in found.message


def test_vd110_is_info_and_names_the_builtin() -> None:
    f = facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
              plugins=[plugin(("LlamaForCausalLM", "mine:MyLlama"))])
    (found,) = problems(f, "VD110")
    assert found.severity is Severity.INFO
    assert found.evidence["builtin"] == BUILTIN["LlamaForCausalLM"]


def test_import_pass_checks_skip_with_the_reason_when_it_did_not_run() -> None:
    f = facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, import_pass_error="boom")
    for code in ("VD106", "VD201", "VD207"):
        (finding,) = run_checks(f, [code])
        assert finding.outcome is Outcome.SKIP and "boom" in finding.message


def test_a_check_that_raises_becomes_a_crash_finding_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(_facts: Facts):
        raise ZeroDivisionError("oops")

    meta = CheckMeta("VD999", "test-crash", "s", Explanation("w", "y", "e", "f"), Severity.WARN, Stage.STATIC)
    monkeypatch.setitem(CATALOGUE, "VD999", Check(meta=meta, run=explode))
    found = run_checks(facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}), ["VD999", "VD108"])
    assert [(f.code, f.outcome) for f in found] == [("VD999", Outcome.CRASH), ("VD108", Outcome.PASS)]
    assert "ZeroDivisionError: oops" in found[0].message


def test_select_and_ignore_take_prefixes() -> None:
    assert selected_codes(CheckOptions(select={"VD2"}, ignore={"VD205"})) == [
        "VD201", "VD202", "VD203", "VD204", "VD206", "VD207", "VD209", "VD210", "VD211", "VD212", "VD214", "VD215", "VD216", "VD217"]


def test_every_check_has_complete_metadata() -> None:
    for code, entry in CATALOGUE.items():
        m = entry.meta
        assert m.code == code and m.name == m.name.lower() and " " not in m.name
        assert m.summary and m.explanation.what and m.explanation.why and m.explanation.example and m.explanation.fix


def test_import_time_registrations_are_not_blamed_on_an_unrelated_plugin() -> None:
    f = facts({"architectures": ["MyForCausalLM"], "model_type": "my"},
              plugins=[plugin(("Other", "o:O")), PluginInfo(name="dyn", value="d:register", distribution="d",
                                                            allowed=True, function_found=True, dynamic=True)])
    f.registry = dict(BUILTIN, my="my.model:MyForCausalLM")
    f.registry_source = "import"
    owners = {arch: p.name for p, arch, _t, _w in f.plugin_registrations()}
    assert owners == {"Other": "p", "my": "dyn"}
    f.plugins[1].dynamic = False  # nobody is opaque: say so instead of guessing
    assert {arch: p.name for p, arch, _t, _w in f.plugin_registrations()}["my"] == "(an installed plugin)"


def test_module_level_entry_point_scans_all_top_level_registrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.compat.plugins import scan_plugin

    (tmp_path / "modplug.py").write_text(
        "from vllm import ModelRegistry\nimport os\n"
        "ModelRegistry.register_model('A', 'a:A')\nModelRegistry.register_model('B', 'b:B')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    info = PluginInfo(name="m", value="modplug", distribution=None, allowed=True)
    scan_plugin(info)
    assert [r.arch for r in info.registrations] == ["A", "B"]


def test_every_requirement_is_a_gate_and_gates_run_before_the_check() -> None:
    from vllm_doctor.checks import GATES, needs_import

    assert {name for c in CATALOGUE.values() for name in c.meta.requires} <= set(GATES)
    # the import pass (or the weights pass beside it) is what these checks wait for
    assert {c for c in CATALOGUE if needs_import(c)} == {
        "VD100", "VD106", "VD111", "VD112", "VD201", "VD202", "VD203", "VD204", "VD205", "VD206", "VD207", "VD209", "VD210", "VD211", "VD212", "VD214", "VD216", "VD217", "VD301", "VD302", "VD303",
        "VD304", "VD310", "VD311", "VD312", "VD313", "VD314", "VD315", "VD317", "VD601", "VD602", "VD603", "VD604", "VD605", "VD606"}
    # no import pass: every check that needs it gets the gate's skip, and its body never runs
    f = facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, import_pass_error="no vLLM here")
    for code in ("VD106", "VD201", "VD207"):
        (finding,) = run_checks(f, [code])
        assert (finding.outcome, finding.message) == (Outcome.SKIP, "needs the import pass: no vLLM here")
    # the import pass ran, nothing of config.json is registered: not applicable, not a skip
    f = facts({"architectures": ["Nope"], "model_type": "llama"}, import_pass={"classes": {}})
    (finding,) = run_checks(f, ["VD201"])
    assert finding.outcome is Outcome.NOT_APPLICABLE and "see VD101" in finding.message


def test_a_gate_that_fails_stops_the_gates_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.checks.base import GATES, Emit, Gate

    calls: list[str] = []

    def first(_f: object, emit: Emit):
        calls.append("first")
        return emit.not_applicable("nothing here")

    def second(_f: object, emit: Emit):
        calls.append("second")
        return None

    monkeypatch.setitem(GATES, "t-first", Gate("t-first", first))
    monkeypatch.setitem(GATES, "t-second", Gate("t-second", second))
    meta = CheckMeta("VD998", "test-gates", "s", Explanation("w", "y", "e", "f"), Severity.WARN, Stage.STATIC,
                     requires=("t-first", "t-second"))
    monkeypatch.setitem(CATALOGUE, "VD998", Check(meta=meta, run=lambda _f: pytest.fail("the body ran")))
    (finding,) = run_checks(object(), ["VD998"])
    assert (finding.code, finding.outcome, finding.message) == ("VD998", Outcome.NOT_APPLICABLE, "nothing here")
    assert calls == ["first"]


def test_vd111_fails_with_vllms_refusal_and_leaves_explained_ones_to_their_checks() -> None:
    refusal = ("ValidationError: 1 validation error for ModelConfig\n  Value error, IQuestQ1 hybrid layer pattern has 88 "
               "layers, expected 2 [type=value_error, input_value=...]")
    f = facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
              import_pass={"config_verdict": {"ok": False, "error": refusal}})
    (finding,) = run_checks(f, ["VD111"])
    assert finding.outcome is Outcome.FAIL and finding.severity is Severity.ERROR
    assert finding.message == ("vLLM refuses config.json: ValidationError: 1 validation error for ModelConfig: "
                               "IQuestQ1 hybrid layer pattern has 88 layers, expected 2")
    generic = "Value error, This model does not support `--runner generate`. [type=value_error]"
    f.import_pass = {"config_verdict": {"ok": False, "error": generic}}
    assert run_checks(f, ["VD111"])[0].outcome is Outcome.NOT_APPLICABLE
    f.import_pass = {"config_verdict": {"ok": True, "config_class": "C", "architectures": ["LlamaForCausalLM"]}}
    assert run_checks(f, ["VD111"])[0].outcome is Outcome.PASS
    f.import_pass = None
    assert run_checks(f, ["VD111"])[0].outcome is Outcome.SKIP


def test_vd310_reports_a_build_failure_once() -> None:
    """The weights pass could not build the model: VD310 fails with vLLM's error and the model's
    line; when a check that names the cause (here VD309) fails in the same run, VD310 defers to it."""
    error = {"stage": "build", "summary": "KeyError: 'factor'", "traceback": "...", "where": "/p/m.py:62 in __init__"}
    f = facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, import_pass={"classes": {}})
    f.weight_load = {"error": error}
    (finding,) = run_checks(f, ["VD310"])
    assert (finding.outcome, finding.subject) == (Outcome.FAIL, "the model's construction")
    assert finding.message == ("failed while building the model on the meta device (vLLM's initialize_model): "
                               "KeyError: 'factor' at /p/m.py:62 in __init__")
    assert finding.evidence["vllm_error"] == "KeyError: 'factor'" and finding.evidence["stage"] == "build"
    f.config["num_hidden_layers"] = 0
    vd309, vd310 = run_checks(f, ["VD309", "VD310"])
    assert vd309.outcome is Outcome.FAIL
    assert vd310.outcome is Outcome.SKIP and vd310.message.startswith("VD309 names the cause of this failure: failed")
    # the pass itself failing is VD100's, a completed build is a pass, no weights pass is n/a
    f.config["num_hidden_layers"] = 2
    f.weight_load = {"error": {"stage": "import", "summary": "ImportError: no vllm"}}
    assert run_checks(f, ["VD310"])[0].outcome is Outcome.NOT_APPLICABLE
    f.weight_load = {"tensors": {}}
    assert run_checks(f, ["VD310"])[0].outcome is Outcome.PASS
    f.weight_load = None
    assert run_checks(f, ["VD310"])[0].outcome is Outcome.NOT_APPLICABLE


LLAVA = "vllm.model_executor.models.llava:LlavaForConditionalGeneration"


def _llava_import_fails(traceback: str) -> Facts:
    f = facts({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"},
              import_pass={"classes": {"LlavaForConditionalGeneration": {
                  "target": LLAVA, "import_error": traceback, "import_error_summary": traceback.splitlines()[-1]}}})
    f.registry = dict(BUILTIN, LlavaForConditionalGeneration=LLAVA)
    return f


def test_a_class_that_needs_torchvision_says_the_environment_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.checks import registry

    versions = {"torch": "2.13.0+cpu", "torchvision": None}
    monkeypatch.setattr(registry, "package_version", versions.get)
    # transformers hides the cause behind its lazy-import error; the chained traceback names it
    missing = ("Traceback (most recent call last):\nModuleNotFoundError: No module named 'torchvision'\n\nThe above "
               "exception was the direct cause of the following exception:\n\nModuleNotFoundError: Could not import "
               "module 'PixtralImageProcessor'.")
    (finding,) = problems(_llava_import_fails(missing), "VD106")
    assert "this environment has no torchvision" in finding.message
    assert "CPU build" in finding.hint and "multimodal-environment.md" in finding.hint
    assert finding.evidence["environment"] == {"torch": "2.13.0+cpu", "torchvision": None, "package": "torchvision",
                                               "state": "missing"}
    # PyPI's CUDA torchvision beside the CPU torch: installed, but its ops do not load
    versions["torchvision"] = "0.28.0"
    broken = "Traceback (most recent call last):\nRuntimeError: operator torchvision::nms does not exist"
    (finding,) = problems(_llava_import_fails(broken), "VD106")
    assert "torchvision 0.28.0 is installed but its C++ ops do not load beside torch 2.13.0+cpu" in finding.message
    assert finding.evidence["environment"]["state"] == "broken"
    # vLLM itself fails to import with it (transformers imports an installed torchvision): VD100 says why
    f = facts({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}, import_pass_error="x",
              pass_failures=[{"pass": "the import pass", "error": "the import pass failed inside vllm-doctor: "
                              "RuntimeError: operator torchvision::nms does not exist"}])
    (finding,) = problems(f, "VD100")
    assert "C++ ops do not load beside torch 2.13.0+cpu" in finding.message and "CPU build" in finding.hint
    # an error in the model's own code keeps the plain message
    (finding,) = problems(_llava_import_fails("Traceback\nImportError: cannot import name 'QKVParallelLinaer'"), "VD106")
    assert finding.message.endswith("ImportError: cannot import name 'QKVParallelLinaer'")
    assert "environment" not in finding.evidence


def test_a_multimodal_registry_that_cannot_be_asked_is_a_skip_that_says_what_it_raised() -> None:
    target = "my_vl.model:MyVLForConditionalGeneration"
    f = facts({"architectures": ["MyVLForConditionalGeneration"], "model_type": "llava"},
              import_pass={"classes": {"MyVLForConditionalGeneration": {"target": target, "contract": {"vllm": {
                  "supports_multimodal": True, "has_mm_processor_error": "ImportError('no module named x')"}}}}})
    f.registry = dict(BUILTIN, MyVLForConditionalGeneration=target)
    (finding,) = run_checks(f, ["VD209"])
    assert finding.outcome is Outcome.SKIP
    assert finding.message == "this vLLM's multimodal registry could not be asked: ImportError('no module named x')"


def test_vd101_fixes_a_typo_of_a_plugin_name_in_config_json_not_by_registering_the_typo() -> None:
    f = facts({"architectures": ["MyForCausalLm"], "model_type": "my"},
              plugins=[plugin(("MyForCausalLM", "my.model:MyForCausalLM"))])
    f.registry = dict(BUILTIN, MyForCausalLM="my.model:MyForCausalLM")
    (found,) = problems(f, "VD101")
    assert found.hint == ("did you mean 'MyForCausalLM'? config.json's `architectures` entry and the registered name "
                          "must match exactly: write 'MyForCausalLM' in config.json's `architectures`")
    assert "MyForCausalLm" not in found.hint  # never: register the misspelled name


def test_vd101_near_a_vllm_name_offers_both_fixes() -> None:
    (found,) = problems(facts({"architectures": ["LlamaForCausalLm"], "model_type": "llama"}), "VD101")
    assert found.hint.startswith("did you mean 'LlamaForCausalLM'? ")
    assert found.hint.endswith("if 'LlamaForCausalLm' is a class of your own, register it from a "
                               "`vllm.general_plugins` entry point: ModelRegistry.register_model('LlamaForCausalLm', "
                               "'your_pkg.model:YourClass')")


def test_vd205_a_load_weights_returning_none_is_the_error_the_catalogue_says() -> None:
    target = "my.model:MyForCausalLM"
    f = facts({"architectures": ["MyForCausalLM"], "model_type": "llama"},
              import_pass={"classes": {"MyForCausalLM": {"target": target, "contract": {
                  "load_weights_callable": True, "load_weights_returns_value": False, "source": "my/model.py:9"}}}})
    f.registry = dict(BUILTIN, MyForCausalLM=target)
    (found,) = problems(f, "VD205")
    assert (found.outcome, found.severity) == (Outcome.FAIL, CATALOGUE["VD205"].meta.severity) == (Outcome.FAIL, Severity.ERROR)
    assert found.message == f"{target}.load_weights returns None: vLLM cannot tell which parameters were never loaded"

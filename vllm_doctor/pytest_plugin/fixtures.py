"""The pytest plugin's fixtures: ``vllm_doctor`` (:class:`VllmDoctor`, the assertions) and
``vllm_doctor_check`` (:class:`DoctorCheck`, static checks only). Both are thin views on the
session (:mod:`vllm_doctor.pytest_plugin.session`); the answers they assert on are cached there."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import Finding, Report, Severity
from vllm_doctor.pytest_plugin.session import SESSION_KEY, DoctorSession, Outcome, frozen

# each assertion fails on the error-level checks of its topics (vllm_doctor.checks.base.TOPICS):
# the catalogue says which codes those are, so a new check of a topic joins its assertion
WEIGHT_TOPICS = ("weights",)
PLACEMENT_TOPICS = ("start-up", "placement")
KV_TOPICS = ("start-up", "kv-cache")


def assertion_codes(topics: Sequence[str]) -> frozenset[str]:
    """The codes an assertion fails on: the error-level checks of ``topics``."""
    from vllm_doctor.checks import codes_for  # the catalogue, loaded by the run the assertion made

    return frozenset(codes_for(*topics, at_least=Severity.ERROR))


def _skip_without(module: str, why: str) -> None:
    try:
        missing = importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a blocked import (sys.modules[name] = None) or a broken package
        missing = True
    if missing:
        pytest.skip(f"vllm-doctor: {module} is not installed ({why})")


def _cuda_visible() -> bool:
    # without importing torch here: NVIDIA's device nodes, unless hidden by CUDA_VISIBLE_DEVICES
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def _clip(text: str, limit: int = 800) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


def _same_engine_but_length(cached: tuple[Any, ...], wanted: tuple[Any, ...]) -> bool:
    """A cached engine report of the same model and options, whatever its ``max_model_len``."""
    if cached[:2] != wanted[:2]:
        return False
    a, b = json.loads(cached[2]), json.loads(wanted[2])
    a.pop("max_model_len", None)
    b.pop("max_model_len", None)
    return bool(a == b)


def _engine_problems(report: Report, codes: Iterable[str]) -> list[Finding]:
    """An engine assertion's problems: its own codes, and the static findings that kept the engine
    stage from starting (VD305, VD309): a model vLLM cannot start never passes an engine assertion."""
    from vllm_doctor.api import ENGINE_BLOCKING_CODES

    wanted = set(codes) | set(ENGINE_BLOCKING_CODES)
    return [f for f in report.problems(Severity.INFO) if f.code in wanted]


def _finding_lines(found: Sequence[Finding]) -> str:
    return "\n".join(
        f"  {f.code} [{f.severity.value}] {f.subject}: {f.message}" + (f"\n      fix: {f.hint}" if f.hint else "")
        for f in found
    )


class VllmDoctor:
    """The ``vllm_doctor`` fixture: runtime assertions about a model on a real vLLM engine."""

    def __init__(self, session: DoctorSession, test: str) -> None:
        self._session = session
        self._test = test

    # -- helpers --------------------------------------------------------------------------------
    @property
    def session(self) -> DoctorSession:
        return self._session

    def model_dir(self, model: str | os.PathLike[str] | None = None) -> str:
        """The model directory: ``model`` or ``--vllm-doctor-model``; skips when there is none."""
        chosen = str(model) if model is not None else self._session.model
        if not chosen:
            pytest.skip("vllm-doctor: no model given (pass a directory or --vllm-doctor-model DIR)")
        if not os.path.isdir(chosen):
            pytest.skip(f"vllm-doctor: model directory {chosen} does not exist")
        return chosen

    def _needs_engine(self, device: str | None = None) -> None:
        _skip_without("vllm", "the runtime assertions start a real vLLM engine")
        if (device or self._session.device) == "cuda" and not _cuda_visible():
            pytest.skip("vllm-doctor: --vllm-doctor-device cuda, but this machine shows no NVIDIA GPU")

    def _record(self, assertion: str, model: str, ok: bool, summary: str, start: float, **details: Any) -> None:
        self._session.outcomes.append(
            Outcome(self._test, assertion, model, ok, summary, round(time.perf_counter() - start, 3), details)
        )

    def _fail_on_findings(
        self, assertion: str, model: str, found: list[Finding], what: str, start: float, report: Report | None = None
    ) -> None:
        """Fail with every finding; an engine report adds its execution mode and vLLM's failure."""
        engine = {k: report.facts[k] for k in ("engine_mode_text", "engine_failure") if report and report.facts.get(k)}
        if found:
            self._record(
                assertion, model, False, f"{len(found)} finding(s): {', '.join(f.code for f in found)}", start, **engine
            )
            context = "".join(f"\n{text}" for text in engine.values())
            pytest.fail(f"vllm-doctor: {what} ({model}):\n{_finding_lines(found)}{context}", pytrace=False)
        self._record(assertion, model, True, "no finding", start, **engine)

    def engine_report(self, model: str, max_model_len: int | None = None, **kwargs: Any) -> Report:
        """The engine-stage report for (model, options), run once per session. The options are the
        session's (``--vllm-doctor-*``) with this call's keywords on top."""
        from vllm_doctor.api import check_engine

        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        keywords = self._session.engine_keywords(**kwargs)
        self._needs_engine(keywords.get("device"))
        key = ("engine", model, frozen(keywords))
        if keywords.get("max_model_len") is None:  # any engine run on this model answers placement questions
            key = next((k for k in self._session.cache if _same_engine_but_length(k, key)), key)

        def run() -> Report:
            return check_engine(model, **keywords)

        try:
            report: Report = self._session.cached(key, run)
        except RuntimeError as exc:  # the engine stage printed no answer: the doctor's own failure
            pytest.fail(f"vllm-doctor: the engine stage did not answer for {model}: {exc}", pytrace=False)
        return report

    # -- static ---------------------------------------------------------------------------------
    def assert_checks_pass(
        self, model: str | None = None, fail_on: Severity | str | None = None, **kwargs: Any
    ) -> None:
        """Every static check (VD1xx-VD3xx) passes at ``fail_on`` (default ``--vllm-doctor-fail-on``)."""
        start = time.perf_counter()
        path = self.model_dir(model)
        threshold = Severity(fail_on) if fail_on is not None else self._session.fail_on
        try:
            report = self._session.check(path, **kwargs)
        except DoctorInputError as exc:
            pytest.fail(f"vllm-doctor: {exc}", pytrace=False)
        self._fail_on_findings(
            "checks_pass", path, report.problems(threshold), f"{threshold.value}-level findings", start
        )

    def assert_weights_cover(self, model: str | None = None, **kwargs: Any) -> None:
        """Every parameter is filled from the checkpoint and every tensor is used (VD301-VD308)."""
        start = time.perf_counter()
        path = self.model_dir(model)
        report = self._session.check(path, **kwargs)
        found = [f for f in report.problems(Severity.INFO) if f.code in assertion_codes(WEIGHT_TOPICS)]
        self._fail_on_findings(
            "weights_cover", path, found, "the checkpoint and the model's parameters disagree", start
        )

    # -- engine ---------------------------------------------------------------------------------
    def assert_on_device(self, model: str | None = None, **kwargs: Any) -> None:
        """Every parameter and buffer is on its worker's device; workers sit on their own devices."""
        start = time.perf_counter()
        path = self.model_dir(model)
        report = self.engine_report(path, **kwargs)
        found = _engine_problems(report, assertion_codes(PLACEMENT_TOPICS))
        self._fail_on_findings("on_device", path, found, "tensors off their worker's device", start, report)

    def assert_kv_cache_fits(self, model: str | None = None, max_model_len: int | None = None, **kwargs: Any) -> None:
        """The engine starts with ``max_model_len`` and its KV cache holds one full-length request."""
        start = time.perf_counter()
        path = self.model_dir(model)
        report = self.engine_report(path, max_model_len=max_model_len, **kwargs)
        found = _engine_problems(report, assertion_codes(KV_TOPICS))
        self._fail_on_findings(
            "kv_cache_fits", path, found, f"the KV cache does not fit max_model_len={max_model_len}", start, report
        )

    def assert_logprobs_close(
        self,
        model: str | None = None,
        *,
        reference: str = "hf",
        hf_class: str | None = None,
        prompts: Sequence[str | Sequence[int]] | None = None,
        max_tokens: int = 8,
        top_k: int = 5,
        dtype: str = "float32",
        atol: float | None = None,
        hidden_rtol: float | None = None,
        images: int = 0,
        **kwargs: Any,
    ) -> Any:
        """vLLM's greedy tokens AND logprob values match the reference (Hugging Face transformers).

        On failure the message names the first decoder layer whose output differs, with a table
        of max abs/rel error per layer and a fix when the error's shape is recognisable.
        ``images``: for a multimodal model, that many seeded images per prompt, the same pixel
        values in vLLM and in the reference (see :func:`vllm_doctor.compare_with_reference`); the
        message then names the vision tower, the projector or the decoder layer that differs first.
        Returns the :class:`vllm_doctor.ParityResult`.
        """
        from vllm_doctor.api import DEFAULT_PROMPTS, ParityUnavailable, compare_with_reference

        start = time.perf_counter()
        path = self.model_dir(model)
        self._needs_engine()
        _skip_without("transformers", "the Hugging Face reference runs on transformers")
        chosen = tuple(p if isinstance(p, str) else tuple(p) for p in (prompts or DEFAULT_PROMPTS))
        key = (
            "parity", path, reference, hf_class, chosen, max_tokens, top_k, dtype, atol, hidden_rtol, images,
            self._session.device, frozen(kwargs),
        )  # fmt: skip

        def run() -> Any:
            engine = self._session.parity_engine(
                path, dtype=dtype, device=self._session.device, images=images, **kwargs
            )
            return compare_with_reference(
                path,
                engine=engine,
                reference=reference,
                hf_class=hf_class,
                prompts=list(chosen),
                max_tokens=max_tokens,
                top_k=top_k,
                dtype=dtype,
                device=self._session.device,
                atol=atol,
                hidden_rtol=hidden_rtol,
                images=images,
                **kwargs,
            )

        problem = None  # failed outside the except blocks: pytest would print the chained exception too
        try:
            result = self._session.cached(key, run)
        except ParityUnavailable as exc:
            self._record("logprobs_close", path, False, "could not run", start, error=str(exc)[:4000])
            problem = (
                f"vllm-doctor: the parity check could not run: {_clip(str(exc))}\n"
                f"(`vllm-doctor check {path}` diagnoses a model vLLM cannot start; "
                "--vllm-doctor-report FILE keeps the full text)"
            )
        except DoctorInputError as exc:
            problem = f"vllm-doctor: {exc}"
        if problem is not None:
            pytest.fail(problem, pytrace=False)
        self._record("logprobs_close", path, result.ok, result.summary(), start, parity=result.to_dict())
        if not result.ok:
            pytest.fail(result.message(), pytrace=False)
        return result


class DoctorCheck:
    """The ``vllm_doctor_check`` fixture (static checks only): call it, then ``assert_clean``."""

    def __init__(self, session: DoctorSession) -> None:
        self._session = session

    def __call__(self, model: str, **kwargs: Any) -> Report:
        return self._session.check(model, **kwargs)

    def assert_clean(self, report: Report, fail_on: Severity | str | None = None) -> None:
        threshold = Severity(fail_on) if fail_on is not None else self._session.fail_on
        found = report.problems(threshold)
        if found:
            pytest.fail(
                f"vllm-doctor found {len(found)} problem(s) in {report.target}:\n{_finding_lines(found)}", pytrace=False
            )


@pytest.fixture
def vllm_doctor(request: pytest.FixtureRequest) -> VllmDoctor:
    """Runtime assertions on a real vLLM engine; answers are cached for the whole session."""
    return VllmDoctor(request.config.stash[SESSION_KEY], request.node.nodeid)


@pytest.fixture
def vllm_doctor_check(request: pytest.FixtureRequest) -> DoctorCheck:
    """Run vllm-doctor's static checks on a model directory; ``.assert_clean(report)`` fails with every finding."""
    return DoctorCheck(request.config.stash[SESSION_KEY])

"""The pytest plugin's session: one :class:`DoctorSession` per run, kept in ``config.stash``.

It holds the session's options (``--vllm-doctor-*``), the answers already computed (each distinct
(model, options) runs vLLM once per session), every assertion's outcome (the terminal summary and
the JSON report) and the parity engines, shut down with the session.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from vllm_doctor.model import Report, Severity
from vllm_doctor.stages.options import EngineOptions, option_names


@dataclass
class Outcome:
    """One assertion's result, for the terminal summary and the JSON report."""

    test: str
    assertion: str
    model: str
    ok: bool
    summary: str
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class DoctorSession:
    """The session's state (``config.stash``): options, cached answers, outcomes."""

    fail_on: Severity = Severity.ERROR
    fast: bool = False
    model: str | None = None
    report_path: str | None = None
    # the engine options of the session (--vllm-doctor-device, --vllm-doctor-eager, ...): every engine
    # assertion runs with them, a keyword of the assertion overrides one
    engine: EngineOptions = field(default_factory=EngineOptions)
    cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    runs: dict[str, int] = field(default_factory=dict)  # kind -> fresh runs (cache misses), engines started
    engines: dict[str, Any] = field(default_factory=dict)  # parity engines by (model, engine options)

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def eager(self) -> bool:
        return self.engine.eager

    @property
    def engine_runs(self) -> int:
        """vLLM engines started: one per engine-stage run, one per parity engine."""
        return self.runs.get("engine", 0) + self.runs.get("parity_engine", 0)

    def engine_keywords(self, **overrides: Any) -> dict[str, Any]:
        """The session's engine options as ``check_engine`` keywords, with an assertion's own on top."""
        return {**{name: getattr(self.engine, name) for name in option_names()}, **overrides}

    def cached(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.runs[key[0]] = self.runs.get(key[0], 0) + 1
            self.cache[key] = compute()
        return self.cache[key]

    def parity_engine(self, model: str, **options: Any) -> Any:
        """The session's vLLM engine for parity checks with these engine options (started once)."""
        from vllm_doctor.api import parity_engine_key, start_parity_engine

        key = parity_engine_key(model, **options)
        engine = self.engines.get(key)
        if engine is None or engine.closed:
            self.runs["parity_engine"] = self.runs.get("parity_engine", 0) + 1
            engine = self.engines[key] = start_parity_engine(model, **options)
        return engine

    def close(self) -> None:
        """Shut down every engine the session started."""
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()

    def check(
        self,
        model: str,
        *,
        trust_remote_code: bool | None = None,
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
    ) -> Report:
        from vllm_doctor.api import check

        trust = self.engine.trust_remote_code if trust_remote_code is None else trust_remote_code
        select, ignore = tuple(sorted(select)), tuple(sorted(ignore))
        # the session's parallel sizes govern the static checks too (VD305), as on the command line
        tp, pp = self.engine.tensor_parallel_size, self.engine.pipeline_parallel_size
        ep = self.engine.enable_expert_parallel
        key = ("check", str(model), trust, select, ignore, self.fast, tp, pp, ep)
        return self.cached(
            key,
            lambda: check(
                str(model),
                trust_remote_code=trust,
                fast=self.fast,
                select=select,
                ignore=ignore,
                tensor_parallel_size=tp,
                pipeline_parallel_size=pp,
                enable_expert_parallel=ep,
            ),
        )

    def options_record(self) -> dict[str, Any]:
        """The session's options, for the JSON report."""
        return {
            "model": self.model,
            "device": self.device,
            "fail_on": self.fail_on.value,
            "eager": self.eager,
            "engine": json.loads(frozen(self.engine_keywords())),
        }


SESSION_KEY = pytest.StashKey[DoctorSession]()


def frozen(options: dict[str, Any]) -> str:
    """An assertion's keyword options as a cache key: ``engine_args={...}`` holds a dict."""
    return json.dumps(options, sort_keys=True, default=str)

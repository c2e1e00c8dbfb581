"""The snapshot every engine-stage check reads: what each worker replied, and its records.

Built by :mod:`vllm_doctor.live.attach` from the extension's ``doctor_*`` replies (or from a failed
engine start, for VD501/VD208). Each worker's replies are kept as they came (``parts``: the JSON
round trip of :func:`facts_to_dict` / :func:`facts_from_dict` is lossless) and read ONCE into the
records of :mod:`vllm_doctor.facts.anatomy`, :mod:`~vllm_doctor.facts.placement`,
:mod:`~vllm_doctor.facts.kv` and :mod:`~vllm_doctor.facts.memory` (the profile into its
:class:`StepTable`), which the checks and the summaries read by attribute. No vLLM or torch
object in here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from vllm_doctor.facts import wire
from vllm_doctor.facts.anatomy import Anatomy
from vllm_doctor.facts.kv import KvCache
from vllm_doctor.facts.memory import MemoryFacts
from vllm_doctor.facts.perf import PerfAnatomy
from vllm_doctor.facts.placement import Placement
from vllm_doctor.facts.probe import ProfileProbe
from vllm_doctor.facts.quant import QuantFacts
from vllm_doctor.facts.steps import StepTable

PARTS = ("anatomy", "placement", "kv", "memory", "perf", "quant", "profile")
R = TypeVar("R")

# the parts read into a record (the profile is read into its StepTable by WorkerFacts.steps)
DECODERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "anatomy": Anatomy.of,
    "placement": Placement.of,
    "kv": KvCache.of,
    "memory": MemoryFacts.of,
    "perf": PerfAnatomy.of,
    "quant": QuantFacts.of,
}


@dataclass(frozen=True)
class RpcReply:
    """One worker's envelope for an extension RPC (:mod:`vllm_doctor.engine.extension`): ``ok``
    with the method's ``data``, or not with ``error`` (``{type, message, traceback}``). ``data``
    and ``error`` are the very dicts the worker sent (a part is kept as it came)."""

    ok: bool = False
    method: str | None = None
    rank: int | None = None
    pid: int | None = None
    data: dict | None = None  # type: ignore[type-arg]  # bare: kept as sent, not copied
    error: dict | None = None  # type: ignore[type-arg]


@dataclass
class WorkerFacts:
    rank: int | None
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)  # part -> the reply's data, as sent
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)  # part -> {type, message, traceback}

    # part -> (the reply it was read from, its record): read once per reply
    _records: dict[str, tuple[dict[str, Any], Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    # (the profile reply it was read from, its step table): read once per reply
    _steps: tuple[dict[str, Any], StepTable] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for part, data in self.parts.items():
            self._decode(part, data)

    def put(self, part: str, data: dict[str, Any]) -> None:
        """A worker's reply for ``part``: kept as it came, and read into its record now."""
        self.parts[part] = data
        self._decode(part, data)

    def carry(self, part: str, other: WorkerFacts) -> None:
        """``other``'s reply for ``part`` and its record (an earlier snapshot's, not asked again)."""
        data = other.parts[part]
        self.parts[part] = data
        cached = other._records.get(part)
        if cached is not None and cached[0] is data:
            self._records[part] = cached
        else:
            self._decode(part, data)

    def get(self, part: str) -> dict[str, Any] | None:
        """The reply for ``part`` as the worker sent it (the raw dict)."""
        return self.parts.get(part)

    def _decode(self, part: str, data: dict[str, Any]) -> Any:
        decode = DECODERS.get(part)
        if decode is None:
            return None
        record = decode(data)
        self._records[part] = (data, record)
        return record

    def _record(self, part: str, kind: type[R]) -> R | None:
        data = self.parts.get(part)
        if data is None:
            return None
        cached = self._records.get(part)
        # a reply put into ``parts`` directly (not through put) is read here, once
        record = cached[1] if cached is not None and cached[0] is data else self._decode(part, data)
        return record if isinstance(record, kind) else None

    @property
    def anatomy(self) -> Anatomy | None:
        """``doctor_anatomy``'s record; None when the worker did not answer it."""
        return self._record("anatomy", Anatomy)

    @property
    def placement(self) -> Placement | None:
        """``doctor_placement``'s record; None when the worker did not answer it."""
        return self._record("placement", Placement)

    @property
    def kv(self) -> KvCache | None:
        """``doctor_kv``'s record; None when the worker did not answer it."""
        return self._record("kv", KvCache)

    @property
    def memory(self) -> MemoryFacts | None:
        """``doctor_memory``'s record; None when the worker did not answer it."""
        return self._record("memory", MemoryFacts)

    @property
    def quant(self) -> QuantFacts | None:
        """``doctor_quant``'s record (each module's quantization method); None when the worker did not
        answer it (a doctor without the method, or an engine that did not start)."""
        return self._record("quant", QuantFacts)

    @property
    def perf(self) -> PerfAnatomy | None:
        """``doctor_perf``'s record (the performance lint's view of the model), with the op probe's
        per-class op counts of its decode step (else its first probed step) when the probe ran."""
        record = self._record("perf", PerfAnatomy)
        if record is None:
            return None
        counts = wire.read(ProfileProbe, self.parts.get("profile")).probe.op_counts
        if counts:
            phase = "decode" if "decode" in counts else next(iter(counts))
            return record.with_op_counts(counts[phase], phase)
        return record

    def steps(self) -> StepTable:
        """The profile's step records (:class:`StepTable`), read once per profile reply."""
        profile = self.parts.get("profile") or {}
        if self._steps is None or self._steps[0] is not profile:
            self._steps = (profile, StepTable.of(profile))
        return self._steps[1]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "parts": self.parts, "errors": self.errors}


@dataclass(frozen=True)
class ExecutionMode(wire.Record):
    """How the engine ran the model (``report.facts["engine_mode"]``): what was asked for and
    what vLLM's config says it did (compat/llm.py:execution_mode); written as sent (only the
    keys known: an engine that failed before its config was read has no compilation mode)."""

    WIRE_SPARSE: ClassVar[bool] = True

    requested: str | None = None  # "vllm-default" | "eager": what the doctor asked vLLM for
    enforce_eager: bool | None = None
    compilation_mode: str | None = None  # vLLM's CompilationMode name
    cudagraph_mode: str | None = None  # vLLM's CUDAGraphMode name
    summary: str | None = None  # the line the front ends print
    torch_compile: Any = None  # an engine that failed to start: was torch.compile compiling then

    @property
    def known(self) -> bool:
        """Anything known of the mode (a served engine that was attached to says nothing of it)."""
        return self != ExecutionMode()


@dataclass
class EngineFacts:
    front_end: dict[str, Any] = field(default_factory=dict)
    workers: list[WorkerFacts] = field(default_factory=list)
    startup_error: str | None = None  # vLLM's message when the engine did not start
    runtime_error: str | None = None  # the engine started, then the workload failed
    nvml: dict[str, Any] | None = None  # from the doctor's own process (compat/nvml.py)
    model_dir: str | None = None
    mode: ExecutionMode = field(default_factory=ExecutionMode)  # how the engine ran
    startup_phase: str | None = None  # where vLLM failed: "load", "profile run", "graph capture", ...
    startup_function: str | None = None  # the vLLM function that names the phase, with file:line
    # after a failure outside eager mode: the same model re-run eagerly with the op probe
    diagnosis: EngineFacts | None = field(default=None, metadata=wire.rules(empty_none=True))
    # each parameter's shape when built at tensor-parallel size 1 (the weights pass, `check --engine`)
    reference_shapes: dict[str, list[int]] | None = None
    # vLLM said its architectures "failed to be inspected": each class that fails to import, as
    # the import pass records it ({"architecture", "target", "import_error", "import_error_summary",
    # "module_file"}: compat/runtime.uninspectable_classes)
    class_import_errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def perf(self) -> PerfAnatomy | None:
        """The first worker's module tree for the performance lint (every rank builds the same classes)."""
        return next((w.perf for w in self.workers if w.perf is not None), None)

    def errors_for(self, part: str) -> list[tuple[WorkerFacts, dict[str, Any]]]:
        return [(w, w.errors[part]) for w in self.workers if part in w.errors]

    @property
    def started(self) -> bool:
        return self.startup_error is None and bool(self.workers)

    @property
    def mode_summary(self) -> str:
        """What ran: vLLM's own summary of the mode, else what was asked for."""
        return str(self.mode.summary or self.mode.requested or "unknown")

    def mode_text(self) -> str:
        """``execution mode: ...``: what ran, and the eager re-run after a failure if there was one."""
        text = f"execution mode: {self.mode_summary}"
        if self.mode.requested == "vllm-default":
            text += " (vLLM's default; --eager forces eager)"
        if self.diagnosis is not None:
            d = self.diagnosis
            text += "; re-run eagerly to find the cause: " + (
                "it ran" if d.started and not d.runtime_error else "it failed too"
            )
        return text

    def failure_text(self) -> str:
        """What vLLM said when it could not start the model or run the workload; "" when it ran."""
        if self.startup_error:
            text = (
                f"the engine did not start (failed in {self.startup_phase or 'start-up'}; mode: {self.mode_summary}):"
                f"\n  {(self.startup_error.splitlines() or [''])[0][:400]}"
            )
            for record in self.class_import_errors[:3]:
                text += f"\n  cause: {class_import_text(record)}"
            return text
        if self.runtime_error:
            first = (self.runtime_error.splitlines() or [""])[0][:400]
            return f"the engine started, then the workload failed (mode: {self.mode_summary}):\n  {first}"
        return ""


# frames of an import's traceback that are not the model author's code
_NOT_THE_AUTHORS = ("/vllm/", "/torch/", "/transformers/", "/vllm_doctor/", "/importlib/")


def class_import_text(record: dict[str, Any]) -> str:
    """``<target> cannot be imported: <Type: message> (at <file>:<line>)`` for a record of
    :attr:`EngineFacts.class_import_errors`: the line is the deepest frame of the traceback in the
    class's own module, else in any file outside vLLM, torch and the standard library."""
    text = f"{record.get('target')} cannot be imported: {record.get('import_error_summary') or 'an error'}"
    line = import_error_line(str(record.get("import_error") or ""), record.get("module_file"))
    return f"{text} (at {line})" if line else text


def import_error_line(traceback_text: str, module_file: str | None) -> str | None:
    """``file:line`` of the frame of a formatted traceback where the import failed: the deepest in
    ``module_file``, else the deepest frame that is not a library's (the author's own code)."""
    frames = re.findall(r'^\s*File "([^"]+)", line (\d+)', traceback_text, flags=re.M)
    own = [f for f in frames if module_file and f[0] == module_file] or [
        f for f in frames if not f[0].startswith("<") and not any(part in f[0] for part in _NOT_THE_AUTHORS)
    ]
    return f"{own[-1][0]}:{own[-1][1]}" if own else None


def facts_to_dict(facts: EngineFacts) -> dict[str, Any]:
    return {
        "front_end": facts.front_end,
        "workers": [w.to_dict() for w in facts.workers],
        "startup_error": facts.startup_error,
        "runtime_error": facts.runtime_error,
        "nvml": facts.nvml,
        "model_dir": facts.model_dir,
        "mode": wire.write(facts.mode),
        "startup_phase": facts.startup_phase,
        "startup_function": facts.startup_function,
        "diagnosis": facts_to_dict(facts.diagnosis) if facts.diagnosis is not None else None,
        "reference_shapes": facts.reference_shapes,
        "class_import_errors": facts.class_import_errors,
    }


def facts_from_dict(data: dict[str, Any]) -> EngineFacts:
    """:func:`facts_to_dict`'s dict (report.json's engine facts) read back, leniently."""
    return wire.read(EngineFacts, data)

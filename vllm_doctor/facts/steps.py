"""A worker's step records as columns, and the per-step dicts the reports show.

The workers send their step records as one packed array per field (``doctor_collect``'s
``step_arrays``, fields :data:`~vllm_doctor.constants.STEP_COLUMNS`, types
:data:`~vllm_doctor.constants.STEP_COLUMN_TYPES`): a served engine runs thousands of steps
between two of ``top``'s windows, and a dict per step cost the engine the time to build it and
the API server and every reader the time to write and parse each number. :class:`StepTable` reads that
reply (or the per-step dicts of an older doctor), answers the summaries column by column, and
builds the per-step dicts (:meth:`StepTable.rows`) only for a report that shows them.
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.constants import STEP_COLUMN_TYPES, STEP_COLUMNS, STEP_COUNT_FIELDS
from vllm_doctor.facts import wire

ARRAY_CODES = frozenset("dqib")
# the per-step dict's fields taken from the columns as they are
ROW_FIELDS = (
    "forward_s",
    "logits_s",
    "host_execute_s",
    "host_sample_s",
    "sampled",
    "layers_timed",
    "layers_detail",
    "idle_before_s",
    "encoder_s",
)


# a field a reply may lack: counts are 0; without ``sampled`` / ``layers_timed`` (the oldest
# records) every step was timed; without ``layers_detail`` (a doctor from before eager mode's two
# grains) every step timed per layer was timed inside its layers too; without ``device_timed`` (a
# doctor from before the sampled step clock) every step was on the profile's clock
DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(STEP_COUNT_FIELDS, 0),
    "device_timed": True,
    "sampled": True,
    "layers_timed": True,
    "layers_detail": True,
}


@dataclass(frozen=True)
class StepArrays:
    """``step_arrays``: one packed array per field (``[array type code, base64 bytes]``)."""

    n: int = 0  # steps
    byteorder: str = sys.byteorder  # the worker's
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileSteps:
    """The parts of a ``doctor_collect`` reply that hold its steps."""

    clock: str | None = None  # what timed the steps ("cuda-events", "host", ...)
    t0: float = 0.0  # the first step's host time (each row's ``t`` counts from it)
    step_arrays: StepArrays | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)  # an older doctor's per-step dicts


@dataclass(frozen=True)
class _StepRow:
    """The fields of an older doctor's per-step dict that the table reads by name."""

    t: float | None = None
    step_clock: str | None = None  # "host": not on the profile's clock (a dict without it: on it)
    phase: str | None = None


class StepTable:
    """One worker's step records, a list per field (all the same length)."""

    __slots__ = ("_phases", "_rows", "clock", "columns", "error", "t0")

    def __init__(self, columns: dict[str, list[Any]], clock: str | None = None, t0: float = 0.0) -> None:
        self.columns = columns
        self.clock = clock
        self.t0 = t0
        self.error: str | None = None  # why a reply's steps could not be read (the table is empty then)
        self._phases: list[str] | None = None
        self._rows: list[dict[str, Any]] | None = None

    @classmethod
    def of(cls, profile: dict[str, Any] | None) -> StepTable:
        """From a ``doctor_collect`` reply: its ``step_arrays``, else its per-step dicts. Arrays
        that do not decode to one value per step give an empty table that says why (``error``)."""
        reply = wire.read(ProfileSteps, profile)
        clock = reply.clock
        if reply.step_arrays is not None:
            try:
                return cls(_unpack(reply.step_arrays), clock, float(reply.t0))
            except (ValueError, TypeError) as exc:
                empty = cls(_unpack(StepArrays()), clock)
                empty.error = f"the worker's step records could not be read: {exc}"
                return empty
        rows = reply.steps
        named = [wire.read(_StepRow, s) for s in rows]
        cols = {name: [s.get(name) for s in rows] for name in STEP_COLUMNS}
        cols["host_start"] = [s.t for s in named]
        cols["device_timed"] = [s.step_clock != "host" for s in named]
        table = cls(_defaults(cols), clock, 0.0)
        table._rows = rows
        computed = table.phases
        table._phases = [s.phase or p for s, p in zip(named, computed, strict=True)]
        return table

    def __len__(self) -> int:
        return len(self.columns["index"])

    def __getitem__(self, name: str) -> list[Any]:
        return self.columns[name]

    @property
    def phases(self) -> list[str]:
        """Each step's phase: prefill, decode or mixed (both in one step)."""
        if self._phases is None:
            self._phases = [
                ("mixed" if d else "prefill") if p else "decode"
                for p, d in zip(self.columns["prefill_tokens"], self.columns["decode_tokens"], strict=True)
            ]
        return self._phases

    def rows(self) -> list[dict[str, Any]]:
        """The steps as the reports show them (profiles.engine.steps), built once."""
        if self._rows is None:
            c, t0, clock = self.columns, self.t0, self.clock
            counts = [c[name] for name in STEP_COUNT_FIELDS]
            rows = []
            for i, phase in enumerate(self.phases):
                start = c["host_start"][i]
                t = None if start is None else round(start - t0, 6)
                row: dict[str, Any] = {"index": c["index"][i], "t": t, "phase": phase}
                for name, col in zip(STEP_COUNT_FIELDS, counts, strict=True):
                    row[name] = col[i]
                row["num_reqs"] = row["prefill_reqs"] + row["decode_reqs"]
                row["step_s"] = c["step_s"][i]
                row["step_clock"] = clock if c["device_timed"][i] else "host"
                for name in ROW_FIELDS:
                    row[name] = c[name][i]
                rows.append(row)
            self._rows = rows
        return self._rows


def unpack(packed: dict[str, Any]) -> dict[str, list[Any]]:
    """``step_arrays`` (vllm_doctor.engine.profiler) to one list per field of :data:`STEP_COLUMNS`.

    A field the reply leaves out (top's windows send :data:`STEP_SUMMARY_COLUMNS`) takes its
    :data:`DEFAULTS` value or None; a field this doctor does not know is ignored."""
    return _unpack(wire.read(StepArrays, packed))


def _unpack(packed: StepArrays) -> dict[str, list[Any]]:
    n = packed.n
    swap = packed.byteorder != sys.byteorder
    cols: dict[str, list[Any]] = {}
    for name, item in packed.columns.items():
        if name not in STEP_COLUMN_TYPES:
            continue
        code, data = item if isinstance(item, list) and len(item) == 2 else (None, None)
        if code not in ARRAY_CODES or not isinstance(data, str):
            raise ValueError(f"step_arrays.{name}: not [array type, base64 bytes] ({str(item)[:40]!r})")
        values = array(code)
        try:
            values.frombytes(base64.b64decode(data, validate=True))
        except (binascii.Error, TypeError, ValueError) as exc:
            raise ValueError(f"step_arrays.{name}: not base64 array bytes ({exc})") from None
        if len(values) != n:
            raise ValueError(f"step_arrays.{name}: {len(values)} values for {n} steps")
        if swap:
            values.byteswap()
        out: list[Any] = values.tolist()
        if code == "b":
            out = list(map(bool, out))
        elif code == "d" and any(map(math.isnan, out)):
            out = [None if v != v else v for v in out]
        cols[name] = out
    for name in STEP_COLUMNS:
        if name not in cols:
            cols[name] = [DEFAULTS.get(name)] * n
    return cols


def _defaults(cols: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A field absent from a per-step dict takes its :data:`DEFAULTS` value."""
    for name, default in DEFAULTS.items():
        cols[name] = [default if v is None else v for v in cols[name]]
    return cols

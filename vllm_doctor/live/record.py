"""Recordings of ``top``: every refresh as one gzip JSONL line; replay drives the same app.

Line 1 is a header ``{"format": "vllm-doctor-top", "version": 1, "url", "interval_s", ...}``;
every other line is one refresh: the raw ``/metrics`` text (or the scrape's error), the derived
numbers, the devices and the model panel's data. Each line is flushed with a gzip sync point,
so a killed ``top`` leaves a file that reads up to its last refresh. Replay re-derives from the
raw scrapes through the same :class:`~vllm_doctor.live.derive.Deriver` that ``top`` uses.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts import wire
from vllm_doctor.live.derive import HISTORY_LEN, Deriver
from vllm_doctor.live.devices import DevicesFrame
from vllm_doctor.live.sources import Frame, ModelSummary

FORMAT = "vllm-doctor-top"
VERSION = 1


@dataclass(frozen=True)
class RecordingHeader:
    """A recording's first line: what was recorded, and how often."""

    format: str = ""  # FORMAT
    version: int = 0
    url: str = "?"
    interval_s: float | None = None  # seconds between two refreshes
    window_s: float | None = None  # the latency window top ran with
    started: float | None = None  # seconds since the epoch


@dataclass(frozen=True)
class RecordedRefresh:
    """One refresh of a recording (:meth:`Recorder.write`)."""

    seq: int | None = None
    t: float = 0.0
    sent: float | None = None  # when the scrape's request went out (None: a recording from before)
    interval_s: float | None = None
    raw: str | None = None  # the /metrics text as scraped
    error: str | None = None  # why the scrape failed
    devices: DevicesFrame | None = None  # read from its JSON
    model: ModelSummary | None = None  # the model panel's data, read from its JSON


class Recorder:
    """Appends frames to ``path`` (gzip JSONL), flushed after every line: the edge where a
    frame's records (the devices, the model panel's summary) become their JSON."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        try:
            self._raw: IO[bytes] = open(self.path, "wb")  # closed in close()
        except OSError as exc:
            raise DoctorInputError(f"cannot write the recording {self.path}: {exc.strerror or exc}") from None
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6)
        self.frames = 0
        self._write({"format": FORMAT, "version": VERSION, **header})

    def _write(self, record: dict[str, Any]) -> None:
        self._gz.write(json.dumps(record, separators=(",", ":"), default=str).encode() + b"\n")
        self._gz.flush(zlib.Z_SYNC_FLUSH)
        self._raw.flush()

    def write(self, frame: Frame) -> None:
        self._write(
            {
                "seq": frame.seq,
                "t": frame.t,
                "sent": frame.sent,
                "interval_s": frame.interval_s,
                "raw": frame.raw,
                "error": frame.metrics.error,
                "derived": frame.metrics.to_json(),
                "devices": frame.devices.to_json() if frame.devices is not None else None,
                "model": frame.model.to_json() if frame.model is not None else None,
            }
        )
        self.frames += 1

    def close(self) -> None:
        try:
            self._gz.close()
        finally:
            self._raw.close()


def read_recording(path: str | os.PathLike[str]) -> tuple[RecordingHeader, list[RecordedRefresh], int]:
    """(header, refreshes, unreadable lines). A file cut short reads up to its last whole line."""
    p = Path(path)
    if not p.is_file():
        raise DoctorInputError(f"no such recording: {p}", "record one with: vllm-doctor top --url URL --record FILE")
    lines: list[bytes] = []
    try:
        with gzip.open(p, "rb") as fh:
            while True:
                try:
                    line = fh.readline()
                except (EOFError, zlib.error):
                    break  # cut short (a killed top): keep what was flushed
                if not line:
                    break
                lines.append(line)
    except (OSError, gzip.BadGzipFile) as exc:
        if not lines:
            raise DoctorInputError(f"{p} is not a vllm-doctor recording (gzip JSONL): {exc}") from None
    bad = 0
    records: list[dict[str, Any]] = []
    for line in lines:
        if not line.endswith(b"\n"):
            bad += 1  # the last line of a cut file
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(rec, dict):
            records.append(rec)
        else:
            bad += 1
    header = wire.read(RecordingHeader, records[0] if records else {})
    if header.format != FORMAT:
        raise DoctorInputError(f"{p} is not a vllm-doctor recording (its first line is not a {FORMAT} header)")
    if header.version > VERSION:
        raise DoctorInputError(f"{p} is a version {header.version} recording; this doctor reads {VERSION}")
    return header, [wire.read(RecordedRefresh, r) for r in records[1:]], bad


class ReplaySource:
    """A recording as a :class:`~vllm_doctor.live.sources.Source`; seekable, with a speed."""

    def __init__(self, path: str | os.PathLike[str], speed: float = 1.0, window_s: float | None = None) -> None:
        self.path = Path(path)
        self.header, self.records, self.unreadable = read_recording(path)
        if not self.records:
            raise DoctorInputError(f"{self.path} holds no refreshes (the recording was stopped before the first one)")
        self.url = self.header.url
        self.recorded_interval_s = float(self.header.interval_s or 1.0)
        self.speed = speed
        self._window = float(window_s or self.header.window_s or 60.0)
        self.index = 0
        self.deriver = Deriver(window_s=self._window)
        self._derived_upto = -1
        self._last: Frame | None = None

    @property
    def interval_s(self) -> float:
        """Wall seconds between two refreshes at the current speed."""
        return self.recorded_interval_s / max(self.speed, 1e-3)

    @property
    def window_s(self) -> float:
        return self._window

    @window_s.setter
    def window_s(self, value: float) -> None:
        self._window = value
        self._rederive(self.index)

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.records)

    def _rederive(self, upto: int) -> None:
        self.deriver = Deriver(window_s=self._window)
        # the latency window needs older scrapes than the history does
        keep = max(HISTORY_LEN, int(self._window / max(self.recorded_interval_s, 0.05)) + 2)
        self._derived_upto = max(-1, upto - 1 - keep)
        for i in range(self._derived_upto + 1, upto):
            self._frame(i)

    def seek(self, index: int) -> None:
        """Go to refresh ``index`` (clamped); the next :meth:`poll` shows it."""
        index = max(0, min(len(self.records) - 1, index))
        self._rederive(index)
        self.index = index

    def _frame(self, i: int) -> Frame:
        rec = self.records[i]
        metrics = self.deriver.update(float(rec.t), rec.raw, rec.error or "", sent=rec.sent)
        self._derived_upto = i
        return Frame(
            seq=rec.seq if rec.seq is not None else i + 1,
            t=float(rec.t),
            url=self.url,
            interval_s=float(rec.interval_s or self.recorded_interval_s),
            metrics=metrics,
            devices=rec.devices,
            model=rec.model,
            raw=rec.raw,
            replay={"index": i, "count": len(self.records), "speed": self.speed},
            sent=rec.sent,
        )

    def poll(self) -> Frame:
        """The refresh at the current position, then advance (stays on the last one at the end)."""
        if self.at_end and self._last is not None:
            return self._last
        i = min(self.index, len(self.records) - 1)
        if self._derived_upto != i - 1:
            self._rederive(i)
        self._last = self._frame(i)
        self.index = i + 1
        return self._last

    def close(self) -> None:
        pass

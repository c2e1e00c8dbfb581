"""Timers for the forward profiler: wall clock on CPU, CUDA events on GPU.

A *mark* is a point in time: a ``perf_counter`` float on CPU, a recorded ``torch.cuda.Event``
on GPU. CUDA marks are read back lazily (``ready`` polls without blocking; ``wait`` blocks once
per collection), so the forward never pays a host sync for the profiler.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class WallClock:
    """``perf_counter``: on CPU the host is the device, so the wall clock times the work itself."""

    kind = "wall_clock"
    domain = "host"  # the clock's domain: the host's wall clock (on CPU that is the device's time)

    def mark(self, refresh: bool = False) -> Any:
        return time.perf_counter()

    def reserve(self, count: int) -> None:
        """Nothing to create ahead: a mark is a float."""

    @staticmethod
    def capturing() -> bool:
        return False

    def ready(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        return None

    def seconds(self, start: Any, end: Any) -> float:
        return float(end - start)


MAX_FREE_EVENTS = 4096  # events kept for reuse
# the current CUDA stream's raw handle on a device (torch's own C++ binding, which Inductor's
# generated code calls per kernel launch); without it every refresh builds the Stream object
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class CudaEventClock:
    """CUDA events recorded on the current stream; elapsed time read after the fact."""

    kind = "cuda_events"
    domain = "device"
    # A step's bounds are events on the stream that is current when ``execute_model`` is entered
    # and when ``sample_tokens`` returns (vLLM's own StepTimingCollector records its pair on the
    # stream the forward runs on, the same one): under async scheduling the host runs ahead, the
    # events still bracket the step's work on the device.

    def __init__(self) -> None:
        self._free: list[Any] = []
        self._stream: Any = None
        self._raw: int | None = None  # the current stream's handle when ``_stream`` was looked up
        # every mark so far went to one stream, so they complete in the order recorded (the
        # profiler then asks only whether the newest has completed)
        self.one_stream = True

    def mark(self, refresh: bool = False) -> Any:
        """Record an event on the current stream.

        The stream is looked up when ``refresh`` is set (the profiler does so where each step,
        the model's forward and the logits processor begin) and reused for the marks inside:
        asking torch for the current stream (a ``Stream`` object built in Python) costs about
        as much as recording the event. A refresh asks first for the stream's raw handle, one
        call into torch's C++, and builds the object only when the stream changed.
        """
        if refresh or self._stream is None:
            raw = None
            if _RAW_STREAM is not None and self._stream is not None:
                raw = _RAW_STREAM(self._stream.device_index)
            if raw is None or raw != self._raw:
                stream = torch.cuda.current_stream()
                if self._stream is not None and stream != self._stream:
                    self.one_stream = False
                self._stream = stream
                self._raw = _RAW_STREAM(stream.device_index) if _RAW_STREAM is not None else None
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    @staticmethod
    def capturing() -> bool:
        """Is the current stream being captured into a CUDA graph? (An ordinary event recorded
        then would be an error or a node of vLLM's graph.)"""
        return bool(torch.cuda.is_current_stream_capturing())

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0

    def release(self, *marks: Any) -> None:
        """Give resolved events back for reuse (creating events is not free)."""
        if len(self._free) < MAX_FREE_EVENTS:
            self._free.extend(m for m in marks if m is not None)

    def reserve(self, count: int) -> None:
        """Create ``count`` events ahead, outside any step. torch creates a CUDA event when it is
        first recorded: a timed step that found the free list empty paid that creation for each
        of its marks, on the host that launches an eager step's kernels. Each is recorded once
        here on the current stream (a timestamp, nothing else) and waited for once."""
        count = min(count, MAX_FREE_EVENTS) - len(self._free)
        if count <= 0 or self.capturing():
            return
        made = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        stream = torch.cuda.current_stream()
        for event in made:
            event.record(stream)
        made[-1].synchronize()
        self._free.extend(made)


def clock_for(device: torch.device) -> WallClock | CudaEventClock:
    if device.type == "cuda" and torch.cuda.is_available():
        return CudaEventClock()
    return WallClock()

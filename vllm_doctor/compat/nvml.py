"""The ONE gateway to NVML (nvidia-ml-py). Every call returns data or an "unavailable" reason.

Called from the doctor's own process, never inside a worker (in-process NVML polling can
disturb CUDA-graph capture). Nothing here raises: no driver, no GPU, an old driver without a
function, a permission error all become ``{"available": False, "reason": ...}``.
"""

from __future__ import annotations

from typing import Any


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return _Unavailable(f"{getattr(fn, '__name__', 'nvml')}: {type(exc).__name__}: {exc}")


class _Unavailable:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def snapshot(pids: list[int] | None = None) -> dict[str, Any]:
    """Devices, their memory, and per-process memory (for ``pids`` if given, else all)."""
    try:
        import pynvml
    except Exception as exc:
        return {"available": False, "reason": f"nvidia-ml-py not importable: {exc}"}
    init = _call(pynvml.nvmlInit)
    if isinstance(init, _Unavailable):
        return {"available": False, "reason": init.reason}
    try:
        count = _call(pynvml.nvmlDeviceGetCount)
        if isinstance(count, _Unavailable):
            return {"available": False, "reason": count.reason}
        devices = []
        for i in range(count):
            handle = _call(pynvml.nvmlDeviceGetHandleByIndex, i)
            if isinstance(handle, _Unavailable):
                devices.append({"index": i, "error": handle.reason})
                continue
            dev: dict[str, Any] = {"index": i}
            for key, fn in (("name", pynvml.nvmlDeviceGetName), ("uuid", pynvml.nvmlDeviceGetUUID)):
                value = _call(fn, handle)
                dev[key] = None if isinstance(value, _Unavailable) else _text(value)
            mem = _call(pynvml.nvmlDeviceGetMemoryInfo, handle)
            if not isinstance(mem, _Unavailable):
                dev.update(memory_total=int(mem.total), memory_used=int(mem.used), memory_free=int(mem.free))
            procs = _call(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
            if isinstance(procs, _Unavailable):
                dev["processes_error"] = procs.reason
            else:
                dev["processes"] = [
                    {"pid": int(p.pid), "used_memory": int(p.usedGpuMemory) if p.usedGpuMemory is not None else None}
                    for p in procs
                    if pids is None or int(p.pid) in pids
                ]
            devices.append(dev)
        driver = _call(pynvml.nvmlSystemGetDriverVersion)
        return {
            "available": True,
            "driver": None if isinstance(driver, _Unavailable) else _text(driver),
            "devices": devices,
        }
    finally:
        _call(pynvml.nvmlShutdown)

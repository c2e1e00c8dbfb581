"""The ONE gateway to NVML (nvidia-ml-py). Every call returns data or an "unavailable" reason.

Called from the doctor's own process, never inside a worker (in-process NVML polling can
disturb CUDA-graph capture). Nothing here raises: no driver, no GPU, an old driver without a
function, a permission error all become ``{"available": False, "reason": ...}`` or, for one
reading, ``None`` with its reason in ``unavailable``.

Two ways in: ``snapshot()`` (init, read memory and processes, shut down: one-off reports) and
``NvmlSession`` (init ONCE, read every device on each ``read_device`` call, ``close()`` shuts
down: the live sampler). Both read through ``NvmlSession.read_device``.
"""

from __future__ import annotations

from typing import Any

# pynvml's error classes -> what the user should know (the exception text stays after a colon)
_ERROR_MEANINGS = {
    "NVMLError_LibraryNotFound": "no libnvidia-ml.so.1 on this host (no NVIDIA driver installed)",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NoPermission": "no permission to use NVML (/dev/nvidia* not accessible)",
    "NVMLError_FunctionNotFound": "this driver's NVML lacks the function",
    "NVMLError_NotSupported": "not supported on this device or driver",
}
# errors after which a reading is never retried on that device (an old driver stays old)
_PERMANENT = ("NVMLError_FunctionNotFound", "NVMLError_NotSupported", "AttributeError")
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long readings


class _Unavailable:
    def __init__(self, reason: str, permanent: bool = False) -> None:
        self.reason = reason
        self.permanent = permanent


def _describe(where: str, exc: BaseException) -> str:
    kind = type(exc).__name__
    meaning = _ERROR_MEANINGS.get(kind)
    return f"{where}: {meaning} ({exc})" if meaning else f"{where}: {kind}: {exc}"


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        name = getattr(fn, "__name__", "nvml")
        return _Unavailable(_describe(name, exc), permanent=type(exc).__name__ in _PERMANENT)


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _bytes(value: Any) -> int | None:
    return None if value is None or int(value) >= _NOT_AVAILABLE else int(value)


class NvmlSession:
    """NVML initialised once; ``read_device(i)`` reads one GPU; ``close()`` shuts NVML down.

    Never raises. ``available`` is False with a precise ``reason`` when NVML cannot be used at
    all (nvidia-ml-py missing, no libnvidia-ml, driver not loaded, no permission). A function an
    old driver lacks (or a device does not support) makes only that reading None, with the
    reason in the reading's ``unavailable`` map, and is not called again on that device.
    """

    def __init__(self) -> None:
        self.available = False
        self.reason = ""
        self.driver: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._never_again: dict[tuple[str, int], str] = {}
        try:
            import pynvml
        except Exception as exc:
            self.reason = f"nvidia-ml-py is not importable ({type(exc).__name__}: {exc})"
            return
        init = _call(pynvml.nvmlInit)
        if isinstance(init, _Unavailable):
            self.reason = init.reason
            return
        self._nvml = pynvml
        count = _call(pynvml.nvmlDeviceGetCount)
        if isinstance(count, _Unavailable):
            self.reason = count.reason
            self.close()
            return
        self.available = True
        driver = _call(pynvml.nvmlSystemGetDriverVersion)
        self.driver = None if isinstance(driver, _Unavailable) else _text(driver)
        for i in range(int(count)):
            handle = _call(pynvml.nvmlDeviceGetHandleByIndex, i)
            self._handles.append(handle)
            static: dict[str, Any] = {"index": i}
            if isinstance(handle, _Unavailable):
                static["error"] = handle.reason
            else:
                for key, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
                    value = self._query(fn, i)
                    static[key] = None if isinstance(value, _Unavailable) else _text(value)
            self._static.append(static)
        if not self._handles:
            self.reason = "NVML sees no GPU"

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def _query(self, fn_name: str, index: int, *args: Any) -> Any:
        """``pynvml.<fn_name>(handle_of(index), *args)`` or an _Unavailable; remembers permanent failures."""
        known = self._never_again.get((fn_name, index))
        if known is not None:
            return _Unavailable(known, permanent=True)
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            result: Any = _Unavailable(f"{fn_name}: not in this nvidia-ml-py", permanent=True)
        else:
            result = _call(fn, self._handles[index], *args)
        if isinstance(result, _Unavailable) and result.permanent:
            self._never_again[(fn_name, index)] = result.reason
        return result

    def read_device(self, index: int) -> dict[str, Any]:
        """One GPU now: name, uuid, utilisation %, memory bytes, power W, limit W, temperature °C,
        SM and memory clocks MHz, and its compute processes (``[{pid, used_memory}]``); every
        reading that failed is None with its reason under ``unavailable``."""
        dev = dict(self._static[index])
        if "error" in dev:
            return dev
        missing: dict[str, str] = {}

        def read(keys: tuple[str, ...], fn_name: str, *args: Any) -> Any:
            value = self._query(fn_name, index, *args)
            if isinstance(value, _Unavailable):
                for key in keys:
                    dev[key] = None
                    missing[key] = value.reason
                return None
            return value

        nvml = self._nvml
        util = read(("util_gpu_pct", "util_mem_pct"), "nvmlDeviceGetUtilizationRates")
        if util is not None:
            dev.update(util_gpu_pct=float(util.gpu), util_mem_pct=float(util.memory))
        mem = read(("memory_used", "memory_total", "memory_free"), "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            dev.update(memory_used=int(mem.used), memory_total=int(mem.total), memory_free=int(mem.free))
        power = read(("power_w",), "nvmlDeviceGetPowerUsage")
        if power is not None:
            dev["power_w"] = power / 1000.0
        limit = read(("power_limit_w",), "nvmlDeviceGetEnforcedPowerLimit")
        if limit is not None:
            dev["power_limit_w"] = limit / 1000.0
        temp = read(("temp_c",), "nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        if temp is not None:
            dev["temp_c"] = float(temp)
        for key, const, default in (("sm_clock_mhz", "NVML_CLOCK_SM", 1), ("mem_clock_mhz", "NVML_CLOCK_MEM", 2)):
            clock = read((key,), "nvmlDeviceGetClockInfo", getattr(nvml, const, default))
            if clock is not None:
                dev[key] = int(clock)
        procs = read(("processes",), "nvmlDeviceGetComputeRunningProcesses")
        if procs is not None:
            dev["processes"] = [{"pid": int(p.pid), "used_memory": _bytes(p.usedGpuMemory)} for p in procs]
        if missing:
            dev["unavailable"] = missing
        return dev

    def process_name(self, pid: int) -> str | None:
        """NVML's name for a process (its executable path), or None."""
        fn = getattr(self._nvml, "nvmlSystemGetProcessName", None)
        if fn is None:
            return None
        name = _call(fn, pid)
        return None if isinstance(name, _Unavailable) else _text(name)

    def close(self) -> None:
        """Shut NVML down (once; later calls do nothing)."""
        if self._nvml is not None:
            _call(self._nvml.nvmlShutdown)
            self._nvml = None
            self._handles = []


def snapshot(pids: list[int] | None = None) -> dict[str, Any]:
    """Devices, their memory, and per-process memory (for ``pids`` if given, else all)."""
    session = NvmlSession()
    try:
        if not session.available:
            return {"available": False, "reason": session.reason}
        devices = []
        for i in range(session.device_count):
            read = session.read_device(i)
            dev: dict[str, Any] = {k: read[k] for k in ("index", "name", "uuid", "error") if k in read}
            if read.get("memory_total") is not None:
                dev.update({k: read[k] for k in ("memory_total", "memory_used", "memory_free")})
            if read.get("processes") is not None:
                dev["processes"] = [p for p in read["processes"] if pids is None or p["pid"] in pids]
            elif "error" not in read:
                dev["processes_error"] = read["unavailable"]["processes"]
            devices.append(dev)
        return {"available": True, "driver": session.driver, "devices": devices}
    finally:
        session.close()

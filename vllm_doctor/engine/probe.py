"""The forward probe (VD403, VD404): watch one forward pass op by op, name the module.

While armed for a step, a ``TorchFunctionMode`` sees the Python-level calls a model makes
(``.item()``, ``.tolist()``, ``.cpu()``, ``bool(tensor)``...) and a ``TorchDispatchMode`` sees
every aten op with its input and output devices (tensors created on, or copied to, another
device than the worker's; data-dependent output shapes such as ``nonzero``). Forward
pre/post hooks on every module keep the current module path. Both modes only observe: each
op runs unchanged, so outputs stay bit-identical. Nothing is active outside the probe step.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Python-level calls that read a tensor's value on the host (a device->host copy + sync on GPU)
_HOST_SYNC_METHODS = {
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
}
# aten ops whose output shape depends on tensor values (graph breaks, host syncs on GPU)
_DATA_DEPENDENT_OPS = {
    "nonzero",
    "masked_select",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "_unique",
    "argwhere",
    "repeat_interleave",
}
MAX_EVENTS = 200
_SKIP_FRAMES = ("/torch/", "/vllm_doctor/engine/", "<frozen")


def _user_frames(limit: int = 3) -> list[str]:
    frames = [
        f"{f.filename}:{f.lineno} in {f.name}"
        for f in traceback.extract_stack(limit=40)
        if not any(s in f.filename for s in _SKIP_FRAMES)
    ]
    return frames[-limit:]


def _same(dev: torch.device, worker: torch.device) -> bool:
    if dev.type != worker.type:
        return False
    return dev.index is None or worker.index is None or dev.index == worker.index


class ProbeRecorder:
    """Collects probe events keyed by (kind, op, module); counts repeats."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stack: list[str] = []
        self.events: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.steps_probed: list[dict[str, Any]] = []
        self._classes: dict[str, tuple[str, bool]] = {}
        self._fullnames: dict[str, str] = {}  # module path -> module.QualName of its class
        # probed step's phase -> class -> aten ops run directly in that class's forward (not in its children)
        self.op_counts: dict[str, dict[str, int]] = {}
        self._handles: list[Any] = []

    # -- module path ---------------------------------------------------------------------
    def install_hooks(self) -> None:
        for name, mod in self.model.named_modules():
            self._classes[name] = (type(mod).__qualname__, type(mod).__module__.startswith("vllm."))
            self._fullnames[name] = f"{type(mod).__module__}.{type(mod).__qualname__}"
            self._handles.append(mod.register_forward_pre_hook(self._pusher(name)))
            self._handles.append(mod.register_forward_hook(self._popper(name), always_call=True))

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pusher(self, name: str) -> Any:
        def pre_hook(module: nn.Module, args: Any) -> None:
            self.stack.append(name)

        return pre_hook

    def _popper(self, name: str) -> Any:
        def post_hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.stack and self.stack[-1] == name:
                self.stack.pop()

        return post_hook

    def count_op(self) -> None:
        """One aten op in the current module (the op counts VD604 quotes)."""
        module = self.stack[-1] if self.stack else ""
        cls = self._fullnames.get(module, self._fullnames.get("", "<model>"))
        phase = str(self.steps_probed[-1].get("phase")) if self.steps_probed else "step"
        per_class = self.op_counts.setdefault(phase, {})
        per_class[cls] = per_class.get(cls, 0) + 1

    # -- events --------------------------------------------------------------------------
    def record(self, kind: str, op: str, detail: dict[str, Any] | None = None) -> None:
        module = self.stack[-1] if self.stack else "<model>"
        key = (kind, op, module)
        event = self.events.get(key)
        if event is not None:
            event["count"] += 1
            return
        if len(self.events) >= MAX_EVENTS:
            return
        cls, builtin = self._classes.get(module, (type(self.model).__qualname__, False))
        self.events[key] = {
            "kind": kind,
            "op": op,
            "module": module,
            "module_class": cls,
            "vllm_builtin": builtin,
            "count": 1,
            "where": _user_frames(),
            **(detail or {}),
        }

    def snapshot(self) -> dict[str, Any]:
        return {
            "worker_device": str(self.device),
            "steps": list(self.steps_probed),
            "events": list(self.events.values()),
            "op_counts": {phase: dict(counts) for phase, counts in self.op_counts.items()},
        }


class _FunctionWatch(TorchFunctionMode):
    def __init__(self, rec: ProbeRecorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_SYNC_METHODS and args and isinstance(args[0], torch.Tensor):
            t = args[0]
            self.rec.record("host_sync", f"Tensor.{name}", {"tensor_device": str(t.device), "numel": t.numel()})
        elif name == "to" and args and isinstance(args[0], torch.Tensor):
            target = kwargs.get("device") or next((a for a in args[1:] if isinstance(a, (str, torch.device))), None)
            if target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu":
                self.rec.record("host_sync", "Tensor.to(cpu)", {"tensor_device": str(args[0].device)})
        return func(*args, **kwargs)


class _DispatchWatch(TorchDispatchMode):
    def __init__(self, rec: ProbeRecorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.rec.count_op()
        base = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        op = str(func)
        dev = self.rec.device
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if base in _DATA_DEPENDENT_OPS or (
            base == "index" and any(t.dtype in (torch.bool, torch.uint8) for t in inputs[1:])
        ):
            self.rec.record("data_dependent", op)
        wrong_out = [t for t in outputs if not _same(t.device, dev)]
        big_foreign_in = [t for t in inputs if not _same(t.device, dev) and t.dim() > 0]
        if wrong_out:
            t = wrong_out[0]
            detail = {"device": str(t.device), "shape": list(t.shape), "numel": t.numel()}
            if not inputs:
                self.rec.record("wrong_device_create", op, detail)
            elif all(_same(i.device, dev) for i in inputs):
                self.rec.record("cross_device_copy", op, {**detail, "from": str(inputs[0].device)})
            else:
                self.rec.record("wrong_device_compute", op, detail)
        elif big_foreign_in and outputs:
            t = big_foreign_in[0]
            self.rec.record(
                "cross_device_copy",
                op,
                {"from": str(t.device), "device": str(outputs[0].device), "shape": list(t.shape), "numel": t.numel()},
            )
        return out


class ProbeModes:
    """Enter/exit both modes from hooks (LIFO: function mode outside, dispatch mode inside)."""

    def __init__(self, rec: ProbeRecorder) -> None:
        self.rec = rec
        self._active: list[Any] = []

    @property
    def active(self) -> bool:
        return bool(self._active)

    def enter(self) -> None:
        if self._active:
            return
        fmode, dmode = _FunctionWatch(self.rec), _DispatchWatch(self.rec)
        fmode.__enter__()
        try:
            dmode.__enter__()
        except BaseException:
            fmode.__exit__(None, None, None)
            raise
        self._active = [fmode, dmode]

    def exit(self) -> None:
        while self._active:
            self._active.pop().__exit__(None, None, None)

"""Per-decoder-layer hidden states of ONE request, captured inside the worker (parity checks).

``arm(worker, tokens)`` hooks every decoder layer (an element of the model's ``layers``/``h``/
``blocks`` ModuleList, as :mod:`vllm_doctor.engine.layers` finds them); the first forward that
runs at least ``tokens`` tokens (the prefill of the request the doctor sends next) is recorded
and every hook is removed at once. ``arm(worker, tokens, decode=True)`` records instead the first
forward with fewer tokens AFTER that prefill: the decode step that feeds the request's next token
through the KV cache (its first row; the request is the only one running). ``collect(worker)``
returns what was recorded as plain lists.

vLLM decoder layers often return ``(hidden, residual)`` with the residual add deferred to the
next layer's fused norm; the layer's real output (what a Hugging Face layer returns) is then
``hidden + residual``. Size is bounded: at most ``max_values`` floats in all (tokens are dropped
from the end first). Needs eager mode: CUDA-graph replay skips Python hooks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm_doctor.compat import worker as wv
from vllm_doctor.engine.layers import select_modules

STATE_ATTR = "_vllm_doctor_hidden_capture"
DEFAULT_MAX_VALUES = 4_000_000


def layer_output(output: Any) -> torch.Tensor | None:
    """The hidden state a decoder layer produced (``hidden + residual`` for vLLM's pair form)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        hidden = output[0]
        if len(output) > 1 and isinstance(output[1], torch.Tensor) and output[1].shape == hidden.shape:
            return hidden + output[1]
        return hidden
    return None


class HiddenCapture:
    def __init__(self, model: nn.Module, tokens: int, max_values: int, decode: bool = False) -> None:
        self.tokens = tokens
        self.max_values = max_values
        self.decode = decode
        self.prefilled: set[int] = set()  # decode mode: the layers that have seen the prefill
        self.layers = [m for m in select_modules(model) if m.kind == "layer" and m.layer is not None]
        self.modules = dict(model.named_modules())
        self.handles: list[Any] = []
        self.records: dict[int, torch.Tensor] = {}
        self.skipped_forwards = 0
        self.done = False

    def arm(self) -> dict[str, Any]:
        if not self.layers:
            raise RuntimeError("no decoder layers found (no ModuleList named layers, h or blocks)")
        keep = max(1, self.max_values // max(1, len(self.layers)))
        for timed in self.layers:
            self.handles.append(self.modules[timed.name].register_forward_hook(self._hook(timed.layer or 0, keep)))
        return {"armed": True, "layers": [t.name for t in self.layers], "tokens": self.tokens, "decode": self.decode}

    def _hook(self, index: int, keep_values: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            if self.done:
                return
            hidden = layer_output(output)
            if hidden is None:
                return
            flat = hidden.reshape(-1, hidden.shape[-1])
            if self.decode:
                if flat.shape[0] >= self.tokens:  # the prefill before the step we want
                    self.prefilled.add(index)
                    return
                if index not in self.prefilled:  # a dummy run, or a step before our request's prefill
                    self.skipped_forwards += 1
                    return
                rows = 1
            elif flat.shape[0] < self.tokens:  # a decode step or a dummy run, not our prefill
                self.skipped_forwards += 1
                return
            else:
                rows = max(1, min(self.tokens, keep_values // max(1, flat.shape[-1])))
            self.records[index] = flat[:rows].detach().to(device="cpu", dtype=torch.float32).clone()
            if len(self.records) == len(self.layers):
                self.disarm()

        return hook

    def disarm(self) -> None:
        self.done = True
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def result(self) -> dict[str, Any]:
        return {
            "complete": len(self.records) == len(self.layers),
            "layers": {str(i): t.tolist() for i, t in sorted(self.records.items())},
            "names": {str(t.layer): t.name for t in self.layers},
            "skipped_forwards": self.skipped_forwards,
            "decode": self.decode,
        }


def arm(worker: Any, tokens: int, max_values: int = DEFAULT_MAX_VALUES, decode: bool = False) -> dict[str, Any]:
    """Hook the decoder layers for the next forward of >= ``tokens`` tokens (replaces an earlier arm);
    ``decode``: for the decode step right after that prefill instead."""
    old = worker.__dict__.pop(STATE_ATTR, None)
    if old is not None:
        old.disarm()
    model = wv.model(worker)
    if model is None:
        raise RuntimeError("the worker has no model to hook")
    mode = wv.compile_state(worker)
    if not mode.get("eager"):
        raise RuntimeError("hidden states need eager mode (enforce_eager=True): CUDA graphs skip Python hooks")
    capture = HiddenCapture(model, tokens, max_values, decode)
    worker.__dict__[STATE_ATTR] = capture
    return capture.arm()


def collect(worker: Any) -> dict[str, Any]:
    """What the armed capture recorded; removes its hooks (whether it fired or not)."""
    capture = worker.__dict__.pop(STATE_ATTR, None)
    if capture is None:
        return {"complete": False, "layers": {}, "names": {}, "error": "not armed"}
    capture.disarm()
    return capture.result()

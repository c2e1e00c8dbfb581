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
``hidden + residual``.

A multimodal model's encoder (``encoder=True``): the vision tower's input (the pixel values the
processor made) and output and the projector's output, on the first call of each after arming
(:func:`vllm_doctor.compat.worker.encoder_parts` names them; the decoder layers are the language
model's). ``layers=False`` hooks only those; ``all_rows``: every row of the recorded forward (a
multimodal prompt's prefill is longer than its ids: the placeholders are expanded).

Size is bounded: at most ``max_values`` floats in all (tokens are dropped
from the end first). Needs eager mode: CUDA-graph replay skips Python hooks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm_doctor.compat import roles
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


def first_tensor(output: Any) -> torch.Tensor | None:
    """An encoder part's output tensor: itself, a tuple's first, a model output's ``last_hidden_state``."""
    if isinstance(output, torch.Tensor):
        return output
    hidden = getattr(output, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor):
        return hidden
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


class HiddenCapture:
    def __init__(
        self,
        model: nn.Module,
        tokens: int,
        max_values: int,
        decode: bool = False,
        *,
        layers: bool = True,
        encoder: bool = False,
        all_rows: bool = False,
    ) -> None:
        self.tokens = tokens
        self.max_values = max_values
        self.decode = decode
        self.all_rows = all_rows
        self.prefilled: set[int] = set()  # decode mode: the layers that have seen the prefill
        lm = wv.language_model(model)
        timed = select_modules(model, lm, () if lm is not None else wv.encoder_prefixes(model))
        self.wants_layers = layers
        self.layers = [m for m in timed if m.kind == "layer" and m.layer is not None] if layers else []
        self.parts = wv.encoder_parts(model) if encoder else []
        self.modules = dict(model.named_modules())
        self.handles: list[Any] = []
        self.records: dict[int, torch.Tensor] = {}
        self.encoder_records: dict[str, torch.Tensor] = {}
        self.pixel_values: torch.Tensor | None = None
        self.skipped_forwards = 0
        self.done = False

    def arm(self) -> dict[str, Any]:
        if self.wants_layers and not self.layers:
            raise RuntimeError("no decoder layers found (no ModuleList named layers, h or blocks)")
        if not self.layers and not self.parts:
            raise RuntimeError("no encoder parts found (no child named like a vision tower or a projector)")
        keep = max(1, self.max_values // max(1, len(self.layers) + len(self.parts)))
        for timed in self.layers:
            self.handles.append(self.modules[timed.name].register_forward_hook(self._hook(timed.layer or 0, keep)))
        for part, name in self.parts:
            module = self.modules[name]
            if part == roles.VISION_TOWER:
                self.handles.append(module.register_forward_pre_hook(self._pixels_hook(), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._part_hook(part, keep)))
        return {
            "armed": True,
            "layers": [t.name for t in self.layers],
            "encoder": dict(self.parts),
            "tokens": self.tokens,
            "decode": self.decode,
        }

    def _pixels_hook(self) -> Any:
        def hook(_module: nn.Module, args: Any, kwargs: Any) -> None:
            given = args[0] if args else kwargs.get("pixel_values")
            if self.pixel_values is None and isinstance(given, torch.Tensor):
                self.pixel_values = given.detach().to(device="cpu", dtype=torch.float32).clone()

        return hook

    def _part_hook(self, part: str, keep_values: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            out = first_tensor(output)
            if self.done or part in self.encoder_records or out is None:
                return
            flat = out.reshape(-1, out.shape[-1])
            rows = max(1, min(flat.shape[0], keep_values // max(1, flat.shape[-1])))
            self.encoder_records[part] = flat[:rows].detach().to(device="cpu", dtype=torch.float32).clone()
            self._maybe_done()

        return hook

    def _maybe_done(self) -> None:
        if len(self.records) == len(self.layers) and len(self.encoder_records) == len(self.parts):
            self.disarm()

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
                wanted = flat.shape[0] if self.all_rows else self.tokens
                rows = max(1, min(wanted, keep_values // max(1, flat.shape[-1])))
            self.records[index] = flat[:rows].detach().to(device="cpu", dtype=torch.float32).clone()
            self._maybe_done()

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
            "encoder": {part: t.tolist() for part, t in self.encoder_records.items()},
            "encoder_names": dict(self.parts),
            "encoder_complete": len(self.encoder_records) == len(self.parts),
            "pixel_values": None if self.pixel_values is None else self.pixel_values.tolist(),
        }


def arm(
    worker: Any,
    tokens: int,
    max_values: int = DEFAULT_MAX_VALUES,
    decode: bool = False,
    *,
    layers: bool = True,
    encoder: bool = False,
    all_rows: bool = False,
) -> dict[str, Any]:
    """Hook the decoder layers for the next forward of >= ``tokens`` tokens (replaces an earlier arm);
    ``decode``: for the decode step right after that prefill instead. ``encoder``, ``layers``,
    ``all_rows``: see the module's docstring."""
    old = worker.__dict__.pop(STATE_ATTR, None)
    if old is not None:
        old.disarm()
    model = wv.model(worker)
    if model is None:
        raise RuntimeError("the worker has no model to hook")
    mode = wv.compile_state(worker)
    if not mode.get("eager"):
        raise RuntimeError("hidden states need eager mode (enforce_eager=True): CUDA graphs skip Python hooks")
    capture = HiddenCapture(model, tokens, max_values, decode, layers=layers, encoder=encoder, all_rows=all_rows)
    worker.__dict__[STATE_ATTR] = capture
    return capture.arm()


def collect(worker: Any) -> dict[str, Any]:
    """What the armed capture recorded; removes its hooks (whether it fired or not)."""
    capture = worker.__dict__.pop(STATE_ATTR, None)
    if capture is None:
        return {"complete": False, "layers": {}, "names": {}, "error": "not armed"}
    capture.disarm()
    return capture.result()

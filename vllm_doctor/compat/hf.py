"""The gateway to Hugging Face transformers as a *reference implementation* (parity checks).

Runs in a child process of the doctor (never in vLLM's): loads the checkpoint with the
author's HF class (``"package.module:Class"`` or ``"path/to/file.py:Class"``) or
``AutoModelForCausalLM``, decodes greedily with a full forward per step (no KV cache, the
plainest possible reference) and records each decoder layer's output through forward hooks:
on a prompt's prefill, or on one decode step (:func:`step_layer_outputs`: the model's own cache
path, ``past_key_values``, where it keeps one). Everything returned is plain lists and dicts.

With images (a multimodal model): every forward gets ``pixel_values`` (the ones vLLM's vision tower
received, sent by the parent) with the expanded token ids vLLM ran, and a capture also records the
vision tower's and the projector's outputs (the children named like them,
:func:`vllm_doctor.compat.roles.named_parts`); the decoder layers are searched outside them.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vllm_doctor.compat.roles import named_parts

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_LAYERS_NAME = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)$")


def load_class(spec: str) -> type:
    """``"pkg.mod:Class"`` or ``"dir/file.py:Class"`` -> the class."""
    target, sep, cls_name = spec.rpartition(":")
    if not sep or not target or not cls_name:
        raise ValueError(f"hf_class must be 'module:Class' or 'file.py:Class', not {spec!r}")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"hf_class file {path} does not exist")
        name = f"_vllm_doctor_reference_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        raise AttributeError(f"{target} has no class {cls_name}")
    return cls


def load_model(model_dir: str, hf_class: str | None, dtype: str, device: str, trust_remote_code: bool) -> nn.Module:
    torch_dtype = DTYPES[dtype]
    if hf_class:
        cls: Any = load_class(hf_class)
    else:
        from transformers import AutoModelForCausalLM

        cls = AutoModelForCausalLM
    kwargs: dict[str, Any] = {"dtype": torch_dtype}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    model = cls.from_pretrained(model_dir, **kwargs)
    return model.to(device).eval()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers: the longest ModuleList named layers/layer/h/blocks (outside a
    multimodal model's vision tower and projector)."""
    encoder = named_parts(model).encoder
    best: list[nn.Module] = []
    for name, module in model.named_modules():
        if any(name == e or name.startswith(e + ".") for e in encoder):
            continue
        if isinstance(module, nn.ModuleList) and _LAYERS_NAME.search(name) and len(module) > len(best):
            best = list(module)
    return best


def encoder_modules(model: nn.Module) -> dict[str, nn.Module]:
    """A multimodal reference model's "vision tower" and "projector" (the first child of each kind)."""
    modules = dict(model.named_modules())
    out: dict[str, nn.Module] = {}
    for part, name in named_parts(model).pairs():
        out.setdefault(part, modules[name])
    return out


def _pixels(pixel_values: Any, device: str) -> dict[str, Any]:
    """The forward's image keywords: none for a text prompt."""
    if pixel_values is None:
        return {}
    return {"pixel_values": torch.tensor(pixel_values, dtype=torch.float32, device=device)}


def _logits(model: nn.Module, ids: list[int], device: str, extra: dict[str, Any]) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids], device=device), **extra)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[0, -1].float()


@torch.no_grad()
def greedy_logprobs(
    model: nn.Module, prompt: list[int], max_tokens: int, top_k: int, device: str, pixel_values: Any = None
) -> dict[str, Any]:
    ids = list(prompt)
    tokens: list[int] = []
    logprobs: list[dict[str, float]] = []
    extra = _pixels(pixel_values, device)
    for _ in range(max_tokens):
        lp = torch.log_softmax(_logits(model, ids, device, extra), dim=-1)
        top = torch.topk(lp, top_k)
        chosen = int(torch.argmax(lp))
        step = {str(int(t)): float(v) for t, v in zip(top.indices, top.values, strict=True)}
        step.setdefault(str(chosen), float(lp[chosen]))
        tokens.append(chosen)
        logprobs.append(step)
        ids.append(chosen)
    return {"token_ids": tokens, "logprobs": logprobs}


class _LayerHooks:
    """Forward hooks on every decoder layer that keep the last ``rows`` rows (all: None) of each
    output; ``encoder``: also the vision tower's and the projector's outputs (first call, all rows)."""

    def __init__(self, model: nn.Module, rows: int | None = None, encoder: bool = False, layers: bool = True) -> None:
        self.records: dict[str, list[list[float]]] = {}
        self.encoder: dict[str, list[list[float]]] = {}
        self.rows = rows
        hooked = decoder_layers(model) if layers else []
        self.handles = [layer.register_forward_hook(self._hook(index)) for index, layer in enumerate(hooked)]
        parts = encoder_modules(model) if encoder else {}
        self.handles += [module.register_forward_hook(self._part_hook(part)) for part, module in parts.items()]

    def _part_hook(self, part: str) -> Any:
        def hook(_m: nn.Module, _a: Any, output: Any) -> None:
            out = output if isinstance(output, torch.Tensor) else getattr(output, "last_hidden_state", None)
            if out is None and isinstance(output, (tuple, list)) and output:
                out = output[0]
            if isinstance(out, torch.Tensor) and part not in self.encoder:
                self.encoder[part] = out.reshape(-1, out.shape[-1]).float().cpu().tolist()

        return hook

    def _hook(self, index: int) -> Any:
        def hook(_m: nn.Module, _a: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, (tuple, list)) else output
            flat = hidden.reshape(-1, hidden.shape[-1])
            self.records[str(index)] = (flat if self.rows is None else flat[-self.rows :]).float().cpu().tolist()

        return hook

    def __enter__(self) -> _LayerHooks:
        return self

    def __exit__(self, *_: Any) -> None:
        for handle in self.handles:
            handle.remove()


@torch.no_grad()
def layer_outputs(
    model: nn.Module, ids: list[int], device: str, pixel_values: Any = None
) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]]]:
    """Each decoder layer's output on ``ids`` (one sequence), keyed by layer index; with
    ``pixel_values``, also the encoder parts' outputs (keyed by part)."""
    with _LayerHooks(model, encoder=pixel_values is not None) as hooks:
        model(input_ids=torch.tensor([ids], device=device), **_pixels(pixel_values, device))
    return hooks.records, hooks.encoder


@torch.no_grad()
def step_layer_outputs(
    model: nn.Module, context: list[int], token: int, device: str, pixel_values: Any = None
) -> tuple[dict[str, list[list[float]]], str, dict[str, list[list[float]]]]:
    """Each decoder layer's output on ONE decode step: ``context`` prefilled, then ``token`` fed.

    Through the model's KV cache (``use_cache=True``, then ``past_key_values``) when it returns
    one, as the decode steps of ``generate`` run; a model that keeps no cache (a plain reference)
    gets a full forward over ``context + [token]`` and the last position's outputs, which is the
    same value. Returns the records (one row per layer), which way was taken and, with
    ``pixel_values``, the encoder parts' outputs on the prefill (or the full forward)."""
    past = None
    extra = _pixels(pixel_values, device)
    with _LayerHooks(model, encoder=bool(extra), layers=False) as prefill:
        try:
            out = model(input_ids=torch.tensor([context], device=device), use_cache=True, **extra)
            past = getattr(out, "past_key_values", None)
        except TypeError:  # a forward without use_cache
            past = None
    if past is not None:
        with _LayerHooks(model, rows=1) as hooks:
            model(input_ids=torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
        return hooks.records, "its KV cache (past_key_values)", prefill.encoder
    with _LayerHooks(model, rows=1, encoder=bool(extra)) as hooks:
        model(input_ids=torch.tensor([[*context, token]], device=device), **extra)
    return hooks.records, "a full forward, its last position (it keeps no KV cache)", hooks.encoder


def reference_run(request: dict[str, Any]) -> dict[str, Any]:
    """The HF side of a parity check: greedy outputs per prompt + layer outputs on the first prompt."""
    device = request.get("device") or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda was asked for, but torch sees no CUDA device")
    torch.manual_seed(0)
    model = load_model(
        request["model"], request.get("hf_class"), request["dtype"], device, bool(request.get("trust_remote_code"))
    )
    model_class = f"{type(model).__module__}.{type(model).__qualname__}"
    step = request.get("capture_step")
    if step:  # one step's layer outputs only (the parity check's second round)
        context, token, pixels = [int(t) for t in step["context"]], step.get("token"), step.get("pixel_values")
        if token is None:
            records, parts = layer_outputs(model, context, device, pixels)
            path = "a full forward"
        else:
            records, path, parts = step_layer_outputs(model, context, int(token), device, pixels)
        return {"hidden": records, "path": path, "model_class": model_class, "encoder": parts}
    prompts = prompt_token_ids(request["model"], list(request["prompts"]), bool(request.get("trust_remote_code")))
    max_tokens, top_k = int(request["max_tokens"]), int(request["top_k"])
    pixels = request.get("pixel_values") or [None] * len(prompts)  # per prompt (with images)
    outputs = [
        greedy_logprobs(model, ids, max_tokens, top_k, device, pv) for ids, pv in zip(prompts, pixels, strict=True)
    ]
    hidden: dict[str, Any] = {}
    encoder: dict[str, Any] = {}
    if request.get("capture") and prompts:
        hidden, encoder = layer_outputs(model, prompts[0], device, pixels[0])
    return {
        "prompt_token_ids": prompts,
        "outputs": outputs,
        "hidden": hidden,
        "encoder": encoder,
        "model_class": model_class,
    }


def prompt_token_ids(model_dir: str, prompts: list[Any], trust_remote_code: bool) -> list[list[int]]:
    """Strings through the checkpoint's tokenizer (as vLLM does: special tokens added); ids as given."""
    tokenizer = None
    out = []
    for prompt in prompts:
        if isinstance(prompt, str):
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
            out.append([int(t) for t in tokenizer.encode(prompt)])
        else:
            out.append([int(t) for t in prompt])
    return out

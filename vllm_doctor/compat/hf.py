"""The gateway to Hugging Face transformers as a *reference implementation* (parity checks).

Runs in a child process of the doctor (never in vLLM's): loads the checkpoint with the
author's HF class (``"package.module:Class"`` or ``"path/to/file.py:Class"``) or
``AutoModelForCausalLM``, decodes greedily with a full forward per step (no KV cache, the
plainest possible reference) and records each decoder layer's output through forward hooks:
on a prompt's prefill, or on one decode step (:func:`step_layer_outputs`: the model's own cache
path, ``past_key_values``, where it keeps one). Everything returned is plain lists and dicts.
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
    """The decoder layers: the longest ModuleList named layers/layer/h/blocks."""
    best: list[nn.Module] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and _LAYERS_NAME.search(name) and len(module) > len(best):
            best = list(module)
    return best


def _logits(model: nn.Module, ids: list[int], device: str) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids], device=device))
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[0, -1].float()


@torch.no_grad()
def greedy_logprobs(model: nn.Module, prompt: list[int], max_tokens: int, top_k: int, device: str) -> dict[str, Any]:
    ids = list(prompt)
    tokens: list[int] = []
    logprobs: list[dict[str, float]] = []
    for _ in range(max_tokens):
        lp = torch.log_softmax(_logits(model, ids, device), dim=-1)
        top = torch.topk(lp, top_k)
        chosen = int(torch.argmax(lp))
        step = {str(int(t)): float(v) for t, v in zip(top.indices, top.values, strict=True)}
        step.setdefault(str(chosen), float(lp[chosen]))
        tokens.append(chosen)
        logprobs.append(step)
        ids.append(chosen)
    return {"token_ids": tokens, "logprobs": logprobs}


class _LayerHooks:
    """Forward hooks on every decoder layer that keep the last ``rows`` rows (all: None) of each output."""

    def __init__(self, model: nn.Module, rows: int | None = None) -> None:
        self.records: dict[str, list[list[float]]] = {}
        self.rows = rows
        self.handles = [
            layer.register_forward_hook(self._hook(index)) for index, layer in enumerate(decoder_layers(model))
        ]

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
def layer_outputs(model: nn.Module, ids: list[int], device: str) -> dict[str, list[list[float]]]:
    """Each decoder layer's output on ``ids`` (one sequence), keyed by layer index."""
    with _LayerHooks(model) as hooks:
        model(input_ids=torch.tensor([ids], device=device))
    return hooks.records


@torch.no_grad()
def step_layer_outputs(
    model: nn.Module, context: list[int], token: int, device: str
) -> tuple[dict[str, list[list[float]]], str]:
    """Each decoder layer's output on ONE decode step: ``context`` prefilled, then ``token`` fed.

    Through the model's KV cache (``use_cache=True``, then ``past_key_values``) when it returns
    one, as the decode steps of ``generate`` run; a model that keeps no cache (a plain reference)
    gets a full forward over ``context + [token]`` and the last position's outputs, which is the
    same value. Returns the records (one row per layer) and which way was taken."""
    past = None
    try:
        out = model(input_ids=torch.tensor([context], device=device), use_cache=True)
        past = getattr(out, "past_key_values", None)
    except TypeError:  # a forward without use_cache
        past = None
    if past is not None:
        with _LayerHooks(model, rows=1) as hooks:
            model(input_ids=torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
        return hooks.records, "its KV cache (past_key_values)"
    with _LayerHooks(model, rows=1) as hooks:
        model(input_ids=torch.tensor([[*context, token]], device=device))
    return hooks.records, "a full forward, its last position (it keeps no KV cache)"


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
        context, token = [int(t) for t in step["context"]], step.get("token")
        if token is None:
            records, path = layer_outputs(model, context, device), "a full forward"
        else:
            records, path = step_layer_outputs(model, context, int(token), device)
        return {"hidden": records, "path": path, "model_class": model_class}
    prompts = prompt_token_ids(request["model"], list(request["prompts"]), bool(request.get("trust_remote_code")))
    max_tokens, top_k = int(request["max_tokens"]), int(request["top_k"])
    outputs = [greedy_logprobs(model, ids, max_tokens, top_k, device) for ids in prompts]
    hidden = layer_outputs(model, prompts[0], device) if request.get("capture") and prompts else {}
    return {
        "prompt_token_ids": prompts,
        "outputs": outputs,
        "hidden": hidden,
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

"""The doctor's side of a running engine: the ONE place that touches a ``vllm.LLM``'s internals.

Everything here probes capabilities (attributes, signatures) rather than version numbers, and
turns vLLM objects into plain dicts at once. Worker-side code lives in
:mod:`vllm_doctor.engine`; this module reaches it only through ``LLM.collective_rpc`` by method
name (no pickled functions, so no ``VLLM_ALLOW_INSECURE_SERIALIZATION``).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from vllm_doctor.compat.common import qualname
from vllm_doctor.constants import EXTENSION_QUALNAME

# The cheapest settings that still run the real engine (measured on CPU: 2-4 s to start).
FAST_ENGINE_KWARGS: dict[str, Any] = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 * 2**20,
}


class ExtensionMissing(RuntimeError):
    """The engine was built without the doctor's worker extension."""


def engine_kwargs(**extra: Any) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` that make the doctor attachable.

    >>> llm = LLM(model=..., **vllm_doctor.engine_kwargs(enforce_eager=True))
    """
    kwargs = {"worker_extension_cls": EXTENSION_QUALNAME}
    kwargs.update(extra)
    return kwargs


def _missing_message(configured: str | None) -> str:
    have = f"it has worker_extension_cls={configured!r}" if configured else "it has no worker_extension_cls"
    return (
        f"this engine was built without vllm-doctor's worker extension ({have}). "
        f"Create it with LLM(..., worker_extension_cls={EXTENSION_QUALNAME!r}) "
        "(or LLM(..., **vllm_doctor.engine_kwargs())); for `vllm serve` pass "
        f"--worker-extension-cls {EXTENSION_QUALNAME}. If you have your own extension, make it "
        "subclass vllm_doctor.engine.extension.DoctorWorkerExtension."
    )


class EngineHandle:
    """A user's ``vllm.LLM`` seen by the doctor."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.engine = getattr(llm, "llm_engine", None)
        self.vllm_config = getattr(self.engine, "vllm_config", None)

    # -- the extension ------------------------------------------------------------------------
    def configured_extension(self) -> str | None:
        pc = getattr(self.vllm_config, "parallel_config", None)
        value = getattr(pc, "worker_extension_cls", None)
        return value if isinstance(value, str) and value else None

    def ensure_extension(self, method: str = "doctor_ping") -> list[dict[str, Any]]:
        """Ping every worker; raise :class:`ExtensionMissing` with the fix when it is absent.

        vLLM mixes an extension into the worker *class*, so in one process a later engine may
        inherit an earlier engine's extension: the ping, not the config, is the real test.
        """
        configured = self.configured_extension()
        if configured is not None and configured != EXTENSION_QUALNAME and not _subclasses_ours(configured):
            raise ExtensionMissing(_missing_message(configured))
        try:
            replies = self.rpc(method)
        except Exception as exc:  # AttributeError in-process; a wrapped error from other processes
            if method in str(exc) or isinstance(exc, AttributeError):
                raise ExtensionMissing(_missing_message(configured)) from exc
            raise
        return replies

    def rpc(
        self, method: str, options: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Call ``method`` on every worker; one envelope per worker, in rank order."""
        args = (options,) if options is not None else ()
        replies = self.llm.collective_rpc(method, timeout=timeout, args=args)
        return [
            r
            if isinstance(r, dict)
            else {"ok": False, "method": method, "error": {"type": "BadReply", "message": repr(r)[:500]}}
            for r in replies
        ]

    def model_name(self) -> str:
        mc = getattr(self.vllm_config, "model_config", None)
        return str(getattr(mc, "model", "") or "engine")

    def vocab_size(self) -> int | None:
        mc = getattr(self.vllm_config, "model_config", None)
        get = getattr(mc, "get_vocab_size", None)
        try:
            return int(get()) if callable(get) else None
        except Exception:
            return None

    def multimodal_prompts(
        self, prompts: int, input_len: int, images: int, seed: int
    ) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """Prompts with ``images`` images each for a model vLLM treats as multimodal, built the
        way vLLM builds its start-up dummy inputs: the registered processor's dummy-inputs
        builder gives the placeholder text (tokenized, then filled with random token ids to
        ``input_len``) and an image at the processor's largest size; each prompt gets its own
        random pixels of that size (vLLM caches an encoder's output per image content: the same
        image twice is encoded once). ``(prompts, what was fed)``; None for a text model or one
        that takes no images."""
        layout = self.image_layout(images)
        if layout is None:
            return None
        import numpy as np

        head, (width, height), text = layout
        rng = np.random.default_rng(seed)
        vocab = self.vocab_size() or 1000
        low = min(10, max(0, vocab - 1))
        out = []
        for _ in range(prompts):
            pictures = random_images(rng, images, width, height)
            filler = rng.integers(low, vocab, max(0, input_len - len(head))).tolist()
            out.append(
                {
                    "prompt_token_ids": head + filler,
                    "multi_modal_data": {"image": pictures if images > 1 else pictures[0]},
                }
            )
        return out, {"images_per_prompt": images, "image_size": [width, height], "placeholder_text": text}

    def image_layout(self, images: int) -> tuple[list[int], tuple[int, int], str] | None:
        """What a prompt with ``images`` images needs, from the registered processor's dummy-inputs
        builder: the placeholder text's token ids, the image size ``(width, height)`` (the
        processor's largest) and the text. None for a text model or one that takes no images."""
        mc: Any = getattr(self.vllm_config, "model_config", None)
        if images <= 0 or not getattr(mc, "is_multimodal_model", False):
            return None
        from vllm.multimodal import MULTIMODAL_REGISTRY

        processor = MULTIMODAL_REGISTRY.create_processor(mc)
        if "image" not in processor.info.get_supported_mm_limits():
            return None
        counts = {"image": images}
        builder = processor.dummy_inputs
        text = builder.get_dummy_text(counts)
        mm_config = getattr(mc, "multimodal_config", None)
        options: Any = getattr(mm_config, "limit_per_prompt", None)
        data = builder.get_dummy_mm_data(mc.max_model_len, counts, options)
        given: Any = data["image"]
        template = given[0] if isinstance(given, list) else given
        head = list(self.llm.get_tokenizer().encode(text, add_special_tokens=False))
        return head, tuple(template.size), text

    def image_prompt(self, ids: list[int], images: int, seed: int, prompt: int, tag: str) -> dict[str, Any]:
        """Prompt ``prompt`` of a parity check with ``images`` seeded random images (the same
        pixels for the same ``seed`` and ``prompt``, every time): the placeholder text's ids
        after the prompt's BOS (before its first token when it has none), the images as PIL
        images in ``multi_modal_data``. ``tag`` names the images (``multi_modal_uuids``): vLLM keys
        its encoder cache by it, so a new tag makes the engine run the encoder again."""
        layout = self.image_layout(images)
        if layout is None:
            raise ValueError("this model takes no images (vLLM does not treat it as a multimodal model)")
        import numpy as np

        head, (width, height), _ = layout
        bos = getattr(self.llm.get_tokenizer(), "bos_token_id", None)
        cut = 1 if ids and bos is not None and ids[0] == bos else 0
        pictures = random_images(np.random.default_rng([seed, prompt]), images, width, height)
        return {
            "prompt_token_ids": ids[:cut] + head + ids[cut:],
            "multi_modal_data": {"image": pictures},
            "multi_modal_uuids": {"image": [f"{tag}-{prompt}-{i}" for i in range(images)]},
        }

    # -- the front end: which process holds what ---------------------------------------------
    def front_end(self) -> dict[str, Any]:
        core = getattr(self.engine, "engine_core", None)
        pc = getattr(self.vllm_config, "parallel_config", None)
        in_process = type(core).__name__ == "InprocClient"
        info: dict[str, Any] = {
            "pid": os.getpid(),
            "llm_class": _qualname(self.llm),
            "engine_class": _qualname(self.engine),
            "core_client_class": _qualname(core),
            "engine_core_in_process": in_process,
            "executor_backend": _str(getattr(pc, "distributed_executor_backend", None)),
            "engine_core_pids": [os.getpid()] if in_process else _engine_core_pids(core),
            "worker_extension_cls": self.configured_extension(),
        }
        executor = getattr(self.engine, "model_executor", None)
        if executor is None and in_process:
            executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
        if executor is not None:
            info["executor_class"] = _qualname(executor)
        return info

    # -- vLLM's own torch profiler (deep dive) ------------------------------------------------
    def torch_profiler_dir(self) -> str | None:
        cfg = getattr(self.vllm_config, "profiler_config", None)
        if getattr(cfg, "profiler", None) == "torch":
            return getattr(cfg, "torch_profiler_dir", None) or None
        return None

    def start_torch_profile(self) -> None:
        self.llm.start_profile()

    def stop_torch_profile(self) -> None:
        self.llm.stop_profile()


def random_images(rng: Any, count: int, width: int, height: int) -> list[Any]:
    """``count`` PIL RGB images of uniformly random pixels from the numpy generator ``rng``."""
    import numpy as np
    from PIL import Image

    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(count)]


def torch_profiler_kwargs(out_dir: str) -> dict[str, Any]:
    """LLM kwargs that enable vLLM's torch profiler writing into ``out_dir``, if supported."""
    from vllm import LLM

    if "profiler_config" in inspect.signature(LLM.__init__).parameters:
        return {
            "profiler_config": {
                "profiler": "torch",
                "torch_profiler_dir": os.path.abspath(out_dir),
                "torch_profiler_with_stack": False,
            }
        }
    return {}  # older vLLM: VLLM_TORCH_PROFILER_DIR in the environment instead


def start_engine(model: str, single_process: bool = True, **kwargs: Any) -> Any:
    """Start a real engine with the doctor's extension (the CLI's engine stage, tests, bench).

    ``kwargs`` go to ``vllm.LLM`` as given (:data:`FAST_ENGINE_KWARGS` are the cheap CPU ones).
    """
    if single_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    kwargs.setdefault("worker_extension_cls", EXTENSION_QUALNAME)
    return LLM(model=model, **kwargs)


def execution_mode(llm: Any) -> dict[str, Any]:
    """How a started engine runs the model: eager, torch.compile, CUDA graphs (read from its config)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    mc = getattr(config, "model_config", None)
    cc = getattr(config, "compilation_config", None)
    eager = bool(getattr(mc, "enforce_eager", False))
    compile_mode = getattr(cc, "mode", None)
    if compile_mode is None:
        compile_mode = getattr(cc, "level", None)  # before vLLM 0.11
    cudagraph = getattr(cc, "cudagraph_mode", None)
    out: dict[str, Any] = {
        "enforce_eager": eager,
        "compilation_mode": _name(compile_mode),
        "cudagraph_mode": _name(cudagraph),
    }
    if eager:
        out["summary"] = "eager (enforce_eager)"
    else:
        out["summary"] = f"compilation {out['compilation_mode']}, CUDA graphs {out['cudagraph_mode']}"
    return out


def _name(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "name", value))


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def greedy(max_tokens: int, ignore_eos: bool = False) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)


def shutdown(llm: Any) -> None:
    """Stop an engine started by the doctor, as far as this vLLM lets us."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    stop = getattr(core, "shutdown", None)
    if callable(stop):
        try:
            stop()
        except Exception:
            pass


def _engine_core_pids(core: Any) -> list[int]:
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    procs = getattr(manager, "processes", None) or []
    return [p.pid for p in procs if getattr(p, "pid", None)]


def _subclasses_ours(qualname_: str) -> bool:
    """Is the configured extension class the doctor's or a subclass of it? (by the names in its
    MRO, so the doctor's side never imports the worker-side package)"""
    try:
        import importlib

        module_name, _, cls_name = qualname_.rpartition(".")
        cls = getattr(importlib.import_module(module_name), cls_name)
        return isinstance(cls, type) and any(qualname(c) == EXTENSION_QUALNAME for c in cls.__mro__)
    except Exception:
        return True


def _qualname(obj: Any) -> str | None:
    return None if obj is None else qualname(obj)


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else getattr(value, "__name__", str(value))


def prompt_token_ids(llm: Any, prompts: list[Any]) -> list[list[int]]:
    """Token ids of each prompt (a string through the engine's tokenizer, or ids as given)."""
    out: list[list[int]] = []
    tokenizer = None
    for prompt in prompts:
        if isinstance(prompt, str):
            tokenizer = tokenizer or llm.get_tokenizer()
            out.append([int(t) for t in tokenizer.encode(prompt)])
        else:
            out.append([int(t) for t in prompt])
    return out


def greedy_logprobs(
    llm: Any, prompts: list[Any], max_tokens: int, top_k: int, only_token: int | None = None
) -> list[dict[str, Any]]:
    """Greedy tokens and each step's top-k logprobs (``{"token_ids", "logprobs": [{id: lp}],
    "prompt_token_ids"}``; the last: the ids the engine ran, a multimodal prompt's placeholders
    expanded). A prompt: token ids, or a prompt dict (``prompt_token_ids``, ``multi_modal_data``, ...).

    ``only_token``: every step samples that token (``allowed_token_ids``; the logprobs reported
    are the raw ones, from before that mask), to feed a chosen token into the next decode step."""
    from vllm import SamplingParams

    extra: dict[str, Any] = {} if only_token is None else {"allowed_token_ids": [int(only_token)]}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=top_k, ignore_eos=True, **extra)
    asked = [p if isinstance(p, dict) else {"prompt_token_ids": p} for p in prompts]
    outputs = llm.generate(asked, params, use_tqdm=False)
    results = []
    for prompt, output in zip(asked, outputs, strict=True):
        sample = output.outputs[0]
        steps = [
            {str(int(tok)): float(getattr(info, "logprob", info)) for tok, info in (step or {}).items()}
            for step in (sample.logprobs or [])
        ]
        ran = getattr(output, "prompt_token_ids", None) or prompt["prompt_token_ids"]
        results.append(
            {
                "token_ids": [int(t) for t in sample.token_ids],
                "logprobs": steps,
                "prompt_token_ids": [int(t) for t in ran],
            }
        )
    return results

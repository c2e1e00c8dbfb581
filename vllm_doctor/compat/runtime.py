"""Facts that need vLLM imported. Runs only in a fresh child process (see probes/import_probe.py).

Everything returned is a plain JSON-able dict; no vLLM object leaves this module.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
import traceback
from collections.abc import Callable
from typing import Any

from vllm_doctor.compat.common import format_exc, qualname
from vllm_doctor.compat.plugins import GENERAL_PLUGINS_GROUP


def import_vllm() -> str | None:
    """Import vLLM (the slow part of the import pass); return its version."""
    import vllm

    return getattr(vllm, "__version__", None)


def load_general_plugins_observed() -> list[dict[str, Any]]:
    """Load ``vllm.general_plugins`` the way vLLM does, recording each plugin's fate.

    vLLM logs a failed plugin and carries on; we keep the traceback instead. The
    ``VLLM_PLUGINS`` filter is vLLM's own (``vllm.envs``), so the result is what an engine
    process would see. ``plugins_loaded`` is set so nothing loads them twice.
    """
    from importlib.metadata import entry_points

    import vllm.envs as envs

    try:
        import vllm.plugins as vllm_plugins
    except ImportError:  # pragma: no cover - every supported vLLM has it
        vllm_plugins = None  # type: ignore[assignment]
    allowed = envs.VLLM_PLUGINS
    results: list[dict[str, Any]] = []
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        record: dict[str, Any] = {"name": ep.name, "value": ep.value, "allowed": allowed is None or ep.name in allowed}
        if record["allowed"]:
            try:
                func = ep.load()
                record["loaded"] = True
            except Exception as exc:
                record.update(loaded=False, error=format_exc(exc))
                results.append(record)
                continue
            try:
                func()
                record["called"] = True
            except Exception as exc:
                record.update(called=False, error=format_exc(exc))
        results.append(record)
    if vllm_plugins is not None and hasattr(vllm_plugins, "plugins_loaded"):
        vllm_plugins.plugins_loaded = True
    return results


def registry_snapshot() -> dict[str, str]:
    """arch -> "module:Class" for every architecture in vLLM's ModelRegistry, as it stands."""
    from vllm import ModelRegistry

    out: dict[str, str] = {}
    models = getattr(ModelRegistry, "models", None)
    if not isinstance(models, dict):  # unknown layout: names only
        return {arch: "?" for arch in ModelRegistry.get_supported_archs()}
    for arch, entry in models.items():
        module = getattr(entry, "module_name", None)
        cls_name = getattr(entry, "class_name", None)
        if module and cls_name:
            out[arch] = f"{module}:{cls_name}"
            continue
        cls = getattr(entry, "model_cls", None)
        out[arch] = f"{cls.__module__}:{cls.__qualname__}" if cls is not None else "?"
    return out


def transformers_model_types() -> list[str]:
    """model_types AutoConfig resolves now (built-ins + ``AutoConfig.register`` calls)."""
    from transformers import CONFIG_MAPPING

    keys = set(CONFIG_MAPPING.keys())
    extra = getattr(CONFIG_MAPPING, "_extra_content", {})
    keys.update(extra)
    return sorted(keys)


class CudaInitWatch:
    """Records who first initialises CUDA while active (``torch.cuda._lazy_init``).

    The original is still called, so behaviour is what vLLM would get: on a CPU build of torch
    that raises, on a GPU it initialises CUDA, which forked workers cannot survive.
    """

    def __init__(self) -> None:
        self.stack: list[str] | None = None
        self._orig: Callable[[], None] | None = None

    def __enter__(self) -> CudaInitWatch:
        import torch.cuda

        self._orig = torch.cuda._lazy_init
        watch = self

        def _lazy_init() -> None:
            if watch.stack is None:
                watch.stack = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_stack()[:-1]]
            assert watch._orig is not None
            watch._orig()

        torch.cuda._lazy_init = _lazy_init  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.cuda

        if self._orig is not None:
            torch.cuda._lazy_init = self._orig  # type: ignore[assignment]

    def user_frames(self, module_file: str | None) -> list[str]:
        frames = self.stack or []
        if module_file:
            mine = [f for f in frames if f.startswith(module_file)]
            if mine:
                return mine
        return [f for f in frames if "/torch/" not in f and "importlib" not in f][-3:]


def _returns_value(func: Callable[..., Any]) -> bool | None:
    """Does the function's own body have a ``return <value>``? None if the source is unavailable."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    fn = tree.body[0]
    stack: list[ast.AST] = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue  # nested scopes return for themselves
        if isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                return True
        if isinstance(node, ast.Yield | ast.YieldFrom):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _params(func: Any) -> list[str] | None:
    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None


def _supports_kw() -> Callable[[Any, str], bool]:
    for where in ("vllm.utils.func_utils", "vllm.utils"):
        try:
            return importlib.import_module(where).supports_kw  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue

    def fallback(func: Any, kw: str) -> bool:
        try:
            params = inspect.signature(func).parameters
        except (TypeError, ValueError):
            return False
        return kw in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    return fallback


def vllm_verdicts(cls: type) -> dict[str, Any]:
    """vLLM's own interface checks on the class (capability-detected)."""
    out: dict[str, Any] = {}
    try:
        base = importlib.import_module("vllm.model_executor.models.interfaces_base")
    except ImportError:
        return out
    for name in ("is_vllm_model", "is_text_generation_model", "is_pooling_model"):
        fn = getattr(base, name, None)
        if callable(fn):
            try:
                out[name] = bool(fn(cls))
            except Exception as exc:
                out[name] = None
                out[f"{name}_error"] = repr(exc)
    try:  # pipeline parallelism: vLLM refuses pipeline_parallel_size > 1 for a class without SupportsPP
        interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
        supports_pp = getattr(interfaces, "supports_pp", None)
        if callable(supports_pp):
            out["supports_pp"] = bool(supports_pp(cls))
    except Exception as exc:
        out["supports_pp_error"] = repr(exc)
    out.update(multimodal_verdicts(cls))
    # does the installed vLLM require embed_input_ids for is_vllm_model? (0.32 does)
    check = getattr(base, "is_vllm_model", None)
    if check is not None:
        try:
            out["requires_embed_input_ids"] = "_check_vllm_model_embed_input_ids" in inspect.getsource(check)
        except (OSError, TypeError):
            out["requires_embed_input_ids"] = None
    return out


def multimodal_verdicts(cls: type) -> dict[str, Any]:
    """Does vLLM treat the class as multimodal (``supports_multimodal``: it implements
    ``SupportsMultiModal``), and does its multimodal registry hold a processor for it
    (``MULTIMODAL_REGISTRY.register_processor`` on this class or a base)? Capability-detected:
    vLLM keeps the factories on the class (``_processor_factory``, what its registry's
    lookup, ``_get_model_cls``, reads; so since 0.26 at least)."""
    out: dict[str, Any] = {}
    try:
        interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
        supports = getattr(interfaces, "supports_multimodal", None)
        if callable(supports):
            out["supports_multimodal"] = bool(supports(cls))
    except Exception as exc:
        out["supports_multimodal_error"] = repr(exc)
    try:
        registry = importlib.import_module("vllm.multimodal").MULTIMODAL_REGISTRY
        if callable(getattr(registry, "_get_model_cls", None)):  # the lookup that reads the class's factories
            out["has_mm_processor"] = hasattr(cls, "_processor_factory")
    except Exception as exc:
        out["has_mm_processor_error"] = repr(exc)
    if out.get("has_mm_processor") is False:  # where the registration went instead (a hint: never the verdict)
        try:
            out["mm_processor_on"] = _registered_elsewhere(cls)
        except Exception as exc:
            out["mm_processor_on_error"] = repr(exc)
    return out


def _registered_elsewhere(cls: type) -> list[str]:
    """Classes of ``cls``'s module (and of its package's modules already imported) that carry a
    multimodal processor registration of their own: the decorator put on another class than the
    one the architecture resolves to."""
    package = cls.__module__.rsplit(".", 1)[0]
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == cls.__module__ or name.startswith(package + ".")):
            continue
        for value in list(getattr(module, "__dict__", {}).values()):  # sys.modules may hold non-modules
            if isinstance(value, type) and value is not cls and "_processor_factory" in value.__dict__:
                qual = f"{value.__module__}.{value.__qualname__}"
                if value.__module__ == name and qual not in found:
                    found.append(qual)
    return found


def contract_facts(cls: type) -> dict[str, Any]:
    """Everything the VD2xx checks need about a model class, as plain data."""
    import torch.nn as nn

    supports_kw = _supports_kw()
    facts: dict[str, Any] = {
        "qualname": f"{cls.__module__}.{cls.__qualname__}",
        "mro": [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__],
        "is_nn_module": isinstance(cls, type) and issubclass(cls, nn.Module),
    }
    try:
        facts["source"] = f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):
        facts["source"] = None
    try:
        import transformers

        facts["is_pretrained_model"] = issubclass(cls, transformers.PreTrainedModel)
    except ImportError:
        facts["is_pretrained_model"] = False
    init = cls.__init__  # type: ignore[misc]
    facts["init_params"] = _params(init)
    facts["init_accepts_vllm_config"] = supports_kw(init, "vllm_config")
    facts["init_accepts_prefix"] = supports_kw(init, "prefix")
    forward = getattr(cls, "forward", None)
    facts["forward_callable"] = callable(forward)
    facts["forward_params"] = _params(forward) if callable(forward) else None
    facts["forward_supports"] = {
        kw: (supports_kw(forward, kw) if callable(forward) else False)
        for kw in ("input_ids", "positions", "intermediate_tensors", "inputs_embeds")
    }
    facts["compute_logits_callable"] = callable(getattr(cls, "compute_logits", None))
    load_weights = getattr(cls, "load_weights", None)
    facts["load_weights_callable"] = callable(load_weights)
    facts["load_weights_returns_value"] = _returns_value(load_weights) if callable(load_weights) else None
    facts["embed_input_ids_callable"] = callable(getattr(cls, "embed_input_ids", None))
    facts["get_input_embeddings_callable"] = callable(getattr(cls, "get_input_embeddings", None))
    facts["vllm"] = vllm_verdicts(cls)
    if facts["vllm"].get("supports_multimodal"):
        facts["multimodal_methods"] = multimodal_methods(cls)
    return facts


# SupportsMultiModal's methods by role, newest name first (vLLM renamed them; >= 0.26 has the first)
MM_ENCODER_NAMES = ("embed_multimodal", "get_multimodal_embeddings")
MM_MERGE_NAMES = ("embed_input_ids", "get_input_embeddings")
MM_MERGE_KWARGS = ("multimodal_embeddings", "is_multimodal")


def _unread_params(func: Callable[..., Any], names: tuple[str, ...]) -> list[str] | None:
    """The named parameters among ``names`` that the function's own body never reads (None: no
    source). A name the function takes only through ``**kwargs`` is not judged."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("locals", "vars")
        for n in ast.walk(fn)
    ):
        return []  # reads its arguments by name
    args = fn.args
    named = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    return [n for n in names if n in named and n not in read]


def multimodal_methods(cls: type) -> dict[str, Any]:
    """For a class vLLM treats as multimodal: who implements the two methods vLLM's runner calls
    with images, named as the installed vLLM's ``SupportsMultiModal`` names them (capability:
    the first of each ``*_NAMES`` it has): ``encoder`` (the image embeddings) and ``merge`` (the
    token embeddings with the image embeddings written on the placeholder positions). ``owner``
    is the class in the MRO that defines the method, ``interface`` whether that is vLLM's own
    ``SupportsMultiModal`` (its ``embed_multimodal`` is an empty protocol method; its
    ``embed_input_ids`` a working default that asks ``get_language_model``); ``legacy`` the
    older names the class defines itself; for an overridden merge method, whether it accepts the
    keywords vLLM passes and which of them its body never reads."""
    interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
    protocol = interfaces.SupportsMultiModal
    supports_kw = _supports_kw()
    # the model's own classes (not vLLM's interfaces, torch's or transformers' bases)
    model_classes = [
        c for c in cls.__mro__ if not c.__module__.startswith((interfaces.__name__, "torch.", "transformers."))
    ]
    out: dict[str, Any] = {}
    for role, names in (("encoder", MM_ENCODER_NAMES), ("merge", MM_MERGE_NAMES)):
        name = next((n for n in names if callable(getattr(protocol, n, None))), names[0])
        owner = next((c for c in cls.__mro__ if name in vars(c)), None)
        method = getattr(cls, name, None)
        entry: dict[str, Any] = {
            "name": name,
            "owner": None if owner is None else f"{owner.__module__}.{owner.__qualname__}",
            "interface": owner is None or owner.__module__ == interfaces.__name__,
            "legacy": [n for n in names if n != name and any(n in vars(c) for c in model_classes)],
        }
        if role == "merge" and callable(method) and not entry["interface"]:
            entry["params"] = _params(method)
            entry["accepts"] = {kw: bool(supports_kw(method, kw)) for kw in MM_MERGE_KWARGS}
            entry["unread"] = _unread_params(method, MM_MERGE_KWARGS)
        out[role] = entry
    return out


def load_class(target: str) -> tuple[type | None, dict[str, Any]]:
    """Import ``module:Class`` under a CUDA-init watch; return (class, record)."""
    module_name, _, cls_name = target.partition(":")
    record: dict[str, Any] = {"target": target}
    already = module_name in sys.modules
    watch = CudaInitWatch()
    try:
        with watch:
            module = importlib.import_module(module_name)
            cls = getattr(module, cls_name)
    except BaseException as exc:  # SystemExit from a module is a failure too
        record["import_error"] = format_exc(exc)
        record["import_error_summary"] = f"{type(exc).__name__}: {exc}"
        cls = None
    module_file = getattr(sys.modules.get(module_name), "__file__", None)
    if module_file is None:
        try:
            spec = importlib.util.find_spec(module_name)
            module_file = spec.origin if spec else None
        except (ImportError, ValueError):
            module_file = None
    record["module_file"] = module_file
    record["imported_before"] = already
    if watch.stack is not None:
        record["cuda_init_at_import"] = watch.user_frames(module_file)
    return cls, record


# vLLM's registry, when importing a lazily registered class failed in its inspection subprocess
# (``_LazyRegisteredModel.inspect_model_cls``): that subprocess's traceback only went to the log
_NOT_INSPECTED = re.compile(r"Model architectures (\[[^\]]*\]) failed to be inspected")


def uninspectable_classes(error: str) -> list[dict[str, Any]]:
    """vLLM said only that the architectures ``failed to be inspected``: import each one's registered
    class here, as the import pass does (:func:`load_class`), for the error vLLM's subprocess hid.
    ``[{"architecture", "target", "import_error", "import_error_summary", "module_file"}]`` for the
    classes that fail to import; [] when ``error`` is not that refusal or nothing fails here."""
    found = _NOT_INSPECTED.search(error)
    if found is None:
        return []
    try:
        archs = ast.literal_eval(found.group(1))
    except (ValueError, SyntaxError):
        return []
    registry = registry_snapshot()
    out: list[dict[str, Any]] = []
    for arch in archs if isinstance(archs, list) else []:
        target = registry.get(str(arch))
        if not target or target == "?":
            continue
        _cls, record = load_class(target)
        if record.get("import_error") is not None:
            out.append({"architecture": str(arch), **record})
    return out


def vllm_config_model_types() -> list[str]:
    """model_types in vLLM's own config registry now (plugins may add to it at import time)."""
    try:
        from vllm.transformers_utils import config as vllm_config
    except Exception:
        return []
    registry = getattr(vllm_config, "_CONFIG_REGISTRY", None)
    return sorted(str(k) for k in registry) if isinstance(registry, dict) else []


def config_verdict(model_dir: str, trust_remote_code: bool) -> dict[str, Any]:
    """vLLM's own verdict on the model directory's config, loaded the way ``vllm serve`` loads it
    (``EngineArgs.create_model_config``): ``{"ok", "model_type", "architectures"}`` or ``{"ok":
    False, "error"}``. Its verdict wins over the doctor's tables."""
    from vllm_doctor.compat.common import describe_exception

    try:
        from vllm.engine.arg_utils import EngineArgs

        model_config = EngineArgs(model=model_dir, trust_remote_code=trust_remote_code).create_model_config()
    except Exception as exc:
        return {"ok": False, "error": describe_exception(exc, limit=3000), "type": type(exc).__name__}
    hf = getattr(model_config, "hf_config", None)
    out: dict[str, Any] = {
        "ok": True,
        "model_type": getattr(hf, "model_type", None),
        "config_class": None if hf is None else qualname(hf),
        "architectures": [str(a) for a in getattr(model_config, "architectures", None) or []],
    }
    try:
        mm = multimodal_dummy_inputs(model_config)
    except Exception as exc:  # the doctor's own question failed: say so, keep the verdict
        mm = {"ok": False, "stage": "doctor", "error": describe_exception(exc, limit=2000)}
    if mm is not None:
        out["multimodal"] = mm
    if hf is not None:
        vision = vision_config(hf)
        if vision is not None:
            out["vision"] = vision
    return out


VISION_SIZES = ("hidden_size", "num_hidden_layers", "image_size", "patch_size")


def vision_config(hf: Any) -> dict[str, Any] | None:
    """Where the loaded HF config keeps its vision tower's settings, with their values: a
    ``vision_config`` sub-config (transformers' LLaVA, Qwen-VL, ...), or flat ``vision_*``
    fields. A config class fills either from its defaults when config.json lacks them (LLaVA's
    builds a default CLIP ViT-L/14), which VD112 compares with config.json. None: neither."""

    def plain(value: Any) -> Any:
        return value if isinstance(value, int | float | str | bool) or value is None else repr(value)

    sub = getattr(hf, "vision_config", None)
    if sub is not None:
        values = {k: plain(getattr(sub, k)) for k in VISION_SIZES if hasattr(sub, k)}
        return {"source": "vision_config", "config_class": qualname(sub), "values": values}
    flat = {k: plain(v) for k, v in vars(hf).items() if k.startswith("vision_") and not k.startswith("vision_config")}
    if flat:
        return {"source": "flat", "config_class": qualname(hf), "values": flat}
    return None


def multimodal_dummy_inputs(model_config: Any) -> dict[str, Any] | None:
    """For a model vLLM treats as multimodal: build its multimodal processor from the model
    directory and feed it the dummy inputs vLLM feeds at start-up (one item per modality it
    supports), as vLLM sizes its encoder budget (``vllm/multimodal/encoder_budget.py``): the
    processor (processing info, dummy-inputs builder, the model dir's processor files and
    tokenizer) and its prompt update run on the same code path. None for a text model.

    ``{"ok", "stage", "error", "traceback", "modalities", "tokens_per_item", "declares_max_tokens"}``:
    ``stage`` is where it failed (``processor``: building it; ``info``: its supported
    modalities; ``dummy_inputs``: processing the dummy prompt and items); ``declares_max_tokens``
    whether the processing info gives ``get_mm_max_tokens_per_item`` (then vLLM skips this build
    at start-up and the same failure comes with every request instead)."""
    from vllm_doctor.compat.common import describe_exception, format_exc

    if not getattr(model_config, "is_multimodal_model", False):
        return None
    from vllm.multimodal import MULTIMODAL_REGISTRY

    out: dict[str, Any] = {"ok": False, "modalities": [], "tokens_per_item": {}, "declares_max_tokens": None}

    def failed(stage: str, exc: Exception) -> dict[str, Any]:
        out.update(stage=stage, error=describe_exception(exc, limit=2000), traceback=format_exc(exc, limit=6000))
        return out

    try:
        processor = MULTIMODAL_REGISTRY.create_processor(model_config)
    except Exception as exc:
        return failed("processor", exc)
    try:
        counts = {str(m): 1 for m in processor.info.get_supported_mm_limits()}
        out["modalities"] = sorted(counts)
    except Exception as exc:
        return failed("info", exc)
    try:  # the placeholder as the tokenizer reads it (what the prompt update must find)
        text = processor.dummy_inputs.get_dummy_text(counts)
        out["placeholder_text"] = text
        out["placeholder_ids"] = [int(i) for i in processor.info.get_tokenizer().encode(text, add_special_tokens=False)]
    except Exception:
        pass  # a builder or tokenizer that fails here fails below too, with the traceback
    try:
        declared = processor.info.get_mm_max_tokens_per_item(seq_len=model_config.max_model_len, mm_counts=counts)
        out["declares_max_tokens"] = declared is not None
    except Exception as exc:
        return failed("info", exc)
    try:
        # vLLM >= 0.27 asks the processor; 0.26 its registry (encoder_budget.get_mm_max_toks_per_item)
        if callable(getattr(processor, "get_dummy_mm_inputs", None)):
            inputs = processor.get_dummy_mm_inputs(counts)
        else:
            registry: Any = MULTIMODAL_REGISTRY
            inputs = registry.get_dummy_mm_inputs(model_config, mm_counts=counts, processor=processor)
        out["tokens_per_item"] = {
            str(m): sum(int(p.get_num_embeds()) for p in items) for m, items in inputs["mm_placeholders"].items()
        }
    except Exception as exc:
        return failed("dummy_inputs", exc)
    out["ok"] = True
    return out


def cuda_initialized() -> bool | None:
    """Has anything in this process initialised CUDA? (None: torch cannot tell)"""
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return None

"""Read vLLM's and transformers' lookup tables from their source files, without importing them.

``import vllm`` plus its model registry costs 4-13 s; the doctor's fast pass must answer
"is this architecture registered?" in well under 2 s. The tables we need are plain dict
literals in the installed source, so we parse them with :mod:`ast`. Capability first: if the
expected assignment is not found (a future refactor), the caller gets ``None`` and falls back
to the import path, which is always correct, only slower.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_doctor.facts.static import is_transformers_backend


def find_module_file(dotted: str) -> Path | None:
    """Locate a module's source file WITHOUT executing any package ``__init__``.

    ``importlib.util.find_spec("a.b")`` imports ``a`` first; walking the path finders by hand
    does not, so a plugin whose package imports vLLM (or is broken) costs nothing here.
    """
    parts = dotted.split(".")
    search: list[str] | None = None
    spec = None
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None and i == 0:
            spec = _editable_spec(part)  # `pip install -e` packages live behind a meta-path finder
        if spec is None:
            return None
        if i < len(parts) - 1:
            locations = spec.submodule_search_locations
            if not locations:
                return None
            search = list(locations)
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    path = Path(spec.origin)
    return path if path.suffix == ".py" and path.is_file() else None


def _editable_spec(name: str) -> Any:
    """Ask setuptools' editable-install finder (it maps top-level names to source folders
    without importing anything): PathFinder alone misses every `pip install -e` package."""
    import sys

    for finder in sys.meta_path:
        names = f"{getattr(finder, '__module__', '')} {getattr(finder, '__name__', '')} {type(finder).__name__}"
        if "editable" not in names.lower():
            continue
        try:
            spec = finder.find_spec(name, None)
        except Exception:
            continue
        if spec is not None:
            return spec
    return None


def _literal(node: ast.AST, env: dict[str, Any]) -> Any:
    """Evaluate dict/tuple/str literals, ``OrderedDict(...)`` and ``**name`` merges."""
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:  # {**OTHER}
                merged = _literal(value, env)
                if not isinstance(merged, dict):
                    raise ValueError("unmergeable")
                out.update(merged)
            else:
                out[_literal(key, env)] = _literal(value, env)
        return out
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_literal(elt, env) for elt in node.elts)
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.Call):
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if fname in ("OrderedDict", "dict", "LazyConfigDict"):
            out = {}
            for arg in node.args:
                value = _literal(arg, env)
                out.update(dict(value) if isinstance(value, tuple) else value)
            for kw in node.keywords:
                if kw.arg is None:
                    out.update(_literal(kw.value, env))
                else:
                    out[kw.arg] = _literal(kw.value, env)
            return out
    if isinstance(node, ast.DictComp | ast.ListComp | ast.SetComp):
        # e.g. ``{k: v for k, v in _TEXT_GENERATION_MODELS.items() if ...}``: this is the
        # installed package's own code (the import path would run it too), evaluated over the
        # tables read so far with no builtins.
        code = compile(ast.Expression(body=node), "<vllm-table>", "eval")
        try:
            return eval(code, {"__builtins__": {}}, dict(env))
        except Exception as exc:
            raise ValueError(f"comprehension not evaluable: {exc}") from exc
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def read_dict_literals(
    path: Path, names: set[str] | None = None, seed: dict[str, Any] | None = None
) -> dict[str, dict[Any, Any]]:
    """Top-level ``NAME = <dict literal>`` assignments of a source file (and ``NAME.update``).

    ``seed`` supplies names the file imports from elsewhere (read from their own files first).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    env: dict[str, Any] = dict(seed or {})
    for stmt in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        elif (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute)
            and stmt.value.func.attr == "update"
            and isinstance(stmt.value.func.value, ast.Name)
            and stmt.value.func.value.id in env
        ):
            try:
                for arg in stmt.value.args:
                    env[stmt.value.func.value.id].update(_literal(arg, env))
            except (ValueError, TypeError):
                pass
            continue
        if isinstance(target, ast.Name) and value is not None:
            try:
                result = _literal(value, env)
            except (ValueError, TypeError, KeyError):
                continue
            if isinstance(result, dict):
                env[target.id] = result
    if names is None:
        return env
    return {k: v for k, v in env.items() if k in names}


@dataclass
class RegistryTables:
    """vLLM's built-in architecture table, as read from its source."""

    builtin: dict[str, tuple[str, str]]  # arch -> (module, class)
    transformers_backend_archs: set[str]  # archs served by vLLM's Transformers backend
    previously_supported: dict[str, str] = field(default_factory=dict)  # arch -> last version
    out_of_tree: dict[str, str] = field(default_factory=dict)  # arch -> plugin URL
    config_registry: set[str] = field(default_factory=set)  # model_types vLLM ships configs for


def vllm_package_dir() -> Path | None:
    spec = importlib.machinery.PathFinder.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def read_vllm_registry_tables(root: Path | None = None) -> RegistryTables | None:
    """Built-in architectures from ``vllm/model_executor/models/registry.py``; None if unreadable.

    ``root`` is a ``vllm`` package directory (default: the installed one; a test reads an
    unpacked wheel of another release).
    """
    root = root or vllm_package_dir()
    if root is None:
        return None
    path = root / "model_executor" / "models" / "registry.py"
    if not path.is_file():
        return None
    try:
        tables = read_dict_literals(path)
    except (SyntaxError, OSError, UnicodeDecodeError):
        return None
    models = tables.get("_VLLM_MODELS")
    if not isinstance(models, dict) or not models:
        return None
    builtin: dict[str, tuple[str, str]] = {}
    for arch, target in models.items():
        if not (isinstance(target, tuple) and len(target) == 2):
            return None  # the table's shape changed: let the import path answer
        module, cls = target
        builtin[arch] = (module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}", cls)
    backend = {arch for arch, (module, _cls) in builtin.items() if is_transformers_backend(module)}
    config_registry: set[str] = set()
    config_py = root / "transformers_utils" / "config.py"
    if config_py.is_file():
        try:
            config_registry = set(read_dict_literals(config_py, {"_CONFIG_REGISTRY"}).get("_CONFIG_REGISTRY", {}))
        except (SyntaxError, OSError, UnicodeDecodeError):
            config_registry = set()
    return RegistryTables(
        builtin=builtin,
        transformers_backend_archs=backend,
        previously_supported=dict(tables.get("_PREVIOUSLY_SUPPORTED_MODELS", {})),
        out_of_tree=dict(tables.get("_OOT_SUPPORTED_MODELS", {})),
        config_registry=config_registry,
    )


def read_vllm_quantization_methods(root: Path | None = None) -> list[str] | None:
    """The quantization methods vLLM knows (``QuantizationMethods``, the ``Literal`` of
    ``vllm/model_executor/layers/quantization/__init__.py`` that its ``QUANTIZATION_METHODS`` and
    ``ModelConfig``'s "Unknown quantization method" check read), without importing vLLM; None if
    unreadable. A plugin's ``register_quantization_config`` adds to it at run time."""
    root = root or vllm_package_dir()
    path = None if root is None else root / "model_executor" / "layers" / "quantization" / "__init__.py"
    if path is None or not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, OSError, UnicodeDecodeError):
        return None
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "QuantizationMethods" for t in stmt.targets)
            and isinstance(stmt.value, ast.Subscript)
        ):
            elts = stmt.value.slice.elts if isinstance(stmt.value.slice, ast.Tuple) else [stmt.value.slice]
            names = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            return names or None
    return None


def read_transformers_model_types() -> set[str] | None:
    """``model_type`` strings the installed transformers knows (CONFIG_MAPPING_NAMES)."""
    names: dict[str, Any] = {}
    for dotted in (
        "transformers.models.auto.auto_mappings",  # transformers >= 5
        "transformers.models.auto.configuration_auto",
    ):
        path = find_module_file(dotted)
        if path is None:
            continue
        try:
            seed = {"CONFIG_MAPPING_NAMES": dict(names)} if names else None
            names = read_dict_literals(path, {"CONFIG_MAPPING_NAMES"}, seed).get("CONFIG_MAPPING_NAMES", names)
        except (SyntaxError, OSError, UnicodeDecodeError):
            continue
    return set(names) or None


def read_transformers_class_names() -> set[str] | None:
    """Public model class names that ``getattr(transformers, name)`` would resolve.

    Read from the per-model ``__all__`` lists of ``transformers/models/*/modeling_*.py``.
    """
    path = find_module_file("transformers")
    if path is None:
        return None
    models_dir = path.parent / "models"
    if not models_dir.is_dir():
        return None
    found: set[str] = set()
    for modeling in models_dir.glob("*/modeling_*.py"):
        try:
            text = modeling.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        marker = text.rfind("__all__")
        if marker < 0:
            continue
        try:
            node = ast.parse(text[marker:]).body[0]
        except SyntaxError:
            continue
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List | ast.Tuple):
            found.update(e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return found or None


def read_transformers_sub_configs(model_type: str) -> set[str] | None:
    """The sub-configs (``sub_configs = {"text_config": ..., "vision_config": ...}``) of the config
    class transformers has for ``model_type``, read from ``transformers/models/<type>/
    configuration_<type>.py``; None when there is no such file or it does not say. A declared
    ``vision_config`` that config.json leaves out is built from the class's defaults."""
    if not model_type.replace("_", "").isalnum():
        return None
    path = find_module_file(f"transformers.models.{model_type}.configuration_{model_type}")
    if path is None:
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, OSError, UnicodeDecodeError):
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "sub_configs" and isinstance(value, ast.Dict):
            found.update(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return found or None

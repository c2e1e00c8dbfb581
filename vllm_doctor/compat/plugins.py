"""vLLM's general plugins: which entry points exist, which vLLM would load, what they register.

Mirrors ``vllm.plugins.load_plugins_by_group`` (group ``vllm.general_plugins``, filtered by
``VLLM_PLUGINS`` split on commas) without importing vLLM. The static scan reads each plugin
function's source and collects ``register_model(...)`` and ``AutoConfig.register(...)`` calls
whose arguments are literals; anything dynamic is flagged so the import pass decides.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
from collections.abc import Mapping
from pathlib import Path

from vllm_doctor.compat.source_tables import find_module_file
from vllm_doctor.facts.plugins import PluginInfo, Registration

GENERAL_PLUGINS_GROUP = "vllm.general_plugins"


def allowed_plugin_names(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """``VLLM_PLUGINS`` exactly as vLLM parses it: unset -> None (all), else comma split."""
    env = os.environ if environ is None else environ
    if "VLLM_PLUGINS" not in env:
        return None
    return env["VLLM_PLUGINS"].split(",")


def discover_general_plugins(environ: Mapping[str, str] | None = None) -> list[PluginInfo]:
    allowed = allowed_plugin_names(environ)
    plugins: list[PluginInfo] = []
    for ep in importlib.metadata.entry_points(group=GENERAL_PLUGINS_GROUP):
        dist = getattr(ep, "dist", None)
        info = PluginInfo(
            name=ep.name,
            value=ep.value,
            distribution=dist.metadata["Name"] if dist is not None else None,
            allowed=allowed is None or ep.name in allowed,
        )
        scan_plugin(info)
        plugins.append(info)
    return plugins


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        base = func.value
        prefix = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        return f"{prefix}.{func.attr}"
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted origin, for ``from x import Y`` anywhere in the module."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def scan_plugin(info: PluginInfo) -> None:
    module_name, _, attr = info.value.partition(":")
    path = find_module_file(module_name.strip())
    if path is None:
        info.problem = f"module {module_name!r} not found on sys.path"
        return
    info.module_file = str(path)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, OSError, UnicodeDecodeError) as exc:
        info.problem = f"cannot parse {path}: {exc}"
        return
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    attr = attr.strip()
    if attr and attr not in functions:
        # could still be an assignment or re-export; the import pass decides
        assigned = any(
            isinstance(n, ast.Assign | ast.ImportFrom)
            and attr
            in (
                {t.id for t in n.targets if isinstance(t, ast.Name)}
                if isinstance(n, ast.Assign)
                else {a.asname or a.name for a in n.names}
            )
            for n in tree.body
        )
        if not assigned:
            info.problem = f"{module_name} has no function {attr!r}"
            return
        info.dynamic = True
        return
    info.function_found = True
    imported = _imported_names(tree)
    # follow calls from the entry function into same-module helpers (one level is typical)
    # entry point "module:function" -> that function; plain "module" -> its top-level code
    module_code = ast.Module(body=[n for n in tree.body if not isinstance(n, ast.FunctionDef)], type_ignores=[])
    todo: list[ast.AST] = [functions[attr]] if attr else [module_code]
    seen: set[str] = set()
    while todo:
        fn = todo.pop()
        key = getattr(fn, "name", "<module>")
        if key in seen:
            continue
        seen.add(key)
        for node in ast.walk(fn):
            reg = _vllm_config_registry_assignment(node, imported)
            if reg is not None:
                info.vllm_config_registrations.append(reg)
                continue
            if not isinstance(node, ast.Call):
                continue
            cname = _call_name(node)
            if cname in functions and cname not in seen:
                todo.append(functions[cname])
            where = f"{path}:{node.lineno}"
            if cname.endswith("register_model"):
                if (
                    len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    target = node.args[1]
                    if isinstance(target, ast.Constant) and isinstance(target.value, str):
                        info.registrations.append(Registration(node.args[0].value, target.value, True, where))
                    elif isinstance(target, ast.Name):
                        origin = imported.get(target.id, f"{module_name}.{target.id}")
                        info.registrations.append(Registration(node.args[0].value, origin, False, where))
                    else:
                        info.dynamic = True
                else:
                    info.dynamic = True
            elif cname.endswith("AutoConfig.register") or cname == "AutoConfig.register":
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    cls = node.args[1] if len(node.args) > 1 else None
                    cls_name = imported.get(cls.id, cls.id) if isinstance(cls, ast.Name) else "?"
                    info.config_registrations.append((node.args[0].value, cls_name))
                else:
                    info.dynamic = True


def _vllm_config_registry_assignment(node: ast.AST, imported: dict[str, str]) -> tuple[str, str] | None:
    """``_CONFIG_REGISTRY["mt"] = Cls`` (vLLM's own config registry, as some plugins fill it)."""
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return None
    target = node.targets[0]
    if not isinstance(target, ast.Subscript):
        return None
    base = target.value
    base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    key = target.slice
    if base_name != "_CONFIG_REGISTRY" or not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    cls = node.value
    return key.value, imported.get(cls.id, cls.id) if isinstance(cls, ast.Name) else "?"


_QUANT_REGISTRATION = re.compile(r"register_quantization_config\s*\(\s*(?:(['\"])([^'\"]+)\1)?")
_SCAN_FILES = 200  # source files of one plugin package read for quantization registrations
_SCAN_BYTES = 512 * 1024  # of each file


def plugin_quantization_methods(plugins: list[PluginInfo]) -> set[str] | None:
    """The quantization methods the allowed plugins register (vLLM's ``register_quantization_config``
    decorator, mostly in a module the plugin function imports), read from their packages' source;
    None when a call names its method other than by a literal, or a package is larger than the
    scan reads (the import pass decides then)."""
    names: set[str] = set()
    for plugin in plugins:
        if not plugin.allowed or not plugin.module_file:
            continue
        module = Path(plugin.module_file)
        files = sorted(module.parent.rglob("*.py")) if module.name == "__init__.py" else [module]
        if len(files) > _SCAN_FILES:
            return None
        for path in files:
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(_SCAN_BYTES + 1)
            except OSError:
                continue
            if len(raw) > _SCAN_BYTES:
                return None
            for match in _QUANT_REGISTRATION.finditer(raw.decode("utf-8", "replace")):
                if match.group(2) is None:
                    return None
                names.add(match.group(2))
    return names

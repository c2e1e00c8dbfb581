"""Find ``register_model`` calls in a user's script and the scope each runs in (for VD102).

Spawned engine processes re-import the main script as ``__mp_main__``: code at module level
runs there, code under ``if __name__ == "__main__":`` or inside a function does not.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from vllm_doctor.compat.plugins import scan_plugin
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts.plugins import PluginInfo


def _imported_functions(tree: ast.Module) -> dict[str, str]:
    """Local name -> "module:function" for ``from module import function`` in the script."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return out


def _registrations_behind(value: str) -> list[tuple[str, str, str]]:
    """(arch, target, where) registered by calling ``module:function`` (static scan)."""
    info = PluginInfo(name=value, value=value, distribution=None, allowed=True)
    scan_plugin(info)
    return [(r.arch, r.target, r.where) for r in info.registrations]


def _is_main_guard(node: ast.If) -> bool:
    test = node.test
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def scan_script(path: str | Path) -> list[dict[str, Any]]:
    """[{arch, target, scope, where}] with scope "module", "function NAME" or "the __main__ guard"."""
    file = Path(path)
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except FileNotFoundError as exc:
        raise DoctorInputError(f"{file}: no such script") from exc
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise DoctorInputError(f"{file}: cannot parse as Python: {exc}") from exc
    found: list[dict[str, Any]] = []
    imported = _imported_functions(tree)

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            child_scope = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                child_scope = f"function {child.name}()"
            elif isinstance(child, ast.If) and scope == "module" and _is_main_guard(child):
                child_scope = "the `if __name__ == '__main__':` block"
            if isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Attribute) and func.attr == "register_model" and child.args:
                    arch_node = child.args[0]
                    target_node = child.args[1] if len(child.args) > 1 else None
                    found.append(
                        {
                            "arch": arch_node.value if isinstance(arch_node, ast.Constant) else ast.unparse(arch_node),
                            "target": target_node.value
                            if isinstance(target_node, ast.Constant)
                            else (ast.unparse(target_node) if target_node is not None else ""),
                            "scope": scope,
                            "where": f"{file}:{child.lineno}",
                        }
                    )
                elif isinstance(func, ast.Name) and func.id in imported:
                    # a helper such as `register()` from the user's package: look inside it
                    for arch, target, where in _registrations_behind(imported[func.id]):
                        found.append(
                            {
                                "arch": arch,
                                "target": target,
                                "scope": scope,
                                "where": f"{file}:{child.lineno}",
                                "via": f"{func.id}() at {where}",
                            }
                        )
            visit(child, child_scope)

    visit(tree, "module")
    return found

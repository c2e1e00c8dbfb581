"""What a model class's ``forward`` does in Python, read from its source (stdlib only).

The performance lint (VD604-VD606) reads the source of each model class in the built module tree:
the code ``forward`` reaches (its own body, the ``self.<method>()`` calls it makes, and the
functions of the same module it calls by name), never ``__init__`` or ``load_weights``. It looks
for three things the module tree cannot show:

- a Python ``for`` loop (or comprehension) over attention heads, tokens or sequences: one kernel
  launch per iteration where vLLM's layers run one batched op; loops over the model's own module
  containers (``for layer in self.layers``) are how every decoder runs and are not reported;
- a float32 island: the input of a large projection or a matmul cast to float32 (``.float()``,
  ``.to(torch.float32)``) inside a bf16/fp16 model;
- attention computed by hand (``scaled_dot_product_attention``, flash-attn's functions) instead
  of vLLM's ``Attention`` layer, which owns the paged KV cache and the attention backend.

The scan is pure (stdlib only): the caller (:mod:`vllm_doctor.compat.perf`, inside the doctor's
child or the engine worker, where the class is already imported) hands it the module's source
text; nothing here imports or runs model code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict

from vllm_doctor.facts.perf import SourceFinding

# names of callables that compute attention outside vLLM's Attention layer
ATTENTION_CALLS = frozenset(
    {
        "scaled_dot_product_attention",
        "flash_attn_func",
        "flash_attn_varlen_func",
        "flash_attn_with_kvcache",
        "memory_efficient_attention",
    }
)
MATMUL_CALLS = frozenset({"matmul", "bmm", "mm", "einsum", "linear", "baddbmm", "addmm"})
_FLOAT32 = frozenset({"float32", "float"})
# what a loop's iterable says it walks (the first pattern that matches names it)
_OVER = (
    ("heads", re.compile(r"head", re.I)),
    (
        "tokens or sequences",
        re.compile(r"token|seq|batch|num_reqs|query_start|positions|\.shape\[0\]|\.size\(0\)|len\(", re.I),
    ),
    ("slices of a tensor", re.compile(r"\.(unbind|split|chunk|tensor_split)\(")),
)
_LAYER_LOOP = re.compile(r"layer", re.I)
MAX_DEPTH = 4  # calls followed from forward


def _call_name(node: ast.AST) -> str:
    """``torch.nn.functional.scaled_dot_product_attention`` -> its last name; ``f`` -> ``f``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _self_attr(node: ast.AST) -> str | None:
    """``self.NAME`` -> NAME."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _is_float32_cast(node: ast.AST) -> str | None:
    """The cast's source when ``node`` is ``x.float()``, ``x.to(torch.float32)``, ``x.to(dtype=torch.float)``."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    method = node.func.attr
    if method in ("float", "double") and not node.args:
        return ast.unparse(node)
    if method in ("to", "type"):
        targets = [*node.args, *(k.value for k in node.keywords if k.arg == "dtype")]
        for t in targets:
            if _call_name(t) in _FLOAT32 or _call_name(t) == "float64":
                return ast.unparse(node)
    return None


def _iterates_container(node: ast.AST, containers: set[str]) -> bool:
    """Does the loop walk one of the model's module containers (``self.layers``, ``self.layers[a:b]``,
    ``enumerate(self.layers)``, ``islice(self.layers, ...)``, ``zip(self.experts, ...)``)?"""
    for sub in ast.walk(node):
        name = _self_attr(sub)
        if name is not None and name in containers:
            return True
    return False


def _loop_over(iter_node: ast.AST, containers: set[str]) -> str | None:
    """What a loop walks, when it is one the lint reports; None for module-container and layer loops."""
    if _iterates_container(iter_node, containers):
        return None
    text = ast.unparse(iter_node)
    if _LAYER_LOOP.search(text):
        return None
    for what, pattern in _OVER:
        if pattern.search(text):
            return what
    return None


def _head(node: ast.AST, source_lines: list[str]) -> str:
    lineno = getattr(node, "lineno", 0)
    line = source_lines[lineno - 1].strip() if 0 < lineno <= len(source_lines) else ""
    return line[:160]


class _Scanner:
    def __init__(self, source: str, filename: str, containers: set[str], projections: set[str]) -> None:
        self.tree = ast.parse(source)
        self.lines = source.splitlines()
        self.filename = filename
        self.containers = containers
        self.projections = projections
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def class_def(self, name: str) -> ast.ClassDef | None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None

    def reachable(self, cls: ast.ClassDef) -> Iterator[tuple[str, ast.AST]]:
        """(name, function node) of forward and what it calls: self methods, same-module functions."""
        methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if "forward" not in methods:
            return
        seen: set[str] = set()
        todo: list[tuple[str, ast.AST, int]] = [("forward", methods["forward"], 0)]
        while todo:
            name, fn, depth = todo.pop(0)
            if name in seen:
                continue
            seen.add(name)
            yield name, fn
            if depth >= MAX_DEPTH:
                continue
            for sub in ast.walk(fn):
                if not isinstance(sub, ast.Call):
                    continue
                attr = _self_attr(sub.func)
                if attr is not None and attr in methods and attr not in seen:
                    todo.append((attr, methods[attr], depth + 1))
                elif isinstance(sub.func, ast.Name) and sub.func.id in self.functions and sub.func.id not in seen:
                    todo.append((sub.func.id, self.functions[sub.func.id], depth + 1))

    def scan(self, cls_name: str) -> list[SourceFinding]:
        cls = self.class_def(cls_name)
        if cls is None:
            return []
        out: list[SourceFinding] = []
        for fname, fn in self.reachable(cls):
            out.extend(self._scan_function(cls_name, fname, fn))
        return out

    def _finding(self, kind: str, cls: str, fname: str, node: ast.AST, detail: str) -> SourceFinding:
        return SourceFinding(
            kind, cls, fname, getattr(node, "lineno", 0), self.filename, _head(node, self.lines), detail
        )

    def _scan_function(self, cls: str, fname: str, fn: ast.AST) -> Iterable[SourceFinding]:
        for node in ast.walk(fn):
            if isinstance(node, (ast.For, ast.AsyncFor)):
                over = _loop_over(node.iter, self.containers)
                if over:
                    yield self._finding("loop", cls, fname, node, over)
            elif isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
                for gen in node.generators:
                    over = _loop_over(gen.iter, self.containers)
                    if over:
                        yield self._finding("loop", cls, fname, node, over)
                        break
            elif isinstance(node, ast.Call):
                name = _call_name(node.func)
                if name in ATTENTION_CALLS:
                    yield self._finding("attention", cls, fname, node, name)
                    continue
                target = _self_attr(node.func)
                if (target is not None and target in self.projections) or name in MATMUL_CALLS:
                    for arg in node.args:
                        cast = _is_float32_cast(arg)
                        if cast:
                            yield self._finding("float32", cls, fname, node, cast)
                            break
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                for operand in (node.left, node.right):
                    cast = _is_float32_cast(operand)
                    if cast:
                        yield self._finding("float32", cls, fname, node, cast)
                        break


def scan_class(
    source: str,
    cls_name: str,
    *,
    filename: str = "",
    containers: Iterable[str] = (),
    projections: Iterable[str] = (),
    first_line: int = 1,
) -> list[SourceFinding]:
    """The loops, float32 casts and hand-written attention on ``cls_name``'s forward path.

    ``source``: the text of the module that defines the class (``first_line``: the line it starts
    at in ``filename``, 1 for a whole file). ``containers``: the instance's attributes that hold
    modules (ModuleList, ModuleDict, Sequential): loops over them are not reported.
    ``projections``: attributes that are large projections (a float32 input to them is an island).
    A source that does not parse gives no findings."""
    try:
        scanner = _Scanner(source, filename, set(containers), set(projections))
    except (SyntaxError, ValueError):
        return []
    found = scanner.scan(cls_name)
    if first_line != 1:
        found = [SourceFinding(**{**asdict(f), "line": f.line + first_line - 1}) for f in found]
    return found

"""Regular expressions from the user's files, run with a bound.

A quantization config names modules by pattern: compressed-tensors' ``ignore`` and ``targets``
entries ``re:PATTERN``, GPTQ's ``dynamic`` keys ``+:PATTERN`` / ``-:PATTERN``; vLLM matches each
against every layer's name with Python's ``re`` (``re.match``), which backtracks: ``(.|.)*Z``
takes time exponential in the name's length, ``.*.*.*.*.*Z`` a high power of it, and Python
cannot interrupt a match from another thread. vllm-doctor therefore runs a pattern from the
user's files only when its shape bounds the work (:func:`pattern_problem`):

- at most :data:`MAX_PATTERN_CHARS` characters;
- no backreference (``\\1``, ``(?P=name)``, ``(?(1)...)``);
- no repetition inside a repetition (``(\\w+\\.)*``, ``(a{2})+``) and no alternatives inside a
  repetition (``(a|ab)*``, ``(.|.)*``): the shapes whose backtracking is exponential;
- at most :data:`MAX_UNBOUNDED` unbounded repetitions (``*``, ``+``, ``{n,}``) in all, so that
  the work is at most a cubic of the name's length; names over :data:`MAX_NAME_CHARS`
  characters are not matched.

A pattern over the bound is never run (:func:`bounded_match` returns None) and is a finding
(VD316); vLLM itself would spend the same time in it at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from re import _constants as sre_c  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

MAX_PATTERN_CHARS = 256
MAX_UNBOUNDED = 3
MAX_NAME_CHARS = 512
# where vLLM reads patterns in a quantization config: the prefix that marks one, by its role
PATTERN_PREFIXES = ("re:", "+:", "-:")
_REPEATS = tuple(
    getattr(sre_c, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(sre_c, name)
)


class _Over(Exception):
    """The pattern's shape is over the bound (the message says which part)."""


def _walk(items: Any, in_repeat: bool, unbounded: list[int]) -> None:
    """Raise :class:`_Over` at the first part of a parsed pattern that is over the bound."""
    for op, av in items:
        if op in (sre_c.GROUPREF, sre_c.GROUPREF_EXISTS):
            raise _Over("a backreference")
        if op in _REPEATS:
            _low, high, sub = av
            repeats = high == sre_c.MAXREPEAT or high > 1
            if repeats and in_repeat:
                raise _Over("a repetition inside a repetition")
            if high == sre_c.MAXREPEAT:
                unbounded[0] += 1
            _walk(sub, in_repeat or repeats, unbounded)
        elif op is sre_c.BRANCH:
            if in_repeat:
                raise _Over("alternatives inside a repetition")
            for alternative in av[1]:
                _walk(alternative, in_repeat, unbounded)
        elif op is sre_c.SUBPATTERN:
            _walk(av[-1], in_repeat, unbounded)
        elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            _walk(av[1], in_repeat, unbounded)
        elif op is getattr(sre_c, "ATOMIC_GROUP", None):
            _walk(av, in_repeat, unbounded)


def pattern_problem(pattern: str) -> str | None:
    """Why vllm-doctor does not run ``pattern`` (a regex from the user's files), or None.

    An invalid pattern is not this function's business (``re.error`` where it is compiled)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"it is {len(pattern):,} characters long (vllm-doctor runs at most {MAX_PATTERN_CHARS})"
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    unbounded = [0]
    try:
        _walk(parsed.data, False, unbounded)
    except _Over as over:
        return f"it has {over} (its matching time can grow exponentially with the name it is matched against)"
    except RecursionError:
        return "it nests groups too deeply"
    if unbounded[0] > MAX_UNBOUNDED:
        return (
            f"it has {unbounded[0]} unbounded repetitions (vllm-doctor runs at most {MAX_UNBOUNDED}: each multiplies "
            "the matching time by the name's length)"
        )
    return None


def bounded_match(pattern: str, name: str) -> bool | None:
    """``re.match(pattern, name)`` (as compressed-tensors and vLLM match) when the pattern is within
    the bound and valid; None when it was not run (over the bound, invalid, or a name too long)."""
    if len(name) > MAX_NAME_CHARS or pattern_problem(pattern) is not None:
        return None
    try:
        return re.match(pattern, name) is not None
    except (re.error, RecursionError, OverflowError):
        return None


def config_patterns(qconfig: Any, where: str = "quantization_config") -> Iterator[tuple[str, str]]:
    """Every pattern of a quantization config as (where, the whole entry): string values and dict
    keys starting with ``re:`` / ``+:`` / ``-:`` (compressed-tensors' ignore/targets, GPTQ's
    dynamic), at any depth (iterative: config.json's depth is bounded when it is read)."""
    stack: list[tuple[str, Any]] = [(where, qconfig)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if value.startswith(PATTERN_PREFIXES):
                yield path, value
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                if isinstance(key, str) and key.startswith(PATTERN_PREFIXES):
                    yield f"{path}.{key}", key
                stack.append((f"{path}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))


def unbounded_patterns(qconfig: Any) -> list[dict[str, str]]:
    """The patterns of a quantization config that vllm-doctor does not run: each ``{"key", "value",
    "why"}`` (key dotted as config.json nests it; value cut to 80 characters)."""
    out = []
    for where, entry in config_patterns(qconfig):
        why = pattern_problem(entry[2:] if entry.startswith(("+:", "-:")) else entry[3:])
        if why is not None:
            shown = entry if len(entry) <= 80 else f"{entry[:80]}... ({len(entry):,} characters)"
            out.append({"key": where, "value": shown, "why": why})
    return out

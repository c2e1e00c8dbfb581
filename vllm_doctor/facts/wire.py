"""Reading a worker's reply into a record: one lenient reader per wire type (stdlib only).

The worker-side collectors (:mod:`vllm_doctor.compat.worker_facts`) build the records of
:mod:`vllm_doctor.facts.placement`, :mod:`~vllm_doctor.facts.kv`, :mod:`~vllm_doctor.facts.memory`
and :mod:`~vllm_doctor.facts.anatomy` and send their ``to_wire()`` dict; the doctor's side reads
that dict back with the record's ``from_wire``. The two ends may be different doctor versions (a
served engine keeps the doctor it started with), so a decoder never raises on a reply's shape:
a field that is missing or of another type reads as its default (None, 0, empty), a field it does
not know is ignored, and a reply of a newer wire version is read for the fields this one knows.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

R = TypeVar("R")

VERSION_KEY = "wire_version"  # each record's wire version, in its to_wire() dict


def version(data: Mapping[str, Any]) -> int:
    """The reply's wire version: 0 for a reply of a doctor that sent none."""
    return opt_int(data.get(VERSION_KEY)) or 0


def mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}


def opt_int(value: Any) -> int | None:
    """An integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def opt_float(value: Any) -> float | None:
    """A number (an int is kept as it is), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def opt_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def int_list(value: Any) -> list[int]:
    """A list of integers (a shape), else empty: a list with anything else in it is not one."""
    if isinstance(value, (list, tuple)) and all(opt_int(v) is not None for v in value):
        return list(value)
    return []


def str_list(value: Any) -> list[str]:
    """The strings of a list (anything else in it dropped), else empty."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else []


def float_list(value: Any) -> list[float] | None:
    """A list of numbers, else None."""
    if isinstance(value, (list, tuple)) and all(opt_float(v) is not None for v in value):
        return list(value)
    return None


def int_map(value: Any) -> dict[str, int]:
    """The integer entries of a ``str -> int`` dict (counts by device, by dtype)."""
    return {k: v for k, v in mapping(value).items() if isinstance(k, str) and opt_int(v) is not None}


def records(value: Any, decode: Callable[[Mapping[str, Any]], R]) -> list[R]:
    """Each dict of a list, decoded (anything else in the list dropped)."""
    if not isinstance(value, (list, tuple)):
        return []
    return [decode(v) for v in value if isinstance(v, dict)]


def without_none(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less its None values: for the parts of a reply that list only what vLLM exposed."""
    return {k: v for k, v in data.items() if v is not None}


# --- records read and written from their declaration --------------------------------------------
# A frozen dataclass declares its fields once; ``read`` decodes a reply into it by the fields'
# annotations with the same tolerance as the helpers above, ``write`` encodes it, and
# ``json_schema`` declares it for docs/report-schema.json. No per-field key strings.

_NONE = type(None)

# A field's wire rules (its ``metadata``, made by :func:`rules`), for the replies whose shape
# predates the declared records:
_KEY = "wire_key"  # the reply's key for the field, where it is not the field's name
_WHOLE = "wire_whole"  # a list is read only if every item is of its type (a shape: no holes)
_EMPTY_NONE = "wire_empty_none"  # an optional record sent as {} reads as None (not sent)
_INLINE = "wire_inline"  # a record whose fields sit in the reply beside its owner's
_PREFIX = "wire_prefix"  # a dict whose entries sit in the reply as "<prefix><name>" keys
_OMIT = "wire_omit"  # written only when it is not the field's default
# a record class with this attribute true is written without its None fields (what vLLM exposed)
SPARSE = "WIRE_SPARSE"


def rules(
    *,
    key: str | None = None,
    whole: bool = False,
    empty_none: bool = False,
    inline: bool = False,
    prefix: str | None = None,
    omit_default: bool = False,
    doc: str | None = None,
) -> dict[str, Any]:
    """A field's ``metadata``: where :func:`read` and :func:`write` find it in a reply whose
    shape is not the field's plain name and type (the flags above), and its schema ``doc``."""
    given = {_KEY: key, _WHOLE: whole, _EMPTY_NONE: empty_none, _INLINE: inline, _PREFIX: prefix, _OMIT: omit_default}
    return {k: v for k, v in (given | {"doc": doc}).items() if v}


def _raw(f: dataclasses.Field[Any], data: Mapping[str, Any]) -> Any:
    """The reply's value for field ``f`` as sent (``_MISSING`` where it has none)."""
    if f.metadata.get(_INLINE):
        return data
    prefix = f.metadata.get(_PREFIX)
    if prefix:
        return {k[len(prefix) :]: v for k, v in data.items() if isinstance(k, str) and k.startswith(prefix)}
    return data.get(f.metadata.get(_KEY) or f.name, _MISSING)


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _zero(tp: Any) -> Any:
    """What a required field of type ``tp`` reads as when the reply lacks it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return None if _NONE in args else _zero(args[0])
    if origin in (list, tuple) or tp in (list, tuple):
        return [] if (origin or tp) is list else ()
    if origin is dict or tp is dict:
        return {}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return read(tp, {})
    return {int: 0, float: 0.0, str: "", bool: False}.get(tp)


_MISSING = object()


def _coerce(tp: Any, value: Any) -> Any:
    """``value`` as ``tp``, or ``_MISSING`` where it is not one (a container keeps what is)."""
    if tp is Any or tp is object:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and _NONE in args:
            return None
        for arg in args:
            if arg is _NONE:
                continue
            out = _coerce(arg, value)
            if out is not _MISSING:
                return out
        return _MISSING
    if origin is typing.Literal:
        return value if value in args else _MISSING
    if tp is bool:
        return value if isinstance(value, bool) else _MISSING
    if tp is int:
        return value if opt_int(value) is not None else _MISSING
    if tp is float:
        return value if opt_float(value) is not None else _MISSING
    if tp is str:
        return value if isinstance(value, str) else _MISSING
    if origin is list or origin is tuple:
        if not isinstance(value, (list, tuple)):
            return _MISSING
        item = args[0] if args else Any
        kept = [c for c in (_coerce(item, v) for v in value) if c is not _MISSING]
        return kept if origin is list else tuple(kept)
    if origin is dict:
        if not isinstance(value, dict):
            return _MISSING
        key_tp, value_tp = args if args else (Any, Any)
        kept_items: dict[Any, Any] = {}
        for k, v in value.items():
            ck, cv = _coerce(key_tp, k), _coerce(value_tp, v)
            if ck is not _MISSING and cv is not _MISSING:
                kept_items[ck] = cv
        return kept_items
    if tp in (list, dict, tuple):
        return value if isinstance(value, tp) else _MISSING
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return read(tp, value) if isinstance(value, dict) else _MISSING
    return value if isinstance(tp, type) and isinstance(value, tp) else _MISSING


def read(cls: type[R], data: Any) -> R:
    """A record of dataclass ``cls`` from a decoded reply, leniently: each field by its
    annotation; a field that is missing or of another type reads as its default (or the type's
    empty value where it has none), an unknown key is ignored, a list or dict keeps the items
    that are of its item type. ``data`` that is not a dict reads as ``{}``. A field named
    ``wire_version`` reads the reply's :func:`version`; a field's :func:`rules` say where its
    value sits in a reply of another shape."""
    data = mapping(data)
    hints = _hints(cls)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.name == VERSION_KEY:  # the reply's version: 0 for a doctor that sent none
            kwargs[f.name] = version(data)
            continue
        raw = _raw(f, data)
        value = _MISSING if raw is _MISSING else _coerce(hints[f.name], raw)
        if f.metadata.get(_WHOLE) and isinstance(value, (list, tuple)) and len(value) != len(raw):
            value = _MISSING  # a list with an item of another type is not one
        if f.metadata.get(_EMPTY_NONE) and raw == {}:
            value = None
        if value is _MISSING:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue  # the dataclass fills its own default
            value = _zero(hints[f.name])
        kwargs[f.name] = value
    return cls(**kwargs)


def write(record: Any) -> Any:
    """A record (or a list or dict of them) as JSON-able data: ``dataclasses.asdict`` with
    tuples as lists, each field where its :func:`rules` put it, a :data:`SPARSE` record's None
    fields left out."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if f.metadata.get(_OMIT) and value == _default(f):
                continue
            encoded = write(value)
            if f.metadata.get(_INLINE) and isinstance(encoded, dict):
                out.update(encoded)
            elif f.metadata.get(_PREFIX) and isinstance(encoded, dict):
                out.update({f.metadata[_PREFIX] + str(k): v for k, v in encoded.items()})
            else:
                out[f.metadata.get(_KEY) or f.name] = encoded
        return without_none(out) if getattr(record, SPARSE, False) else out
    if isinstance(record, (list, tuple)):
        return [write(v) for v in record]
    if isinstance(record, dict):
        return {k: write(v) for k, v in record.items()}
    return record


def versioned(record: Any, wire_version: int) -> dict[str, Any]:
    """:func:`write`'s dict of ``record`` headed by ``wire_version`` (a reply's ``to_wire``)."""
    return {VERSION_KEY: wire_version, **{k: v for k, v in write(record).items() if k != VERSION_KEY}}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def json_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema of a record type (or a field's annotation). A field's description is its
    ``metadata["doc"]``; the record's, the first paragraph of its docstring."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        options = [json_schema(a) for a in args if a is not _NONE]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        if _NONE in args:
            schema = {"anyOf": [schema, {"type": "null"}]}
        return schema
    if origin is typing.Literal:
        return {"enum": list(args)}
    if tp in (int, float, str, bool):
        return {"type": {int: "integer", float: "number", str: "string", bool: "boolean"}[tp]}
    if origin in (list, tuple) or tp in (list, tuple):
        return {"type": "array", "items": json_schema(args[0])} if args else {"type": "array"}
    if origin is dict or tp is dict:
        return {"type": "object", "additionalProperties": json_schema(args[1])} if args else {"type": "object"}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = _hints(tp)
        props: dict[str, Any] = {}
        for f in dataclasses.fields(tp):
            prop = json_schema(hints[f.name])
            if f.metadata.get(_INLINE):
                props.update(prop["properties"])
                continue
            if f.metadata.get(_PREFIX):
                continue  # keys made of a name (the schema cannot list them)
            if f.metadata.get("doc"):
                prop = {**prop, "description": f.metadata["doc"]}
            props[f.metadata.get(_KEY) or f.name] = prop
        out: dict[str, Any] = {"type": "object", "properties": props}
        doc = (tp.__doc__ or "").strip().split("\n\n")[0]
        if doc and not doc.startswith(tp.__name__ + "("):  # not the dataclass's generated signature
            out["description"] = " ".join(doc.split())
        return out
    return {}

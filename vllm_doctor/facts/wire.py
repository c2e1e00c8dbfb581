"""Reading a worker's reply into a record: one lenient reader per wire type (stdlib only).

The worker-side collectors (:mod:`vllm_doctor.compat.worker_facts`) build the records of
:mod:`vllm_doctor.facts.placement`, :mod:`~vllm_doctor.facts.kv`, :mod:`~vllm_doctor.facts.memory`
and :mod:`~vllm_doctor.facts.anatomy` and send their ``to_json()`` dict; the doctor's side reads
that dict back with the record's ``of``. The two ends may be different doctor versions (a
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
from typing import Any, Self, TypeVar

R = TypeVar("R")

VERSION_KEY = "wire_version"  # each record's wire version, in its to_json() dict


def version(data: Mapping[str, Any]) -> int:
    """The reply's wire version: 0 for a reply of a doctor that sent none."""
    value = data.get(VERSION_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}


def without_none(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less its None values: for the parts of a reply that list only what vLLM exposed."""
    return {k: v for k, v in data.items() if v is not None}


# --- records read and written from their declaration --------------------------------------------
# A frozen dataclass declares its fields once; ``read`` decodes a reply into it by the fields'
# annotations (a value of another type reads as the field's default), ``write`` encodes it, and
# ``json_schema`` declares it for docs/report-schema.json. No per-field key strings. A field
# whose reply does not hold it under its plain name and type says where it is in its
# ``metadata``, made by :func:`rules` (or written out: ``{"key": "class"}``, ``{"doc": ...}``).

_NONE = type(None)

# A field's rules (its ``metadata``), for JSON keys that are no Python name and for the replies
# whose shape predates the declared records:
_KEY = "key"  # the reply's key for the field, where it is not the field's name
_WHOLE = "wire_whole"  # a list is read only if every item is of its type (a shape: no holes)
_EMPTY_NONE = "wire_empty_none"  # an optional record sent as {} reads as None (not sent)
_INLINE = "wire_inline"  # a record whose fields sit in the reply beside its owner's
_PREFIX = "wire_prefix"  # a dict whose entries sit in the reply as "<prefix><name>" keys
_OMIT = "wire_omit"  # written only when it is not the field's default
_OMIT_NONE = "omit_none"  # a None is written as no key (a key whose presence readers test)
_SPECIAL = (_WHOLE, _EMPTY_NONE, _INLINE, _PREFIX)  # read by _read_special, off the fast path
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
    omit_none: bool = False,
    doc: str | None = None,
) -> dict[str, Any]:
    """A field's ``metadata``: where :func:`read` and :func:`write` find it in a reply whose
    shape is not the field's plain name and type (the flags above), and its schema ``doc``."""
    given = {
        _KEY: key,
        _WHOLE: whole,
        _EMPTY_NONE: empty_none,
        _INLINE: inline,
        _PREFIX: prefix,
        _OMIT: omit_default,
        _OMIT_NONE: omit_none,
        "doc": doc,
    }
    return {k: v for k, v in given.items() if v}


def key_of(f: dataclasses.Field[Any]) -> str:
    """The JSON key of a record's field: its name, or ``metadata["key"]``."""
    return str(f.metadata.get(_KEY) or f.name)


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


def _same(value: Any) -> Any:
    return value


@functools.cache
def _decoder(tp: Any) -> Callable[[Any], Any]:
    """The function that reads a value as ``tp`` (``_MISSING`` where it is not one), built once
    per annotation: a report holds thousands of step rows, each read field by field."""
    if tp is Any or tp is object:
        return _same
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        nullable = _NONE in args
        options = [_decoder(a) for a in args if a is not _NONE]

        def union(value: Any) -> Any:
            if value is None and nullable:
                return None
            for option in options:
                out = option(value)
                if out is not _MISSING:
                    return out
            return _MISSING

        return union
    if origin is typing.Literal:
        return lambda value: value if value in args else _MISSING
    if tp is bool:
        return lambda value: value if value is True or value is False else _MISSING
    if tp is int:
        return lambda value: value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    if tp is float:
        return lambda value: value if isinstance(value, (int, float)) and not isinstance(value, bool) else _MISSING
    if tp is str:
        return lambda value: value if isinstance(value, str) else _MISSING
    if origin is list or origin is tuple:
        item = _decoder(args[0]) if args else _same
        kind = list if origin is list else tuple

        def sequence(value: Any) -> Any:
            if not isinstance(value, (list, tuple)):
                return _MISSING
            return kind(c for c in map(item, value) if c is not _MISSING)

        return sequence
    if origin is dict:
        key_of_item, value_of_item = (_decoder(args[0]), _decoder(args[1])) if args else (_same, _same)

        def mapping_of(value: Any) -> Any:
            if not isinstance(value, dict):
                return _MISSING
            kept: dict[Any, Any] = {}
            for k, v in value.items():
                ck, cv = key_of_item(k), value_of_item(v)
                if ck is not _MISSING and cv is not _MISSING:
                    kept[ck] = cv
            return kept

        return mapping_of
    if tp in (list, dict, tuple):
        return lambda value: value if isinstance(value, tp) else _MISSING
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        record = tp
        return lambda value: read(record, value) if isinstance(value, (dict, record)) else _MISSING
    if isinstance(tp, type):
        return lambda value: value if isinstance(value, tp) else _MISSING
    return lambda value: _MISSING


@functools.cache
def _plan(cls: Any) -> tuple[tuple[str, str, Callable[[Any], Any], bool, dataclasses.Field[Any] | None], ...]:
    """Per init field of a record: its name, JSON key, decoder, whether the dataclass fills its
    own default, and the field itself where its rules take the slow path (else None)."""
    hints = _hints(cls)
    return tuple(
        (
            f.name,
            key_of(f),
            _decoder(hints[f.name]),
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
            f if f.name == VERSION_KEY or any(f.metadata.get(k) for k in _SPECIAL) else None,
        )
        for f in dataclasses.fields(cls)
        if f.init
    )


def _read_special(f: dataclasses.Field[Any], key: str, decode: Callable[[Any], Any], data: Mapping[str, Any]) -> Any:
    """A field whose rules say where it sits in the reply, or the reply's version."""
    if f.name == VERSION_KEY:  # the reply's version: 0 for a doctor that sent none
        return version(data)
    md = f.metadata
    prefix = md.get(_PREFIX)
    if md.get(_INLINE):
        raw: Any = data
    elif prefix:
        raw = {k[len(prefix) :]: v for k, v in data.items() if isinstance(k, str) and k.startswith(prefix)}
    else:
        raw = data.get(key, _MISSING)
    value = _MISSING if raw is _MISSING else decode(raw)
    if md.get(_WHOLE) and isinstance(value, (list, tuple)) and len(value) != len(raw):
        value = _MISSING  # a list with an item of another type is not one
    if md.get(_EMPTY_NONE) and raw == {}:
        value = None
    if md.get(_INLINE) and md.get(_OMIT_NONE) and isinstance(value, Record) and value == type(value)():
        value = None  # an optional record written beside its owner's fields, none of them there: not written
    return value


def read(cls: type[R], data: Any) -> R:
    """A record of dataclass ``cls`` from a decoded reply, leniently: each field by its
    annotation; a field that is missing or of another type reads as its default (or the type's
    empty value where it has none), an unknown key is ignored, a list or dict keeps the items
    that are of its item type. ``data`` that is not a dict reads as ``{}``; a record of ``cls``
    is returned as it is (a reader takes the record or the report's JSON of it alike). A field
    named ``wire_version`` reads the reply's :func:`version`; a field's :func:`rules` say where
    its value sits in a reply of another shape."""
    if isinstance(data, cls):
        return data
    data = mapping(data)
    kwargs: dict[str, Any] = {}
    for name, key, decode, has_default, special in _plan(cls):  # type: ignore[arg-type]
        if special is None:
            value = decode(data[key]) if key in data else _MISSING
        else:
            value = _read_special(special, key, decode, data)
        if value is _MISSING:
            if has_default:
                continue  # the dataclass fills its own default
            value = _zero(_hints(cls)[name])  # type: ignore[arg-type]
        kwargs[name] = value
    return cls(**kwargs)


_PLAIN = (str, int, float, bool, type(None))
_KEEP = object()  # a field written whatever its value


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


@functools.cache
def _keys(cls: Any) -> tuple[tuple[str, str, bool, Any, bool, str | None], ...]:
    """Per field: its JSON key, its name, whether a None is left out, the default it is left
    out at (``_KEEP``: never), and where its rules put it (inline, a key prefix)."""
    return tuple(
        (
            key_of(f),
            f.name,
            bool(f.metadata.get(_OMIT_NONE)),
            _default(f) if f.metadata.get(_OMIT) else _KEEP,
            bool(f.metadata.get(_INLINE)),
            f.metadata.get(_PREFIX),
        )
        for f in dataclasses.fields(cls)
    )


def write(record: Any) -> Any:
    """A record (or a list or dict of them) as JSON-able data: ``dataclasses.asdict`` with
    tuples as lists, each field where its :func:`rules` put it, a :data:`SPARSE` record's None
    fields left out."""
    if type(record) in _PLAIN:
        return record
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out: dict[str, Any] = {}
        for key, name, omit_none, omit_at, inline, prefix in _keys(type(record)):
            value = getattr(record, name)
            if (value is None and omit_none) or (omit_at is not _KEEP and value == omit_at):
                continue
            encoded = value if type(value) in _PLAIN else write(value)
            if inline and isinstance(encoded, dict):
                out.update(encoded)
            elif prefix and isinstance(encoded, dict):
                out.update({prefix + str(k): v for k, v in encoded.items()})
            else:
                out[key] = encoded
        return without_none(out) if getattr(record, SPARSE, False) else out
    if isinstance(record, (list, tuple)):
        return [v if type(v) in _PLAIN else write(v) for v in record]
    if isinstance(record, dict):
        return {k: v if type(v) in _PLAIN else write(v) for k, v in record.items()}
    return record


def versioned(record: Any, wire_version: int) -> dict[str, Any]:
    """:func:`write`'s dict of ``record`` headed by ``wire_version`` (a versioned reply's ``to_json``)."""
    return {VERSION_KEY: wire_version, **{k: v for k, v in write(record).items() if k != VERSION_KEY}}


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
            if f.metadata.get(_INLINE):  # an optional record's too (its properties, where it is written)
                inner = prop if "properties" in prop else next(o for o in prop["anyOf"] if "properties" in o)
                props.update(inner["properties"])
                continue
            if f.metadata.get(_PREFIX):
                continue  # keys made of a name (the schema cannot list them)
            if f.metadata.get("doc"):
                prop = {**prop, "description": f.metadata["doc"]}
            props[key_of(f)] = prop
        out: dict[str, Any] = {"type": "object", "properties": props}
        doc = (tp.__doc__ or "").strip().split("\n\n")[0]
        if doc and not doc.startswith(tp.__name__ + "("):  # not the dataclass's generated signature
            out["description"] = " ".join(doc.split())
        return out
    return {}


class Record:
    """A record: a frozen dataclass the doctor keeps as an object from where it is read to where
    it is written. The worker's replies (:mod:`vllm_doctor.facts.kv`, ``placement``, ``memory``,
    ``anatomy``, ``quant``, ``perf``, the import pass's) and the report's sections
    (:mod:`vllm_doctor.analysis.records`) share it: :meth:`of` reads one from its JSON (a reply,
    a report.json section) leniently and takes a record as it is, :meth:`to_json` writes it (only
    at the edges: the wire, report writing, a recording), :meth:`json_schema` declares it."""

    __slots__ = ()

    @classmethod
    def of(cls, data: Any) -> Self:
        """The record from its JSON (leniently: :func:`read`), or the record itself."""
        return read(cls, data)

    def to_json(self) -> Any:
        """The record as JSON-able data (:func:`write`)."""
        return write(self)

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        return json_schema(cls)

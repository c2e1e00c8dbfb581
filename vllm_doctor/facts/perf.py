"""The model's performance anatomy (VD6xx): its projections, embeddings, attention layers,
which of its classes vLLM compiles, and what its forward path does in Python. Stdlib only.

Built where the model exists: the weights pass's meta-device build (``check``) and the engine's
worker (``check --engine``, ``profile``) by :func:`vllm_doctor.compat.perf.perf_anatomy`, sent as
:meth:`PerfAnatomy.to_wire` and read back with :meth:`PerfAnatomy.from_wire` (lenient, as every
wire record: :mod:`vllm_doctor.facts.wire`). It is kept in ``report.facts["perf"]`` so that a
measurement made later (the A/B against the in-tree twin) can re-run the checks on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vllm_doctor.facts.wire import VERSION_KEY, mapping, opt_int, opt_str, str_list, version

WIRE_VERSION = 1


@dataclass(frozen=True)
class SourceFinding:
    """One thing a class's forward path does: ``kind`` is "loop", "float32" or "attention"."""

    kind: str
    cls: str  # the class whose forward reaches it
    function: str  # where it is: "forward", "_rotate", a module-level function
    line: int  # line in ``file``
    file: str
    code: str  # the source of the statement's head, one line
    detail: str  # loop: what it walks ("heads", ...); float32: the cast; attention: the call

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> SourceFinding:
        return cls(**{k: data.get(k, "" if k != "line" else 0) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Projection:
    """A linear or embedding module: its path, class, kind and sizes."""

    name: str  # module path, "model.layers.0.self_attn.q_proj"
    cls: str  # qualified class name
    kind: str  # "vllm-linear", "plain-linear", "vllm-embedding", "plain-embedding"
    in_features: int | None = None  # embeddings: the number of rows (vocabulary)
    out_features: int | None = None  # embeddings: the embedding size
    dtype: str | None = None  # the weight's dtype ("bfloat16"); None when it has none

    @property
    def parent(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def leaf(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def plain(self) -> bool:
        return self.kind.startswith("plain-")

    @property
    def linear(self) -> bool:
        return self.kind.endswith("-linear")

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cls": self.cls,
            "kind": self.kind,
            "in_features": self.in_features,
            "out_features": self.out_features,
            "dtype": self.dtype,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Projection:
        return cls(
            name=opt_str(data.get("name")) or "",
            cls=opt_str(data.get("cls")) or "",
            kind=opt_str(data.get("kind")) or "",
            in_features=opt_int(data.get("in_features")),
            out_features=opt_int(data.get("out_features")),
            dtype=opt_str(data.get("dtype")),
        )


@dataclass(frozen=True)
class ModelClass:
    """A class of the module tree whose forward the lint read (model code, not vLLM's layers)."""

    cls: str  # qualified name
    file: str | None = None
    instances: int = 0  # modules of this class in the tree
    first_instance: str = ""  # the first module's path
    source_error: str | None = None  # why its source could not be read

    def to_wire(self) -> dict[str, Any]:
        return {
            "cls": self.cls,
            "file": self.file,
            "instances": self.instances,
            "first_instance": self.first_instance,
            "source_error": self.source_error,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ModelClass:
        return cls(
            cls=opt_str(data.get("cls")) or "",
            file=opt_str(data.get("file")),
            instances=opt_int(data.get("instances")) or 0,
            first_instance=opt_str(data.get("first_instance")) or "",
            source_error=opt_str(data.get("source_error")),
        )


@dataclass(frozen=True)
class PerfAnatomy:
    """The module tree as the performance lint reads it."""

    root_class: str = ""
    dtype: str | None = None  # the model's dtype ("bfloat16")
    hidden_size: int | None = None
    vocab_size: int | None = None
    num_hidden_layers: int | None = None
    source: str = ""  # "meta-device build" or "engine worker"
    projections: tuple[Projection, ...] = ()
    attention_layers: tuple[str, ...] = ()  # vLLM attention-layer modules (own a KV cache)
    compiled_modules: tuple[str, ...] = ()  # modules of a class with @support_torch_compile
    model_classes: tuple[ModelClass, ...] = ()
    source_findings: tuple[SourceFinding, ...] = ()
    # aten ops the op probe counted per module class in one probed step (engine stage only)
    op_counts: dict[str, int] = field(default_factory=dict)
    op_count_step: str | None = None  # the probed step's phase ("prefill", "decode", "mixed")

    def to_wire(self) -> dict[str, Any]:
        return {
            VERSION_KEY: WIRE_VERSION,
            "root_class": self.root_class,
            "dtype": self.dtype,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_hidden_layers": self.num_hidden_layers,
            "source": self.source,
            "projections": [p.to_wire() for p in self.projections],
            "attention_layers": list(self.attention_layers),
            "compiled_modules": list(self.compiled_modules),
            "model_classes": [c.to_wire() for c in self.model_classes],
            "source_findings": [f.to_wire() for f in self.source_findings],
            "op_counts": dict(self.op_counts),
            "op_count_step": self.op_count_step,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PerfAnatomy:
        data = mapping(data)
        version(data)  # every version so far is read field by field
        ops = mapping(data.get("op_counts"))
        return cls(
            root_class=opt_str(data.get("root_class")) or "",
            dtype=opt_str(data.get("dtype")),
            hidden_size=opt_int(data.get("hidden_size")),
            vocab_size=opt_int(data.get("vocab_size")),
            num_hidden_layers=opt_int(data.get("num_hidden_layers")),
            source=opt_str(data.get("source")) or "",
            projections=tuple(Projection.from_wire(mapping(p)) for p in _items(data.get("projections"))),
            attention_layers=tuple(str_list(data.get("attention_layers"))),
            compiled_modules=tuple(str_list(data.get("compiled_modules"))),
            model_classes=tuple(ModelClass.from_wire(mapping(c)) for c in _items(data.get("model_classes"))),
            source_findings=tuple(
                SourceFinding.from_wire(mapping(f)) for f in _items(data.get("source_findings")) if isinstance(f, dict)
            ),
            op_counts={str(k): v for k, v in ops.items() if opt_int(v) is not None},
            op_count_step=opt_str(data.get("op_count_step")),
        )

    @property
    def compiled(self) -> bool:
        """Does vLLM compile any part of the model (a class with ``@support_torch_compile``)?"""
        return bool(self.compiled_modules)

    @property
    def low_precision(self) -> bool:
        return self.dtype in ("bfloat16", "float16")

    def with_op_counts(self, counts: dict[str, int], step: str | None) -> PerfAnatomy:
        return replace(self, op_counts=dict(counts), op_count_step=step)


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []

"""The model's performance anatomy (VD6xx): its projections, embeddings, attention layers,
which of its classes vLLM compiles, and what its forward path does in Python. Stdlib only.

Built where the model exists: the weights pass's meta-device build (``check``) and the engine's
worker (``check --engine``, ``profile``) by :func:`vllm_doctor.compat.perf.perf_anatomy`, sent as
:meth:`PerfAnatomy.to_json` and read back with :meth:`PerfAnatomy.of` (lenient, as every
wire record: :mod:`vllm_doctor.facts.wire`). It is kept in ``report.facts["perf"]`` so that a
measurement made later (the A/B against the in-tree twin) can re-run the checks on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vllm_doctor.facts import wire

WIRE_VERSION = 1


@dataclass(frozen=True)
class SourceFinding(wire.Record):
    """One thing a class's forward path does: ``kind`` is "loop", "float32" or "attention"."""

    kind: str
    cls: str  # the class whose forward reaches it
    function: str  # where it is: "forward", "_rotate", a module-level function
    line: int  # line in ``file``
    file: str
    code: str  # the source of the statement's head, one line
    detail: str  # loop: what it walks ("heads", ...); float32: the cast; attention: the call


@dataclass(frozen=True)
class Projection(wire.Record):
    """A linear or embedding module: its path, class, kind and sizes."""

    name: str  # module path, "model.layers.0.self_attn.q_proj"
    cls: str  # qualified class name
    kind: str  # "vllm-linear", "plain-linear", "vllm-embedding", "plain-embedding"
    in_features: int | None = None  # embeddings: the number of rows (vocabulary)
    out_features: int | None = None  # embeddings: the embedding size
    dtype: str | None = None  # the weight's dtype ("bfloat16"); None when it has none
    # the kind its time counts under in the per-layer profile (compat.roles.kinds_by_path:
    # "attention", "mlp", "state", ...); None outside every kind
    role: str | None = None

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


@dataclass(frozen=True)
class ModelClass(wire.Record):
    """A class of the module tree whose forward the lint read (model code, not vLLM's layers)."""

    cls: str  # qualified name
    file: str | None = None
    instances: int = 0  # modules of this class in the tree
    first_instance: str = ""  # the first module's path
    source_error: str | None = None  # why its source could not be read
    in_encoder: bool = False  # every instance sits in a multimodal encoder part (PerfAnatomy.encoder_modules)


@dataclass(frozen=True)
class PerfAnatomy(wire.Record):
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
    # a multimodal model's encoder parts (vision tower, projector: the top-level modules outside
    # its language model) and the attention layer vLLM's own encoders use (MMEncoderAttention)
    encoder_modules: tuple[str, ...] = ()
    encoder_attention: str | None = None
    # aten ops the op probe counted per module class in one probed step (engine stage only)
    op_counts: dict[str, int] = field(default_factory=dict)
    op_count_step: str | None = None  # the probed step's phase ("prefill", "decode", "mixed")

    def to_json(self) -> dict[str, Any]:
        return wire.versioned(self, WIRE_VERSION)

    @property
    def compiled(self) -> bool:
        """Does vLLM compile any part of the model (a class with ``@support_torch_compile``)?"""
        return bool(self.compiled_modules)

    @property
    def low_precision(self) -> bool:
        return self.dtype in ("bfloat16", "float16")

    def in_encoder(self, path: str) -> bool:
        """Is the module at ``path`` (``*`` for layer indices allowed) inside an encoder part?"""
        return any(path == p or path.startswith(p + ".") for p in self.encoder_modules)

    def encoder_class(self, cls: str) -> bool:
        """Is every instance of model class ``cls`` inside an encoder part?"""
        return any(c.cls == cls and c.in_encoder for c in self.model_classes)

    def with_op_counts(self, counts: dict[str, int], step: str | None) -> PerfAnatomy:
        return replace(self, op_counts=dict(counts), op_count_step=step)

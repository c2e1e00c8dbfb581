"""The merge check's part of a worker's ``doctor_collect`` reply (``profile["mm_merge"]``): on
the first calls of a multimodal model's ``embed_input_ids`` with image embeddings, did the rows
at the placeholder positions come out equal to those embeddings? Built by the session's
``_merge_call`` (:mod:`vllm_doctor.engine.session`); VD213 reads it. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MergeCall:
    """One checked call."""

    items: int = 0  # image (multimodal) embeddings passed in
    rows: int = 0  # positions the mask marks
    expected_rows: int = 0  # rows of the embeddings, concatenated
    rows_differ: int | None = None  # masked output rows unequal to the embeddings (None: shapes differ)


@dataclass(frozen=True)
class MergeReply:
    method: str | None = None  # the wrapped method (embed_input_ids); None: not wrapped
    calls: list[MergeCall] = field(default_factory=list)


@dataclass(frozen=True)
class ProfileMerge:
    """A ``doctor_collect`` reply, for its ``mm_merge`` part (None: a text model, or an older doctor)."""

    mm_merge: MergeReply | None = None

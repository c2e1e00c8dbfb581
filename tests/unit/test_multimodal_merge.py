"""VD213's two halves without an engine: the worker's comparison of one ``embed_input_ids`` call
(real torch tensors, as the session's wrapper gets them) and the check over the replies.
The engine run: tests/unit/test_multimodal_profile_replies.py (recorded)."""

from __future__ import annotations

import torch

from vllm_doctor.checks import run_checks
from vllm_doctor.compat.runtime import MM_MERGE_KWARGS, _unread_params
from vllm_doctor.engine.session import _compare_merge
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.model import Outcome


def _call(merged: bool) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Ten positions, two images of 3 rows each at positions 1-3 and 6-8."""
    text = torch.zeros(10, 4, dtype=torch.bfloat16)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[1:4] = mask[6:9] = True
    images = [torch.full((3, 4), 1.0), torch.full((3, 4), 2.0)]
    out = text.clone()
    if merged:
        out[mask] = torch.cat(images).to(out.dtype)
    return out, images, mask


def test_a_merged_call_has_no_row_that_differs_and_a_dropped_one_has_all() -> None:
    assert _compare_merge(*_call(merged=True)) == {"items": 2, "rows": 6, "expected_rows": 6, "rows_differ": 0}
    assert _compare_merge(*_call(merged=False)) == {"items": 2, "rows": 6, "expected_rows": 6, "rows_differ": 6}
    out, images, mask = _call(merged=True)
    mask[0] = True  # one placeholder more than the images have rows
    assert _compare_merge(out, images, mask) == {"items": 2, "rows": 7, "expected_rows": 6, "rows_differ": None}


def _facts(merge: dict | None) -> EngineFacts:
    profile = {"steps": []} if merge is None else {"steps": [], "mm_merge": merge}
    return EngineFacts(workers=[WorkerFacts(rank=0, parts={"profile": profile})])


def test_vd213_reads_the_workers_calls() -> None:
    calls = [{"items": 2, "rows": 32, "expected_rows": 32, "rows_differ": 32}]
    (bad,) = run_checks(_facts({"method": "embed_input_ids", "calls": calls}), ["VD213"])
    assert bad.outcome is Outcome.FAIL
    assert bad.message == "image embeddings not merged at the placeholder positions: 32 of 32 rows differ (1 call(s) checked)"
    assert bad.subject == "rank 0: embed_input_ids"
    calls = [{"items": 1, "rows": 16, "expected_rows": 16, "rows_differ": 0}] * 2
    (good,) = run_checks(_facts({"method": "embed_input_ids", "calls": calls}), ["VD213"])
    assert good.outcome is Outcome.PASS and "(32 row(s) in 2 call(s))" in good.message
    (unseen,) = run_checks(_facts({"method": "embed_input_ids", "calls": []}), ["VD213"])
    assert unseen.outcome is Outcome.SKIP and "no image in the workload" in unseen.message
    (text,) = run_checks(_facts(None), ["VD213"])
    assert text.outcome is Outcome.NOT_APPLICABLE
    misshaped = [{"items": 2, "rows": 7, "expected_rows": 6, "rows_differ": None}]
    (shape,) = run_checks(_facts({"method": "embed_input_ids", "calls": misshaped}), ["VD213"])
    assert shape.outcome is Outcome.FAIL and "the mask marks 7 row(s), the 2 image embedding(s) have 6" in shape.message


def _drops(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):  # type: ignore[no-untyped-def]
    return self.embed_tokens(input_ids)


def _merges(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):  # type: ignore[no-untyped-def]
    embeds = self.embed_tokens(input_ids)
    if multimodal_embeddings:
        embeds[is_multimodal] = torch.cat(list(multimodal_embeddings))
    return embeds


def _passes_on(self, input_ids, **kwargs):  # type: ignore[no-untyped-def]
    return super().embed_input_ids(input_ids, **kwargs)


def test_vd212s_reader_judges_only_the_named_parameters_a_body_never_reads() -> None:
    assert _unread_params(_drops, MM_MERGE_KWARGS) == ["multimodal_embeddings", "is_multimodal"]
    assert _unread_params(_merges, MM_MERGE_KWARGS) == []
    assert _unread_params(_passes_on, MM_MERGE_KWARGS) == []  # through **kwargs: not judged

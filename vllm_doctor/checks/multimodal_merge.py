"""VD213: does the model's ``embed_input_ids`` put the image embeddings on the placeholder
positions? (engine stage; the worker compares its first calls with images, see
:mod:`vllm_doctor.engine.session`). The static side of the same contract is VD212."""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import profiles, subject
from vllm_doctor.facts import wire
from vllm_doctor.facts.engine import EngineFacts
from vllm_doctor.facts.multimodal import ProfileMerge
from vllm_doctor.model import Finding, Severity, Stage


@check(
    "VD213",
    "multimodal-embeddings-not-merged",
    "`embed_input_ids` does not put the image embeddings on the placeholder positions vLLM marks.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="contract",
    what=(
        "With images in the workload (`check --engine`, `profile`: one image per prompt by default for a multimodal "
        "model), the worker watches the model's first calls of `embed_input_ids(input_ids, multimodal_embeddings=..., "
        "is_multimodal=mask)`: the output's rows at the masked positions must equal the image embeddings, "
        "concatenated in order (what vLLM's own default merge, `_merge_multimodal_embeddings`, writes there)."
    ),
    why=(
        "vLLM does not check the merge: an `embed_input_ids` that drops or misplaces the image embeddings fails "
        "nothing; the decoder reads the image token's own embedding (or the wrong rows), and the answers do not "
        "depend on the image (measured on vLLM 0.32: two different images give the same tokens)."
    ),
    example=(
        "def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):\n"
        "    return self.embed_tokens(input_ids)  # the image embeddings are dropped"
    ),
    fix=(
        "embeds = self.embed_tokens(input_ids)\n"
        "if multimodal_embeddings:\n"
        "    embeds[is_multimodal] = torch.cat(list(multimodal_embeddings)).to(embeds.dtype)\n"
        "return embeds"
    ),
    references=("vllm/model_executor/models/utils.py:_merge_multimodal_embeddings",),
    requires=("engine",),
)
def multimodal_embeddings_not_merged(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = profiles(facts, emit)
    yield from crashes
    for w, profile in pairs:
        merge = wire.read(ProfileMerge, profile).mm_merge
        if merge is None or merge.method is None:
            yield emit.not_applicable("not a multimodal model (no embed_input_ids with image embeddings)", subject(w))
            continue
        calls = merge.calls
        if not calls:
            yield emit.skip(
                f"no {merge.method} call with image embeddings was seen (no image in the workload?)", subject(w)
            )
            continue
        where = f"{subject(w)}: {merge.method}"
        evidence = {"method": merge.method, "calls": [wire.write(c) for c in calls]}
        misshaped = [c for c in calls if c.rows_differ is None]
        if misshaped:
            c = misshaped[0]
            yield emit.fail(
                f"image embeddings not merged at the placeholder positions: the mask marks {c.rows} row(s), the "
                f"{c.items} image embedding(s) have {c.expected_rows}",
                where,
                evidence,
                "write one embedding row per position is_multimodal marks, in order",
            )
            continue
        rows = sum(c.rows for c in calls)
        differ = sum(c.rows_differ or 0 for c in calls)
        if differ:
            yield emit.fail(
                f"image embeddings not merged at the placeholder positions: {differ} of {rows} rows differ "
                f"({len(calls)} call(s) checked)",
                where,
                evidence,
                "write them on the positions is_multimodal marks: embeds[is_multimodal] = "
                "torch.cat(list(multimodal_embeddings)).to(embeds.dtype)",
            )
        else:
            yield emit.ok(
                f"the image embeddings are on the placeholder positions ({rows} row(s) in {len(calls)} call(s))", where
            )

"""VD306-VD308: the checkpoint's files: the shard index, the LM head's tie, readable headers.

Fast pass only: config.json and the safetensors headers (``facts.checkpoint``), no tensor data
read and no vLLM imported. VD307 uses the weights pass's config class default when config.json
does not set ``tie_word_embeddings``.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, capped_findings, check, known
from vllm_doctor.checks.weights_base import built, text_config
from vllm_doctor.facts.checkpoint import INDEX_NAME, OUTSIDE_KINDS
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage


@check(
    "VD306",
    "broken-shard-index",
    (
        "model.safetensors.index.json names a missing file or a path outside the model directory (or a file links "
        "outside it)."
    ),
    severity=Severity.ERROR,
    also=(Severity.WARN,),
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "For a sharded checkpoint vLLM globs the top-level *.safetensors files and keeps those the index's "
        "`weight_map` names. vllm-doctor checks every entry: the file must exist, be a top-level file of the model "
        "directory, and stay inside it (no `../`, absolute paths or escaping symlinks; such paths are never opened). "
        "It also flags tensors the index places in a file that lacks them and tensors stored twice."
    ),
    why=(
        "vLLM 0.32 stops with `FileNotFoundError: Weight files referenced in index but missing: {...}` after the "
        "model was built; an index path outside the directory can make a loader read files the model's author did not "
        "ship."
    ),
    example='"weight_map": {"lm_head.weight": "../outside.safetensors", ...}',
    fix=(
        "Regenerate the index (e.g. save_pretrained with max_shard_size), or fix the file names in `weight_map` to "
        "the shard files in the directory."
    ),
    requires=("checkpoint-files",),
)
def broken_shard_index(facts: Facts, emit: Emit) -> Iterable[Finding]:
    checkpoint = known(facts.checkpoint)
    problems = [p for p in checkpoint.problems if p.scope == "index"]
    warn_kinds = {"duplicate-tensor", "index-tensor-not-in-file"}
    findings: list[Finding] = []
    for p in problems:
        evidence = {"kind": p.kind, **p.evidence, "vllm_error": p.vllm_error}
        if p.kind in warn_kinds:
            findings.append(
                emit.warn(
                    p.message, p.subject, evidence, "regenerate the index from the shard files", severity=Severity.WARN
                )
            )
        else:
            hint = (
                "use plain file names of shards in the model directory in weight_map"
                if p.kind in OUTSIDE_KINDS or p.kind in ("index-path-not-top-level", "index-path-invalid")
                else "add the missing shard file or regenerate the index"
            )
            findings.append(emit.fail(p.message, p.subject, evidence, hint))
    yield from capped_findings(findings, emit, "shard index problems")
    if not problems:
        index = checkpoint.index
        if index is None:
            yield emit.ok(
                f"single-file or unindexed checkpoint ({len(checkpoint.files)} file(s)); no index to check",
                "checkpoint",
            )
        else:
            yield emit.ok(
                (
                    f"{INDEX_NAME}: {index.get('entries')} entries in {len(index.get('files', []))} file(s), all "
                    f"present and inside the model directory"
                ),
                INDEX_NAME,
            )


@check(
    "VD307",
    "tie-word-embeddings-mismatch",
    "`tie_word_embeddings` disagrees with the presence of `lm_head.weight` in the checkpoint.",
    severity=Severity.ERROR,
    also=(Severity.WARN, Severity.INFO),
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "With `tie_word_embeddings: true` the LM head reuses the input embedding and models skip `lm_head.weight`; "
        "with `false` the checkpoint must carry `lm_head.weight`."
    ),
    why=(
        "Untied without lm_head.weight: vLLM leaves the LM head uninitialised without a word (embedding-type layers "
        "are exempt from its missing-weight check) and generates garbage. Tied with a separate lm_head.weight: the "
        "trained LM head is silently ignored."
    ),
    example=(
        'config.json "tie_word_embeddings": false, checkpoint without lm_head.weight (a tied model exported with the '
        "flag dropped)."
    ),
    fix=(
        "Set tie_word_embeddings to what the model was trained with: true if the head is the embedding, false (and "
        "ship lm_head.weight) if not."
    ),
    requires=("checkpoint-files",),
)
def tie_word_embeddings_mismatch(facts: Facts, emit: Emit) -> Iterable[Finding]:
    checkpoint = known(facts.checkpoint)
    cfg = text_config(facts.config)
    model = built(facts)
    hf = model.hf if model is not None else {}  # the config class vLLM built (its values), from the weights pass
    tie = cfg.get("tie_word_embeddings", facts.config.get("tie_word_embeddings"))
    source = "config.json"
    if not isinstance(tie, bool):
        tie = hf.get("tie_word_embeddings")
        source = "the config class's default (config.json does not set it)"
        if not isinstance(tie, bool):
            yield emit.skip(
                "config.json does not set tie_word_embeddings and its config class default is unknown (needs the "
                "weights pass)"
            )
            return
    names = {t.name for t in checkpoint.tensors}
    index = checkpoint.index
    complete = checkpoint.complete
    # a multimodal checkpoint keeps the decoder's head under its prefix (language_model.lm_head.weight)
    has_lm_head = any(n == "lm_head.weight" or n.endswith(".lm_head.weight") for n in names)
    if not has_lm_head and not complete:
        yield emit.skip("part of the checkpoint could not be read (see VD306/VD308); lm_head.weight may be in it")
        return
    has_embed = any(n.endswith(("embed_tokens.weight", "wte.weight")) for n in names)
    subject = "config.json:tie_word_embeddings"
    evidence = {
        "tie_word_embeddings": tie,
        "from": source,
        "lm_head_in_checkpoint": has_lm_head,
        "indexed": index is not None,
    }
    if tie is False and not has_lm_head and has_embed:
        yield emit.fail(
            (
                "tie_word_embeddings is false but the checkpoint has no lm_head.weight: the LM head stays "
                "uninitialised and vLLM does not notice"
            ),
            subject,
            evidence,
            (
                'if the model was trained with a tied head, set "tie_word_embeddings": true; otherwise export '
                "lm_head.weight"
            ),
        )
    elif tie is True and has_lm_head:
        unties = hf.get("untied_by_checkpoint")
        evidence["vllm_unties"] = unties
        if unties:
            yield emit.warn(
                "tie_word_embeddings is true but the checkpoint carries its own lm_head.weight: this vLLM notices, "
                "builds the head untied and loads it (re-tying only if it equals the embedding); older vLLM "
                "versions tie and silently ignore it",
                subject,
                evidence,
                'make config.json say what the model is: "tie_word_embeddings": false if lm_head.weight differs from '
                "the embedding, "
                "else drop lm_head.weight from the checkpoint",
                severity=Severity.INFO,
            )
        else:
            untie_known = unties is False
            yield emit.warn(
                "tie_word_embeddings is true but the checkpoint carries its own lm_head.weight: "
                + (
                    "this vLLM ties the head to the embedding and ignores it"
                    if untie_known
                    else (
                        "vLLM ties the head to the embedding and ignores it (vLLM 0.32 and later load it untied "
                        "instead)"
                    )
                ),
                subject,
                evidence,
                'if lm_head.weight differs from the embedding (an untied model), set "tie_word_embeddings": false',
                severity=Severity.WARN,
            )
    else:
        yield emit.ok(
            f"tie_word_embeddings={tie} and lm_head.weight {'present' if has_lm_head else 'absent'} agree", subject
        )


@check(
    "VD308",
    "safetensors-file-unreadable",
    (
        "A safetensors file is corrupt: truncated header, header length past end of file, bad JSON or offsets, data "
        "cut short."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "A safetensors file starts with an 8-byte little-endian header length, then a JSON header of tensor names, "
        "dtypes, shapes and data offsets that must tile the rest of the file exactly. vllm-doctor validates the "
        "header (reading no tensor data) and cross-checks it with the safetensors library that vLLM uses."
    ),
    why=(
        "vLLM finds out only when it reaches the file during loading, after building the model: `SafetensorError: "
        "Error while deserializing header: ...` without saying which of many shards is broken. A download cut short "
        "is the usual cause."
    ),
    example="model-00003-of-00004.safetensors is 2 GB shorter than its header says (interrupted download).",
    fix="Download or copy the named file again (compare its size or hash with the source).",
    requires=("checkpoint-files",),
)
def safetensors_file_unreadable(facts: Facts, emit: Emit) -> Iterable[Finding]:
    checkpoint = known(facts.checkpoint)
    problems = [p for p in checkpoint.problems if p.scope == "file"]
    yield from capped_findings(
        (
            emit.fail(
                p.message,
                p.subject,
                {"kind": p.kind, **p.evidence, "vllm_error": p.vllm_error},
                "download or copy this file again; compare its size with the source",
            )
            for p in problems
        ),
        emit,
        "unreadable safetensors files",
    )
    if not problems:
        files = checkpoint.files
        yield emit.ok(
            f"{len(files)} safetensors file(s), headers valid ({len(checkpoint.tensors)} tensors)", "checkpoint"
        )

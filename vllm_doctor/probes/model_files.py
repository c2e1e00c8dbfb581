"""The files of a model directory that vLLM and transformers would open on the doctor's behalf, vetted
before the directory is handed to them (no file is opened here: ``lstat``/``stat`` and ``realpath``).

vLLM and transformers open files of the model directory by name (``processor_config.json``,
``preprocessor_config.json``, ``tokenizer_config.json``, ``generation_config.json``, the tokenizer, a
chat template, ...) and by glob (``*.safetensors``), following symlinks, blocking on a FIFO and reading a
file whole, whatever its size. The doctor's children (the import pass's config verdict, the weights
pass, the engine stage) hand them the directory; so before it does, every entry of the directory
(subdirectories to :data:`MAX_DEPTH` levels, at most :data:`MAX_ENTRIES` entries) is checked here:

- a symlink whose real path lies outside the directory (:func:`vllm_doctor.probes.paths.model_roots`:
  the directory, or a Hugging Face cache snapshot's own ``blobs/``) is refused, with where it points;
- a FIFO, socket or device is refused (opening a FIFO blocks);
- a settings file (:data:`SETTINGS_FILES`) over :data:`MAX_SETTINGS_BYTES`, or a tokenizer file
  (:data:`TOKENIZER_FILES`) over :data:`MAX_TOKENIZER_BYTES`, is refused (its size as ``stat`` gives
  it: a sparse file of 1 GiB counts as 1 GiB).

The checkpoint's own files (``*.safetensors``, the shard index) are the safetensors reader's (VD306/VD308
report them); they are listed too, so that the directory is not handed over, and marked ``checkpoint``.
"""

from __future__ import annotations

import os
import stat

from vllm_doctor.facts.model_files import MAX_SETTINGS_BYTES, MAX_TOKENIZER_BYTES, RefusedFile
from vllm_doctor.probes.paths import inside, kind_of, model_roots, resolves_to

MAX_DEPTH = 3
MAX_ENTRIES = 10_000
SETTINGS_FILES = frozenset(
    {
        "processor_config.json",
        "preprocessor_config.json",
        "video_preprocessor_config.json",
        "generation_config.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.json",
        "chat_template.jinja",
        "params.json",
        "quantize_config.json",
        "quant_config.json",
        "hf_quant_config.json",
        "adapter_config.json",
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
    }
)
TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "spiece.model", "tekken.json"}
)
CHECKPOINT_SUFFIXES = (".safetensors", ".safetensors.index.json")


def _size_limit(name: str) -> int | None:
    base = os.path.basename(name)
    if base in SETTINGS_FILES:
        return MAX_SETTINGS_BYTES
    if base in TOKENIZER_FILES or base.endswith(".tiktoken"):
        return MAX_TOKENIZER_BYTES
    return None


def _vet(path: str, rel: str, roots: tuple[str, ...], st: os.stat_result) -> RefusedFile | None:
    """Why vLLM must not be handed the entry ``rel`` (lstat ``st``), or None."""
    checkpoint = rel.endswith(CHECKPOINT_SUFFIXES)
    if stat.S_ISLNK(st.st_mode):
        if not inside(roots, path):
            return RefusedFile(rel, "links-outside", resolves_to(path), checkpoint)
        try:
            st = os.stat(path)
        except OSError:
            return None  # dangling or looping: nothing to open (vLLM's own error names it)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return RefusedFile(rel, "not-regular", kind_of(st.st_mode), checkpoint)
    limit = _size_limit(rel)
    if limit is not None and stat.S_ISREG(st.st_mode) and st.st_size > limit:
        return RefusedFile(
            rel,
            "too-large",
            f"{st.st_size / 2**20:,.1f} MiB, over vllm-doctor's limit of {limit >> 20} MiB for this file",
            checkpoint,
        )
    return None


def refused_files(model_dir: str | os.PathLike[str]) -> list[RefusedFile]:
    """Every entry of the model directory vLLM must not be handed (see the module's docstring), in
    name order. Opens no file; subdirectories are entered only when they are real directories
    inside it."""
    root = os.fspath(model_dir)
    roots = model_roots(root)
    out: list[RefusedFile] = []
    seen = 0
    stack: list[tuple[str, str, int]] = [(root, "", 0)]
    while stack and seen < MAX_ENTRIES:
        folder, prefix, depth = stack.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names[: MAX_ENTRIES - seen]:
            seen += 1
            path, rel = os.path.join(folder, name), prefix + name
            try:
                st = os.lstat(path)
            except OSError:
                continue
            refused = _vet(path, rel, roots, st)
            if refused is not None:
                out.append(refused)
            elif stat.S_ISDIR(st.st_mode) and depth + 1 < MAX_DEPTH:
                stack.append((path, rel + "/", depth + 1))
    return sorted(out, key=lambda r: r.name)


def handover_refusal(refused: list[RefusedFile]) -> str | None:
    """Why the directory is not handed to vLLM (a sentence for a pass's or a stage's reason), or None."""
    if not refused:
        return None
    listed = "; ".join(r.describe() for r in refused[:3]) + (f"; {len(refused) - 3} more" if len(refused) > 3 else "")
    codes = "VD306" if all(r.checkpoint for r in refused) else "VD113"
    return f"vllm-doctor does not hand the model directory to vLLM: {listed} (see {codes})"

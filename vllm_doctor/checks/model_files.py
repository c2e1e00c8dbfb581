"""VD113: the files of the model directory that vLLM and transformers would open on the doctor's
behalf, vetted in the fast pass (``facts.refused_files``, probes/model_files.py; no file opened).

A file that links outside the directory, is a FIFO / socket / device, or is a settings or tokenizer
file over vllm-doctor's size limit is not opened, and the directory is not handed to vLLM: the import
pass does not ask vLLM for its verdict on the config, the weights pass and the engine stage do not
start. The checkpoint's own files are VD306's and VD308's.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, capped_findings, check
from vllm_doctor.facts.model_files import MAX_SETTINGS_BYTES, MAX_TOKENIZER_BYTES, RefusedFile
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage

_HINTS = {
    "links-outside": "copy the real file into the model directory (only a Hugging Face cache snapshot may link into "
    "its own repo's blobs/), or delete the link",
    "not-regular": "replace it with the regular file it stands for, or delete it",
    "too-large": "is this the right file? processor, generation and tokenizer settings are a few KiB; re-save them "
    "with save_pretrained",
}
_WHAT_VLLM_DOES = {
    "links-outside": "vLLM and transformers would open it and read what it points to",
    "not-regular": "vLLM and transformers would open it (a FIFO blocks them)",
    "too-large": "transformers would read it whole into memory",
}


@check(
    "VD113",
    "model-file-refused",
    (
        "A file of the model directory links outside it, is not a regular file, or is over vllm-doctor's size "
        "limit: it is not opened, and the directory is not handed to vLLM."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="config",
    what=(
        "vLLM and transformers open the model directory's files by name (processor_config.json, "
        "preprocessor_config.json, tokenizer_config.json, generation_config.json, the tokenizer, a chat template) "
        "and follow symlinks. Before any child of vllm-doctor hands them the directory, every entry (subdirectories "
        "three levels deep) is checked with lstat: a symlink whose real path is outside the directory (a Hugging "
        "Face cache snapshot may link into its own repo's blobs/), a FIFO, socket or device, or a settings file over "
        f"{MAX_SETTINGS_BYTES >> 20} MiB (a tokenizer file over {MAX_TOKENIZER_BYTES >> 20} MiB) is reported and "
        "never opened. Read in the fast pass: no vLLM import. The checkpoint's files are VD306's."
    ),
    why=(
        "A downloaded directory whose preprocessor_config.json links to /etc/passwd or to another user's file makes "
        "vLLM read that file (and print parts of it in its error); a FIFO blocks start-up for good; a 1 GiB sparse "
        "processor_config.json costs the process gigabytes. vLLM 0.32 then blames config.json (`It looks like the "
        "config file at '.../processor_config.json' is not a valid JSON file`)."
    ),
    example="preprocessor_config.json -> /etc/passwd",
    fix=(
        "Put the real files in the model directory (copies, or links that stay inside it); delete links, FIFOs and "
        "oversized files that do not belong to the model."
    ),
)
def model_file_refused(facts: Facts, emit: Emit) -> Iterable[Finding]:
    if facts.refused_files is None:
        yield emit.skip("the model directory's files were not read")
        return
    refused = [RefusedFile(**r) for r in facts.refused_files if not r.get("checkpoint")]
    if not refused:
        yield emit.ok("no file of the model directory links outside it, blocks, or is oversized", "model directory")
        return
    findings = [
        emit.fail(
            f"{r.describe()}: {_WHAT_VLLM_DOES[r.kind]}; vllm-doctor did not open it and does not hand the "
            "directory to vLLM (the config verdict, the weights pass and the engine stage are not run)",
            r.name,
            r.to_dict(),
            _HINTS[r.kind],
        )
        for r in refused
    ]
    yield from capped_findings(findings, emit, "files of the model directory refused")

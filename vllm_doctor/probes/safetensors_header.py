"""Read a safetensors checkpoint from its headers only: names, shapes, dtypes, offsets.

A safetensors file is ``<u64 little-endian N><N bytes of JSON header><data>``. This module
reads the 8-byte length and the header, never a byte of tensor data, so a 140 GB checkpoint
costs a few milliseconds. Every defect becomes a :class:`CheckpointProblem` (a finding for the
VD306/VD308 checks), never an exception:

- the file is shorter than 8 bytes, its header length points past the end of the file, the
  header is cut short or is not JSON, an entry has a bad dtype/shape/offsets, the data region
  is shorter or longer than the offsets say (safetensors and therefore vLLM reject such files);
- ``model.safetensors.index.json`` names a file that does not exist, lies outside the model
  directory (``../x``, an absolute path, a symlink that escapes) or that vLLM's top-level
  ``*.safetensors`` glob does not find. Such paths are never opened. "Inside" is
  :func:`vllm_doctor.probes.paths.model_roots`: the directory itself, and for a Hugging Face
  cache snapshot the same repo's ``blobs/`` (where its files link to).

The file set and order are vLLM's (``DefaultModelLoader._prepare_weights`` +
``filter_duplicate_safetensors_files`` + ``safetensors_weights_iterator``, vLLM 0.32): every
top-level ``*.safetensors``, filtered by the index when there is one, natural-sorted, and
within a file the tensors in ``safe_open(...).keys()`` order (sorted by name).

No torch and no vLLM here: the parent process stays light. The ``safetensors`` library (the
reader vLLM uses) cross-checks each header we accepted, with ``framework="numpy"`` so that
torch is not imported; ``get_slice(name).get_shape()/get_dtype()`` read the header only.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import stat
import struct
import time
from operator import attrgetter
from pathlib import Path
from typing import Any

from vllm_doctor.facts.checkpoint import (
    DTYPE_BITS,
    INDEX_NAME,
    CheckpointFacts,
    CheckpointProblem,
    FileHeader,
    TensorHeader,
)
from vllm_doctor.probes.paths import (
    BadJSON,
    NotRegular,
    TooLarge,
    inside,
    model_roots,
    parse_json,
    paused_gc,
    read_regular,
    resolves_to,
)

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit (HeaderTooLarge)
DIAGNOSE_BYTES = 1 << 20  # how much a corrupt header length lets us look at
SAFETENSORS_ERROR = "safetensors_rust.SafetensorError: Error while deserializing header: "


def natural_sort_key(path: str) -> list[Any]:
    """vLLM's ``_natural_sort_key``: shard 2 before shard 10."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path)]


def brief(value: Any, limit: int = 120) -> str:
    """``repr(value)``, cut to ``limit`` characters (a header can hold a 10-million-entry shape)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _kept(value: Any, limit: int = 200) -> Any:
    """``value`` for the evidence when its repr is short, else :func:`brief` of it."""
    return value if len(repr(value)) <= limit else brief(value, limit)


def parse_header(path: Path, rel: str) -> tuple[FileHeader, list[CheckpointProblem]]:
    """Read and validate one file's header. Reads at most 8 + header-length bytes.

    Linear in the header: a million tensors (a 70 MB header) are parsed and validated with the
    cyclic garbage collector paused (:func:`vllm_doctor.probes.paths.paused_gc`), which otherwise
    rescans the millions of new objects again and again and costs more than the parsing."""
    with paused_gc():
        return _parse_header(path, rel)


def _parse_header(path: Path, rel: str) -> tuple[FileHeader, list[CheckpointProblem]]:
    problems: list[CheckpointProblem] = []

    def bad(kind: str, message: str, **evidence: Any) -> tuple[FileHeader, list[CheckpointProblem]]:
        problems.append(CheckpointProblem("file", kind, rel, message, evidence))
        return header, problems

    try:
        st = os.stat(path)
    except OSError as exc:
        header = FileHeader(file=rel, size=0)
        return bad("unreadable", f"{rel}: cannot stat: {exc.strerror}")
    header = FileHeader(file=rel, size=st.st_size)
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
        return bad("not-a-regular-file", f"{rel} is not a regular file; it was not opened")
    if st.st_size < 8:
        return bad(
            "truncated-header",
            f"{rel} is {st.st_size} bytes: too short for the 8-byte header length of a safetensors file",
            file_size=st.st_size,
        )
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header.header_bytes = n
            if n > st.st_size - 8:
                # Cut off inside the header, or a corrupt length field? Look at what is there
                # (at most 1 MiB, and only up to the end of a JSON object that starts at byte 8).
                head = fh.read(min(st.st_size - 8, DIAGNOSE_BYTES))
                json_end = _complete_json_object(head)
                if json_end is None:
                    return bad(
                        "truncated-header",
                        f"{rel} ends inside its header: the header length says {n} bytes but the file has only "
                        f"{st.st_size - 8} after the length field (a download or copy cut short)",
                        header_length=n,
                        file_size=st.st_size,
                    )
                return bad(
                    "header-past-eof",
                    f"{rel}: header length {n} bytes points past the end of the file ({st.st_size} bytes); "
                    f"the JSON header really ends after {json_end} bytes, so the length field is corrupt",
                    header_length=n,
                    file_size=st.st_size,
                    json_header_bytes=json_end,
                )
            if n > MAX_HEADER_BYTES:
                return bad(
                    "header-too-large",
                    f"{rel}: header length {n} bytes is over safetensors' limit of {MAX_HEADER_BYTES}",
                    header_length=n,
                )
            raw = fh.read(n)
    except OSError as exc:
        return bad("unreadable", f"{rel}: cannot read: {exc.strerror}")
    if len(raw) < n:
        return bad(
            "truncated-header", f"{rel}: header cut short ({len(raw)} of {n} bytes)", header_length=n, read=len(raw)
        )
    try:
        doc = parse_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return bad(
            "header-not-json",
            f"{rel}: header is not UTF-8 (byte {exc.start}); the file is corrupt or not safetensors",
            header_length=n,
        )
    except json.JSONDecodeError as exc:
        # cut short: the error is at the end (a complete object followed by padding is not)
        truncated = exc.pos >= len(raw.rstrip(b" \x00")) - 1 and exc.msg != "Extra data"
        what = (
            "ends in the middle of the JSON (truncated header)"
            if truncated
            else f"is not valid JSON ({exc.msg} at byte {exc.pos})"
        )
        return bad(
            "truncated-header" if truncated else "header-not-json",
            f"{rel}: header {what}",
            header_length=n,
            json_error=exc.msg,
            at=exc.pos,
        )
    except BadJSON as exc:  # thousands of nested brackets, a 5000-digit number
        return bad("header-not-json", f"{rel}: header {exc.message}", header_length=n)
    if not isinstance(doc, dict):
        return bad("header-not-json", f"{rel}: header is a JSON {type(doc).__name__}, not an object", header_length=n)
    data_len = st.st_size - 8 - n
    meta = doc.pop("__metadata__", None)
    if meta is not None:
        if isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            header.metadata = meta
        else:
            return bad("bad-entry", f"{rel}: __metadata__ must map strings to strings", header_length=n)
    tensors: list[TensorHeader] = []
    for name, entry in doc.items():  # a million entries: kept to plain type tests and C builtins
        if type(entry) is not dict:
            return bad("bad-entry", f"{rel}: entry {brief(name)} is not an object", tensor=_kept(name))
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if type(dtype) is not str or (bits := DTYPE_BITS.get(dtype)) is None:
            return bad(
                "bad-entry",
                f"{rel}: tensor {brief(name)} has unknown dtype {brief(dtype)}",
                tensor=_kept(name),
                dtype=_kept(dtype),
            )
        # type(d) is int: JSON numbers are exact ints or floats (and a bool is no dimension)
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            return bad(
                "bad-entry",
                f"{rel}: tensor {brief(name)} has an invalid shape {brief(shape)}",
                tensor=_kept(name),
                shape=_kept(shape),
            )
        if not (
            type(offsets) is list
            and len(offsets) == 2
            and type(offsets[0]) is int
            and type(offsets[1]) is int
            and 0 <= offsets[0] <= offsets[1]
        ):
            return bad(
                "bad-entry",
                f"{rel}: tensor {brief(name)} has invalid data_offsets {brief(offsets)}",
                tensor=_kept(name),
                data_offsets=_kept(offsets),
            )
        bits *= math.prod(shape)
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            return bad(
                "bad-entry",
                f"{rel}: tensor {brief(name)} ({dtype} {brief(shape)}) needs {bits / 8:g} bytes but its offsets span "
                f"{offsets[1] - offsets[0]}",
                tensor=_kept(name),
                shape=_kept(shape),
                dtype=dtype,
                data_offsets=offsets,
            )
        tensors.append(TensorHeader(name, dtype, shape, rel, (offsets[0], offsets[1])))
    # safetensors requires the tensors to tile the data region exactly, in offset order
    end = 0
    for t in sorted(tensors, key=attrgetter("offsets")):
        if t.offsets[0] != end:
            return bad(
                "bad-entry",
                (
                    f"{rel}: tensor {t.name!r} starts at byte {t.offsets[0]} of the data region, expected {end} (gap "
                    f"or overlap)"
                ),
                tensor=t.name,
                data_offsets=list(t.offsets),
                expected_begin=end,
            )
        end = t.offsets[1]
    if end > data_len:
        last = max(tensors, key=lambda t: t.offsets[1])
        return bad(
            "data-past-eof",
            f"{rel}: tensor data ends at byte {end} of the data region but the file holds only {data_len} "
            f"bytes after the header (file truncated; {last.name!r} runs past the end)",
            data_end=end,
            data_bytes=data_len,
            file_size=st.st_size,
            tensor=last.name,
        )
    if end < data_len:
        return bad(
            "trailing-bytes",
            (
                f"{rel}: {data_len - end} bytes after the last tensor; safetensors rejects files whose data region is "
                f"longer than its tensors"
            ),
            data_end=end,
            data_bytes=data_len,
        )
    tensors.sort(key=attrgetter("name"))
    header.tensors = tensors
    header.ok = True
    return header, problems


def _complete_json_object(raw: bytes) -> int | None:
    """Byte length of a complete JSON object at the start of ``raw``, or None."""
    text = raw.decode("utf-8", "replace")
    if not text.startswith("{"):
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return None
    return len(text[:end].encode("utf-8", "replace"))


def library_check(path: Path, header: FileHeader) -> str | None:
    """Does the safetensors library (vLLM's reader) accept the header we accepted? Error text, or None.

    Header only: ``get_slice(name).get_shape()/get_dtype()`` read no tensor data.
    """
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    try:
        with paused_gc(), safe_open(str(path), framework="numpy") as f:
            # offset_keys (newer safetensors) lists without the library's slow name sort; sorted()
            # here is linear for the usual files, whose offsets follow the names
            keys = sorted(f.offset_keys() if hasattr(f, "offset_keys") else f.keys())
            if keys != [t.name for t in header.tensors]:
                return f"safetensors lists different tensors: {len(keys)} vs {len(header.tensors)}"
            for t in header.tensors:
                sl = f.get_slice(t.name)
                if list(sl.get_shape()) != t.shape or sl.get_dtype() != t.dtype:
                    return (
                        f"{t.name}: safetensors reads {sl.get_dtype()} {list(sl.get_shape())}, header says {t.dtype} "
                        f"{t.shape}"
                    )
    except Exception as exc:  # SafetensorError and friends
        return f"{type(exc).__name__}: {exc}"
    return None


def _read_index(root: Path, roots: tuple[str, ...], problems: list[CheckpointProblem]) -> dict[str, Any] | None:
    path = root / INDEX_NAME
    if not os.path.lexists(path):
        return None
    index: dict[str, Any] = {"file": INDEX_NAME, "entries": 0, "files": []}
    if not inside(roots, path):
        problems.append(
            CheckpointProblem(
                "index",
                "index-outside-dir",
                INDEX_NAME,
                f"{INDEX_NAME} is a symlink to {resolves_to(path)}, outside the model directory; vllm-doctor did not "
                "open it",
                {"resolves_to": resolves_to(path)},
            )
        )
        index["error"] = "outside the model directory"
        return index
    vllm_error = "json.decoder.JSONDecodeError (vLLM reads the index before loading)"
    try:
        raw = read_regular(path, MAX_HEADER_BYTES)
    except (NotRegular, TooLarge) as exc:
        why = f"{INDEX_NAME} {exc}; vllm-doctor did not read it"
        vllm_error = ""
    except OSError as exc:
        why = f"{INDEX_NAME} cannot be read: {exc.strerror or exc}"
    else:
        why = ""
        try:
            doc = parse_json(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            why = f"{INDEX_NAME} is not UTF-8 (byte {exc.start})"
        except ValueError as exc:  # JSONDecodeError, or BadJSON: too deep, a 5000-digit number
            why = f"{INDEX_NAME} cannot be read as JSON: {exc}"
    if why:
        problems.append(CheckpointProblem("index", "index-unreadable", INDEX_NAME, why, vllm_error=vllm_error))
        index["error"] = why
        return index
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        problems.append(
            CheckpointProblem(
                "index",
                "index-no-weight-map",
                INDEX_NAME,
                f"{INDEX_NAME} has no `weight_map` object of tensor name -> file name",
                vllm_error="KeyError: 'weight_map'",
            )
        )
        index["error"] = "no weight_map"
        return index
    index["entries"] = len(weight_map)
    index["weight_map"] = weight_map
    index["files"] = sorted(set(weight_map.values()), key=natural_sort_key)
    return index


def read_checkpoint(model_dir: str | os.PathLike[str], library: bool = True) -> CheckpointFacts:
    """Headers of every checkpoint file vLLM would load from ``model_dir``, and their defects."""
    start = time.monotonic()
    root = Path(model_dir)
    roots = model_roots(root)
    facts = CheckpointFacts(model_dir=str(root), format="none")
    problems = facts.problems
    folder = str(root)
    globbed = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not globbed:
        for pattern, fmt in (("*.bin", "bin"), ("*.pt", "pt")):
            if glob.glob(os.path.join(folder, pattern)):
                facts.format = fmt
                break
        facts.seconds = time.monotonic() - start
        return facts
    facts.format = "safetensors"
    index = _read_index(root, roots, problems)
    facts.index = {k: v for k, v in index.items() if k != "weight_map"} if index else None
    load_files = list(globbed)
    if index and "weight_map" in index:
        weight_map: dict[str, str] = index["weight_map"]
        by_file: dict[str, list[str]] = {}
        for tensor, fname in weight_map.items():
            by_file.setdefault(fname, []).append(tensor)
        wanted = {os.path.join(folder, f) for f in by_file}
        missing_for_vllm = sorted(wanted - set(globbed))
        vllm_error = (
            f"FileNotFoundError: Weight files referenced in index but missing: {set(missing_for_vllm[:20])}"
            + (f" (and {len(missing_for_vllm) - 20} more)" if len(missing_for_vllm) > 20 else "")
            if missing_for_vllm
            else ""
        )
        for fname in sorted(by_file, key=natural_sort_key):
            joined = os.path.join(folder, fname)
            tensors = sorted(by_file[fname])
            evidence = {"index_entry": fname, "tensors": len(tensors), "first_tensors": tensors[:5]}
            subject = f"{INDEX_NAME}:{fname}"
            if joined in globbed:
                continue  # a file vLLM loads: checked below (an escaping symlink included)
            if not fname or "\x00" in fname:
                problems.append(
                    CheckpointProblem(
                        "index",
                        "index-path-invalid",
                        subject,
                        f"the index sends {len(tensors)} tensor(s) to {brief(fname)}, which is not a file name"
                        + (" (it holds a NUL byte)" if fname else ""),
                        evidence,
                        vllm_error,
                    )
                )
            elif os.path.isabs(fname) or not inside(roots, joined):
                problems.append(
                    CheckpointProblem(
                        "index",
                        "index-path-outside-dir",
                        subject,
                        f"the index sends {len(tensors)} tensor(s) to {fname!r}, a path outside the model directory; "
                        "vllm-doctor does not follow it and vLLM will not load it",
                        {**evidence, "resolves_to": resolves_to(joined)},
                        vllm_error,
                    )
                )
            else:
                exists = os.path.exists(joined)
                kind, why = (
                    (
                        "index-path-not-top-level",
                        f"{fname!r} exists but is not a top-level *.safetensors file vLLM's glob finds",
                    )
                    if exists
                    else ("index-file-missing", f"{fname!r} does not exist")
                )
                problems.append(
                    CheckpointProblem(
                        "index",
                        kind,
                        subject,
                        f"the index sends {len(tensors)} tensor(s) to {fname!r}: {why}",
                        evidence,
                        vllm_error,
                    )
                )
        unlisted = [os.path.basename(f) for f in globbed if f not in wanted]
        if unlisted and facts.index is not None:
            facts.index["unlisted_files_ignored"] = unlisted
        load_files = [f for f in globbed if f in wanted]
    load_files = sorted(load_files, key=natural_sort_key)
    seen: dict[str, str] = {}
    for fpath in load_files:
        rel = os.path.relpath(fpath, folder)
        if not inside(roots, fpath):
            problems.append(
                CheckpointProblem(
                    "index",
                    "file-outside-dir",
                    rel,
                    (
                        f"{rel} is a symlink to {resolves_to(fpath)}, outside the model directory; vllm-doctor did "
                        "not open it"
                    ),
                    {"resolves_to": resolves_to(fpath)},
                )
            )
            facts.files.append(FileHeader(file=rel, size=0))
            continue
        header, file_problems = parse_header(Path(fpath), rel)
        problems.extend(file_problems)
        if header.ok and library:
            err = library_check(Path(fpath), header)
            if err is not None:
                header.ok = False
                problems.append(
                    CheckpointProblem(
                        "file",
                        "library-rejects",
                        rel,
                        f"{rel}: the safetensors library rejects it: {err}",
                        vllm_error=err,
                    )
                )
        elif not header.ok and library and file_problems:
            # what vLLM would print: the library's own error for the same file
            lib = _library_error(Path(fpath))
            if lib:
                file_problems[-1].vllm_error = lib
        facts.files.append(header)
        if header.ok:
            for t in header.tensors:
                if t.name in seen:
                    problems.append(
                        CheckpointProblem(
                            "index",
                            "duplicate-tensor",
                            t.name,
                            (
                                f"tensor {t.name!r} is stored in both {seen[t.name]} and {rel}; vLLM loads both and "
                                f"the later file wins"
                            ),
                            {"files": [seen[t.name], rel]},
                        )
                    )
                else:
                    seen[t.name] = rel
    if index and "weight_map" in index:
        weight_map = index["weight_map"]
        readable = {f.file for f in facts.files if f.ok}
        facts.unread_tensors = sorted(t for t, fname in weight_map.items() if fname not in readable)
        for tensor, fname in sorted(weight_map.items()):
            if fname in readable and seen.get(tensor) != fname and tensor not in seen:
                problems.append(
                    CheckpointProblem(
                        "index",
                        "index-tensor-not-in-file",
                        f"{INDEX_NAME}:{tensor}",
                        f"the index puts {tensor!r} in {fname}, but {fname} does not contain it",
                        {"tensor": tensor, "index_file": fname},
                    )
                )
    facts.seconds = time.monotonic() - start
    return facts


def _library_error(path: Path) -> str | None:
    """The safetensors library's own message for a file our parser rejected (header only)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        from safetensors import safe_open
    except (OSError, ImportError):
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            list(f.keys())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

"""Resolve the user's model argument to a local directory and read its config.json.

The doctor reads local paths and the local Hugging Face cache only; it never downloads.
A config.json that parses but is wrong (say ``architectures`` missing) is NOT an input error:
the raw dict is returned and the VD108 check reports it with the other findings.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorInputError
from vllm_doctor.probes.paths import (
    BadJSON,
    TooLarge,
    inside,
    kind_of,
    model_roots,
    parse_json,
    read_regular,
    resolves_to,
)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# a revision the HF cache writes into refs/<branch> (a commit hash): one plain path component
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
MAX_REF_BYTES = 4096
_JSON_NAMES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
MAX_CONFIG_BYTES = 16 << 20  # a model's config.json is a few KiB; a large multimodal one well under 1 MiB


@dataclass
class ModelDir:
    path: Path
    config: dict[str, Any]
    source: str  # "local" or "hf-cache"

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"


def _hf_cache_roots() -> list[Path]:
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    roots.append(hf_home / "hub")
    return roots


def _read_ref(ref: Path, repo: Path) -> str | None:
    """The revision ``refs/main`` names, or None when there is no such file.

    Raises DoctorInputError when the file is not a plain small file of the repo or does not
    hold a plain revision name (``../../..`` must not lead out of the cache)."""
    try:
        st = os.lstat(ref)
    except OSError:
        return None
    hint = "delete the broken cache entry and download the model again"
    if stat.S_ISLNK(st.st_mode) and not inside((os.path.realpath(repo),), ref):
        raise DoctorInputError(
            f"{ref} is a symlink to {resolves_to(ref)}, outside the cache entry; vllm-doctor does not open it", hint
        )
    try:
        raw = read_regular(ref, MAX_REF_BYTES)
    except OSError as exc:
        raise DoctorInputError(f"{ref}: cannot read: {exc.strerror or exc}", hint) from exc
    revision = raw.decode("utf-8", "replace").strip()
    if not _REVISION.match(revision) or ".." in revision:
        raise DoctorInputError(
            f"{ref} holds {revision[:80]!r}, not a revision name; vllm-doctor does not follow it out of the "
            f"snapshots directory",
            hint,
        )
    return revision


def find_in_hf_cache(repo_id: str) -> Path | None:
    """The newest snapshot of ``repo_id`` in the local HF cache that has a config.json.

    Only directories that really lie in the repo's ``snapshots/`` are candidates."""
    folder = "models--" + repo_id.replace("/", "--")
    for root in _hf_cache_roots():
        snapshots = root / folder / "snapshots"
        if not snapshots.is_dir():
            continue
        real_snapshots = (os.path.realpath(snapshots),)

        def usable(candidate: Path, real_snapshots: tuple[str, ...] = real_snapshots) -> bool:
            return inside(real_snapshots, candidate) and (candidate / "config.json").is_file()

        revision = _read_ref(root / folder / "refs" / "main", root / folder)
        if revision is not None:
            candidate = snapshots / revision
            if os.path.lexists(candidate) and not inside(real_snapshots, candidate):
                raise DoctorInputError(
                    f"{candidate} is a symlink to {resolves_to(candidate)}, outside the cache's snapshots directory; "
                    "vllm-doctor does not follow it",
                    "delete the broken cache entry and download the model again",
                )
            if usable(candidate):
                return candidate
        found = sorted(
            (p for p in snapshots.iterdir() if usable(p)),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        if found:
            return found[0]
    return None


def resolve_model_dir(model: str) -> ModelDir:
    path = Path(model).expanduser()
    source = "local"
    if not path.exists():
        if _HUB_ID.match(model) and not model.startswith((".", "/")):
            cached = find_in_hf_cache(model)
            if cached is None:
                raise DoctorInputError(
                    f"{model!r} is not a local path and has no copy in the local Hugging Face cache",
                    "vllm-doctor reads local model directories and the local HF cache only (it never "
                    f"downloads); run `huggingface-cli download {model}` first or pass the directory.",
                )
            path, source = cached, "hf-cache"
        else:
            raise DoctorInputError(
                f"{model}: no such file or directory", "pass the model directory that holds config.json"
            )
    if not path.is_dir():
        try:
            what = kind_of(path.stat().st_mode)
        except OSError:
            what = "unreadable"
        raise DoctorInputError(
            f"{model}: is {'a file' if what == 'a regular file' else what}, not a model directory",
            "pass the directory that holds config.json and the weights, not a file inside it",
        )
    config_path = path / "config.json"
    raw = _read_config(path, config_path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DoctorInputError(
            f"{config_path}: not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})",
            "config.json must be UTF-8 JSON; re-save it with config.save_pretrained",
        ) from exc
    try:
        config = parse_json(text)
    except json.JSONDecodeError as exc:
        raise DoctorInputError(
            f"{config_path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            "fix the JSON syntax (a trailing comma or a missing quote is the usual cause)",
        ) from exc
    except BadJSON as exc:
        raise DoctorInputError(
            f"{config_path}: {exc.message}",
            "config.json is a flat object of settings; re-save it with config.save_pretrained",
        ) from exc
    if not isinstance(config, dict):
        raise DoctorInputError(
            f"{config_path}: expected a JSON object, found {_JSON_NAMES.get(type(config), type(config).__name__)}",
            'config.json must be an object like {"architectures": [...], "model_type": ...}',
        )
    return ModelDir(path=path.resolve(), config=config, source=source)


def _read_config(path: Path, config_path: Path) -> bytes:
    """config.json's bytes, opened only when it is a regular file that resolves into the model
    directory (or, for an HF cache snapshot, into the same repo's blobs/)."""
    try:
        st = os.lstat(config_path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise DoctorInputError(f"{config_path}: cannot stat: {exc.strerror}") from exc
    if st is None:
        raise DoctorInputError(
            f"{path}: no config.json in this directory",
            "a Hugging Face-style model directory needs config.json (write it with config.save_pretrained)",
        )
    if stat.S_ISLNK(st.st_mode) and not inside(model_roots(path), config_path):
        raise DoctorInputError(
            f"{config_path} is a symlink to {resolves_to(config_path)}, outside the model directory; "
            "vllm-doctor does not open it",
            "copy the real config.json into the model directory (only a Hugging Face cache snapshot may link into "
            "its own repo's blobs/)",
        )
    try:
        st = os.stat(config_path)
    except OSError as exc:
        what = "a dangling symlink" if isinstance(exc, FileNotFoundError) else "unreadable"
        raise DoctorInputError(f"{config_path}: {what}: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read; a directory is not a file
        raise DoctorInputError(
            f"{config_path} is {kind_of(st.st_mode)}, not a regular file; vllm-doctor did not open it",
            "config.json must be a regular JSON file (write it with config.save_pretrained)",
        )
    try:
        return read_regular(config_path, MAX_CONFIG_BYTES)
    except TooLarge as exc:
        raise DoctorInputError(
            f"{config_path}: config.json is {exc.size / 2**20:.1f} MiB; vllm-doctor reads at most "
            f"{MAX_CONFIG_BYTES >> 20} MiB (a model's config.json is a few KiB)",
            "is this the right file? config.json holds settings, not weights or vocabularies",
        ) from exc
    except OSError as exc:
        raise DoctorInputError(f"{config_path}: cannot read: {exc.strerror or exc}") from exc

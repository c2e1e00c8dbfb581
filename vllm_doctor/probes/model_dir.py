"""Resolve the user's model argument to a local directory and read its config.json.

The doctor reads local paths and the local Hugging Face cache only; it never downloads.
A config.json that parses but is wrong (say ``architectures`` missing) is NOT an input error:
the raw dict is returned and the VD108 check reports it with the other findings.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorInputError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


def find_in_hf_cache(repo_id: str) -> Path | None:
    """The newest snapshot of ``repo_id`` in the local HF cache that has a config.json."""
    folder = "models--" + repo_id.replace("/", "--")
    for root in _hf_cache_roots():
        snapshots = root / folder / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = root / folder / "refs" / "main"
        if ref.is_file():
            candidate = snapshots / ref.read_text(encoding="utf-8").strip()
            if (candidate / "config.json").is_file():
                return candidate
        found = sorted(
            (p for p in snapshots.iterdir() if (p / "config.json").is_file()),
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
        raise DoctorInputError(
            f"{model}: is a file, not a model directory",
            "pass the directory that holds config.json and the weights, not a file inside it",
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise DoctorInputError(
            f"{path}: no config.json in this directory",
            "a Hugging Face-style model directory needs config.json (write it with config.save_pretrained)",
        )
    try:
        raw = config_path.read_bytes()
    except OSError as exc:
        raise DoctorInputError(f"{config_path}: cannot read: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DoctorInputError(
            f"{config_path}: not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})",
            "config.json must be UTF-8 JSON; re-save it with config.save_pretrained",
        ) from exc
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DoctorInputError(
            f"{config_path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            "fix the JSON syntax (a trailing comma or a missing quote is the usual cause)",
        ) from exc
    if not isinstance(config, dict):
        raise DoctorInputError(
            f"{config_path}: expected a JSON object, found {type(config).__name__}",
            'config.json must be an object like {"architectures": [...], "model_type": ...}',
        )
    return ModelDir(path=path.resolve(), config=config, source=source)

"""A file of the model directory that vLLM must not be handed (probes/model_files.py finds them; VD113
reports them): plain data, and the size limits both sides name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_SETTINGS_BYTES = 16 << 20  # config.json's limit: processor / generation / tokenizer settings are a few KiB
MAX_TOKENIZER_BYTES = 512 << 20  # the largest published tokenizer.json are a few 10 MiB


@dataclass(frozen=True)
class RefusedFile:
    """A file of the model directory the doctor does not open and does not let vLLM open."""

    name: str  # relative to the model directory
    kind: str  # "links-outside" | "not-regular" | "too-large"
    detail: str  # where it points / what it is / its size
    checkpoint: bool = False  # a safetensors file or the shard index (VD306/VD308 report it)

    def describe(self) -> str:
        """One phrase for a message: ``processor_config.json is a symlink to /etc/passwd, outside ...``."""
        if self.kind == "links-outside":
            return f"{self.name} is a symlink to {self.detail}, outside the model directory"
        if self.kind == "not-regular":
            return f"{self.name} is {self.detail}, not a regular file"
        return f"{self.name} is {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "detail": self.detail, "checkpoint": self.checkpoint}

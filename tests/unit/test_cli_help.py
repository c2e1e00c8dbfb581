"""`vllm-doctor --help`: one overview that lists every verb exactly once."""

from __future__ import annotations

import argparse
import re

import pytest

from vllm_doctor.cli import build_parser, main


def _verbs(parser: argparse.ArgumentParser) -> list[str]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_every_verb_is_listed_once_in_the_overview() -> None:
    parser = build_parser()
    text = parser.format_help()
    verbs = _verbs(parser)
    assert set(verbs) == {
        "check", "profile", "attach", "stacks", "cpu-profile", "top", "replay", "rules", "rule", "view",
    }
    for verb in verbs:
        entries = re.findall(rf"^  {re.escape(verb)}(?=[ \n])", text, flags=re.MULTILINE)
        assert len(entries) == 1, f"{verb!r} is listed {len(entries)} times in `vllm-doctor --help`:\n{text}"
    listed = re.findall(r"^  ([a-z][a-z-]*)(?=[ \n])", text.split("commands:", 1)[1].split("\n\n", 1)[0], re.MULTILINE)
    assert listed == ["check", "profile", "attach", "stacks", "cpu-profile", "top", "replay", "rules", "rule", "view"]
    assert "positional arguments" not in text  # argparse's own second list of the verbs
    assert text.startswith("usage: vllm-doctor [-h] [--version] [--debug] COMMAND ...\n")
    assert "`vllm-doctor COMMAND --help`" in text and "exit codes: 0 " in text


def test_no_command_prints_the_overview_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert capsys.readouterr().out == build_parser().format_help()


def test_an_unknown_verb_is_one_error_that_names_the_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["chek"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'chek'" in err and "'check'" in err and "Traceback" not in err

"""The full check gives each config-only mistake the code ``check --fast`` gives it (issue 47
item 18; the --fast side: tests/unit/test_fast_config_only.py): vLLM's own answer, through the
import and weights passes, on the same directories."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import CHECK_LIMIT, run_doctor
from tests.fixtures.config_only import CASES, build_bases, build_case

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
# one case per kind of reading (the same code for a string and a list, a huge and a negative id)
NAMES = ("quant-list", "quant-unknown-method", "image-token-negative", "image-token-fractional",
         "vision-class-without-vision-config", "moe-class-without-experts")


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_bases(tmp_path_factory.mktemp("config-only-bases"))


@pytest.mark.parametrize("name", NAMES)
def test_the_full_check_gives_the_fast_code(name: str, bases: dict[str, Path], tmp_path: Path) -> None:
    code = CASES[name].expect[0]  # type: ignore[index]
    proc = run_doctor(["check", str(build_case(name, bases, tmp_path)), "--json", "-q", *CHECK_LIMIT], timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = {f["code"] for f in json.loads(proc.stdout)["findings"] if f["outcome"] == "fail"}
    assert code in failed, failed

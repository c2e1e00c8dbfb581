"""vLLM still answers as recorded: the live half of the recorded engine replies (issue 46 item 2).

The unit tier runs the doctor's check and analysis assertions on engine replies recorded once
(tests/fixtures/engine_replies.py, ``tools/record_engine_replies.py``). Here the same command runs
on the real engine again for the cases in LIVE, and
what vLLM decided (whether it started, the model and runner classes, the execution mode, each KV
layer's kind, spec and cache shape, the blocks it allocated, the modules timed and their kinds)
must be what the recording says. A difference means vLLM or what the workers send changed: re-record
(``tools/record_engine_replies.py --family FAMILY``) and read the diff. The other cases are diffed
by ``tools/record_engine_replies.py --diff`` (every case; run it after a change to the worker side
or to vLLM, as docs/development.md says), not on every run of the suite: each is an engine start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_harness import host_has_amx
from tests.fixtures import engine_replies

# the cases run live here: vLLM's default mode on MLA (one latent head, the MLA spec) and on the
# Mamba 2 hybrid (state specs beside attention), issue 43's first two cases, and the working
# example eager with vLLM's torch profiler (the dense family; every module timed)
LIVE = ("kinds-mla-deepseek-v2", "kinds-mamba2-nemotron-h", "ok-eager-deep")


# recorded on a host without AMX; on an AMX host vLLM answers these otherwise, as it should
AMX_OTHERWISE = {
    "kinds-mla-deepseek-v2": "vLLM picks its AMX_MLA backend on an AMX host: KV blocks of 128 tokens, not 16",
}


@pytest.mark.parametrize("name", LIVE)
def test_vllm_answers_as_recorded(name: str, tmp_path: Path) -> None:
    if name in AMX_OTHERWISE and host_has_amx():
        pytest.skip(f"recorded on a host without AMX: {AMX_OTHERWISE[name]}")
    engine_replies.assert_as_recorded(name, tmp_path)

"""vLLM still answers ``check``'s passes as recorded: the live half of the recorded check replies
(issue 46 item 2).

The unit tier runs what the doctor makes of the import and weights passes' answers on replies
recorded once per example variant, bad input and weight fixture (tests/fixtures/engine_replies.py,
``check-*`` cases; tests/unit/test_doctor_on_examples_replies.py, test_multimodal_checks_replies.py,
test_multimodal_weights_replies.py, test_moe_checks_replies.py, test_quant_checks_replies.py,
test_weights_replies.py, test_hybrid_checks_replies.py, test_mla_checks_replies.py). Here one case
per family runs again on
the real vLLM (``check`` starts no engine: an import pass and a weights pass, each a child that
imports vLLM), and what vLLM answered (the registry, each resolved class's contract, vLLM's
verdict on the config, what each plugin did; where the weights pass stopped, every parameter's and
checkpoint tensor's trace, what load_weights returned: ``engine_replies.pass_essentials``) must be
what the recording says. A difference means vLLM or what the passes send changed: re-record
(``tools/record_engine_replies.py --family FAMILY``) and read the diff; ``--diff`` compares every
case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import engine_replies

# one case per family: the working example of each (both passes answer in full); of the weight
# fixtures one whose load_weights skips tensors (the trace's misses, vLLM's own error)
LIVE = ("check-ok", "check-mm-ok", "check-moe-ok", "check-quant-ok-vd3", "check-weights-loader-skips-norm", "check-hybrid-ok", "check-mla-ok")


@pytest.mark.parametrize("name", LIVE)
def test_vllm_answers_the_passes_as_recorded(name: str, tmp_path: Path) -> None:
    engine_replies.assert_as_recorded(name, tmp_path)

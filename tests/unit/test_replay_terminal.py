"""``vllm-doctor replay`` in a real terminal (tmux), read back with ``tmux capture-pane``.

The SVG snapshots (test_top_snapshots.py) draw through Textual's headless driver, where the
panels have their size before the first frame comes. In a terminal the replay's first frame
came before the first layout: the panels' lines were cropped to width 0 then, and the lines
that did not change afterwards (waiting, restarts, server up, the devices' header, the model's
class, KV and findings lines) stayed blank for good. Skipped where tmux is not installed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "top"
ROOT = Path(__file__).resolve().parents[2]
TMUX = shutil.which("tmux")

# rows each panel draws once and then keeps (they never change over loaded.jsonl.gz's refreshes)
STEADY_ROWS = (
    "waiting       0",
    "restarts seen 0",
    "server up",
    "pid role",  # the devices panel's header
    "TinyDoctorForCausalLM",  # the model panel's class line
    "KV 64.00 MiB in 1024 blocks",
    "no VD4xx/VD5xx findings",
    "usage ",  # the KV panel's first row
)

pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt install tmux)")


def _tmux(sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert TMUX is not None
    return subprocess.run([TMUX, "-L", sock, *args], capture_output=True, text=True, timeout=20, check=False)


def test_replay_in_a_real_terminal_draws_every_row() -> None:
    sock = f"vd-replay-{uuid.uuid4().hex[:8]}"  # a tmux server of its own: never the user's
    command = shlex.join([sys.executable, "-m", "vllm_doctor", "replay", str(DATA / "loaded.jsonl.gz")])
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    started = subprocess.run(
        [TMUX, "-L", sock, "new-session", "-d", "-s", "r", "-x", "120", "-y", "40", "-c", str(ROOT), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    screen = ""
    try:
        deadline = time.monotonic() + 60  # the app's start imports Textual (seconds on a busy machine)
        while time.monotonic() < deadline:
            screen = _tmux(sock, "capture-pane", "-p", "-t", "r").stdout
            # frame 5 of 24: the rows in question were drawn frames ago (and never change)
            if "REPLAY" in screen and _frame(screen) >= 5:
                break
            time.sleep(0.5)
        missing = [row for row in STEADY_ROWS if row not in screen]
        assert _frame(screen) >= 5, f"the replay did not get to its 5th refresh in 60 s:\n{screen}"
        assert not missing, f"rows blank in the terminal: {missing}\n{screen}"
    finally:
        _tmux(sock, "kill-server")


def _frame(screen: str) -> int:
    """The refresh the status bar shows (``REPLAY  8/24``), 0 before the first."""
    for word in screen.split():
        head, _, tail = word.partition("/")
        if head.isdigit() and tail.isdigit():
            return int(head)
    return 0

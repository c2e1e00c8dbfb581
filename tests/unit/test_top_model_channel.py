"""``top``'s model panel (live/sources.ModelChannel) across a server restart on the same port.

The server is a process of its own (tests/fixtures/channel_worker.py: the doctor's real channel
server and worker session, no vLLM); it is killed and a new one starts, with a new pid and a new
socket, as a restarted ``vllm serve`` has. The panel said "cannot open the vllm-doctor channel of
pid <old>" for good; it now says why it lost the channel and finds the new server's workers.
(The real served engine's restart: tests/engine/test_top_served.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_doctor.live.channel import ChannelHandle
from vllm_doctor.live.sources import ModelChannel, ModelSummary

ROOT = Path(__file__).resolve().parents[2]


class Server:
    """One channel server process: its pid and socket."""

    def __init__(self, base: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.channel_worker", str(base)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.path = self.proc.stdout.readline().strip()
        assert self.path.endswith(f"chan-{self.proc.pid}.sock"), self.path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.kill()


def _handle(server: Server) -> ChannelHandle:
    """What ``served_engine(url)`` finds for the server now on the port (here: the test says)."""
    handle = ChannelHandle.__new__(ChannelHandle)
    handle._conns = {}
    handle.http, handle.url, handle.name, handle.timeout = None, "http://127.0.0.1:8000", "toy", 10.0
    handle.procs, handle.base, handle.paths = [], os.path.dirname(server.path), {server.proc.pid: server.path}
    return handle


def _wait(channel: ModelChannel, ok: Any, what: str, timeout: float = 60.0) -> ModelSummary:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        summary = ModelSummary.of(channel.latest)
        if ok(summary):
            return summary
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout:.0f} s; the panel says {channel.latest}")


def test_the_model_panel_finds_the_new_server_after_a_restart(
    tmp_path: Path, servers: list[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    servers.append(Server(tmp_path))
    monkeypatch.setattr("vllm_doctor.live.attach.served_engine", lambda url, timeout=60.0: _handle(servers[-1]))
    channel = ModelChannel("http://127.0.0.1:8000", every_s=0.3)
    try:
        _wait(channel, lambda s: s.steps > 0, "the first server's steps")
        old = servers[-1].proc.pid
        servers[-1].kill()
        down = _wait(channel, lambda s: not s.steps and "trying again" in s.reason, "the lost channel said")
        assert "channel" in down.reason, down.reason
        servers.append(Server(tmp_path))  # the server restarted: a new process, a new socket
        assert servers[-1].proc.pid != old
        _wait(channel, lambda s: s.steps > 0 and not s.reason, "the new server's steps")
    finally:
        channel.close()

"""Each reader of the private channel gets its own window of the worker's records, or an error.

The channel's server (engine/channel.py) runs here on a worker without vLLM: the doctor's real
extension methods and session, with the profiler's start (which needs a loaded model) replaced
by a profiler on no modules; the steps are driven through the profiler as the worker's
wrappers drive them. Readers talk to the server over its real Unix socket.

What went wrong before: readers were keyed by ``id(conn)`` (an id is reused once a closed
connection's socket is freed), and a collect from a reader without a window fell back to the
profiler's start: ``attach --seconds 6`` reported 19,899 steps "of the worker's 173.74 s".
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.channel_worker import ProfileOnlyWorker, Worker, install_without_model, run_steps
from vllm_doctor import channel as wire
from vllm_doctor.engine.channel import ChannelServer
from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.profiler import ForwardProfiler
from vllm_doctor.engine.session import NoWindow, WorkerSession, session_for
from vllm_doctor.live.channel import ChannelHandle
from vllm_doctor.live.sources import WindowReader


@pytest.fixture
def installs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The readers the server's installs named (the profiler's start needs no model here)."""
    seen: list[Any] = []
    monkeypatch.setattr(WorkerSession, "install", install_without_model(seen))
    return seen


def _ask(conn: socket.socket, method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    conn.sendall(wire.encode({"v": wire.PROTOCOL, "method": method, "options": options or {}}))
    reply = wire.recv_frame(conn, wire.MAX_REPLY)
    assert reply["ok"], reply
    envelope: dict[str, Any] = reply["reply"]
    return envelope


def _connect(server: ChannelServer) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(20)
    conn.connect(server.path)
    return conn


def _steps(envelope: dict[str, Any]) -> int:
    assert envelope["ok"], envelope
    return int(envelope["data"]["step_arrays"]["n"])


def test_a_reader_gets_its_own_window_or_an_error_never_the_whole_buffer(tmp_path: Path, installs: list[Any]) -> None:
    worker = Worker()
    server = ChannelServer(worker, base=str(tmp_path))
    server.start()
    try:
        with _connect(server) as a:
            assert _ask(a, "doctor_install", {"layers": False})["ok"]
            run_steps(worker, 40, first=True)  # the buffer fills before the second reader comes
            with _connect(server) as b:
                # b never installed: an error that says so, not the 40 steps since the start
                reply = _ask(b, "doctor_collect", {"timeline": False})
                assert not reply["ok"] and reply["error"]["type"] == "NoWindow", reply
                assert "install again" in reply["error"]["message"]
                assert _ask(b, "doctor_install", {"layers": False})["ok"]
                run_steps(worker, 3)
                assert _steps(_ask(b, "doctor_collect", {"timeline": False, "reset": True})) == 3
            # b's window ended with its connection; a's is its own, from its install
            assert _steps(_ask(a, "doctor_collect", {"timeline": False, "reset": True})) == 43
            # readers that come and go, one after the other (their sockets freed in between):
            # each has a key of its own, and a new connection never inherits a closed one's window
            for _ in range(12):
                with _connect(server) as c:
                    assert _ask(c, "doctor_install", {"layers": False})["ok"]
                    run_steps(worker, 1)
                    assert _steps(_ask(c, "doctor_collect", {"timeline": False})) == 1
                _wait_for_windows(worker, 1)  # the server let c's window go: a's is left
                with _connect(server) as d:
                    reply = _ask(d, "doctor_collect", {"timeline": False})
                    assert not reply["ok"] and reply["error"]["type"] == "NoWindow", reply
            assert len(set(installs)) == len(installs) == 14, installs
    finally:
        server.close()


def _wait_for_windows(worker: Worker, most: int) -> None:
    """The server forgets a reader's window on its own thread once the connection closed."""
    deadline = time.monotonic() + 10
    while len(session_for(worker).windows) > most and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(session_for(worker).windows) <= most


def test_a_collect_without_a_window_is_an_error_in_process() -> None:
    """Through vLLM's collective_rpc (one shared window, reader None) the rule is the same."""
    worker = Worker()
    session = session_for(worker)
    session.profiler = ForwardProfiler(WallClock(), [])
    run_steps(worker, 5, first=True)
    reply = worker.doctor_collect({"timeline": False})
    assert not reply["ok"] and reply["error"]["type"] == "NoWindow"
    with pytest.raises(NoWindow):
        session.collect(reader=7)
    session.open_window(None)
    run_steps(worker, 2)
    assert _steps(worker.doctor_collect({"timeline": False})) == 2


def _handle(server: ChannelServer) -> ChannelHandle:
    """The reader's side of the channel (live/channel.py) on this process's server (found by
    pid and private directory in a real server)."""
    handle = ChannelHandle.__new__(ChannelHandle)
    handle._conns = {}
    handle.http, handle.url, handle.name, handle.timeout = None, "pid (test)", "toy", 20.0
    handle.procs, handle.base, handle.paths = [], server.base, {os.getpid(): server.path}
    return handle


def test_tops_reader_opens_a_new_window_when_its_connection_was_lost(tmp_path: Path, installs: list[Any]) -> None:
    """top's model panel (live/sources.WindowReader) on a channel connection that failed: the
    handle connects again, the worker says that connection has no window, and the reader
    installs again (a new window from then) instead of showing the records since the start."""
    worker = ProfileOnlyWorker()
    server = ChannelServer(worker, base=str(tmp_path))
    server.start()
    try:
        with _connect(server) as other:  # another reader (attach, the /metrics exporter) keeps the hooks on
            assert _ask(other, "doctor_install", {"layers": False})["ok"]
            handle = _handle(server)
            reader = WindowReader(handle)
            run_steps(worker, 4, first=True)
            assert reader.read().steps == 4
            handle._drop(os.getpid())  # the connection fails (a timeout, a broken pipe)
            _wait_for_windows(worker, 1)
            run_steps(worker, 30)
            lost = reader.read()
            assert lost.steps == 0 and "window was lost with the channel's connection" in lost.reason, lost
            assert "attached again" in lost.reason
            run_steps(worker, 2)
            assert reader.read().steps == 2  # its new window, not the 34 steps before it
            reader.close()
    finally:
        server.close()


class _KvLaterWorker(ProfileOnlyWorker):
    """A worker whose KV cache is made after a reader attached (the /metrics exporter attaches
    while vLLM loads the model): its KV part has vLLM's capacity once ``made`` is set."""

    made = False

    def doctor_kv(self, options: Any = None) -> dict[str, Any]:
        from vllm_doctor.engine.extension import _envelope
        from vllm_doctor.facts.kv import KvCache

        capacity = KvCache(capacity_tokens=4096, max_concurrency=2.0) if self.made else KvCache()
        return _envelope(self, "doctor_kv", capacity.to_json)


def test_a_reader_that_attached_before_the_kv_cache_was_made_reads_its_capacity_at_its_next_read(
    tmp_path: Path, installs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full read (anatomy, KV cache, placement) comes once a minute; one that found no KV
    cache is asked again at the next read, a bounded number of times, so the exporter that
    attached while the engine started has vLLM's KV capacity from its next window on."""
    from vllm_doctor.live import sources

    monkeypatch.setattr(sources, "MODEL_FULL_RETRIES", 3)
    worker = _KvLaterWorker()
    server = ChannelServer(worker, base=str(tmp_path))
    server.start()
    try:
        handle = _handle(server)
        reader = WindowReader(handle)
        run_steps(worker, 2, first=True)
        assert reader.read().kv.capacity_tokens is None  # no KV cache yet
        worker.made = True
        run_steps(worker, 2)
        kv = reader.read().kv  # within the minute
        assert (kv.capacity_tokens, kv.max_concurrency) == (4096, 2.0)
        assert reader.read().kv.capacity_tokens == 4096  # kept between the full reads
        # an engine whose workers never tell one: asked again until the 3 early reads are spent
        # (one went on the start), then once a minute
        gathers: list[Any] = []
        gather = reader.doc.gather
        monkeypatch.setattr(reader.doc, "gather", lambda *a, **k: gathers.append(k.get("parts")) or gather(*a, **k))
        worker.made = False
        reader._full_at = 0.0  # the minute is up
        for _ in range(6):
            run_steps(worker, 1)
            reader.read()
        assert [p is None for p in gathers] == [True] * 3 + [False] * 3, gathers
        reader.close()
    finally:
        server.close()

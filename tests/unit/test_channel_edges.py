"""Nobody else steers the doctor (issue 47): the channel's edges on its real socket server and the
reader's side, without vLLM.

- a server that another OS user runs on a loopback port is refused before anything is asked of
  it (it answered ``attach`` with made-up replies that became the report);
- the shared private directory taken by another user first: the server makes a fresh one that the
  reader finds, and a reader that finds none names the taken directory and its owner;
- idle connections never lock the owner out, a frame trickled a byte at a time is cut off at the
  whole frame's deadline, and a full channel refuses with a reply that says who holds it;
- a reader that only armed the probe and left leaves nothing installed;
- the socket goes when the server closes; a stale one (older than the process of its pid) is
  ignored.

The worker is the doctor's real extension on no model (the profiler's start and the probe's hooks
replaced: they need a loaded model); the server is :class:`vllm_doctor.engine.channel.ChannelServer`.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_doctor
from vllm_doctor import channel as wire
from vllm_doctor.engine import channel as server_mod
from vllm_doctor.engine.channel import ChannelServer
from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.extension import DoctorWorkerExtension
from vllm_doctor.engine.profiler import ForwardProfiler
from vllm_doctor.engine.session import SESSION_ATTR, WorkerSession, session_for
from vllm_doctor.live import channel as reader_mod

NOBODY = 65534


class Worker(DoctorWorkerExtension):
    rank = 0


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """install and arm_probe on a worker without a model: the profiler on no modules, the probe a
    marker (what the channel decides about them is what is tested)."""

    def install(self: WorkerSession, layers: bool = True, trace_steps: int = 0, sample_every: int = 8,
                reader: Any = None, step_clock: str | None = None) -> dict[str, Any]:  # fmt: skip
        if self.profiler is None:
            self.profiler = ForwardProfiler(WallClock(), [])
        self.open_window(reader, sample_every)
        return {"installed": True}

    def arm_probe(self: WorkerSession, phases: list[str], reader: Any = None) -> dict[str, Any]:
        if self.profiler is None:
            install(self, reader=reader)
        self.probe_plan = list(phases)
        self.probe = object()  # type: ignore[assignment]
        return {"armed": True, "phases": phases}

    def stop_probe(self: WorkerSession) -> None:
        self.probe = None
        self.probe_plan = []

    monkeypatch.setattr(WorkerSession, "install", install)
    monkeypatch.setattr(WorkerSession, "arm_probe", arm_probe)
    monkeypatch.setattr(WorkerSession, "_stop_probe", stop_probe)
    monkeypatch.setattr(WorkerSession, "_unwrap_runner", lambda self: [])
    monkeypatch.setattr(WorkerSession, "_disarm", lambda self: None)
    monkeypatch.setattr(WorkerSession, "status", lambda self: {"profiling": self.profiler is not None})


@pytest.fixture
def served(tmp_path: Path, no_model: None) -> Iterator[tuple[Worker, ChannelServer]]:
    worker = Worker()
    server = ChannelServer(worker, base=str(tmp_path))
    server.start()
    try:
        yield worker, server
    finally:
        server.close()


def _connect(server: ChannelServer) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(20)
    conn.connect(server.path)
    return conn


def _ask(conn: socket.socket, method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        conn.sendall(wire.encode({"v": wire.PROTOCOL, "method": method, "options": options or {}}))
    except BrokenPipeError:  # a refused connection is closed at once: its reason is there to read
        pass
    reply: dict[str, Any] = wire.recv_frame(conn, wire.MAX_REPLY)
    return reply


def _until(what: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := what()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


# -- item 1: another user's server ---------------------------------------------------------------

FAKE_SERVER = textwrap.dedent("""
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def _send(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self._send({"data": [{"id": "fake-model"}]} if self.path.startswith("/v1/models") else {"version": "0.32.0"})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            data = {"protocol": 1, "version": "x", "served_model_name": "fake-model"}
            self._send({"results": [{"ok": True, "method": body.get("method"), "rank": 0, "pid": 1, "data": data}]})
        def log_message(self, *a):
            pass
    server = HTTPServer(("127.0.0.1", 0), H)
    print(server.server_address[1], flush=True)
    server.serve_forever()
""")


def _fake_server(as_nobody: bool) -> subprocess.Popen[str]:
    python = shutil.which("python3", path="/usr/bin:/bin") if as_nobody else sys.executable
    if python is None:
        pytest.skip("no system python3 that the user nobody can run")

    def drop() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.Popen([python, "-c", FAKE_SERVER], stdout=subprocess.PIPE, text=True, cwd="/",
                            env={"PATH": "/usr/bin:/bin"}, preexec_fn=drop if as_nobody else None)  # fmt: skip


def test_attach_refuses_a_server_of_another_os_user_before_asking_it_anything(tmp_path: Path) -> None:
    """As root (who can read every process's files), a fake vLLM of the user nobody on loopback:
    exit 2, the listener's owner named, no report written from its answers."""
    if os.geteuid() != 0:
        pytest.skip(f"running a server as another user needs root (this test runs as uid {os.geteuid()})")
    fake = _fake_server(as_nobody=True)
    try:
        assert fake.stdout is not None
        port = int(fake.stdout.readline())
        out = tmp_path / "out"
        proc = run_doctor(["attach", "--url", f"http://127.0.0.1:{port}", "--duration", "1", "--out", str(out)],
                          timeout=120)  # fmt: skip
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert f"port {port}" in proc.stderr and f"uid {NOBODY}" in proc.stderr, proc.stderr
        assert "not of this user" in proc.stderr and "Traceback" not in proc.stderr
        assert not out.exists()
        # the listener's owner, as top's model panel and the library ask for it too
        assert reader_mod.foreign_listeners(port) == [NOBODY]
    finally:
        fake.kill()
        fake.wait(timeout=30)


def test_the_dev_endpoint_is_used_only_for_this_users_loopback_server_and_attach_says_so(tmp_path: Path) -> None:
    fake = _fake_server(as_nobody=False)
    try:
        assert fake.stdout is not None
        port = int(fake.stdout.readline())
        proc = run_doctor(["attach", "--url", f"http://127.0.0.1:{port}", "--duration", "0", "--json"], timeout=120)
        assert proc.returncode in (0, 1), proc.stderr
        assert "reading the workers through vLLM's dev endpoint" in proc.stderr, proc.stderr
        assert "the server is this user's and listens on loopback only" in proc.stderr, proc.stderr
    finally:
        fake.kill()
        fake.wait(timeout=30)


# -- item 3: the shared directory taken first ----------------------------------------------------


def test_a_directory_another_user_made_first_gives_way_to_a_fresh_one_and_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"making a directory for another user needs root (this test runs as uid {os.geteuid()})")
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o777)
    tmp.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv(wire.DIR_ENV, raising=False)
    monkeypatch.delenv(wire.RUNTIME_ENV, raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    squatted = tmp / f"vllm-doctor-{os.getuid()}"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, NOBODY, NOBODY)
    # the reader, before any server made a fresh one: the taken directory and its owner, and the fix
    bases, refused = reader_mod.channel_dirs([])
    assert bases == [] and any(str(squatted) in r and f"uid {NOBODY}" in r for r in refused), refused
    assert "another user created it first" in refused[0]
    # the server's side: a fresh directory nobody could have made before, recorded for its children
    fresh = wire.private_dir(create=True)
    assert fresh != str(squatted) and fresh.startswith(str(squatted) + "-")
    assert os.environ[wire.DIR_ENV] == fresh and Path(fresh).stat().st_mode & 0o777 == 0o700
    monkeypatch.delenv(wire.DIR_ENV)  # a reader started without it finds the fresh one too
    bases, refused = reader_mod.channel_dirs([])
    assert bases == [fresh], (bases, refused)


def test_the_runtime_directory_comes_first_where_it_is_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(wire.DIR_ENV, raising=False)
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv(wire.RUNTIME_ENV, str(runtime))
    assert wire.default_dir() == str(runtime / "vllm-doctor")
    runtime.chmod(0o777)  # not private: the runtime directory is not used
    assert wire.default_dir() == wire.shared_tmp_dir()
    env = {wire.RUNTIME_ENV: str(runtime), "TMPDIR": "/elsewhere"}  # a server's environment, read by a reader
    assert wire.default_dir(env) == f"/elsewhere/vllm-doctor-{os.getuid()}"


# -- item 4: idle, trickling and too many connections ---------------------------------------------


def test_a_frame_trickled_a_byte_at_a_time_is_cut_off_at_the_whole_frames_deadline(
    served: tuple[Worker, ChannelServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, server = served
    monkeypatch.setattr(server_mod, "FRAME_TIMEOUT_S", 1.0)
    frame = wire.encode({"v": 1, "method": "doctor_ping"})
    with _connect(server) as conn:
        started = time.monotonic()
        closed_after = None
        for byte in frame:  # a byte every 0.3 s: each read is quick, the frame never whole in time
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - started
                break
            time.sleep(0.3)
        if closed_after is None:  # every byte went out before the close was seen
            closed_after = time.monotonic() - started
        reply = wire.recv_frame(conn, wire.MAX_REPLY)
        assert reply["error"]["type"] == "FrameTimeout", reply
        assert closed_after < 4.0, closed_after  # the deadline is the frame's (1 s), not each read's
    with _connect(server) as conn:  # the server serves the next reader
        assert _ask(conn, "doctor_ping")["ok"]


def test_idle_connections_never_lock_the_owner_out_and_a_full_channel_says_who_holds_it(
    served: tuple[Worker, ChannelServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, server = served
    monkeypatch.setattr(server_mod, "IDLE_EVICT_S", 0.5)
    idle = [_connect(server) for _ in range(server_mod.MAX_CONNECTIONS)]  # connected, never a word
    try:
        # while they are fresh, a ninth is refused with the reason (the reader's handle reads it)
        with _connect(server) as ninth:
            refused = _ask(ninth, "doctor_ping")
        assert refused["error"]["type"] == "Refused", refused
        assert f"pid {os.getpid()}" in refused["error"]["message"] and "end one of them" in refused["error"]["message"]
        time.sleep(0.6)
        # idle and holding nothing: each new reader takes an idle one's place, every reader is served
        for _ in range(server_mod.MAX_CONNECTIONS + 2):
            with _connect(server) as conn:
                assert _ask(conn, "doctor_ping")["ok"]
    finally:
        for conn in idle:
            conn.close()
    # readers that hold the hooks keep their places: the next one is refused, told who holds them
    holders = [_connect(server) for _ in range(server_mod.MAX_CONNECTIONS)]
    try:
        for conn in holders:
            reply = _ask(conn, "doctor_install", {"layers": False})
            assert reply.get("reply", {}).get("ok"), reply
        time.sleep(0.6)
        with _connect(server) as extra:
            refused = _ask(extra, "doctor_ping")
        assert refused["error"]["type"] == "Refused" and "(attached)" in refused["error"]["message"], refused
    finally:
        for conn in holders:
            conn.close()


def test_readers_that_hung_up_leave_their_places_to_the_next_at_once(served: tuple[Worker, ChannelServer]) -> None:
    """A full channel whose readers all hung up a moment ago (the loop has not read their ends
    yet): the next readers take their places, none is refused."""
    _, server = served
    for _ in range(3):
        gone = [_connect(server) for _ in range(server_mod.MAX_CONNECTIONS)]
        for conn in gone:
            assert _ask(conn, "doctor_ping")["ok"]  # active just now: none of them is idle
        for conn in gone:
            conn.close()
        fresh = [_connect(server) for _ in range(server_mod.MAX_CONNECTIONS)]
        try:
            for conn in fresh:
                reply = _ask(conn, "doctor_ping")
                assert reply.get("ok"), reply
        finally:
            for conn in fresh:
                conn.close()


def test_the_readers_handle_shows_the_refusal_not_a_broken_pipe(
    served: tuple[Worker, ChannelServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, server = served
    handle = reader_mod.ChannelHandle.__new__(reader_mod.ChannelHandle)
    handle._conns, handle.timeout, handle.paths = {}, 20.0, {os.getpid(): server.path}
    held = [_connect(server) for _ in range(server_mod.MAX_CONNECTIONS)]
    try:
        for conn in held:
            assert _ask(conn, "doctor_install", {"layers": False})["reply"]["ok"]
        (reply,) = handle.rpc("doctor_status")
        assert reply["error"]["type"] == "Refused" and "readers already" in reply["error"]["message"], reply
    finally:
        for conn in held:
            conn.close()
    (reply,) = _until(lambda: [r for r in [handle.rpc("doctor_status")[0]] if r.get("ok")])
    assert reply["ok"], reply
    handle.close()


# -- item 5: every verb's effect ends with its reader ----------------------------------------------


def test_a_reader_that_only_arms_the_probe_and_leaves_leaves_nothing_installed(
    served: tuple[Worker, ChannelServer],
) -> None:
    worker, server = served
    with _connect(server) as conn:
        reply = _ask(conn, "doctor_arm_probe", {"phases": ["prefill"]})
        assert reply["ok"] and reply["reply"]["ok"], reply
        assert session_for(worker).profiler is not None and session_for(worker).probe is not None
    # gone: the session (profiler, probe) is detached
    assert _until(lambda: SESSION_ATTR not in worker.__dict__), vars(session_for(worker))
    # with another reader attached, the prober's leaving disarms its probe and keeps the other's hooks
    with _connect(server) as keeper:
        assert _ask(keeper, "doctor_install", {"layers": False})["reply"]["ok"]
        with _connect(server) as prober:
            assert _ask(prober, "doctor_arm_probe", {"phases": ["decode"]})["reply"]["ok"]
            assert session_for(worker).probe is not None
        assert _until(lambda: session_for(worker).probe is None)
        assert session_for(worker).profiler is not None
        assert _ask(keeper, "doctor_collect", {"timeline": False})["reply"]["ok"]


# -- item 6: files left behind ---------------------------------------------------------------------


def test_the_socket_goes_with_the_server_and_a_stale_one_is_ignored(tmp_path: Path, no_model: None) -> None:
    server = ChannelServer(Worker(), base=str(tmp_path))
    server.start()
    assert Path(server.path).is_socket() and reader_mod.live_socket(server.path, os.getpid())
    server.close()
    assert not Path(server.path).exists()
    # a socket older than the process of its pid: a dead process's, left behind (the pid reused)
    stale = tmp_path / f"chan-{os.getpid()}.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    old = time.time() - 3600
    os.utime(stale, (old, old), follow_symlinks=False)
    assert not reader_mod.live_socket(str(stale), os.getpid())
    assert not reader_mod.live_socket(str(stale), 2**22 + 1)  # no such process


def test_what_killed_engine_processes_left_is_swept_by_the_process_that_started_them(tmp_path: Path) -> None:
    """vLLM's shutdown SIGKILLs the engine core and the workers (seen on vLLM 0.32: "force killing
    remaining processes"): their socket and record stay. The API server's exit (the plugin's, in
    the process that started them) removes its own record and theirs; a live process's stay."""
    repo = str(Path(__file__).resolve().parents[2])
    holder = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {repo!r})
        from vllm_doctor.engine import plugin
        from vllm_doctor.engine.channel import ChannelServer
        from vllm_doctor.engine.extension import DoctorWorkerExtension
        plugin._announce()
        ChannelServer(DoctorWorkerExtension(), base={str(tmp_path)!r}).start()
        print("up", flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "VLLM_DOCTOR": "1", wire.DIR_ENV: str(tmp_path)}
    killed = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env)
    alive = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert killed.stdout is not None and alive.stdout is not None
        assert killed.stdout.readline().strip() == "up" and alive.stdout.readline().strip() == "up"
        killed.kill()
        killed.wait(timeout=30)
        left = {f"chan-{killed.pid}.sock", f"proc-{killed.pid}.json"}
        assert left <= {p.name for p in tmp_path.iterdir()}  # SIGKILL: nothing removed
        # a reader ignores them: the socket's process is gone
        assert not reader_mod.live_socket(str(tmp_path / f"chan-{killed.pid}.sock"), killed.pid)
        assert reader_mod.live_socket(str(tmp_path / f"chan-{alive.pid}.sock"), alive.pid)
        # the API server: its record, announced and removed at its normal exit, and the killed one's swept
        api = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {repo!r}); from vllm_doctor.engine import plugin; "
             "plugin._announce(); print(__import__('os').getpid())"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert api.returncode == 0, api.stderr
        names = {p.name for p in tmp_path.iterdir()}
        assert not left & names and f"proc-{api.stdout.strip()}.json" not in names, names
        assert {f"chan-{alive.pid}.sock", f"proc-{alive.pid}.json"} <= names  # a live server's stay
    finally:
        for proc in (killed, alive):
            proc.kill()
            proc.wait(timeout=30)


def test_frames_are_still_checked(served: tuple[Worker, ChannelServer]) -> None:
    _, server = served
    with _connect(server) as conn:
        conn.sendall(struct.pack(">I", 2**31))
        reply = wire.recv_frame(conn, wire.MAX_REPLY)
        assert reply["error"]["type"] == "BadRequest" and "over the limit" in reply["error"]["message"]
    with _connect(server) as conn:
        assert _ask(conn, "doctor_inject_fault")["error"]["type"] == "BadRequest"
        assert _ask(conn, "doctor_ping")["ok"]  # the connection still serves after a bad request

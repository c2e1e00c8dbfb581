"""The doctor's private channel on a real ``vllm serve`` (the session's server: VLLM_DOCTOR=1, no
dev mode): hostile and broken readers never reach vLLM or change its outputs; another OS user
cannot reach it; the doctor's code in the server opens Unix sockets only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.served import ServedEngine
from vllm_doctor import channel as wire
from vllm_doctor.live.proctree import discover

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]
PROMPTS = ["the channel is private", "nobody else gets in"]


def _outputs(server: ServedEngine) -> list[tuple[str, list[float]]]:
    return server.greedy(PROMPTS, 6)


def _sockets(server: ServedEngine) -> list[Path]:
    paths = sorted(server.procs_dir.glob(f"{wire.SOCKET_PREFIX}*{wire.SOCKET_SUFFIX}"))
    assert paths, f"no channel socket in {server.procs_dir}: {sorted(p.name for p in server.procs_dir.iterdir())}"
    return paths


def _talk(path: Path, payload: bytes, read: bool = True) -> Any:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(path))
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            # a refused connection gets its reply and is closed at once, maybe before the request
            # is written (seen here under load): the reply is still there to read
            pass
        if not read:
            return None
        try:
            return wire.recv_frame(s, wire.MAX_REPLY)
        except (EOFError, ConnectionResetError):
            return "closed"


def _wait_detached(server: ServedEngine, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        (status,) = server.rpc("doctor_status")
        if not status["data"]["profiling"] or time.monotonic() > deadline:
            return status["data"]
        time.sleep(0.2)


def test_the_channel_is_private_to_the_servers_user(served_engine: ServedEngine) -> None:
    mode = served_engine.procs_dir.stat().st_mode & 0o777
    assert mode == 0o700, oct(mode)
    for path in _sockets(served_engine):
        assert path.is_socket() and path.stat().st_mode & 0o777 == 0o600
    # the socket belongs to a process of the server's tree (a worker holder), named by its pid
    pids = {p.pid for p in discover(url=served_engine.base)}
    assert {int(p.name[len(wire.SOCKET_PREFIX) : -len(wire.SOCKET_SUFFIX)]) for p in _sockets(served_engine)} <= pids


def test_hostile_messages_and_a_killed_reader_leave_the_engine_serving_the_same_outputs(
    served_engine: ServedEngine,
) -> None:
    before = _outputs(served_engine)
    path = _sockets(served_engine)[0]
    replies = {
        "unknown verb": _talk(path, wire.encode({"v": 1, "method": "load_model"})),
        "test hook": _talk(path, wire.encode({"v": 1, "method": "doctor_inject_fault", "options": {"where": "steps"}})),
        "bad option": _talk(path, wire.encode({"v": 1, "method": "doctor_install", "options": {"sample_every": -3}})),
        "unknown option": _talk(path, wire.encode({"v": 1, "method": "doctor_collect", "options": {"path": "/etc"}})),
        "not an object": _talk(path, wire.encode([1, 2])),  # type: ignore[arg-type]
        "not JSON": _talk(path, struct.pack(">I", 6) + b"\x00\xffnope"),
        "oversized": _talk(path, struct.pack(">I", 2**31) + b"x" * 100),
        "old protocol": _talk(path, wire.encode({"v": 0, "method": "doctor_ping"})),
    }
    for name, reply in replies.items():
        assert isinstance(reply, dict) and reply["ok"] is False and reply["error"]["type"] == "BadRequest", (
            name,
            reply,
        )
    assert "over the limit" in replies["oversized"]["error"]["message"]
    assert "unknown verb 'doctor_inject_fault'" in replies["test hook"]["error"]["message"]
    # half a frame, then silence: the server gives up on it (it never reaches the worker)
    _talk(path, struct.pack(">I", 100) + b'{"v": 1', read=False)
    # a reader that attaches, asks for the profile and is killed before it reads the reply
    reader = textwrap.dedent(f"""
        import os, signal, socket, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from vllm_doctor import channel as wire
        s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r})
        s.sendall(wire.encode({{"v": 1, "method": "doctor_install", "options": {{"layers": True, "sample_every": 1}}}}))
        assert wire.recv_frame(s, wire.MAX_REPLY)["reply"]["ok"]
        print("attached", flush=True)
        sys.stdin.readline()
        s.sendall(wire.encode({{"v": 1, "method": "doctor_collect", "options": {{"timeline": True}}}}))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.Popen([sys.executable, "-c", reader], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "attached"
    (status,) = served_engine.rpc("doctor_status")
    assert status["data"]["profiling"] is True  # the killed reader had attached
    during = _outputs(served_engine)  # served while attached, per layer on every step
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    # the reader is gone: the server detaches it, nothing of the doctor stays in the worker
    status = _wait_detached(served_engine)
    assert status["profiling"] is False and status["wrapped_methods"] == [], status
    assert status["model_hook_counts"] == {"forward_pre_hooks": 0, "forward_hooks": 0}
    after = _outputs(served_engine)
    assert before == during == after  # the same tokens and logprobs
    # nine readers at once: the ninth is refused, the others served
    held = [socket.socket(socket.AF_UNIX) for _ in range(8)]
    try:
        for s in held:
            s.connect(str(path))
        refused = _talk(path, wire.encode({"v": 1, "method": "doctor_ping"}))
        assert refused["ok"] is False and refused["error"]["type"] == "Refused", refused
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 30
    while True:  # the held connections' threads notice the close
        reply = _talk(path, wire.encode({"v": 1, "method": "doctor_ping"}))
        if (isinstance(reply, dict) and reply["ok"]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert isinstance(reply, dict) and reply["ok"] and reply["reply"]["ok"], reply


def test_another_os_user_cannot_reach_the_channel(served_engine: ServedEngine) -> None:
    """``nobody`` gets EACCES on the socket (the directory is 0700), and cannot attach."""
    if os.geteuid() != 0:
        pytest.skip(f"running a reader as another user needs root (this test runs as uid {os.geteuid()})")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that the user nobody can run")
    import pwd

    nobody = pwd.getpwnam("nobody")
    paths = [str(p) for p in _sockets(served_engine)]
    probe = textwrap.dedent(f"""
        import json, socket
        out = {{}}
        for path in {paths!r}:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                s.sendall(b"\\x00\\x00\\x00\\x20" + b'{{"v": 1, "method": "doctor_ping"}}')
                out[path] = "connected: " + repr(s.recv(200))
            except OSError as exc:
                out[path] = type(exc).__name__
        print(json.dumps(out))
    """)

    def as_nobody() -> None:
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    proc = subprocess.run([python, "-c", probe], preexec_fn=as_nobody, capture_output=True, text=True,
                          timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout).values()) == {"PermissionError"}, proc.stdout
    (status,) = served_engine.rpc("doctor_status")
    assert status["data"]["profiling"] is False


def test_the_doctor_opens_unix_sockets_only_in_the_server(served_engine: ServedEngine) -> None:
    """Every socket the doctor's code created or bound in the server's processes (recorded by an
    audit hook in each: tests/fixtures/audit_site) is a Unix socket: the channel adds no TCP
    listener to what vLLM opens."""
    served_engine.rpc("doctor_ping")
    pids = {p.pid for p in discover(url=served_engine.base)}
    records = []
    for pid in pids:
        path = served_engine.audit_dir / f"{pid}.jsonl"
        if path.exists():
            records += [json.loads(line) for line in path.read_text().splitlines()]
    binds = [r for r in records if r["event"] == "socket.bind"]
    assert binds, f"no socket bound by the doctor's code in {sorted(pids)}: the audit hook saw {records}"
    assert {r["family"] for r in records} == {int(socket.AF_UNIX)}, records
    assert all(wire.SOCKET_PREFIX in r["address"] for r in binds), binds


# -- issue 47: nobody else steers the doctor ---------------------------------------------------------


def _status(server: ServedEngine) -> dict[str, Any]:
    (status,) = server.rpc("doctor_status")
    assert status["ok"], status
    data: dict[str, Any] = status["data"]
    return data


def _status_within(server: ServedEngine, timeout: float) -> dict[str, Any]:
    """:func:`_status` once the channel serves it, asked every 0.5 s until ``timeout`` (then its error)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _status(server)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_metrics_scrape_switches_nothing_on_in_the_workers(served_engine: ServedEngine) -> None:
    """The session's server has no VLLM_DOCTOR_METRICS (the default): a /metrics scrape, from
    anyone (vLLM applies no --api-key there; another OS user where the test runs as root), neither
    carries the doctor's series nor attaches anything in the workers."""
    assert _status(served_engine)["profiling"] is False
    scrape = f"import urllib.request; print(urllib.request.urlopen({served_engine.base + '/metrics'!r}).read().decode())"
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() == 0 and python is not None:
        import pwd

        nobody = pwd.getpwnam("nobody")

        def as_nobody() -> None:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)

        proc = subprocess.run([python, "-c", scrape], preexec_fn=as_nobody, capture_output=True, text=True,
                              timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    else:
        proc = subprocess.run([sys.executable, "-c", scrape], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "vllm:num_requests_running" in proc.stdout and "vllm_doctor_" not in proc.stdout
    time.sleep(3)  # the exporter of before attached on a thread a moment after the scrape
    status = _status(served_engine)
    assert status["profiling"] is False and status["wrapped_methods"] == [], status


def test_a_reader_that_only_arms_the_probe_leaves_nothing_installed(served_engine: ServedEngine) -> None:
    path = _sockets(served_engine)[0]
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(str(path))
        s.sendall(wire.encode({"v": 1, "method": "doctor_arm_probe", "options": {"phases": ["prefill", "decode"]}}))
        reply = wire.recv_frame(s, wire.MAX_REPLY)
        assert reply["ok"] and reply["reply"]["ok"] and reply["reply"]["data"]["armed"], reply
        status = _status(served_engine)
        assert status["profiling"] is True and status["probe_hooks"] > 0, status
    status = _wait_detached(served_engine)
    assert status["profiling"] is False and status["probe_hooks"] == 0 and status["probe_armed"] == [], status
    assert status["wrapped_methods"] == [] and status["model_hook_counts"] == {"forward_pre_hooks": 0, "forward_hooks": 0}


def test_idle_and_trickling_readers_never_lock_the_owner_out(served_engine: ServedEngine) -> None:
    from vllm_doctor.engine.channel import FRAME_TIMEOUT_S, IDLE_EVICT_S, MAX_CONNECTIONS

    path = _sockets(served_engine)[0]
    trickler = socket.socket(socket.AF_UNIX)
    trickler.settimeout(60)
    trickler.connect(str(path))
    idle = [socket.socket(socket.AF_UNIX) for _ in range(MAX_CONNECTIONS - 1)]
    try:
        for s in idle:
            s.connect(str(path))
        frame = wire.encode({"v": 1, "method": "doctor_ping"})
        started, cut = time.monotonic(), None
        for byte in frame:  # a byte every 2 s: each read is quick, the whole frame never in time
            try:
                trickler.sendall(bytes([byte]))
            except OSError:
                cut = time.monotonic() - started
                break
            time.sleep(2.0)
        assert cut is not None and cut < FRAME_TIMEOUT_S + 5, cut  # the frame's deadline, not each read's
        idle.append(socket.socket(socket.AF_UNIX))
        idle[-1].connect(str(path))  # the channel's every place taken by an idle connection
        time.sleep(IDLE_EVICT_S + 1)
        # the owner's reader takes the place of one that sat idle holding nothing: served (asked again
        # until a deadline: on a loaded machine the channel's loop may see the idle time a moment late)
        status = _status_within(served_engine, 60)
        assert status["profiling"] is False
    finally:
        trickler.close()
        for s in idle:
            s.close()


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server of this module's own, started without VLLM_DOCTOR_DIR: its private directory is
    where a user's is by default, under a TMPDIR of the test's, where (as root) the user nobody
    made ``vllm-doctor-<uid>`` first. Stopped by the last test."""
    tmp = tmp_path_factory.mktemp("own")
    tmpdir = tmp / "tmp"
    tmpdir.mkdir()
    tmpdir.chmod(0o1777)
    squatted = tmpdir / f"vllm-doctor-{os.getuid()}"
    if os.geteuid() == 0:
        squatted.mkdir(mode=0o700)
        os.chown(squatted, 65534, 65534)
    server = ServedEngine(tmp)
    server.env.pop(wire.DIR_ENV, None)
    server.env.pop(wire.RUNTIME_ENV, None)
    server.env["TMPDIR"] = str(tmpdir)
    server.start()
    try:
        yield server, tmpdir, squatted
    finally:
        server.stop()


def test_a_directory_another_user_made_first_does_not_disable_the_channel(own_server: Any) -> None:
    server, tmpdir, squatted = own_server
    if os.geteuid() != 0:
        pytest.skip(f"making a directory for another user needs root (this test runs as uid {os.geteuid()})")
    log = server.log.read_text()
    assert f"{squatted} belongs to uid 65534" in log and "another user created it first" in log, log[-3000:]
    fresh = [p for p in tmpdir.glob(f"{squatted.name}-*") if p.is_dir()]
    assert len(fresh) == 1 and fresh[0].stat().st_mode & 0o777 == 0o700, fresh
    assert list(fresh[0].glob("chan-*.sock")), sorted(p.name for p in fresh[0].iterdir())
    # the reader (whose own TMPDIR is elsewhere) finds it through the engine processes' environment
    (ping,) = server.rpc("doctor_ping")
    assert ping["ok"], ping


def test_a_graceful_stop_leaves_no_socket_and_no_record(own_server: Any) -> None:
    server, tmpdir, _ = own_server
    dirs = [p for p in tmpdir.glob(f"vllm-doctor-{os.getuid()}*") if p.is_dir() and p.stat().st_uid == os.getuid()]
    assert dirs and any(list(d.glob("chan-*.sock")) for d in dirs), dirs
    assert any(list(d.glob("proc-*.json")) for d in dirs)
    server.stop()  # SIGTERM to the server's process group, as a terminal's Ctrl-C or systemd does
    left = [str(p) for d in dirs if d.exists() for p in d.iterdir()]
    assert left == [], left

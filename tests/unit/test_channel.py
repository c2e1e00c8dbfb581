"""The private channel's pure parts: the verbs it accepts, its frames, its directory's rules, and
which listening addresses make vLLM's dev endpoint unsafe (plain data, no engine)."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import pytest

from vllm_doctor import channel as wire
from vllm_doctor.live.channel import exposed_addresses


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        ({"v": 1, "method": "doctor_inject_fault"}, "unknown verb 'doctor_inject_fault'"),
        ({"v": 1, "method": "__init__"}, "unknown verb"),
        ({"v": 1, "method": 3}, "unknown verb"),
        ({"v": 2, "method": "doctor_ping"}, "protocol version 2"),
        ({"method": "doctor_ping"}, "protocol version None"),
        ({"v": 1, "method": "doctor_ping", "args": ["x"]}, "unknown request fields: ['args']"),
        ({"v": 1, "method": "doctor_collect", "options": "reset"}, "options are a JSON object"),
        ({"v": 1, "method": "doctor_collect", "options": {"reset": 1}}, "reset must be true or false"),
        (
            {"v": 1, "method": "doctor_install", "options": {"sample_every": 0}},
            "sample_every must be an integer in [1,",
        ),
        ({"v": 1, "method": "doctor_install", "options": {"sample_every": True}}, "sample_every must be an integer"),
        ({"v": 1, "method": "doctor_install", "options": {"trace_steps": 10**9}}, "trace_steps must be an integer"),
        ({"v": 1, "method": "doctor_arm_probe", "options": {"phases": ["rm -rf"]}}, "phases must be a list of"),
        ({"v": 1, "method": "doctor_arm_probe", "options": {"phases": []}}, "phases must be a list of"),
        ({"v": 1, "method": "doctor_ping", "options": {"x": 1}}, "unknown option 'x' (known: none)"),
        ([1, 2], "a request is a JSON object, not list"),
    ],
)
def test_the_channel_refuses_what_is_not_one_of_its_verbs(request_: object, says: str) -> None:
    with pytest.raises(wire.ChannelError) as raised:
        wire.validate(request_)
    assert says in str(raised.value)


def test_the_verbs_and_their_options_pass() -> None:
    assert wire.validate({"v": 1, "method": "doctor_ping"}) == ("doctor_ping", {})
    assert wire.validate({"v": 1, "method": "doctor_collect", "options": {"reset": True, "timeline": False}}) == (
        "doctor_collect",
        {"reset": True, "timeline": False},
    )
    assert wire.validate(
        {"v": 1, "method": "doctor_install", "options": {"layers": False, "sample_every": 8, "trace_steps": 64}}
    )[1] == {"layers": False, "sample_every": 8, "trace_steps": 64}
    assert wire.validate({"v": 1, "method": "doctor_arm_probe", "options": {"phases": ["prefill", "decode"]}})[0]
    # test hooks and parity's hidden-state capture are not verbs of the channel
    assert not {"doctor_inject_fault", "doctor_arm_hidden", "doctor_collect_hidden"} & set(wire.VERBS)


def test_frames_over_the_limit_or_not_json_are_refused_before_they_are_read() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", wire.MAX_REQUEST + 1))
        with pytest.raises(wire.ChannelError, match="over the limit"):
            wire.recv_frame(b, wire.MAX_REQUEST)
        a.sendall(struct.pack(">I", 3) + b"{x}")
        with pytest.raises(wire.ChannelError, match="not JSON"):
            wire.recv_frame(b, wire.MAX_REQUEST)
        a.sendall(wire.encode({"v": 1, "method": "doctor_ping"}))
        assert wire.recv_frame(b, wire.MAX_REQUEST) == {"v": 1, "method": "doctor_ping"}
        a.sendall(struct.pack(">I", 10) + b"{")
        a.close()
        with pytest.raises(EOFError):
            wire.recv_frame(b, wire.MAX_REQUEST)


def test_the_peer_is_this_user() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert wire.peer_uid(a) in (None, os.getuid())


def test_the_private_directory_is_made_0700_and_an_open_or_foreign_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "doctor"
    monkeypatch.setenv(wire.DIR_ENV, str(base))
    assert wire.private_dir() == str(base)
    assert base.stat().st_mode & 0o777 == 0o700
    base.chmod(0o755)  # opened to others after the fact: not used
    with pytest.raises(wire.UnsafeDir, match="open to other users"):
        wire.private_dir()
    base.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(base)
    monkeypatch.setenv(wire.DIR_ENV, str(link))
    with pytest.raises(wire.UnsafeDir, match="not a directory"):
        wire.private_dir()
    if os.geteuid() == 0:  # a directory someone else made (root can make one for nobody)
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        monkeypatch.setenv(wire.DIR_ENV, str(foreign))
        with pytest.raises(wire.UnsafeDir, match="belongs to uid 65534"):
            wire.private_dir()


def _proc_net(tmp_path: Path, tcp: list[str], tcp6: list[str]) -> Path:
    net = tmp_path / "net"
    net.mkdir(parents=True)
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (net / "tcp").write_text(
        head
        + "".join(
            f"   0: {a} 00000000:0000 {st} 0 0 0 0 0 0 0 {i}\n" for i, (a, st) in enumerate(x.split() for x in tcp)
        )
    )
    (net / "tcp6").write_text(
        head
        + "".join(
            f"   0: {a} 00000000000000000000000000000000:0000 {st} 0 0 0 0 0 0 0 {i}\n"
            for i, (a, st) in enumerate(x.split() for x in tcp6)
        )
    )
    return tmp_path


def test_listening_on_anything_but_loopback_is_exposed(tmp_path: Path) -> None:
    port = "1F40"  # 8000
    proc = _proc_net(
        tmp_path,
        tcp=[f"0100007F:{port} 0A", "0100007F:1F41 0A", f"0A00000A:{port} 01"],
        tcp6=[f"00000000000000000000000001000000:{port} 0A"],
    )
    assert exposed_addresses(8000, proc) == []  # 127.0.0.1 and ::1 listening; a connection is not a listener
    proc2 = _proc_net(
        tmp_path / "b",
        tcp=[f"00000000:{port} 0A", f"0100000A:{port} 0A"],
        tcp6=[f"00000000000000000000000000000000:{port} 0A"],
    )
    assert exposed_addresses(8000, proc2) == ["0.0.0.0", "10.0.0.1", "::"]

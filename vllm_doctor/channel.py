"""The doctor's private channel to the processes that hold the model: where it is, what it says.

With ``VLLM_DOCTOR=1`` each process that holds a vLLM worker (the engine core of a one-GPU
``vllm serve``, each worker process of a multi-process engine) listens on a Unix-domain socket
``<dir>/chan-<pid>.sock`` (:mod:`vllm_doctor.engine.channel`); ``attach``, ``top`` and the
``/metrics`` exporter read through it (:mod:`vllm_doctor.live.channel`). No TCP listener, no
HTTP route, no vLLM RPC: the engine core is not asked, and vLLM's dev mode is not needed.

Who may talk to it: ``<dir>`` is the user's private directory (:func:`private_dir`: mode 0700,
owned by the user, refused otherwise), the socket is 0600, and the server also checks the peer's
uid (``SO_PEERCRED``): another OS user can neither reach the socket nor be served if it did.

What it accepts: the verbs of :data:`VERBS` only (the doctor's worker methods that attach,
collect and detach; no test hooks, nothing named by the caller), each request one frame (a
4-byte big-endian length, then a UTF-8 JSON object of at most :data:`MAX_REQUEST` bytes)
``{"v": 1, "method": "doctor_collect", "options": {"reset": true}}``, its options checked
against the verb's table (:func:`validate`). A reply is one frame:
``{"v": 1, "ok": true, "reply": <the worker method's envelope>}`` or
``{"v": 1, "ok": false, "error": {"type": ..., "message": ...}}``.

Standard library only: vLLM imports this module in every engine process when the doctor is on.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from typing import Any

PROTOCOL = 1
HEADER = struct.Struct(">I")
MAX_REQUEST = 64 * 1024  # bytes of one request's JSON: the largest valid one is under 200
MAX_REPLY = 256 * 2**20  # bytes of one reply: a collect with a full per-layer trace stays far below
SOCKET_PREFIX = "chan-"
SOCKET_SUFFIX = ".sock"
DIR_ENV = "VLLM_DOCTOR_DIR"

PHASES = ("prefill", "decode", "any")
# verb -> {option: (type, low, high)}; ``bool`` options have no bounds, ``list`` ones are phases
VERBS: dict[str, dict[str, tuple[type, int | None, int | None]]] = {
    "doctor_ping": {},
    "doctor_status": {},
    "doctor_anatomy": {},
    "doctor_perf": {},
    "doctor_placement": {},
    "doctor_kv": {},
    "doctor_memory": {},
    "doctor_quant": {},
    "doctor_install": {
        "layers": (bool, None, None),
        "sample_every": (int, 1, 100_000),
        "trace_steps": (int, 0, 100_000),
    },
    "doctor_arm_probe": {"phases": (list, 1, len(PHASES))},
    "doctor_collect": {"reset": (bool, None, None), "timeline": (bool, None, None)},
    "doctor_detach": {},
}


class ChannelError(Exception):
    """A request the channel refuses, or a frame it cannot read (the reply says which)."""


class UnsafeDir(ChannelError):
    """The channel's directory exists but is not the user's own private directory."""


def default_dir() -> str:
    """``$VLLM_DOCTOR_DIR``, default ``$TMPDIR/vllm-doctor-<uid>``."""
    base = os.environ.get(DIR_ENV)
    if base:
        return base
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"vllm-doctor-{os.getuid()}")


def private_dir(create: bool = True) -> str:
    """The user's private directory of the doctor (:func:`default_dir`): created with mode 0700;
    one that exists must be a directory (not a link) owned by this user with no access for group
    or others, else :class:`UnsafeDir` (someone else made it, or opened it: the doctor puts
    nothing there and reads nothing from it)."""
    base = default_dir()
    if create:
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
    return checked_dir(base)


def checked_dir(base: str) -> str:
    """``base`` if it is a directory of this user's, closed to everyone else; else :class:`UnsafeDir`
    (:class:`FileNotFoundError` if there is none)."""
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"{base} is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDir(f"{base} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    if st.st_mode & 0o077:
        raise UnsafeDir(f"{base} is open to other users (mode {stat.S_IMODE(st.st_mode):o}, want 700)")
    return base


def socket_path(pid: int, base: str) -> str:
    return os.path.join(base, f"{SOCKET_PREFIX}{pid}{SOCKET_SUFFIX}")


def validate(request: Any) -> tuple[str, dict[str, Any]]:
    """The verb and its options of a decoded request, or :class:`ChannelError` saying what is wrong."""
    if not isinstance(request, dict):
        raise ChannelError(f"a request is a JSON object, not {type(request).__name__}")
    if request.get("v") != PROTOCOL:
        raise ChannelError(f"protocol version {request.get('v')!r} is not {PROTOCOL}")
    unknown = set(request) - {"v", "method", "options"}
    if unknown:
        raise ChannelError(f"unknown request fields: {sorted(unknown)[:5]}")
    method = request.get("method")
    if not isinstance(method, str) or method not in VERBS:
        raise ChannelError(f"unknown verb {str(method)[:80]!r}: the channel accepts {', '.join(sorted(VERBS))}")
    options = request.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ChannelError(f"{method}: options are a JSON object, not {type(options).__name__}")
    table = VERBS[method]
    for key, value in options.items():
        if key not in table:
            raise ChannelError(
                f"{method}: unknown option {str(key)[:80]!r} (known: {', '.join(sorted(table)) or 'none'})"
            )
        kind, low, high = table[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise ChannelError(f"{method}: {key} must be true or false")
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or not (low or 0) <= value <= (high or value):
                raise ChannelError(f"{method}: {key} must be an integer in [{low}, {high}]")
        elif kind is list:
            if (
                not isinstance(value, list)
                or not (low or 0) <= len(value) <= (high or len(value))
                or any(p not in PHASES for p in value)
            ):
                raise ChannelError(f"{method}: {key} must be a list of {', '.join(PHASES)}")
    return method, dict(options)


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, default=str).encode()
    return HEADER.pack(len(body)) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or :class:`EOFError` if the peer closed first (``socket.timeout`` passes through)."""
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError(f"the peer closed the connection after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, limit: int) -> Any:
    """One frame's decoded JSON; :class:`ChannelError` for a frame over ``limit`` or not JSON."""
    (size,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    if size > limit:
        raise ChannelError(f"a frame of {size} bytes is over the limit of {limit}")
    raw = recv_exact(sock, size)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ChannelError(f"the frame is not JSON: {exc}") from None


def peer_uid(sock: socket.socket) -> int | None:
    """The connected peer's uid (Linux ``SO_PEERCRED``), None where the platform cannot say."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)

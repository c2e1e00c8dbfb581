"""The doctor's private channel to the processes that hold the model: where it is, what it says.

With ``VLLM_DOCTOR=1`` each process that holds a vLLM worker (the engine core of a one-GPU
``vllm serve``, each worker process of a multi-process engine) listens on a Unix-domain socket
``<dir>/chan-<pid>.sock`` (:mod:`vllm_doctor.engine.channel`); ``attach``, ``top`` and the
``/metrics`` exporter read through it (:mod:`vllm_doctor.live.channel`). No TCP listener, no
HTTP route, no vLLM RPC: the engine core is not asked, and vLLM's dev mode is not needed.

Who may talk to it: ``<dir>`` is the user's private directory (:func:`private_dir`: mode 0700,
owned by the user, refused otherwise), the socket is 0600, and the server also checks the peer's
uid (``SO_PEERCRED``): another OS user can neither reach the socket nor be served if it did.
Where it is (:func:`default_dir`): ``$VLLM_DOCTOR_DIR``; else ``$XDG_RUNTIME_DIR/vllm-doctor``
where the runtime directory is the user's own (``/run/user/<uid>``, which nobody else can write
in); else ``$TMPDIR/vllm-doctor-<uid>``. That last name is predictable: another user may create
it first. The server then refuses it, makes a fresh directory only it could have made
(``$TMPDIR/vllm-doctor-<uid>-XXXXXXXX``, :func:`private_dir`) and records it in its environment
(``VLLM_DOCTOR_DIR``, inherited by the engine's processes it starts), where a reader finds it
(``/proc/PID/environ``, readable by the same user only); a reader names a squatted directory
and its owner (:func:`describe_unsafe`).

Each file the doctor puts there (the sockets, ``proc-<pid>.json``) is removed by its process
when it exits normally (:func:`at_exit`: vLLM's engine processes exit through
``multiprocessing``, which skips ``atexit``); a reader ignores a file older than the process
of its pid (:func:`stale`): one a killed process left.

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

import contextlib
import json
import os
import re
import socket
import stat
import struct
from collections.abc import Callable, Mapping
from typing import Any

from vllm_doctor.constants import DIR_ENV, STEP_CLOCKS

PROTOCOL = 1
HEADER = struct.Struct(">I")
MAX_REQUEST = 64 * 1024  # bytes of one request's JSON: the largest valid one is under 200
MAX_REPLY = 256 * 2**20  # bytes of one reply: a collect with a full per-layer trace stays far below
SOCKET_PREFIX = "chan-"
SOCKET_SUFFIX = ".sock"

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
        "step_clock": (str, None, None),
    },
    "doctor_arm_probe": {"phases": (list, 1, len(PHASES))},
    "doctor_collect": {"reset": (bool, None, None), "timeline": (bool, None, None)},
    "doctor_detach": {},
}

# a ``str`` option's values
CHOICES: dict[str, tuple[str, ...]] = {"step_clock": STEP_CLOCKS}


class ChannelError(Exception):
    """A request the channel refuses, or a frame it cannot read (the reply says which)."""


class UnsafeDir(ChannelError):
    """The channel's directory exists but is not the user's own private directory."""


RUNTIME_ENV = "XDG_RUNTIME_DIR"  # systemd's /run/user/<uid>: the user's own, 0700, nobody else writes there
RUNTIME_NAME = "vllm-doctor"
FALLBACK_PREFIX = "vllm-doctor-"  # + uid in $TMPDIR: predictable; + uid + "-" + random when that is taken


def default_dir(environ: Mapping[str, str] | None = None) -> str:
    """Where the doctor's private directory is for a process with ``environ`` (default: this
    one's): ``$VLLM_DOCTOR_DIR``; else ``$XDG_RUNTIME_DIR/vllm-doctor`` if ``$XDG_RUNTIME_DIR``
    is a directory of this user's closed to others; else ``$TMPDIR/vllm-doctor-<uid>``."""
    env = os.environ if environ is None else environ
    base = env.get(DIR_ENV)
    if base:
        return base
    runtime = env.get(RUNTIME_ENV)
    if runtime and os.path.isabs(runtime):
        try:
            return os.path.join(checked_dir(runtime), RUNTIME_NAME)
        except (UnsafeDir, OSError):
            pass
    return shared_tmp_dir(env)


def shared_tmp_dir(environ: Mapping[str, str] | None = None) -> str:
    """``$TMPDIR/vllm-doctor-<uid>``: in a directory every user may write to."""
    return os.path.join(_tmp(environ), f"{FALLBACK_PREFIX}{os.getuid()}")


def _tmp(environ: Mapping[str, str] | None) -> str:
    if environ is None:
        import tempfile

        return tempfile.gettempdir()
    for name in ("TMPDIR", "TEMP", "TMP"):
        if environ.get(name):
            return environ[name]
    return "/tmp"


def fallback_dirs() -> list[str]:
    """The fresh directories :func:`private_dir` made where the shared one was taken (this
    user's only: :func:`checked_dir` decides)."""
    import glob

    pattern = glob.escape(shared_tmp_dir()) + "-*"
    return sorted(glob.glob(pattern))


def private_dir(create: bool = True) -> str:
    """The user's private directory of the doctor (:func:`default_dir`): created with mode 0700;
    one that exists must be a directory (not a link) owned by this user with no access for group
    or others, else :class:`UnsafeDir` (someone else made it, or opened it: the doctor puts
    nothing there and reads nothing from it).

    Where that directory is ``$TMPDIR/vllm-doctor-<uid>`` (no ``$VLLM_DOCTOR_DIR`` given) and
    another user made it first, ``create`` makes a fresh one instead (``tempfile.mkdtemp``:
    a name nobody can guess, created 0700 by this process) and puts it in this process's
    environment as ``$VLLM_DOCTOR_DIR``: the engine processes started from here use it too, and a
    reader finds it in their ``/proc/PID/environ``."""
    base = default_dir()
    if create:
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
    try:
        return checked_dir(base)
    except UnsafeDir as refused:
        if not create or os.environ.get(DIR_ENV) or base != shared_tmp_dir():
            raise
        import logging
        import tempfile

        fresh = tempfile.mkdtemp(prefix=os.path.basename(base) + "-", dir=os.path.dirname(base))
        os.environ[DIR_ENV] = fresh
        at_exit(lambda: _remove_empty(fresh))  # after the records' sweep: at_exit runs the last registered first
        logging.getLogger("vllm_doctor").warning(
            "vllm-doctor: %s; the doctor's private directory is %s instead (VLLM_DOCTOR_DIR)", refused, fresh
        )
        return fresh


def _remove_empty(base: str) -> None:
    sweep(base)
    with contextlib.suppress(OSError):
        os.rmdir(base)  # only if nothing else is there (another server of the user's)


def owner_name(uid: int) -> str:
    """``uid 1001 (alice)``, or ``uid 1001`` where the system has no name for it."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def checked_dir(base: str) -> str:
    """``base`` if it is a directory of this user's, closed to everyone else; else :class:`UnsafeDir`
    (:class:`FileNotFoundError` if there is none)."""
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"{base} is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDir(
            f"{base} belongs to {owner_name(st.st_uid)}, not to this user ({owner_name(os.getuid())}): "
            "another user created it first"
        )
    if st.st_mode & 0o077:
        raise UnsafeDir(f"{base} is open to other users (mode {stat.S_IMODE(st.st_mode):o}, want 700)")
    return base


def describe_unsafe(base: str) -> str | None:
    """Why ``base`` is not used (:func:`checked_dir`'s words); None if it is usable or absent."""
    try:
        checked_dir(base)
    except UnsafeDir as exc:
        return str(exc)
    except OSError:
        return None
    return None


def at_exit(fn: Callable[[], None]) -> None:
    """Run ``fn`` when this process exits normally: ``atexit`` for a main process, and
    ``multiprocessing``'s exit hooks for the processes vLLM spawns (its engine core and workers
    end with ``os._exit``, which skips ``atexit``, after running those). ``fn`` may run twice."""
    import atexit
    from multiprocessing import util

    atexit.register(fn)
    util.Finalize(None, fn, exitpriority=100)


def running(pid: int) -> bool:
    """Is process ``pid`` running (not gone, not a zombie)?"""
    from vllm_doctor.procfs import stat_fields

    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def stale(path: str, pid: int) -> bool:
    """Is the file ``path`` of process ``pid`` left behind: ``pid`` gone (or a zombie), or the
    file older than the process now running as ``pid`` (a dead process's, the pid reused)?"""
    from vllm_doctor.procfs import started_at

    started = started_at(pid)
    if not running(pid) or started is None:
        return True
    try:
        return os.stat(path).st_mtime < started - 2.0  # btime is whole seconds
    except OSError:
        return True


RECORD_RE = re.compile(rf"^(?:{re.escape(SOCKET_PREFIX)}(\d+){re.escape(SOCKET_SUFFIX)}|proc-(\d+)\.json)$")


def sweep(base: str) -> list[str]:
    """Remove the sockets and ``proc-<pid>.json`` records in ``base`` that processes no longer
    running left (:func:`stale`); the names removed. vLLM's engine core and workers do not remove
    their own on a ``vllm serve``'s shutdown (the API server kills them with SIGKILL at once):
    the API server's own exit sweeps, and so does every process's start."""
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        match = RECORD_RE.match(name)
        if match is None:
            continue
        path = os.path.join(base, name)
        if stale(path, int(match.group(1) or match.group(2))):
            try:
                os.unlink(path)
            except OSError:
                continue
            removed.append(name)
    return removed


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
        elif kind is str:
            if value not in CHOICES[key]:
                raise ChannelError(f"{method}: {key} must be one of {', '.join(CHOICES[key])}")
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
    return decode(recv_exact(sock, size))


def decode(raw: bytes) -> Any:
    """A frame's body as JSON; :class:`ChannelError` if it is not."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ChannelError(f"the frame is not JSON: {exc}") from None


def peer_uid(sock: socket.socket) -> int | None:
    """The connected peer's uid (Linux ``SO_PEERCRED``), None where the platform cannot say."""
    return peer_creds(sock)[1]


def peer_creds(sock: socket.socket) -> tuple[int | None, int | None]:
    """The connected peer's pid and uid (Linux ``SO_PEERCRED``), None where the platform cannot say."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None, None
    creds = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)

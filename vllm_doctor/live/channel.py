"""A served engine's workers through the doctor's private channel (the reader's side).

:class:`ChannelHandle` has the interface of :class:`vllm_doctor.compat.http.HttpEngineHandle`
(``rpc``, ``ensure_extension``, ``front_end``, ``model_name``), so :class:`EngineDoctor
<vllm_doctor.live.attach.EngineDoctor>` and ``top``'s model panel use either. The workers are
found from the server's URL or pid: the engine's process tree (:mod:`vllm_doctor.live.proctree`),
then each process's socket ``chan-<pid>.sock`` in this user's private directory
(:mod:`vllm_doctor.channel`). One connection per worker process, kept open while the handle
lives; the server detaches a reader that goes away. The served model's name and vLLM's version
still come from the OpenAI API's public routes (``/v1/models``, ``/version``).

:func:`served_engine` picks the channel, or vLLM's dev endpoint ``/collective_rpc`` as a
fallback, only for a server of this OS user's (:func:`foreign_listeners`: the listening socket's
owner in ``/proc/net/tcp``) that listens on loopback alone (:func:`exposed_addresses`). A server
of another user's is refused before anything is asked of it: its replies would be the report.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path
from typing import Any

from vllm_doctor import channel as wire
from vllm_doctor.compat.http import HttpEngineHandle, ServerError, normalize_url
from vllm_doctor.compat.llm import ExtensionMissing
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.live.proctree import PROC, discover, listening_rows, port_of

CHANNEL_HINT = "start the server with VLLM_DOCTOR=1 as this user: its workers then open the doctor's private channel"
# a server's error replies after which it closes the connection (the next request opens another)
CLOSING_ERRORS = ("Refused", "FrameTimeout", "Closed")


class NoChannel(ServerError):
    """The engine's processes have no channel this user can open (no VLLM_DOCTOR=1, another user)."""


class ChannelHandle:
    """The workers of the engine at ``url`` (or around ``pid``), through their channel sockets."""

    def __init__(self, url: str | None, timeout: float = 60.0, pid: int | None = None, name: str | None = None) -> None:
        """``url``: the server's (its process tree found from the port; the model's name and
        vLLM's version asked of its public routes); or ``url=None``, ``pid`` and ``name``: the
        engine around ``pid`` serving ``name`` (the ``/metrics`` exporter, in the API server)."""
        self._conns: dict[int, socket.socket] = {}
        self.http = HttpEngineHandle(url, timeout=timeout) if url is not None else None
        self.url = self.http.url if self.http is not None else f"pid {pid}"
        self.name = name
        self.timeout = timeout
        procs = discover(url=None if pid is not None else self.url, pid=pid)
        self.procs = procs
        self.paths: dict[int, str] = {}
        bases, refused = channel_dirs([p.pid for p in procs])
        for base in bases:
            self.paths = {p.pid: path for p in procs if live_socket(path := wire.socket_path(p.pid, base), p.pid)}
            if self.paths:
                self.base = base
                break
        if not self.paths:
            where = " or ".join(bases) or "a private directory of this user's"
            why = "".join(f"; {reason}: the doctor does not use it" for reason in refused)
            raise NoChannel(
                f"no process of the engine at {self.url} ({len(procs)} processes: "
                f"{', '.join(p.label() for p in procs[:6])}) has a vllm-doctor channel in {where}{why}",
                squat_hint(refused) or CHANNEL_HINT,
            )

    # -- transport ----------------------------------------------------------------------------
    def _conn(self, pid: int) -> socket.socket:
        conn = self._conns.get(pid)
        if conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(self.timeout)
            try:
                conn.connect(self.paths[pid])
            except OSError as exc:
                conn.close()
                raise ServerError(
                    f"cannot open the vllm-doctor channel of pid {pid} ({self.paths[pid]}): {exc.strerror or exc}",
                    "is the server still running, as this user?",
                ) from None
            self._conns[pid] = conn
        return conn

    def _ask(self, pid: int, method: str, options: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        request = {"v": wire.PROTOCOL, "method": method, "options": options or {}}
        try:
            conn = self._conn(pid)
            conn.settimeout(timeout)
            try:
                conn.sendall(wire.encode(request))
            except (BrokenPipeError, ConnectionResetError):
                pass  # a server that refuses a connection writes why and closes: the reason is there to read
            reply = wire.recv_frame(conn, wire.MAX_REPLY)
        except (OSError, EOFError, wire.ChannelError) as exc:
            self._drop(pid)
            return _failed(method, pid, "ChannelError", f"the channel of pid {pid} failed: {type(exc).__name__}: {exc}")
        if not isinstance(reply, dict):
            return _failed(method, pid, "BadReply", repr(reply)[:300])
        if not reply.get("ok"):
            raw = reply.get("error")
            error: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if error.get("type") in CLOSING_ERRORS:  # the server closed this connection after saying so
                self._drop(pid)
            return _failed(method, pid, str(error.get("type", "ChannelError")), str(error.get("message", ""))[:1000])
        envelope = reply.get("reply")
        return envelope if isinstance(envelope, dict) else _failed(method, pid, "BadReply", repr(envelope)[:300])

    def _drop(self, pid: int) -> None:
        conn = self._conns.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        for pid in list(self._conns):
            self._drop(pid)

    def __del__(self) -> None:
        self.close()

    # -- the engine-handle interface ----------------------------------------------------------
    def rpc(
        self, method: str, options: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Each worker's envelope for ``method``, in rank order (the process tree's order where a
        reply has no rank)."""
        deadline = timeout or self.timeout
        replies = [self._ask(pid, method, options, deadline) for pid in self.paths]
        return sorted(replies, key=lambda r: (r.get("rank") is None, r.get("rank") or 0))

    def ensure_extension(self, method: str = "doctor_ping") -> list[dict[str, Any]]:
        replies = self.rpc(method)
        if not replies or not all(r.get("ok") for r in replies):
            raise ExtensionMissing(
                f"the vllm-doctor channel of the server at {self.url} answered {method} with {str(replies)[:300]}"
            )
        return replies

    def unreachable_ranks(self) -> list[int]:
        """Ranks of the engine (its world size, as the reachable workers report it) that no
        channel on this machine answers for: workers on other nodes (Ray), each publishing on
        its own machine."""
        replies = [r for r in self.rpc("doctor_anatomy") if r.get("ok") and isinstance(r.get("data"), dict)]
        if not replies:
            return []
        sizes = [r["data"].get("world_size") for r in replies]
        world = max((s for s in sizes if isinstance(s, int)), default=0)
        seen = {r["data"].get("rank") for r in replies}
        return [rank for rank in range(world) if rank not in seen]

    def served_models(self) -> list[str]:
        if self.http is None:
            return [self.name] if self.name else []
        return self.http.served_models()

    def model_name(self) -> str:
        if self.http is None:
            return self.name or self.url
        return self.http.model_name()

    def front_end(self) -> dict[str, Any]:
        channel = {"channel": {"dir": self.base, "pids": sorted(self.paths)}}
        if self.http is None:
            return {"pid": self.procs[0].pid if self.procs else None, "url": None, **channel}
        return {**self.http.front_end(), **channel}


def channel_dirs(pids: list[int], proc: Path = PROC) -> tuple[list[str], list[str]]:
    """Where the engine's sockets can be, and why a directory that exists there is not used.

    The candidates: the private directory each of the engine's processes ``pids`` uses
    (:func:`vllm_doctor.channel.default_dir` of its environment, ``/proc/PID/environ``, readable
    only to its own user: a ``VLLM_DOCTOR_DIR`` it was started with or recorded for its children,
    its ``XDG_RUNTIME_DIR``, its ``TMPDIR``), this user's own, and the fresh directories servers
    made where the shared one was taken (:func:`vllm_doctor.channel.fallback_dirs`). Each is used
    only if it is private to this user (:func:`vllm_doctor.channel.checked_dir`)."""
    candidates = []
    for pid in pids:
        environ = _environ(pid, proc)
        if environ is not None:
            candidates.append(wire.default_dir(environ))
    candidates += [wire.default_dir(), *wire.fallback_dirs()]
    out, refused = [], []
    for base in dict.fromkeys(candidates):
        try:
            out.append(wire.checked_dir(base))
        except wire.UnsafeDir as exc:
            refused.append(str(exc))
        except OSError:
            continue
    return out, refused


def _environ(pid: int, proc: Path = PROC) -> dict[str, str] | None:
    try:
        raw = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    pairs = (os.fsdecode(e).partition("=") for e in raw if b"=" in e)
    return {name: value for name, _, value in pairs}


def live_socket(path: str, pid: int) -> bool:
    """A socket at ``path`` made by the process ``pid`` now running (not one a dead process of
    the same pid left: :func:`vllm_doctor.channel.stale`)."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    return not wire.stale(path, pid)


def squat_hint(refused: list[str]) -> str | None:
    """The fix where the doctor's shared directory was taken by another user (its name and owner
    are in ``refused``)."""
    taken = [r for r in refused if "another user created it first" in r]
    if not taken:
        return None
    return (
        "a server started with VLLM_DOCTOR=1 by this user now makes a fresh private directory of its own, "
        "where the doctor finds it; or remove the directory (as its owner or root), or give both the server and "
        "vllm-doctor a VLLM_DOCTOR_DIR of yours"
    )


def _failed(method: str, pid: int, kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "method": method, "pid": pid, "error": {"type": kind, "message": message}}


def exposed_addresses(port: int, proc: Path = PROC) -> list[str]:
    """The non-loopback addresses a TCP socket listens on at ``port`` (``0.0.0.0`` and ``::``
    are every interface), from /proc/net/tcp and tcp6."""
    exposed = []
    for name, fields in listening_rows(port, proc):
        address = fields[1].rpartition(":")[0]
        if name == "tcp" and address.endswith("7F"):  # 127.x.x.x (little-endian hex)
            continue
        if name == "tcp6" and address in ("00000000000000000000000001000000",):  # ::1
            continue
        exposed.append(_address_text(name, address))
    return sorted(set(exposed))


def _address_text(kind: str, address: str) -> str:
    if kind == "tcp":
        octets = [str(int(address[i : i + 2], 16)) for i in range(6, -1, -2)]
        return ".".join(octets)
    if set(address) == {"0"}:
        return "::"
    return f"[{address}]"


def foreign_listeners(port: int, proc: Path = PROC) -> list[int]:
    """The uids other than this process's that own a socket listening on ``port`` (the uid
    column of /proc/net/tcp and tcp6: the kernel's record of who opened it)."""
    return sorted({int(fields[7]) for _, fields in listening_rows(port, proc)} - {os.geteuid()})


def served_engine(url: str, timeout: float = 60.0) -> ChannelHandle | HttpEngineHandle:
    """The engine at ``url``: through the private channel; else, only for a server of this OS
    user's that listens on loopback alone, through vLLM's dev endpoint
    (``VLLM_SERVER_DEV_MODE=1``). A port another user listens on is refused first, whoever
    the doctor runs as (root too): its answers would be the report. Raises :class:`ServerError`
    (an input error: exit 2) with the reason and the fix otherwise."""
    url = normalize_url(url)
    others = foreign_listeners(port_of(url))
    if others:
        owners = ", ".join(wire.owner_name(uid) for uid in others)
        raise ServerError(
            f"port {port_of(url)} ({url}) is held by a process of {owners}, not of this user "
            f"({wire.owner_name(os.geteuid())}): the doctor reads only a server its own user started",
            "run vllm-doctor as the user who started the server (its private channel is that user's)",
        )
    try:
        return ChannelHandle(url, timeout=timeout)
    except NoChannel as missing:
        no_channel = missing
    except DoctorInputError as exc:  # discover's: a remote host, nobody listening, another user's server
        if isinstance(exc, ServerError):
            raise
        raise ServerError(f"cannot reach the vLLM server at {url}: {exc.message}", exc.hint or CHANNEL_HINT) from None
    exposed = exposed_addresses(port_of(url))  # the listener is this user's (above)
    if exposed:
        raise ServerError(
            f"{no_channel.message}; the server listens on {', '.join(exposed)} (not only loopback), where vLLM's "
            "dev endpoint /collective_rpc would let anyone on the network call worker methods: the doctor "
            "does not use it there",
            CHANNEL_HINT,
        )
    return HttpEngineHandle(
        url,
        timeout=timeout,
        fallback_reason=f"{no_channel.message}; the server is this user's and listens on loopback only",
    )

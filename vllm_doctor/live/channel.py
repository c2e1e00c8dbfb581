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
fallback, only for a server that listens on loopback alone (:func:`exposed_addresses`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

from vllm_doctor import channel as wire
from vllm_doctor.compat.http import HttpEngineHandle, ServerError, normalize_url
from vllm_doctor.compat.llm import ExtensionMissing
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.live.proctree import PROC, discover, listening_rows, port_of

CHANNEL_HINT = "start the server with VLLM_DOCTOR=1 as this user: its workers then open the doctor's private channel"


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
        bases = channel_dirs(procs[0].pid if procs else None)
        for base in bases:
            self.paths = {
                p.pid: wire.socket_path(p.pid, base) for p in procs if os.path.exists(wire.socket_path(p.pid, base))
            }
            if self.paths:
                self.base = base
                break
        if not self.paths:
            where = " or ".join(bases) or "a private directory of this user's"
            raise NoChannel(
                f"no process of the engine at {self.url} ({len(procs)} processes: "
                f"{', '.join(p.label() for p in procs[:6])}) has a vllm-doctor channel in {where}",
                CHANNEL_HINT,
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
            conn.sendall(wire.encode(request))
            reply = wire.recv_frame(conn, wire.MAX_REPLY)
        except (OSError, EOFError, wire.ChannelError) as exc:
            self._drop(pid)
            return _failed(method, pid, "ChannelError", f"the channel of pid {pid} failed: {type(exc).__name__}: {exc}")
        if not isinstance(reply, dict):
            return _failed(method, pid, "BadReply", repr(reply)[:300])
        if not reply.get("ok"):
            raw = reply.get("error")
            error: dict[str, Any] = raw if isinstance(raw, dict) else {}
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


def channel_dirs(server_pid: int | None, proc: Path = PROC) -> list[str]:
    """Where the engine's sockets can be: this user's private directory, and the one the server
    was started with (``VLLM_DOCTOR_DIR`` in its environment, readable only to its own user);
    each only if it is private to this user (:func:`vllm_doctor.channel.private_dir`)."""
    candidates = []
    if server_pid is not None:
        try:
            environ = (proc / str(server_pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            environ = []
        prefix = wire.DIR_ENV.encode() + b"="
        candidates += [os.fsdecode(e[len(prefix) :]) for e in environ if e.startswith(prefix)]
    candidates.append(wire.default_dir())
    out = []
    for base in dict.fromkeys(candidates):
        try:
            out.append(wire.checked_dir(base))
        except (wire.UnsafeDir, FileNotFoundError):
            continue
    return out


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


def served_engine(url: str, timeout: float = 60.0) -> ChannelHandle | HttpEngineHandle:
    """The engine at ``url``: through the private channel; else, only where the server listens
    on loopback alone, through vLLM's dev endpoint (``VLLM_SERVER_DEV_MODE=1``). Raises
    :class:`ServerError` (an input error: exit 2) with the reason and the fix otherwise."""
    url = normalize_url(url)
    try:
        return ChannelHandle(url, timeout=timeout)
    except NoChannel as missing:
        no_channel = missing
    except DoctorInputError as exc:  # discover's: a remote host, nobody listening, another user's server
        if isinstance(exc, ServerError):
            raise
        raise ServerError(f"cannot reach the vLLM server at {url}: {exc.message}", exc.hint or CHANNEL_HINT) from None
    exposed = exposed_addresses(port_of(url))
    if exposed:
        raise ServerError(
            f"{no_channel.message}; the server listens on {', '.join(exposed)} (not only loopback), where vLLM's "
            "dev endpoint /collective_rpc would let anyone on the network call worker methods: the doctor "
            "does not use it there",
            CHANNEL_HINT,
        )
    return HttpEngineHandle(url, timeout=timeout, fallback_reason=no_channel.message)

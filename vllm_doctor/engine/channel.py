"""The private channel's server, in each process that holds a vLLM worker (``VLLM_DOCTOR=1``).

:meth:`DoctorWorkerExtension.__new__ <vllm_doctor.engine.extension.DoctorWorkerExtension>`
calls :func:`serve` when vLLM creates the worker: the process binds
``<private dir>/chan-<pid>.sock`` (mode 0600, in the user's 0700 directory: see
:mod:`vllm_doctor.channel`) and answers on daemon threads. A request runs the doctor's own
worker method under the worker's doctor lock (:func:`~vllm_doctor.engine.session.worker_lock`):
between two of the wrappers' bookkeeping sections, never through vLLM's engine core, its RPC
queue or its HTTP server. What keeps the engine safe from the channel:

- only the verbs of :data:`vllm_doctor.channel.VERBS`, options checked against their table;
  anything else gets an error reply and never reaches the worker;
- a request frame is at most :data:`~vllm_doctor.channel.MAX_REQUEST` bytes and must arrive
  within :data:`BODY_TIMEOUT_S` once it starts; at most :data:`MAX_CONNECTIONS` readers at once;
- peers of another uid are refused (``SO_PEERCRED``), beside the directory's and socket's modes;
- each reader has its own window of the step and layer records (the reader option of install
  and collect, set here per connection to a number no other connection of this process had:
  a reader's reset never takes records from another, and a collect on a connection that did
  not install gets an error, never another reader's window or the records since the start);
- a reader that attached and goes away (closed, killed, timed out) is detached: the hooks come
  off when the last reader that attached leaves, and the records only its window held go;
- nothing raised here reaches vLLM: each connection's thread catches everything.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from typing import Any

from vllm_doctor import channel as wire
from vllm_doctor.engine.extension import READER_OPTION

MAX_CONNECTIONS = 8
BODY_TIMEOUT_S = 10.0
LOCK_TIMEOUT_S = 60.0  # a step longer than this is a hung engine: the reader gets an error
_log = logging.getLogger("vllm_doctor")
_server: ChannelServer | None = None
_server_guard = threading.Lock()


def serve(worker: Any) -> ChannelServer | None:
    """Open this process's channel to ``worker`` (once per process; a second worker in the same
    process, which vLLM does not create, is refused with a log line)."""
    global _server
    with _server_guard:
        if _server is not None:
            if _server.worker is not worker:
                _log.warning("vllm-doctor: pid %d already serves a worker on its channel", os.getpid())
            return _server
        _server = ChannelServer(worker)
        _server.start()
        return _server


class ChannelServer:
    def __init__(self, worker: Any, base: str | None = None) -> None:
        self.worker = worker
        self.base = base if base is not None else wire.private_dir(create=True)
        self.path = wire.socket_path(os.getpid(), self.base)
        self._conns = 0
        self._attached: set[int] = set()  # the keys of the connections that installed the profiler
        self._keys = itertools.count(1)  # a connection's key: never reused (an id() is, once freed)
        self._state = threading.Lock()
        self._sock: socket.socket | None = None
        self._device_set: set[int] = set()  # threads whose CUDA device is the worker's

    # -- life -------------------------------------------------------------------------------
    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a socket left by a dead process of the same pid (the dir is ours)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        umask = os.umask(0o177)  # the socket file is created 0600: no window with wider modes
        try:
            sock.bind(self.path)
        finally:
            os.umask(umask)
        os.chmod(self.path, 0o600)
        sock.listen(MAX_CONNECTIONS)
        self._sock = sock
        atexit.register(self.close)
        threading.Thread(target=self._accept, name="vllm-doctor-channel", daemon=True).start()
        _log.warning("vllm-doctor: private channel of pid %d at %s", os.getpid(), self.path)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _accept(self) -> None:
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._sock is None:
                    return
                time.sleep(0.1)
                continue
            with self._state:
                full = self._conns >= MAX_CONNECTIONS
                if not full:
                    self._conns += 1
            if full:
                self._refuse(conn, f"{MAX_CONNECTIONS} readers are connected already")
                continue
            key = next(self._keys)
            threading.Thread(target=self._connection, args=(conn, key), name="vllm-doctor-reader", daemon=True).start()

    @staticmethod
    def _refuse(conn: socket.socket, why: str) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            conn.sendall(wire.encode({"v": wire.PROTOCOL, "ok": False, "error": {"type": "Refused", "message": why}}))
        with contextlib.suppress(OSError):
            conn.close()

    # -- one reader -------------------------------------------------------------------------
    def _connection(self, conn: socket.socket, key: int) -> None:
        try:
            uid = wire.peer_uid(conn)
            if uid is not None and uid != os.getuid():
                self._refuse(conn, f"uid {uid} is not this server's user")
                return
            while self._sock is not None:
                conn.settimeout(None)  # a reader may stay connected and idle (top between refreshes)
                head = conn.recv(wire.HEADER.size, socket.MSG_PEEK)
                if not head:
                    return
                conn.settimeout(BODY_TIMEOUT_S)
                try:
                    request = wire.recv_frame(conn, wire.MAX_REQUEST)
                    method, options = wire.validate(request)
                except wire.ChannelError as exc:
                    conn.sendall(_error("BadRequest", str(exc)))
                    if "over the limit" in str(exc):
                        return  # the rest of an oversized frame is not read: the stream is lost
                    continue
                conn.sendall(self._run(key, method, options))
        except (OSError, EOFError):
            pass  # the reader went away (or timed out mid-frame)
        except Exception as exc:  # never let the channel's bug reach vLLM
            _log.warning("vllm-doctor channel: %s: %s", type(exc).__name__, exc)
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self._left(key)

    def _run(self, key: int, method: str, options: dict[str, Any]) -> bytes:
        from vllm_doctor.engine.session import settle, worker_lock

        if method == "doctor_detach":
            with self._state:
                self._attached.discard(key)
                others = len(self._attached)
            if others:
                self._forget(key)
                return _ok({"ok": True, "method": method, "pid": os.getpid(), "data": {"kept_for_readers": others}})
        if method in ("doctor_install", "doctor_collect"):
            options = {**options, READER_OPTION: key}  # each reader its own window of the records
        self._use_worker_device()
        if method == "doctor_collect":
            settle(self.worker)  # the device's pending events, waited for outside the lock
        lock = worker_lock(self.worker)
        if not lock.acquire(timeout=LOCK_TIMEOUT_S):
            return _error("Busy", f"the worker did not finish its step within {LOCK_TIMEOUT_S:.0f} s")
        try:
            fn = getattr(self.worker, method)
            reply = fn(options) if wire.VERBS[method] else fn()
        finally:
            lock.release()
        if method == "doctor_install" and isinstance(reply, dict) and reply.get("ok"):
            with self._state:
                self._attached.add(key)
        return _ok(reply)

    def _left(self, key: int) -> None:
        with self._state:
            self._conns -= 1
            was_attached = key in self._attached
            self._attached.discard(key)
            last = was_attached and not self._attached
        if last:  # the last reader that attached is gone: the hooks come off
            with contextlib.suppress(Exception):
                self._run(key, "doctor_detach", {})
        elif was_attached:  # the others keep the hooks; what only this reader's window held goes
            self._forget(key)

    def _forget(self, key: int) -> None:
        from vllm_doctor.engine.session import SESSION_ATTR, worker_lock

        lock = worker_lock(self.worker)
        if not lock.acquire(timeout=LOCK_TIMEOUT_S):
            return
        try:
            session = self.worker.__dict__.get(SESSION_ATTR)
            if session is not None:
                with contextlib.suppress(Exception):
                    session.forget(key)
        finally:
            lock.release()

    def _use_worker_device(self) -> None:
        """CUDA's current device is per thread: this one's is the worker's before it records or
        reads the worker's events."""
        ident = threading.get_ident()
        if ident in self._device_set:
            return
        self._device_set.add(ident)
        from vllm_doctor.compat import worker as wv

        device = wv.device(self.worker)
        if device.type == "cuda":
            import torch

            torch.cuda.set_device(device)


def _ok(reply: Any) -> bytes:
    return wire.encode({"v": wire.PROTOCOL, "ok": True, "reply": reply})


def _error(kind: str, message: str) -> bytes:
    return wire.encode({"v": wire.PROTOCOL, "ok": False, "error": {"type": kind, "message": message[:1000]}})

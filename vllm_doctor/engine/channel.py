"""The private channel's server, in each process that holds a vLLM worker (``VLLM_DOCTOR=1``).

:meth:`DoctorWorkerExtension.__new__ <vllm_doctor.engine.extension.DoctorWorkerExtension>`
calls :func:`serve` when vLLM creates the worker: the process binds
``<private dir>/chan-<pid>.sock`` (mode 0600, in the user's 0700 directory: see
:mod:`vllm_doctor.channel`). One thread reads every connection (a ``selectors`` loop: an idle
connection costs nothing and holds no thread); each complete request runs on a thread of its
own, the doctor's worker method behind the worker's doctor gate
(:func:`~vllm_doctor.engine.session.worker_lock`, :mod:`vllm_doctor.engine.gate`): between two
of the wrappers' bookkeeping sections, never through vLLM's engine core, its RPC queue or its
HTTP server. What keeps the engine safe from the channel:

- only the verbs of :data:`vllm_doctor.channel.VERBS`, options checked against their table;
  anything else gets an error reply and never reaches the worker;
- a request frame is at most :data:`~vllm_doctor.channel.MAX_REQUEST` bytes, and the whole
  frame must arrive within :data:`FRAME_TIMEOUT_S` of its first byte (not per read: a frame
  trickled a byte at a time is cut off), else the connection is closed;
- at most :data:`MAX_CONNECTIONS` readers at once. When the limit is reached a new one takes the
  place of the connection idle longest among those that hold nothing in the worker (no hooks, no
  probe: a client that connected and went quiet); where every one holds something, the new one
  is refused with a reply that names the holders' pids (``SO_PEERCRED``);
- a reply is written within :data:`REPLY_TIMEOUT_S` (a reader that does not read its reply is
  closed);
- peers of another uid are refused (``SO_PEERCRED``), beside the directory's and socket's modes;
- each reader has its own window of the step and layer records (the reader option of install
  and collect, set here per connection to a number no other connection of this process had:
  a reader's reset never takes records from another, and a collect on a connection that did
  not install gets an error, never another reader's window or the records since the start);
- every verb's effect ends with its reader: a reader that installed the profiler or armed the
  probe and goes away (closed, killed, timed out) is detached: the hooks come off when the last
  such reader leaves (a probe it armed is disarmed even where others stay), and the records
  only its window held go;
- the socket is removed when the process exits normally (vLLM's SIGTERM included:
  :func:`vllm_doctor.channel.at_exit`);
- nothing raised here reaches vLLM: each thread catches everything.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import selectors
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor import channel as wire
from vllm_doctor.engine.extension import READER_OPTION

MAX_CONNECTIONS = 8
FRAME_TIMEOUT_S = 10.0  # from a request frame's first byte to its last
REPLY_TIMEOUT_S = 60.0  # for the reader to take a reply (a collect's may be megabytes)
LOCK_TIMEOUT_S = 60.0  # a step longer than this is a hung engine: the reader gets an error
IDLE_EVICT_S = 5.0  # a connection idle this long that holds nothing gives its place to a new one
POLL_S = 0.5  # the serving loop looks at the frames' deadlines this often
EFFECT_VERBS = ("doctor_install", "doctor_arm_probe")  # verbs whose effect lasts until the reader leaves
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


@dataclass(eq=False)
class Reader:
    """One connection: its key (never reused in this process), its peer's pid, the bytes of the
    request it is sending, and what it holds in the worker."""

    sock: socket.socket
    key: int
    pid: int | None
    buf: bytearray = field(default_factory=bytearray)
    frame_started: float | None = None  # monotonic time of the first byte of the frame in ``buf``
    last_active: float = field(default_factory=time.monotonic)
    busy: bool = False  # a request of its runs: the loop does not read it meanwhile
    holds: bool = False  # it installed the profiler or armed the probe
    closed: bool = False

    def describe(self) -> str:
        return f"pid {self.pid if self.pid is not None else '?'}" + (" (attached)" if self.holds else "")


class ChannelServer:
    def __init__(self, worker: Any, base: str | None = None) -> None:
        self.worker = worker
        self.base = base if base is not None else wire.private_dir(create=True)
        self.path = wire.socket_path(os.getpid(), self.base)
        self._readers: dict[int, Reader] = {}  # key -> reader, every open connection
        self._attached: set[int] = set()  # the keys of the readers whose effect holds the hooks
        self._probe_owner: int | None = None  # the key of the reader that armed the probe last
        self._keys = itertools.count(1)  # a connection's key: never reused (an id() is, once freed)
        self._state = threading.Lock()
        self._sock: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._ready: list[Reader] = []  # readers whose request finished: read them again
        self._device_set = threading.local()  # ``done`` in a thread whose CUDA device is the worker's

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
        sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._sock = sock
        wire.at_exit(self.close)
        threading.Thread(target=self._loop, name="vllm-doctor-channel", daemon=True).start()
        _log.warning("vllm-doctor: private channel of pid %d at %s", os.getpid(), self.path)

    def close(self) -> None:
        """Stop serving and remove the socket (idempotent; at the process's exit)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            sock.close()
        self._wake()

    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")

    # -- the serving loop: accepts, reads frames, enforces their deadlines; never blocks -------------
    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        while self._sock is not None:
            try:
                events = selector.select(timeout=POLL_S)
                for key, _ in events:
                    if key.fileobj is self._sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._woken()
                    else:
                        self._read(key.data)
                self._expire()
            except Exception as exc:  # never let the channel's bug reach vLLM; keep serving
                _log.warning("vllm-doctor channel: %s: %s", type(exc).__name__, exc)
                time.sleep(0.1)
        for reader in list(self._readers.values()):
            self._close(reader)
        selector.close()

    def _accept(self) -> None:
        assert self._sock is not None
        try:
            conn, _ = self._sock.accept()
        except OSError:  # BlockingIOError: another event took it; others: try at the next event
            return
        pid, uid = wire.peer_creds(conn)
        if uid is not None and uid != os.getuid():
            self._refuse(conn, f"uid {uid} is not this server's user")
            return
        leaving = self._reap_hung_up() if len(self._readers) >= MAX_CONNECTIONS else 0
        with self._state:
            if len(self._readers) - leaving >= MAX_CONNECTIONS and not self._evict_idle():
                holders = ", ".join(
                    f"{who} x{n}" if n > 1 else who
                    for who, n in Counter(r.describe() for r in self._readers.values()).items()
                )
                why = (
                    f"the doctor's channel of pid {os.getpid()} serves {MAX_CONNECTIONS} readers already "
                    f"({holders}): end one of them (a vllm-doctor attach or top still running) and try again"
                )
            else:
                why = ""
                reader = Reader(conn, next(self._keys), pid)
                self._readers[reader.key] = reader
        if why:
            self._refuse(conn, why)
            return
        conn.setblocking(False)
        assert self._selector is not None
        self._selector.register(conn, selectors.EVENT_READ, reader)

    def _reap_hung_up(self) -> int:
        """Close the connections whose reader has hung up and whose end the loop has not read yet,
        so that a reader that closes and connects again at once finds its old place free, not a
        full channel. A reader that hung up while its request's thread still runs (or has just
        sent the reply) is left to that thread, which closes it; it holds no place: their number
        is returned. The loop's thread only, not under ``_state``."""
        leaving = 0
        readers = [r for r in list(self._readers.values()) if not r.closed]
        # which have something to read (an end is something): a poll that does not wait, since a
        # request's thread may have set a timeout on its socket, and Python's recv waits that
        # long for data before it reads, whatever its flags
        poll = select.poll()
        for reader in readers:
            with contextlib.suppress(ValueError, OSError):  # closed by its request's thread meanwhile
                poll.register(reader.sock, select.POLLIN)
        ready = {fd for fd, _ in poll.poll(0)}
        for reader in readers:
            if reader.sock.fileno() not in ready:  # open, nothing sent
                continue
            try:
                hung_up = reader.sock.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                hung_up = True
            if not hung_up:
                continue
            if reader.busy:  # its socket is the request thread's until it is answered
                leaving += 1
            else:
                self._close(reader)
        return leaving

    def _evict_idle(self) -> bool:
        """Close the connection idle longest among those that hold nothing in the worker and are
        not mid-request (under ``_state``); False if there is none."""
        now = time.monotonic()
        idle = [
            r
            for r in self._readers.values()
            if not r.holds and not r.busy and r.frame_started is None and now - r.last_active >= IDLE_EVICT_S
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda r: r.last_active)
        self._readers.pop(oldest.key, None)
        self._drop_socket(oldest)
        return True

    @staticmethod
    def _refuse(conn: socket.socket, why: str) -> None:
        """Say why, then close (best effort: a reply this small fits the socket's buffer)."""
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(_error("Refused", why))
        with contextlib.suppress(OSError):
            conn.close()

    def _read(self, reader: Reader) -> None:
        try:
            chunk = reader.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(reader)
            return
        now = time.monotonic()
        reader.last_active = now
        if reader.frame_started is None:
            reader.frame_started = now
        reader.buf += chunk
        self._dispatch(reader)

    def _dispatch(self, reader: Reader) -> None:
        """Start the request in ``reader``'s buffer once it is complete (the loop stops reading
        the reader until it is answered)."""
        buf = reader.buf
        if len(buf) < wire.HEADER.size:
            return
        (size,) = wire.HEADER.unpack_from(buf)
        if size > wire.MAX_REQUEST:  # the rest of the frame is not read: the stream is lost
            self._last_word(reader, _error("BadRequest", f"a frame of {size} bytes is over the limit of "
                                                        f"{wire.MAX_REQUEST}"))  # fmt: skip
            return
        if len(buf) < wire.HEADER.size + size:
            return
        body = bytes(buf[wire.HEADER.size : wire.HEADER.size + size])
        del buf[: wire.HEADER.size + size]
        reader.frame_started = time.monotonic() if buf else None
        reader.busy = True
        assert self._selector is not None
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(reader.sock)
        threading.Thread(target=self._request, args=(reader, body), name="vllm-doctor-reader", daemon=True).start()

    def _expire(self) -> None:
        """Close the readers whose frame did not arrive whole within FRAME_TIMEOUT_S."""
        now = time.monotonic()
        for reader in list(self._readers.values()):
            started = reader.frame_started
            if not reader.busy and started is not None and now - started > FRAME_TIMEOUT_S:
                self._last_word(
                    reader,
                    _error("FrameTimeout", f"the request frame did not arrive whole within {FRAME_TIMEOUT_S:.0f} s"),
                )

    def _last_word(self, reader: Reader, reply: bytes) -> None:
        with contextlib.suppress(OSError):
            reader.sock.send(reply)
        self._close(reader)

    def _woken(self) -> None:
        assert self._wake_r is not None
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._state:
            ready, self._ready = self._ready, []
        for reader in ready:
            if reader.closed:
                continue
            assert self._selector is not None
            try:
                self._selector.register(reader.sock, selectors.EVENT_READ, reader)
            except (KeyError, ValueError, OSError):
                self._close(reader)
                continue
            self._dispatch(reader)  # a request sent before the reply came (pipelined)

    def _drop_socket(self, reader: Reader, registered: bool = True) -> None:
        """Close ``reader``'s socket; ``registered``: it is in the selector (the loop's thread only)."""
        reader.closed = True
        if registered and self._selector is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(reader.sock)
        with contextlib.suppress(OSError):
            reader.sock.close()

    def _close(self, reader: Reader, registered: bool = True) -> None:
        """The reader is gone: its connection closes, and what it held in the worker ends (on a
        thread of its own: that waits for the worker's gate, the loop never does). From a
        request's thread ``registered`` is False (the loop does not read a reader while it waits
        for its reply)."""
        if reader.closed:
            return
        self._drop_socket(reader, registered)
        with self._state:
            self._readers.pop(reader.key, None)
        if reader.holds or self._probe_owner == reader.key:
            threading.Thread(target=self._left, args=(reader.key,), name="vllm-doctor-leave", daemon=True).start()

    # -- one request ---------------------------------------------------------------------------
    def _request(self, reader: Reader, body: bytes) -> None:
        from vllm_doctor.engine.extension import TIMED_RPCS
        from vllm_doctor.engine.session import CALL_THREAD, SESSION_ATTR

        # this thread's CPU is the doctor's cost to the engine: its calls' time goes to the
        # session on its CPU clock (session.call_clock), and the rest of a timed request (its
        # decoding, the settle, the reply's encoding and sending) with it, once sent
        CALL_THREAD.side = True
        c0, method = time.thread_time(), None
        conn = reader.sock
        try:
            try:
                method, options = wire.validate(wire.decode(body))
            except wire.ChannelError as exc:
                reply = _error("BadRequest", str(exc))
            else:
                reply = self._run(reader, method, options)
            conn.settimeout(REPLY_TIMEOUT_S)
            conn.sendall(reply)
            conn.setblocking(False)
            if method in TIMED_RPCS:
                session = self.worker.__dict__.get(SESSION_ATTR)
                if session is not None:
                    session.add_side(max(0.0, time.thread_time() - c0 - CALL_THREAD.counted))
        except OSError:  # the reader went away, or did not take its reply in time
            self._close(reader, registered=False)
            return
        except Exception as exc:  # never let the channel's bug reach vLLM
            _log.warning("vllm-doctor channel: %s: %s", type(exc).__name__, exc)
            self._close(reader, registered=False)
            return
        reader.last_active = time.monotonic()
        reader.busy = False
        with self._state:
            self._ready.append(reader)
        self._wake()

    def _run(self, reader: Reader, method: str, options: dict[str, Any]) -> bytes:
        from vllm_doctor.engine.session import CALL_THREAD, settle, worker_lock

        key = reader.key
        if method == "doctor_detach":
            with self._state:
                self._attached.discard(key)
                reader.holds = False
                others = len(self._attached)
            if others:
                self._forget(key)
                return _ok({"ok": True, "method": method, "pid": os.getpid(), "data": {"kept_for_readers": others}})
        if method in ("doctor_install", "doctor_collect", "doctor_arm_probe"):
            options = {**options, READER_OPTION: key}  # each reader its own window of the records
        self._use_worker_device()
        if method == "doctor_collect":
            # the device's pending events, waited for outside the lock: a wait (CUDA's may spin on
            # this thread's CPU, with the GIL let go), not the engine's time
            c0 = time.thread_time()
            settle(self.worker)
            CALL_THREAD.counted += time.thread_time() - c0
        lock = worker_lock(self.worker)
        if not lock.acquire(timeout=LOCK_TIMEOUT_S):
            return _error("Busy", f"the worker did not finish its step within {LOCK_TIMEOUT_S:.0f} s")
        try:
            fn = getattr(self.worker, method)
            reply = fn(options) if wire.VERBS[method] else fn()
            # encoded inside the gate: a step that begins meanwhile waits at the gate, outside the
            # doctor's clock in its wrappers, where beside it the encoding would take the GIL from
            # the step inside its wrapper's span and count twice (there, and in this thread's CPU)
            encoded = _ok(reply)
        finally:
            lock.release()
        if method in EFFECT_VERBS and isinstance(reply, dict) and reply.get("ok"):
            with self._state:
                self._attached.add(key)
                reader.holds = True
                if method == "doctor_arm_probe":
                    self._probe_owner = key
        return encoded

    def _left(self, key: int) -> None:
        with self._state:
            was_attached = key in self._attached
            self._attached.discard(key)
            last = was_attached and not self._attached
            armed_probe = self._probe_owner == key
            if armed_probe:
                self._probe_owner = None
        try:
            if last:  # the last reader that attached is gone: the hooks come off
                self._detach()
            elif was_attached or armed_probe:  # the others keep the hooks; what only this reader held goes
                self._forget(key, disarm_probe=armed_probe)
        except Exception as exc:  # never let the channel's bug reach vLLM
            _log.warning("vllm-doctor channel: %s: %s", type(exc).__name__, exc)

    def _detach(self) -> None:
        from vllm_doctor.engine.session import worker_lock

        self._use_worker_device()
        lock = worker_lock(self.worker)
        if not lock.acquire(timeout=LOCK_TIMEOUT_S):
            return
        try:
            self.worker.doctor_detach()
        finally:
            lock.release()

    def _forget(self, key: int, disarm_probe: bool = False) -> None:
        from vllm_doctor.engine.session import SESSION_ATTR, worker_lock

        lock = worker_lock(self.worker)
        if not lock.acquire(timeout=LOCK_TIMEOUT_S):
            return
        try:
            session = self.worker.__dict__.get(SESSION_ATTR)
            if session is not None:
                with contextlib.suppress(Exception):
                    session.forget(key)
                if disarm_probe:
                    with contextlib.suppress(Exception):
                        session.disarm_probe()
        finally:
            lock.release()

    def _use_worker_device(self) -> None:
        """CUDA's current device is per thread: this one's is the worker's before it records or
        reads the worker's events."""
        if getattr(self._device_set, "done", False):
            return
        self._device_set.done = True
        from vllm_doctor.compat import worker as wv

        device = wv.device(self.worker)
        if device.type == "cuda":
            import torch

            torch.cuda.set_device(device)


def _ok(reply: Any) -> bytes:
    return wire.encode({"v": wire.PROTOCOL, "ok": True, "reply": reply})


def _error(kind: str, message: str) -> bytes:
    return wire.encode({"v": wire.PROTOCOL, "ok": False, "error": {"type": kind, "message": message[:1000]}})

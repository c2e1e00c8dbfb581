"""The doctor's temporary directories, and the janitor that removes them however the doctor ends.

Every directory the doctor makes for itself (a child's request/result/log, the engine stage's
log directory, the parity engine's mailbox) comes from :func:`make` and is removed when the job
ends (:func:`remove`), when the doctor exits or is stopped by SIGTERM/SIGHUP (:func:`remove_all`,
from stages/child.py's handlers and atexit) and also when the doctor is SIGKILLed, which no code
in the doctor survives. What a child makes goes inside its job directory
(:data:`vllm_doctor.constants.SCRATCH_DIR_ENV`), so a child killed at its deadline leaves nothing
outside a directory its parent removes.

Why a janitor process: after a SIGKILL only another process can clean up. A child could do it
when the kernel tells it its parent died (PR_SET_PDEATHSIG), but only for a child started from
the main thread, only while a child runs, and only while vLLM leaves its SIGTERM handler alone;
a directory swept by the *next* run stays until someone runs the doctor again. So the first
:func:`make` starts one tiny janitor (``python -I -S``, stdlib only, its own session: a Ctrl-C
or a kill of the doctor's process group does not reach it) that holds the read end of a pipe
whose write end only the doctor holds. The doctor sends it each directory *before* creating it
and each child process group it starts; when the pipe reaches end-of-file (the doctor is gone,
by any means) the janitor SIGKILLs the groups still registered, waits until they are gone (so
that nothing writes into a directory being removed) and removes the directories. A directory the
user is told about (the engine log a report points at) is handed over with :func:`keep` and
stays. A normal exit closes the pipe and waits for the janitor, so nothing outlives the doctor.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import IO

# the janitor: reads NUL-terminated records ("+dir", "-dir", "g<pgid>", "G<pgid>") until EOF, then
# kills the registered process groups, waits for them (zombies count as gone) and removes the dirs
_JANITOR = r"""
import os, shutil, signal, sys, time
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
dirs, groups, buf = {}, set(), b""
while True:
    try:
        chunk = os.read(0, 65536)
    except InterruptedError:
        continue
    if not chunk:
        break
    buf += chunk
    *records, buf = buf.split(b"\0")
    for rec in records:
        op, arg = rec[:1], rec[1:]
        if op == b"+":
            dirs[arg] = True
        elif op == b"-":
            dirs.pop(arg, None)
        elif op == b"g":
            groups.add(int(arg))
        elif op == b"G":
            groups.discard(int(arg))

def alive(pgid):
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False

for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
deadline = time.monotonic() + 30
while groups and time.monotonic() < deadline:
    groups = {g for g in groups if alive(g)}
    if groups:
        time.sleep(0.05)
for path in dirs:
    shutil.rmtree(path, ignore_errors=True)
"""

_lock = threading.RLock()  # re-entered by a signal handler that interrupts make()
_owned: set[str] = set()
_janitor: subprocess.Popen[bytes] | None = None
_pipe: IO[bytes] | None = None
_started = False


def _send(op: bytes, arg: str | int) -> None:
    """One record to the janitor (none when it could not start: then only this process cleans).
    ``os.write`` on the raw pipe, not a buffered file: a signal handler may send while the main
    thread is in the middle of a record, and a pipe write under PIPE_BUF bytes is atomic."""
    global _pipe
    if _pipe is None:
        return
    data = op + (os.fsencode(arg) if isinstance(arg, str) else str(arg).encode()) + b"\0"
    try:
        while data:
            data = data[os.write(_pipe.fileno(), data) :]
    except (OSError, ValueError):  # the janitor is gone: this process still cleans up itself
        _pipe = None


def _start_janitor() -> None:
    global _janitor, _pipe, _started
    if _started:
        return
    _started = True
    # registered before stages/child.py's kill_all (ChildJob makes its directory first): atexit
    # runs last-in first-out, so the children are dead before their directories go
    atexit.register(_at_exit)
    try:
        _janitor = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _JANITOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return
    _pipe = _janitor.stdin


def make(prefix: str) -> str:
    """A new private (0700) directory ``<tempdir>/<prefix><random>``, removed with the doctor."""
    with _lock:
        _start_janitor()
        base = tempfile.gettempdir()
        for _ in range(100):
            path = os.path.join(base, prefix + secrets.token_hex(6))
            _send(b"+", path)  # before it exists: a SIGKILL between the two leaves nothing
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                _send(b"-", path)
                continue
            except OSError:
                _send(b"-", path)
                raise
            _owned.add(path)
            return path
    raise FileExistsError(f"no free name for a temporary directory {prefix}* in {base}")


def keep(path: str | os.PathLike[str]) -> None:
    """``path`` (from :func:`make`) is output the user is told about: it stays after the doctor."""
    path = os.fspath(path)
    with _lock:
        _owned.discard(path)
        _send(b"-", path)


def remove(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` (from :func:`make`) now."""
    path = os.fspath(path)
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        _owned.discard(path)
        _send(b"-", path)


def watch_group(pgid: int) -> None:
    """A child's process group: should the doctor die, the janitor kills it before removing dirs."""
    with _lock:
        _send(b"g", pgid)


def forget_group(pgid: int) -> None:
    """The group is gone (killed and reaped by the doctor)."""
    with _lock:
        _send(b"G", pgid)


def remove_all() -> None:
    """Remove every directory still owned (at exit, on SIGTERM/SIGHUP: after the children were killed)."""
    for path in list(_owned):
        remove(path)


def _after_fork_in_child() -> None:
    """A process forked from the doctor (a user's test, multiprocessing) owns none of its
    directories: it must not remove them when it exits, nor hold the janitor's pipe open."""
    global _pipe, _janitor, _started, _lock
    pipe, _pipe, _janitor, _started = _pipe, None, None, False
    _lock = threading.RLock()  # another thread of the doctor may have held it at the fork
    _owned.clear()
    if pipe is not None:
        try:
            pipe.close()  # this process's copy of the descriptor; the doctor's stays open
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)


def _at_exit() -> None:
    """The doctor ends: remove what is left, then close the pipe and let the janitor finish."""
    global _pipe
    remove_all()
    pipe, janitor, _pipe = _pipe, _janitor, None
    if pipe is None or janitor is None:
        return
    try:
        pipe.close()
        janitor.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        pass

"""Find the processes of a vLLM engine from outside, and label each by role and rank.

No vLLM import, no cooperation from the engine: everything comes from ``/proc``. vLLM names
its processes with ``setproctitle`` (``vllm.utils.system_utils.set_process_title``:
``f"{VLLM_PROCESS_NAME_PREFIX}::{name}"``, prefix ``VLLM`` by default), which rewrites
``/proc/PID/cmdline`` and the kernel's 15-character ``/proc/PID/comm``. The names, the same
in vLLM 0.26 and 0.32:

- ``EngineCore`` (``EngineCore_DP{n}`` with data parallelism): the engine core process;
- ``Worker`` (one worker, or before the parallel groups exist), else ``Worker`` + ``_DP{n}``
  ``_PP{n}`` ``_PCP{n}`` ``_TP{n}`` ``_DCP{n}`` ``_EP{n}`` (only the axes of size > 1);
- ``APIServer_{i}`` (only with several API server processes), ``DPCoordinator``.

The main process of ``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server`` keeps its
command line; a process spawned by vLLM that has not set its title yet shows
``multiprocessing.spawn``'s command line and is labelled by its parent (a child of the API
server is its engine core, a child of an engine core is a worker).

    discover(url="http://127.0.0.1:8000")   # the server listening there, then its descendants
    discover(pid=12345)                     # that process's vLLM tree (a worker's pid is enough)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from vllm_doctor.errors import DoctorInputError
from vllm_doctor.procfs import PROC, stat_fields

__all__ = ["ROLES", "ProcInfo", "Role", "discover", "label", "listening_pids", "read_proc", "title_of"]

Role = Literal["api-server", "engine-core", "worker", "other"]
ROLES: tuple[Role, ...] = ("api-server", "engine-core", "worker", "other")

# "<prefix>::<name>" as vLLM's set_process_title writes it (the prefix is configurable)
TITLE_RE = re.compile(r"^(?P<prefix>[A-Za-z0-9_.-]+)::(?P<name>[A-Za-z]+)(?P<suffix>(?:_[A-Za-z]*\d+)*)")
AXIS_RE = re.compile(r"_([A-Za-z]*)(\d+)")
WORKER_AXES = ("DP", "PP", "PCP", "TP", "DCP", "EP")  # the order vLLM appends them in
API_SERVER_MARKERS = ("vllm.entrypoints", "vllm serve", "/vllm serve")
SPAWN_MARKER = "multiprocessing.spawn"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""}
TCP_LISTEN = "0A"


@dataclass(frozen=True)
class ProcInfo:
    """One process of an engine's tree.

    ``role``: api-server, engine-core, worker or other; ``rank``: a worker's rank within its
    engine core (from the title's axes, TP/PP order as vLLM numbers them), an engine core's
    data-parallel rank, an API server's index; None where there is none. ``title``: the
    setproctitle title (``VLLM::Worker_TP1``), else the kernel's ``comm``. ``cmdline``: the
    command line as ``/proc/PID/cmdline`` reads, arguments joined by spaces.
    """

    pid: int
    ppid: int
    role: Role
    rank: int | None
    title: str
    cmdline: str

    def label(self) -> str:
        """``worker 1``, ``EngineCore``, ``API server``, or the title for anything else."""
        if self.role == "worker":
            return f"worker {self.rank if self.rank is not None else '?'}"
        if self.role == "engine-core":
            return "EngineCore" + (f" DP{self.rank}" if self.rank else "")
        if self.role == "api-server":
            return "API server" + (f" {self.rank}" if self.rank else "")
        return self.title or f"pid {self.pid}"


@dataclass(frozen=True)
class RawProc:
    """What /proc says of one process (before labelling)."""

    pid: int
    ppid: int
    comm: str
    cmdline: str


def read_proc(pid: int, proc: Path = PROC) -> RawProc | None:
    """``/proc/PID/stat``, ``comm`` and ``cmdline``; None if the process is gone (or a kernel thread)."""
    fields = stat_fields(pid, proc)
    try:
        comm = (proc / str(pid) / "comm").read_text(encoding="utf-8", errors="replace").rstrip("\n")
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    if fields is None or len(fields) < 2:
        return None
    cmdline = " ".join(part for part in raw.decode("utf-8", errors="replace").split("\0") if part).strip()
    return RawProc(pid=pid, ppid=int(fields[1]), comm=comm, cmdline=cmdline)


def _all_procs(proc: Path = PROC) -> dict[int, RawProc]:
    found: dict[int, RawProc] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (raw := read_proc(int(entry.name), proc)) is not None:
            found[raw.pid] = raw
    return found


def title_of(raw: RawProc) -> str:
    """The vLLM title (from cmdline, else from the truncated comm), or the comm."""
    for text in (raw.cmdline, raw.comm):
        if match := TITLE_RE.match(text):
            return match.group(0)
    return raw.comm


def _role_from_title(title: str) -> tuple[Role | None, dict[str, int]]:
    match = TITLE_RE.match(title)
    if match is None:
        return None, {}
    name = match.group("name")
    axes = {axis or "": int(n) for axis, n in AXIS_RE.findall(match.group("suffix"))}
    if name.startswith("EngineCor"):  # comm keeps 15 characters: "VLLM::EngineCor"
        return "engine-core", axes
    if name.startswith("Worker"):
        return "worker", axes
    if name.startswith("APIServ"):
        return "api-server", axes
    return "other", axes


def label(procs: list[RawProc]) -> list[ProcInfo]:
    """Roles and ranks for a tree of processes (parents before children)."""
    roles: dict[int, Role] = {}
    axes: dict[int, dict[str, int]] = {}
    titles: dict[int, str] = {}
    for raw in procs:
        title = titles[raw.pid] = title_of(raw)
        role, found = _role_from_title(title)
        if role is None:
            parent = roles.get(raw.ppid)
            if any(marker in raw.cmdline for marker in API_SERVER_MARKERS):
                role = "api-server"
            elif SPAWN_MARKER in raw.cmdline and "spawn_main" in raw.cmdline and parent == "api-server":
                role = "engine-core"  # spawned, title not set yet
            elif SPAWN_MARKER in raw.cmdline and "spawn_main" in raw.cmdline and parent == "engine-core":
                role = "worker"
            else:
                role = "other"
        roles[raw.pid] = role
        axes[raw.pid] = found
    ranks: dict[int, int | None] = {}
    by_parent: dict[int, list[RawProc]] = {}
    for raw in procs:
        if roles[raw.pid] == "worker":
            by_parent.setdefault(raw.ppid, []).append(raw)
        else:
            ranks[raw.pid] = next(iter(axes[raw.pid].values()), None)
    for siblings in by_parent.values():
        # vLLM numbers ranks pp-major (rank = pp * tp_size + tp): sorting the axes in the order
        # the title lists them gives the rank. vLLM spawns workers in rank order, so untitled
        # siblings keep pid order; one untitled among titled ones has no rank yet.
        titled = [r for r in siblings if TITLE_RE.match(titles[r.pid])]
        ordered = titled if titled else siblings
        ordered.sort(key=lambda r: (tuple(axes[r.pid].get(a, 0) for a in WORKER_AXES), r.pid))
        for raw in siblings:
            ranks[raw.pid] = ordered.index(raw) if raw in ordered else None
    return [ProcInfo(raw.pid, raw.ppid, roles[raw.pid], ranks[raw.pid], titles[raw.pid], raw.cmdline) for raw in procs]


def _is_engine_child(raw: RawProc) -> bool:
    role, _ = _role_from_title(title_of(raw))
    return role in ("engine-core", "worker") or (SPAWN_MARKER in raw.cmdline and "spawn_main" in raw.cmdline)


def _vllm_root(pid: int, procs: dict[int, RawProc]) -> int:
    """Walk up from an engine core or worker to the process that started the engine."""
    current = pid
    seen = {pid}
    while current in procs and _is_engine_child(procs[current]):
        parent = procs[current].ppid
        if parent <= 1 or parent not in procs or parent in seen:
            break
        seen.add(parent)
        current = parent
    return current


def _tree(root: int, procs: dict[int, RawProc]) -> list[RawProc]:
    children: dict[int, list[int]] = {}
    for raw in procs.values():
        children.setdefault(raw.ppid, []).append(raw.pid)
    order, queue = [], [root]
    while queue:  # breadth first: parents before children, siblings in pid order
        pid = queue.pop(0)
        order.append(procs[pid])
        queue += sorted(children.get(pid, []))
    return order


def port_of(url: str) -> int:
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise DoctorInputError(f"not a server URL: {url!r}", "give it as http://127.0.0.1:8000") from None
    host = parts.hostname or ""
    if host not in LOOPBACK and not host.startswith("127."):
        raise DoctorInputError(
            f"{host} is not this machine: the doctor reads the engine's processes from /proc",
            "run vllm-doctor on the server's machine (with --url http://127.0.0.1:PORT) or give --pid",
        )
    return port if port is not None else (443 if parts.scheme == "https" else 80)


def listening_rows(port: int, proc: Path = PROC) -> Iterator[tuple[str, list[str]]]:
    """("tcp" or "tcp6", the row's fields) of each socket listening on ``port``, from
    /proc/net/tcp and tcp6 (fields: sl local_address rem_address st tx:rx tr:when retrnsmt uid
    timeout inode ...)."""
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text(encoding="ascii", errors="replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == TCP_LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                yield name, fields


def _listening_inodes(port: int, proc: Path = PROC) -> dict[str, int]:
    """inode -> the owner's uid of each socket listening on ``port``."""
    return {fields[9]: int(fields[7]) for _, fields in listening_rows(port, proc)}


def listening_pids(port: int, proc: Path = PROC) -> tuple[list[int], set[int]]:
    """Pids holding a socket that listens on ``port``, and the uids of listeners whose fds were unreadable."""
    inodes = _listening_inodes(port, proc)
    targets = {f"socket:[{inode}]" for inode in inodes}
    if not targets:
        return [], set()
    pids, unreadable = [], 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except PermissionError:
            unreadable += 1
            continue
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in targets:
                    pids.append(int(entry.name))
                    break
            except OSError:
                continue
    hidden = set(inodes.values()) - {os.geteuid()} if unreadable and not pids else set()
    return sorted(pids), hidden


def discover(url: str | None = None, pid: int | None = None) -> list[ProcInfo]:
    """The processes of the vLLM engine at ``url`` (a loopback server) or around ``pid``.

    From a URL: the process listening on that port, then all its descendants. From a pid: the
    tree of the process that started the engine (walking up from an engine core or worker).
    The root comes first, then descendants breadth first. Raises DoctorInputError (with the
    fix) for a URL nobody listens on, a pid that does not exist, or neither given.
    """
    if (url is None) == (pid is None):
        raise DoctorInputError("give either a URL or a pid", "--url http://127.0.0.1:8000 or --pid PID")
    procs = _all_procs()
    if url is not None:
        port = port_of(url)
        holders, hidden = listening_pids(port)
        holders = [p for p in holders if p in procs]
        if not holders and hidden:
            uid = min(hidden)
            raise DoctorInputError(
                f"port {port} is held by a process of uid {uid}, whose files vllm-doctor (uid {os.geteuid()}) "
                "may not read",
                f"run vllm-doctor as that user (`sudo -u '#{uid}' vllm-doctor ...`) or give --pid",
            )
        if not holders:
            raise DoctorInputError(
                f"no process of this machine listens on port {port} ({url})",
                "is the server running on this machine? check the port",
            )
        # several processes share a listening socket (API server children): take the topmost
        tops = [p for p in holders if procs[p].ppid not in holders]
        root = tops[0]
    else:
        assert pid is not None
        if pid not in procs:
            raise DoctorInputError(f"no process with pid {pid}", "list the engine's processes: ps -ef | grep VLLM")
        root = _vllm_root(pid, procs)
    return label(_tree(root, procs))

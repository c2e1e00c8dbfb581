"""The worker side of the doctor's ``vllm.general_plugins`` entry points: a no-op unless ``VLLM_DOCTOR=1``.

vLLM calls :func:`register` in every process it starts (front end, engine core, workers),
through the entry point :func:`vllm_doctor.plugins.register` (which sits beside the /metrics
exporter's). Without ``VLLM_DOCTOR=1`` it returns at once and imports nothing. With it, each process:

- logs one line naming itself (pid, parent, command), so ``vllm serve`` logs show the process
  tree the doctor will talk to;
- records itself as ``proc-<pid>.json`` in the user's private directory (mode 0700:
  ``VLLM_DOCTOR_DIR``, else ``$XDG_RUNTIME_DIR/vllm-doctor``, else ``$TMPDIR/vllm-doctor-<uid>``:
  :func:`vllm_doctor.channel.default_dir`), written atomically and removed when the process
  exits normally: the anatomy of a served engine, readable by ``vllm-doctor`` run by the same user;
- in a process that holds a worker, opens the doctor's private channel (a Unix socket in the
  same directory; :mod:`vllm_doctor.engine.channel`), created with the worker.

- in the process that builds the engine config (the ``vllm serve`` API server, or the script
  that creates ``vllm.LLM``), gives every config it builds the doctor's worker extension: if
  ``worker_extension_cls`` is unset it becomes
  ``vllm_doctor.engine.extension.DoctorWorkerExtension`` (what ``--worker-extension-cls`` would
  set); if the user has an extension of their own, a class mixing both
  (:mod:`vllm_doctor.engine.combined`). This is the one place the doctor wraps a vLLM function
  (``EngineArgs.create_engine_config``), and only with the opt-in set.

It never changes what vLLM computes: the extension only adds ``doctor_*`` methods, idle until
called. A served engine's workers are then reachable through the private channel, by the same
OS user on the same machine: ``vllm-doctor attach http://127.0.0.1:PORT``; no dev mode.
"""

from __future__ import annotations

import os
from typing import Any

from vllm_doctor.constants import DOCTOR_ENV, env_switch

_registered = False


def active() -> bool:
    return env_switch(DOCTOR_ENV)


def record_dir() -> str:
    """The user's private directory (mode 0700, created if missing; refused if anyone else can
    read it: :func:`vllm_doctor.channel.private_dir`), where each process records itself and
    the processes that hold a worker put their channel's socket."""
    from vllm_doctor.channel import private_dir

    return private_dir(create=True)


_extension_state = "not-tried"  # "installed" | "unsupported" once decided in this process


def register() -> None:
    """Called by :func:`vllm_doctor.plugins.register`, the entry point vLLM's ``load_general_plugins``
    calls (may run several times per process)."""
    global _registered, _extension_state
    if not active():
        return
    if not _registered:
        _registered = True
        try:
            _announce()
        except Exception:
            pass
    if _extension_state not in ("installed", "unsupported"):
        try:
            _extension_state = default_extension()
        except Exception as exc:  # never break vLLM's start-up for the doctor
            _extension_state = "unsupported"
            _log().warning("vllm-doctor plugin could not add its worker extension: %s: %s", type(exc).__name__, exc)


def _log() -> Any:
    import logging

    return logging.getLogger("vllm_doctor")


def default_extension() -> str:
    """Make engine configs built in this process carry the doctor's worker extension.

    Wraps ``EngineArgs.create_engine_config`` once vLLM's ``arg_utils`` is imported (it is in
    the front end, where vLLM loads plugins from ``EngineArgs.__post_init__``; engine-core and
    worker processes receive a finished config, so there is nothing to do there). Returns
    "installed", "not-yet" (``arg_utils`` not imported: try again at the next call) or
    "unsupported" (this vLLM has no such method: the user passes the flag themselves).
    """
    import sys

    arg_utils = sys.modules.get("vllm.engine.arg_utils")
    if arg_utils is None:
        return "not-yet"
    engine_args = getattr(arg_utils, "EngineArgs", None)
    original = getattr(engine_args, "create_engine_config", None)
    if engine_args is None or not callable(original):
        return "unsupported"
    if getattr(original, "__vllm_doctor_wrapper__", False):
        return "installed"

    import functools

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = original(self, *args, **kwargs)
        try:
            with_extension(config)
        except Exception as exc:
            _log().warning("vllm-doctor could not add its worker extension: %s: %s", type(exc).__name__, exc)
        return config

    create_engine_config.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
    engine_args.create_engine_config = create_engine_config
    return "installed"


def with_extension(config: Any) -> str | None:
    """Set ``config.parallel_config.worker_extension_cls`` to one that includes the doctor's."""
    from vllm_doctor.engine import EXTENSION_QUALNAME
    from vllm_doctor.engine.combined import qualname_with, user_qualname

    pc = getattr(config, "parallel_config", None)
    if pc is None or not hasattr(pc, "worker_extension_cls"):
        return None
    current = pc.worker_extension_cls
    if current == EXTENSION_QUALNAME or (isinstance(current, str) and user_qualname(current) is not None):
        return str(current)
    wanted = qualname_with(current) if isinstance(current, str) and current else EXTENSION_QUALNAME
    pc.worker_extension_cls = wanted
    _log().warning("vllm-doctor plugin: worker_extension_cls=%s (VLLM_DOCTOR=1)", wanted)
    return wanted


EXIT_WAIT_S = 5.0  # at exit, how long to wait for the engine processes this one killed to be gone


def _remove(path: str, base: str) -> None:
    """At this process's exit: its record goes; then, once the engine processes below it (the
    records' parent links) are gone, what they left (vLLM's shutdown has just sent them SIGKILL,
    which takes a moment to land)."""
    import contextlib
    import time

    from vllm_doctor.channel import sweep

    with contextlib.suppress(OSError):
        os.unlink(path)
    below = _descendants(base, os.getpid())
    deadline = time.monotonic() + EXIT_WAIT_S
    while below and time.monotonic() < deadline:
        below = [pid for pid in below if _running(pid)]
        if below:
            time.sleep(0.05)
    sweep(base)


def _descendants(base: str, root: int) -> list[int]:
    """The pids below ``root`` by the parent links of the records in ``base``."""
    import json

    parents: dict[int, int] = {}
    try:
        names = [n for n in os.listdir(base) if n.startswith("proc-") and n.endswith(".json")]
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(base, name), encoding="utf-8") as f:
                record = json.load(f)
            parents[int(record["pid"])] = int(record["ppid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    found, frontier = [], [root]
    while frontier:
        current = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == current and pid not in found]
        found += children
        frontier += children
    return found


def _running(pid: int) -> bool:
    from vllm_doctor.channel import running

    return running(pid)


def _announce() -> None:
    import functools
    import json
    import logging
    import sys
    import time

    from vllm_doctor.channel import at_exit, sweep
    from vllm_doctor.files import write_text_atomic

    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": [a[:200] for a in sys.argv[:12]],
        "started": time.time(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
    }
    base = record_dir()
    sweep(base)  # what processes killed before left (a reader ignores them: channel.stale)
    path = os.path.join(base, f"proc-{os.getpid()}.json")
    write_text_atomic(path, json.dumps(record, indent=1) + "\n")
    # at this process's exit: its record, and what the engine processes it killed left (vLLM's
    # shutdown SIGKILLs the engine core and the workers: they remove nothing themselves)
    at_exit(functools.partial(_remove, path, base))
    logging.getLogger("vllm_doctor").warning(
        "vllm-doctor plugin active in pid %d (parent %d): recorded in %s", os.getpid(), os.getppid(), path
    )

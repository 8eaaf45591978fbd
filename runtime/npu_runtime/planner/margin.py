"""The margin: non-torch memory the engine counts against its budget, and our safety term.

On NPUs, as vllm-ascend's NPUWorker.determine_available_memory accounts (vllm_ascend/worker/worker.py,
v0.23.0 and v0.25.1rc1): KV cache = total x gpu_memory_utilization - (weights + the profile run's
torch peak + the non-torch increase since the worker's memory snapshot). The ACL context predates
that snapshot (torch.npu.set_device runs first in init_device) and is not deducted; the 150 MiB
"redundancy buffer" appears only in the --kv-cache-memory value it suggests after capture, never
in the KV budget. What is left of non-torch memory is the communicators' buffers (`communication`),
created after the snapshot. `NPU_SAFETY` is ours, not the engine's: allocator rounding and small
non-torch allocations our terms miss; a calibration record's measured KV cache gives it back
(fit._kv_cache).

Off NPUs the planner keeps its earlier terms: a runtime context (`NON_TORCH_BASE`) besides the buffers.
"""

from __future__ import annotations

from typing import Final

from npu_runtime.contract import MIB
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["NON_TORCH_BASE", "NPU_SAFETY", "margin_bytes", "safety_bytes"]

NON_TORCH_BASE: Final = 512 * MIB  # CUDA/CPU runtime context, not seen by the torch allocator
NPU_SAFETY: Final = 128 * MIB  # ours (see the module): the calibration loop gives it back


def safety_bytes(device: DeviceInfo) -> int:
    """The part of the margin that is ours, not the engine's."""
    return NPU_SAFETY if device.kind == "npu" else NON_TORCH_BASE


def margin_bytes(device: DeviceInfo, communication_bytes: int) -> int:
    """Non-torch memory: the communicators' buffers (communication.py's communicators, computed once
    per budget by fit.make_budget) and `safety_bytes`."""
    return communication_bytes + safety_bytes(device)

"""The margin: non-torch memory besides the communication buffers, and a safety buffer on NPUs.

Sources: the runtime context (ACL / CUDA) the torch allocator does not see; vllm_ascend/worker/worker.py
determine_available_memory ("A 150 MiB buffer is kept"); the communication buffers are their own
term (`communication`) and are added here, as the engine's "non-torch memory" holds them.
"""

from __future__ import annotations

from typing import Final

from npu_runtime.contract import MIB
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["NON_TORCH_BASE", "NPU_REDUNDANCY", "margin_bytes"]

NON_TORCH_BASE: Final = 512 * MIB  # runtime context (ACL/CUDA), not seen by the torch allocator
NPU_REDUNDANCY: Final = 150 * MIB  # vllm_ascend/worker/worker.py: "A 150 MiB buffer is kept"


def margin_bytes(device: DeviceInfo, communication_bytes: int) -> int:
    """Non-torch memory: the runtime context, the communicators' buffers (communication.py's
    communicators, computed once per budget by fit.make_budget), a buffer on NPUs."""
    margin = NON_TORCH_BASE + communication_bytes
    if device.kind == "npu":
        margin += NPU_REDUNDANCY
    return margin

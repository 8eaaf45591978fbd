"""The margin: non-torch memory the engine's profiler sees but the plan does not estimate term by term.

Sources: the runtime context (ACL / CUDA) the torch allocator does not see; vllm_ascend/worker/worker.py
determine_available_memory ("A 150 MiB buffer is kept"); the communication buffers (`communication`).
"""

from __future__ import annotations

from typing import Final

from npu_runtime.contract import MIB, PlanOptions
from npu_runtime.planner.communication import communication_bytes
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["margin_bytes"]

_NON_TORCH_BASE: Final = 512 * MIB  # runtime context (ACL/CUDA), not seen by the torch allocator
_NPU_REDUNDANCY: Final = 150 * MIB  # vllm_ascend/worker/worker.py: "A 150 MiB buffer is kept"


def margin_bytes(options: PlanOptions, device: DeviceInfo, model: ModelInfo, layout: Layout) -> int:
    """Non-torch memory: the runtime context, HCCL buffers per communication group, a buffer on NPUs."""
    margin = _NON_TORCH_BASE + communication_bytes(options, device, layout)
    if device.kind == "npu":
        margin += _NPU_REDUNDANCY
    return margin

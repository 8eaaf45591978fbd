"""The margin: non-torch memory besides the communication buffers, and a safety buffer on NPUs.

Sources: the runtime context (ACL / CUDA) the torch allocator does not see; vllm_ascend/worker/worker.py
determine_available_memory ("A 150 MiB buffer is kept"); the communication buffers are their own
term (`communication`) and are added here, as the engine's "non-torch memory" holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from npu_runtime.contract import MIB, PlanOptions
from npu_runtime.planner.communication import communication_bytes
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["NON_TORCH_BASE", "NPU_REDUNDANCY", "margin_bytes"]

NON_TORCH_BASE: Final = 512 * MIB  # runtime context (ACL/CUDA), not seen by the torch allocator
NPU_REDUNDANCY: Final = 150 * MIB  # vllm_ascend/worker/worker.py: "A 150 MiB buffer is kept"


def margin_bytes(options: PlanOptions, device: DeviceInfo, layout: Layout, env: Mapping[str, str]) -> int:
    """Non-torch memory: the runtime context, the communicators' buffers, a buffer on NPUs."""
    margin = NON_TORCH_BASE + communication_bytes(options, device, layout, env)
    if device.kind == "npu":
        margin += NPU_REDUNDANCY
    return margin

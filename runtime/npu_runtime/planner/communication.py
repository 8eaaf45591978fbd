"""Communication buffers: HCCL (NCCL) memory per communication group, outside the torch allocator.

Sources: vllm_ascend/distributed/parallel_state.py (the MC2 group over the EP ranks) and
vllm_ascend/utils.py get_hccl_config_for_pg_options (HCCL_BUFFSIZE per group).
"""

from __future__ import annotations

from typing import Final

from npu_runtime.contract import MIB, PlanOptions
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["communication_bytes", "moe_comm_groups"]

_COMM_BUFFERS: Final = 400 * MIB  # HCCL_BUFFSIZE default 200 MB, in and out, per communication group


def communication_bytes(options: PlanOptions, device: DeviceInfo, layout: Layout) -> int:
    """HCCL buffers of every communication group this device joins: TP, PP, DP, and MoE's EP / MC2.

    A MoE model over DP x TP > 1 adds vLLM's EP group (its all-gather or all-to-all); with EP on an
    NPU, vllm-ascend's MC2 group too (vllm_ascend/distributed/parallel_state.py creates "mc2" over
    the same ranks; its buffer is HCCL_BUFFSIZE, vllm_ascend/utils.py get_hccl_config_for_pg_options).
    """
    groups = sum(n > 1 for n in (options.tensor_parallel, options.pipeline_parallel, options.data_parallel))
    groups += moe_comm_groups(device, layout)
    return groups * _COMM_BUFFERS


def moe_comm_groups(device: DeviceInfo, layout: Layout) -> int:
    """Communication groups a MoE layout adds to TP, PP and DP: EP, and MC2 with EP on an NPU."""
    if layout.moe_ranks <= 1 or (layout.data_parallel <= 1 and not layout.expert_parallel):
        return 0  # DP 1 without EP: the MoE group is the TP group
    return 1 + (1 if layout.expert_parallel and device.kind == "npu" else 0)

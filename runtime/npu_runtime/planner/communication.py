"""Communication buffers: the memory each collective communicator holds outside the torch allocator.

Sources (vLLM 0.23.0, vllm-ascend v0.23.0):
- the groups: vLLM's initialize_model_parallel (vllm/distributed/parallel_state.py: tp, pp, dp, and
  ep for MoE models over the DP x TP ranks of a stage) and vllm-ascend's init_ascend_model_parallel
  (vllm_ascend/distributed/parallel_state.py: "mc2" over the same ranks as ep);
- the buffer per group: vllm_ascend/utils.py get_hccl_config_for_pg_options gives every group
  hccl_buffer_size 200 MB (_DEFAULT_BUFFER_SIZE), the dp group calculate_dp_buffer_size() =
  max(ceil((dp + 1) x 4 B / 1 MiB), 50) MB, and leaves mc2 to the HCCL_BUFFSIZE environment
  variable (its FIXME: MC2 operators partition by HCCL_BUFFSIZE), whose HCCL default is 200 MB;
- HCCL holds two buffers of that size per communicator (input and output), allocated when the
  communicator first runs a collective (lazily): mc2 only when a forward pass dispatches MoE
  layers with MC2 or FUSED_MC2; under EP the ep group only with ALLTOALL or ALLGATHER (with
  MC2 / FUSED_MC2 for every pass it never runs one); a group that never runs a collective holds
  nothing;
- groups of the same ranks and options share one communicator (vllm_ascend/patch/worker/
  patch_distributed.py _acquire_hccl_group, reuse domain "shared"; mc2 has its own domain):
  with DP 1 the ep group is the tp group, and with PP 1 it is the world group (one communicator).
Off NPUs (NCCL, Gloo) the planner keeps 2 x 200 MB per group, as before: no engine source sizes
them per group.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from npu_runtime.contract import MIB, PlanError, PlanOptions
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["DEFAULT_HCCL_BUFFSIZE_MB", "Communicator", "communication_bytes", "communicators", "hccl_buffsize"]

DEFAULT_HCCL_BUFFSIZE_MB: Final = 200  # HCCL's default HCCL_BUFFSIZE; vllm_ascend/utils.py _DEFAULT_BUFFER_SIZE
_MIN_DP_BUFFER_MB: Final = 50  # vllm_ascend/utils.py _MIN_DP_BUFFER_SIZE
_BUFFERS_PER_COMMUNICATOR: Final = 2  # input and output


@dataclass(frozen=True)
class Communicator:
    """One communicator this device joins: its group, ranks and buffer (MB, one of the two)."""

    group: str
    ranks: int
    buffer_mb: int

    @property
    def bytes(self) -> int:
        return _BUFFERS_PER_COMMUNICATOR * self.buffer_mb * MIB


def hccl_buffsize(options: PlanOptions, env: Mapping[str, str]) -> int:
    """HCCL_BUFFSIZE in MB: --hccl-buffsize, else the environment's, else 200. PlanError when not a number."""
    if options.hccl_buffsize is not None:
        return options.hccl_buffsize
    text = env.get("HCCL_BUFFSIZE", "").strip()
    if not text:
        return DEFAULT_HCCL_BUFFSIZE_MB
    if not text.isdigit() or int(text) < 1:
        raise PlanError("HCCL_BUFFSIZE", f"must be a positive whole number of MB, got {text!r}")
    return int(text)


def communicators(
    options: PlanOptions,
    device: DeviceInfo,
    layout: Layout,
    env: Mapping[str, str],
    dispatch: Collection[str | None] | None = None,
) -> tuple[Communicator, ...]:
    """The communicators one device holds buffers for (see the module's sources). `dispatch`: the
    MoE communications the forward passes use (activation.moe_comm_mode); None counts every group
    that could run."""
    tp, pp, dp = options.tensor_parallel, options.pipeline_parallel, options.data_parallel
    npu = device.kind == "npu"
    default = DEFAULT_HCCL_BUFFSIZE_MB
    found: list[Communicator] = []
    if tp > 1:
        found.append(Communicator("tp", tp, default))
    if pp > 1:
        found.append(Communicator("pp", pp, default))
    if dp > 1:
        dp_mb = max(math.ceil((dp + 1) * 4 / MIB), _MIN_DP_BUFFER_MB) if npu else default
        found.append(Communicator("dp", dp, dp_mb))
    moe = layout.moe_ranks > 1 and (dp > 1 or layout.expert_parallel)
    used = set(dispatch) if dispatch is not None else {"MC2", "FUSED_MC2", "ALLTOALL", "ALLGATHER"}
    # Without EP the experts are tensor-sliced over the DP x TP ranks and reduce over the ep group.
    ep_runs = not npu or not layout.expert_parallel or bool(used & {"ALLTOALL", "ALLGATHER"})
    if moe and not (npu and layout.moe_ranks == tp) and ep_runs:
        found.append(Communicator("ep", layout.moe_ranks, default))
    if moe and layout.expert_parallel and npu and used & {"MC2", "FUSED_MC2"}:
        found.append(Communicator("mc2", layout.moe_ranks, hccl_buffsize(options, env)))
    return tuple(found)


def communication_bytes(options: PlanOptions, device: DeviceInfo, layout: Layout, env: Mapping[str, str]) -> int:
    """Bytes of every communicator's buffers on one device."""
    return sum(c.bytes for c in communicators(options, device, layout, env))

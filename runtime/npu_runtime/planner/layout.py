"""The layout of one replica: its ranks per node, and how its MoE layers are split over them.

Sources: vLLM's FusedMoEParallelConfig.make (vllm/model_executor/layers/fused_moe/config.py) groups
the DP x TP ranks of a pipeline stage for MoE layers; determine_expert_map (fused_moe/layer.py) gives
the first experts % EP ranks one more expert; the multi-node data parallel launcher's flags come from
vllm-ascend's DeepSeek-R1 multi-node tutorial.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["Layout", "NodeShare", "make_layout", "node_engine_args"]


@dataclass(frozen=True)
class NodeShare:
    """What one node of a replica runs (`vllm serve` flags of vLLM's multi-node data parallel launcher)."""

    node: int
    role: str
    """"leader" (the API server and its local DP ranks) or "worker" (--headless, DP ranks only)."""
    data_parallel_start_rank: int
    data_parallel_ranks: tuple[int, ...]
    devices: int


@dataclass(frozen=True)
class Layout:
    """How one replica's ranks are laid out over its nodes, and how its MoE layers are split.

    vLLM groups the DP x TP ranks of a PP stage for MoE layers (vllm/model_executor/layers/fused_moe/
    config.py FusedMoEParallelConfig.make: "flatten TP across DP"): with --enable-expert-parallel
    each rank owns whole experts (EP size = DP x TP), without it every expert is tensor-sliced
    over the same DP x TP ranks (vllm_ascend/xlite/xlite.py: moe_ep_size / moe_tp_size).
    """

    nodes: int
    devices_per_node: int
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    data_parallel_local: int
    expert_parallel: bool
    """EP in effect: requested, and a MoE model with DP x TP > 1."""
    moe_ranks: int
    """DP x TP: the ranks a MoE layer is split over (1 for dense models)."""
    ep_size: int
    moe_tensor_parallel: int
    experts_per_rank: int | None
    """Routed experts one device holds (the busiest EP rank: ceil((experts + redundant) / EP)); None for
    dense models."""
    redundant_experts: int
    per_node: tuple[NodeShare, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: lists, not tuples."""
        data = dataclasses.asdict(self)
        data["per_node"] = [
            {**dataclasses.asdict(share), "data_parallel_ranks": list(share.data_parallel_ranks)}
            for share in self.per_node
        ]
        return data


@dataclass(frozen=True)
class MoeSplit:
    """The MoE fields of a `Layout` for one TP x DP (make_layout's, and fit's hint's trials)."""

    moe_ranks: int
    expert_parallel: bool
    ep_size: int
    moe_tensor_parallel: int
    experts_per_rank: int | None
    redundant_experts: int


def moe_split(
    model: ModelInfo, *, tensor_parallel: int, data_parallel: int, expert_parallel: bool, redundant: int
) -> MoeSplit:
    """How the experts spread over the DP x TP ranks: EP when asked for and there is more than one rank."""
    moe_ranks = data_parallel * tensor_parallel if model.is_moe else 1
    ep = expert_parallel and moe_ranks > 1
    experts_per_rank = None
    if model.is_moe and model.num_experts:
        # vllm/model_executor/layers/fused_moe/layer.py determine_expert_map: the first
        # experts % EP ranks get one more expert.
        # vllm_ascend/ops/fused_moe/fused_moe.py: local_num_experts = (num_experts +
        # global_redundant_expert_num) // ep_size (EPLB's redundant experts, with EP only).
        physical = model.num_experts + (redundant if ep else 0)
        experts_per_rank = -(-physical // moe_ranks) if ep else model.num_experts
    return MoeSplit(
        moe_ranks=moe_ranks,
        expert_parallel=ep,
        ep_size=moe_ranks if ep else 1,
        moe_tensor_parallel=1 if ep else moe_ranks,
        experts_per_rank=experts_per_rank,
        redundant_experts=redundant if ep else 0,
    )


def make_layout(options: PlanOptions, device: DeviceInfo, model: ModelInfo, warnings: list[str]) -> Layout:
    """The replica's ranks per node and its MoE split (see `Layout`)."""
    tp, pp, dp, nodes = options.tensor_parallel, options.pipeline_parallel, options.data_parallel, options.nodes
    redundant = options.redundant_experts or 0
    split = moe_split(
        model, tensor_parallel=tp, data_parallel=dp, expert_parallel=options.enable_expert_parallel, redundant=redundant
    )
    moe_ranks, ep = split.moe_ranks, split.expert_parallel
    if redundant and not ep:
        warnings.append(f"{redundant} redundant experts have no effect without expert parallelism (EPLB)")
    if options.enable_expert_parallel and not model.is_moe:
        warnings.append(f"--enable-expert-parallel has no effect: {model.architecture} has no experts")
    if ep and model.num_experts and (model.num_experts + redundant) % moe_ranks:
        warnings.append(
            f"{model.num_experts + redundant} experts do not divide evenly over EP {moe_ranks}: the busiest rank "
            f"holds {split.experts_per_rank}"
        )
    local = dp // nodes if nodes > 1 else dp
    per_node = tuple(
        NodeShare(
            node=n,
            role="leader" if n == 0 else "worker",
            data_parallel_start_rank=n * local,
            data_parallel_ranks=tuple(range(n * local, (n + 1) * local)),
            devices=local * tp * pp,
        )
        for n in range(nodes)
    )
    return Layout(
        nodes=nodes,
        devices_per_node=device.count,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        data_parallel_local=local,
        per_node=per_node,
        **dataclasses.asdict(split),
    )


def node_engine_args(layout: Layout, node: int, address: str, rpc_port: int) -> tuple[str, ...]:
    """vLLM's multi-node data parallel flags for one node of the replica (none on a single node).

    As vllm-ascend's DeepSeek-R1 tutorial runs two nodes: every node --data-parallel-size-local,
    --data-parallel-address (the leader's) and --data-parallel-rpc-port; workers add --headless and
    --data-parallel-start-rank.
    """
    if layout.nodes == 1:
        return ()
    if not 0 <= node < layout.nodes:
        raise PlanError("node_rank", f"{node} is not a node of this {layout.nodes}-node replica")
    share = layout.per_node[node]
    args = [
        "--data-parallel-size-local",
        str(layout.data_parallel_local),
        "--data-parallel-address",
        address,
        "--data-parallel-rpc-port",
        str(rpc_port),
    ]
    if share.role == "worker":
        args += ["--headless", "--data-parallel-start-rank", str(share.data_parallel_start_rank)]
    return tuple(args)

"""Graph memory per capture size, and the ACL graph stream cap where one applies.

Sources: vLLM's profile_cudagraph_memory (vllm/v1/worker/gpu_model_runner.py: the first capture
allocates the pool, "at least 1 MiB per graph for driver overhead"),
vllm/v1/worker/gpu_worker.py determine_available_memory (who reserves the graphs).

Streams: vllm-ascend's update_aclgraph_sizes (vllm_ascend/utils.py before #9962) thinned the sizes
to a stream budget; no release in `releases.RULES` has it (removed before v0.21.0rc1), so the stream
cap applies only when a release row names a budget or the user sets --stream-budget (our own cap,
for soft-partitioned NPUs or older driver stacks), and the plan says which.

LoRA: every capture size is captured once per LoRA case (vllm/v1/cudagraph_dispatcher.py
CudagraphDispatcher.initialize_cudagraph_keys: product(capture sizes, lora cases); `lora.capture_cases`),
all into the one graph pool, so the cases multiply the per-graph cost and the streams, not the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from npu_runtime.contract import KIB, MIB, PlanOptions
from npu_runtime.planner import modes
from npu_runtime.planner.activation import activation_bytes
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.probe import DeviceInfo
from npu_runtime.planner.weights import MTP_METHODS

__all__ = ["DEVICE_STREAMS", "StreamPlan", "graph_cost", "graph_reserved_by", "stream_plan"]

# The device's streams; vllm-ascend's old update_aclgraph_sizes allowed 1800 of them ("we save 248
# streams as a buffer"), removed in #9962 after newer HDK/CANN stacks raised the limit.
DEVICE_STREAMS: Final = 2048
# Non-AIV HCCL expansion: each communication group costs about 40 streams up front (same source).
_STREAMS_PER_COMM_GROUP: Final = 40
_GRAPH_POOL_OVERHEAD: Final = 64 * MIB  # graph pool bookkeeping and attention metadata buffers
_PER_GRAPH_MIN: Final = 1 * MIB  # vLLM: "Use at least 1 MiB per graph for driver overhead"
_PER_PIECE: Final = 256 * KIB  # one piecewise sub-graph


@dataclass(frozen=True)
class StreamPlan:
    """ACL graph streams per device (NPU only): estimate <= budget."""

    applies: bool
    budget: int | None
    """None: neither the release nor the user caps the streams."""
    enforced_by: str
    """"release <version>", "user (--stream-budget)" or "none"."""
    device_streams: int
    per_size: int
    fixed: int
    estimate: int
    max_sizes: int | None
    hccl_op_expansion_mode: str
    communication_groups: int
    formula: str


def graph_cost(
    model: ModelInfo,
    mode: str,
    largest: int,
    tp: int,
    dtype_bytes: int,
    layout: Layout,
    moe_mode: str | None = None,
    flashcomm1: bool = False,
    lora_cases: int = 1,
) -> tuple[int, int]:
    """(first capture, each further size), estimated as vLLM's profile_cudagraph_memory measures them.

    The first (largest) capture allocates the graph pool: the activations of one decode step of
    `largest` tokens (MoE layers dispatched as `moe_mode`, see activation.moe_comm_mode). Each
    further size adds driver/graph bookkeeping: at least 1 MiB per graph (vLLM's floor), a
    sub-graph per layer in piecewise mode. FULL_AND_PIECEWISE keeps both families.
    With `lora_cases` graphs per size (see the module), the largest size's other cases and each
    further size's cases each add that increment; the pool is allocated once.
    """
    step = activation_bytes(model, largest, tp, dtype_bytes, layout, moe_mode, flashcomm1)
    first_one = step + _GRAPH_POOL_OVERHEAD
    pieces = model.num_layers + 1
    piecewise = max(_PER_GRAPH_MIN, pieces * _PER_PIECE)
    if mode == modes.FULL_AND_PIECEWISE:
        first, each = 2 * first_one, piecewise + _PER_GRAPH_MIN
    elif mode == modes.PIECEWISE:
        first, each = first_one, piecewise
    else:
        first, each = first_one, _PER_GRAPH_MIN
    return first + (lora_cases - 1) * each, lora_cases * each


def stream_plan(
    options: PlanOptions,
    device: DeviceInfo,
    model: ModelInfo,
    env: dict[str, str],
    mode: str,
    layout: Layout,
    release_budget: int | None = None,
    release: str = "",
    lora_cases: int = 1,
) -> StreamPlan:
    """ACL graph streams, after vllm-ascend's update_aclgraph_sizes (vllm_ascend/utils.py before #9962).

    Applies only with a budget: the release row's (`release_budget`) or the user's --stream-budget;
    without one the plan is not capped by streams (no supported release enforces a budget).
    The estimate is left at 0: `_fit` fills it in once the sizes are chosen.

    Per captured size: PIECEWISE about layers + 1 sub-graphs (plus a draft model's layers + 1), a
    FULL graph about one; times a communication factor: with HCCL_OP_EXPANSION_MODE=AIV
    1 + groups (+ 1 with expert parallel, + 1 for a MoE model with DP > 1, + a fixed block for
    dense models' all-reduce), otherwise 1 + 2 x groups plus 40 streams per group up front.
    FULL_AND_PIECEWISE adds one full graph per size. LoRA multiplies the per-size streams by its
    capture cases.
    """
    budget = options.stream_budget or release_budget
    enforced_by = (
        "user (--stream-budget)" if options.stream_budget else f"release {release}" if release_budget else "none"
    )
    groups = sum(n > 1 for n in (options.tensor_parallel, options.data_parallel))
    aiv = env.get("HCCL_OP_EXPANSION_MODE", "").upper() == "AIV"
    expansion = "AIV" if aiv else "default"
    if device.kind != "npu" or mode == modes.NONE:
        return StreamPlan(
            False, budget, "none", DEVICE_STREAMS, 0, 0, 0, None, expansion, groups, "not an NPU graph mode"
        )
    if budget is None:
        return StreamPlan(
            False,
            None,
            "none",
            DEVICE_STREAMS,
            0,
            0,
            0,
            None,
            expansion,
            groups,
            f"vllm-ascend {release or 'this release'} enforces no stream budget (update_aclgraph_sizes was removed "
            "before v0.21.0rc1); --stream-budget sets one",
        )
    draft = model.draft_layers if options.speculative_method in MTP_METHODS else 0
    if modes.has_piecewise_graphs(mode):
        per_graph = model.num_layers + 1 + (draft + 1 if draft else 0)
        shape = f"(layers {model.num_layers} + 1{f' + draft {draft} + 1' if draft else ''})"
    else:
        per_graph = 1 + (1 if draft else 0)
        shape = "1 full graph" + (" + 1 draft graph" if draft else "")
    if aiv:
        # update_aclgraph_sizes: parallel_factor = 1 + groups + int(enable_expert_parallel), + 1 for a
        # MoE model with DP > 1.
        factor = 1 + groups + (1 if options.enable_expert_parallel else 0)
        moe_dp = model.is_moe and options.data_parallel > 1
        if moe_dp:
            factor += 1
        fixed = 0 if model.is_moe else factor * per_graph
        ep_words = (" + EP" if options.enable_expert_parallel else "") + (" + MoE with DP" if moe_dp else "")
        formula = f"{shape} x (1 + {groups} comm groups{ep_words}) per size" + (
            "" if model.is_moe else " + one dense block"
        )
    else:
        factor = 1 + 2 * groups
        fixed = groups * _STREAMS_PER_COMM_GROUP
        formula = f"{shape} x (1 + 2 x {groups} comm groups) per size + 40 x {groups}"
    per_size = per_graph * factor
    if mode == modes.FULL_AND_PIECEWISE:
        per_size += 1
        formula += " + 1 full graph per size"
    if lora_cases > 1:
        per_size *= lora_cases
        formula = f"({formula}) x {lora_cases} LoRA capture cases"
    max_sizes = max((budget - fixed) // per_size, 0)
    return StreamPlan(
        True, budget, enforced_by, DEVICE_STREAMS, per_size, fixed, 0, max_sizes, expansion, groups, formula
    )


def graph_reserved_by(device: DeviceInfo, env: dict[str, str], graph_bytes: int) -> str:
    if graph_bytes == 0 or device.kind == "cpu":
        return "none"
    if device.kind == "cuda" and env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1") != "0":
        # vllm/v1/worker/gpu_worker.py determine_available_memory subtracts profile_cudagraph_memory()
        # from the KV budget (envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, default on).
        return "engine"
    return "plan"

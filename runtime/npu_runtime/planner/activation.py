"""Peak activation of vLLM's profile run, and the sampler's dummy run.

Sources (vLLM 0.23.0, vllm-ascend v0.23.0):
- the profile run is one forward pass over max_num_batched_tokens dummy tokens, then the sampler
  over max_num_seqs rows (vllm/v1/worker/gpu_model_runner.py profile_run, _dummy_sampler_run);
  the dummy tokens route evenly over the experts (balanced routing);
- attention widths: q and k of heads x (qk_nope + qk_rope) and v of heads x v_head_dim for MLA
  (DeepSeek-V3: 192 and 128), GQA with max(1, kv_heads / tp) KV heads per rank;
- MoE dispatch on NPUs: vllm_ascend/ascend_forward_context.py select_moe_comm_method. Without EP,
  ALLGATHER; with EP on A3, MC2 up to the MC2 token capacity and ALLTOALL above it; on A2, MC2
  only with at most 24 experts per device, EP >= 16 and tokens within the capacity, else
  ALLGATHER. The capacity is min(ceil(max capture size / tp), 512) x tp (set_mc2_tokens_capacity).
  ALLTOALL and MC2 split the tokens over the TP ranks first (ops/fused_moe/prepare_finalize.py
  PrepareAndFinalizeWithAll2All / WithMC2: tensor_split over tp); ALLGATHER gathers the tokens of
  every DP rank (PrepareAndFinalizeWithAllGather: dp_group.all_gather).
"""

from __future__ import annotations

import math
from typing import Final

from npu_runtime.contract import MIB, PlanOptions
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import ModelInfo

__all__ = [
    "ACTIVATION_WORKSPACE",
    "MC2_MAX_TOKENS_PER_RANK",
    "activation_bytes",
    "mc2_capacity",
    "moe_comm_mode",
    "sampler_bytes",
]

ACTIVATION_WORKSPACE: Final = 256 * MIB  # kernels' workspaces, allocator slack during profile_run
# set_mc2_tokens_capacity: "To save memory, we cap the max number of tokens to 512" per TP rank.
MC2_MAX_TOKENS_PER_RANK: Final = 512
# _select_a2_moe_comm_method: MC2 needs at most 24 experts per device and an EP group of 16 or more.
_A2_MC2_MAX_EXPERTS_PER_DEVICE: Final = 24
_A2_MC2_MIN_EP: Final = 16

ALLGATHER: Final = "ALLGATHER"
ALLTOALL: Final = "ALLTOALL"
MC2: Final = "MC2"


def mc2_capacity(max_capture_size: int, tp: int) -> int:
    """vllm-ascend's MC2 token capacity (set_mc2_tokens_capacity, without enable_prefill_mc2)."""
    return min(-(-max_capture_size // tp), MC2_MAX_TOKENS_PER_RANK) * tp


def moe_comm_mode(model: ModelInfo, layout: Layout, family: str, tokens: int, capacity: int) -> str | None:
    """The MoE communication of a forward pass of `tokens` tokens on an NPU of `family`; None off NPUs
    and for dense models (select_moe_comm_method)."""
    if not model.is_moe or family not in ("A2", "A3", "A5", "310P"):
        return None
    if not layout.expert_parallel or family == "310P":
        return ALLGATHER
    if family == "A3":
        return MC2 if tokens <= capacity else ALLTOALL
    if family == "A2":
        per_device = (model.num_experts or 0) // layout.ep_size
        if per_device <= _A2_MC2_MAX_EXPERTS_PER_DEVICE and layout.ep_size >= _A2_MC2_MIN_EP and tokens <= capacity:
            return MC2
        return ALLGATHER
    # A5: _select_a5_moe_comm_method
    if tokens <= capacity:
        return MC2
    return ALLGATHER if layout.ep_size <= (model.num_experts_per_tok or 1) else ALLTOALL


def activation_bytes(
    model: ModelInfo, tokens: int, tp: int, dtype_bytes: int, layout: Layout, mode: str | None = None
) -> int:
    """Peak activation of one forward pass over `tokens` tokens (vLLM's profile_run), estimated.

    Per token: the residual stream and norms (4 x hidden), the attention projections, and the
    widest MLP: a dense MLP's gate/up/down sliced over TP, or the MoE layer. MoE rows (one per
    token and chosen expert) carry the dispatch buffer in and out (2 x hidden) and the expert's
    gate/up/down (3 x its intermediate width, sliced over the MoE TP ranks without EP). `mode` is
    the NPU dispatch (`moe_comm_mode`); None keeps vLLM's generic layer (every token's rows on
    every rank, as the CUDA and CPU builds run it).
    """
    hidden = model.hidden_size
    heads = model.num_attention_heads // tp
    if model.is_mla and model.qk_nope_head_dim and model.v_head_dim:
        qkv = heads * (2 * (model.qk_nope_head_dim + (model.qk_rope_head_dim or 0)) + model.v_head_dim)
    else:
        qkv = heads * model.head_dim + 2 * max(1, model.num_kv_heads // tp) * model.head_dim
    dense_mlp = tokens * 3 * model.intermediate_size // tp
    mlp = dense_mlp
    if model.is_moe and model.num_experts_per_tok and model.moe_intermediate_size:
        mlp = max(_moe_rows_bytes(model, tokens, tp, layout, mode), dense_mlp if model.dense_layers else 0)
    return dtype_bytes * (tokens * (4 * hidden + qkv) + mlp) + ACTIVATION_WORKSPACE


def _moe_rows_bytes(model: ModelInfo, tokens: int, tp: int, layout: Layout, mode: str | None) -> int:
    """Elements of a MoE layer's activation on one rank (see `activation_bytes`)."""
    hidden, top_k = model.hidden_size, model.num_experts_per_tok or 1
    inter = model.moe_intermediate_size or 0
    if mode in (MC2, ALLTOALL):
        # Tokens split over TP, then top_k rows each reach the experts' ranks (balanced routing).
        return math.ceil(tokens / tp) * top_k * (2 * hidden + 3 * inter)
    if mode == ALLGATHER:
        gathered = tokens * layout.data_parallel
        gather = 2 * gathered * hidden if layout.data_parallel > 1 else 0
        if layout.expert_parallel:
            rows = math.ceil(gathered * top_k / layout.ep_size)
            return gather + rows * (2 * hidden + 3 * inter)
        return gather + gathered * top_k * (2 * hidden + 3 * inter // layout.moe_tensor_parallel)
    return tokens * top_k * (2 * hidden + 3 * inter // layout.moe_tensor_parallel)


def sampler_bytes(options: PlanOptions, model: ModelInfo) -> int:
    """The sampler's dummy run over max_num_seqs rows of the vocabulary.

    fp32 logits and probabilities plus an int64 sort order: 16 bytes per entry.
    """
    return options.max_num_seqs * (1 + options.speculative_tokens) * model.vocab_size * 16

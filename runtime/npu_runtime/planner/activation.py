"""Peak activation of the engine's profile run: the forward pass, then the logits.

Sources (vLLM 0.23.0 / 0.25.1, vllm-ascend v0.23.0 / v0.25.1rc1):
- the profile run is one forward pass over max_num_batched_tokens dummy tokens
  (vllm/v1/worker/gpu_model_runner.py profile_run), then vllm-ascend's own _dummy_sampler_run
  (vllm_ascend/worker/model_runner_v1.py NPUModelRunner._dummy_sampler_run), which only computes
  the logits of max_num_seqs rows ("TODO: need to run a dummy sampler"): no sampler buffers;
  the dummy tokens route evenly over the experts (balanced routing);
- the peak is the torch allocator's peak during that run (NPUWorker.determine_available_memory:
  torch_peak_increase read before graph capture): the larger of a layer's attention phase and
  its MLP phase, never the two together, and no flat workspace;
- flashcomm1 (vllm_ascend/utils.py enable_sp; sequence parallelism): the residual stream between
  layers is split over the TP ranks (reduce-scatter after o_proj and down_proj, all-gather
  before the projections), so each rank keeps ceil(tokens / tp) rows of it;
- attention widths: q and k of heads x (qk_nope + qk_rope) and v of heads x v_head_dim for MLA
  (DeepSeek-V3: 192 and 128), GQA with max(1, kv_heads / tp) KV heads per rank;
- MoE dispatch on NPUs: vllm_ascend/ascend_forward_context.py select_moe_comm_method. Without EP,
  ALLGATHER; with EP on A3, MC2 up to the MC2 token capacity and ALLTOALL above it; on A2, MC2
  only with at most 24 experts per device, EP >= 16 and tokens within the capacity, else
  ALLGATHER. The capacity is min(ceil(max capture size / tp), 512) x tp (set_mc2_tokens_capacity).
  With enable_fused_mc2 = 1 and an EP group of at most 32, A3 uses FUSED_MC2 (dispatch_ffn_combine)
  both within and above the capacity (_select_a3_moe_comm_method); = 2 only for decode.
  ALLTOALL and MC2 split the tokens over the TP ranks first (ops/fused_moe/prepare_finalize.py
  PrepareAndFinalizeWithAll2All / WithMC2: tensor_split over tp); ALLGATHER gathers the tokens of
  every DP rank (PrepareAndFinalizeWithAllGather: dp_group.all_gather).
"""

from __future__ import annotations

import math
from typing import Final

from npu_runtime.contract import PlanOptions
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import ModelInfo

__all__ = [
    "MC2_MAX_TOKENS_PER_RANK",
    "activation_bytes",
    "logits_bytes",
    "mc2_capacity",
    "moe_comm_mode",
]

# set_mc2_tokens_capacity: "To save memory, we cap the max number of tokens to 512" per TP rank.
MC2_MAX_TOKENS_PER_RANK: Final = 512
# _select_a2_moe_comm_method: MC2 needs at most 24 experts per device and an EP group of 16 or more.
_A2_MC2_MAX_EXPERTS_PER_DEVICE: Final = 24
_A2_MC2_MIN_EP: Final = 16
# _select_a3_moe_comm_method: "drop the EP-size guard when dispatch_ffn_combine supports larger EP sizes".
_FUSED_MC2_MAX_EP: Final = 32

ALLGATHER: Final = "ALLGATHER"
ALLTOALL: Final = "ALLTOALL"
MC2: Final = "MC2"
FUSED_MC2: Final = "FUSED_MC2"


def mc2_capacity(max_capture_size: int, tp: int) -> int:
    """vllm-ascend's MC2 token capacity (set_mc2_tokens_capacity, without enable_prefill_mc2)."""
    return min(-(-max_capture_size // tp), MC2_MAX_TOKENS_PER_RANK) * tp


def moe_comm_mode(
    model: ModelInfo, layout: Layout, family: str, tokens: int, capacity: int, fused_mc2: int = 0
) -> str | None:
    """The MoE communication of a forward pass of `tokens` tokens on an NPU of `family`; None off NPUs
    and for dense models (select_moe_comm_method)."""
    if not model.is_moe or family not in ("A2", "A3", "A5", "310P"):
        return None
    if not layout.expert_parallel or family == "310P":
        return ALLGATHER
    if family == "A3":
        fused = fused_mc2 == 1 and layout.ep_size <= _FUSED_MC2_MAX_EP
        if tokens <= capacity:
            # enable_fused_mc2 = 2 also needs speculative decoding and w8a8_dynamic: not assumed.
            return FUSED_MC2 if fused else MC2
        return FUSED_MC2 if fused else ALLTOALL
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
    model: ModelInfo,
    tokens: int,
    tp: int,
    dtype_bytes: int,
    layout: Layout,
    mode: str | None = None,
    flashcomm1: bool = False,
) -> int:
    """Peak activation of one forward pass over `tokens` tokens (the profile run), estimated.

    The larger of two phases of one layer, each beside the residual stream (`tokens` rows of
    hidden, ceil(tokens / tp) under flashcomm1): attention holds its input, q/k/v, the attention
    output and o_proj's output; the MLP holds its input, gate/up and the activated half (3 x the
    intermediate width, sliced over TP) and down_proj's output. MoE rows (one per token and
    chosen expert) carry the dispatch buffer in and out (2 x hidden) and the expert's gate/up/down
    (3 x its intermediate width, sliced over the MoE TP ranks without EP). `mode` is the NPU
    dispatch (`moe_comm_mode`); None keeps vLLM's generic layer (every token's rows on every rank,
    as the CUDA and CPU builds run it).
    """
    hidden = model.hidden_size
    heads = model.num_attention_heads // tp
    if model.is_mla and model.qk_nope_head_dim and model.v_head_dim:
        qkv = heads * (2 * (model.qk_nope_head_dim + (model.qk_rope_head_dim or 0)) + model.v_head_dim)
        attention_out = heads * model.v_head_dim
    else:
        qkv = heads * model.head_dim + 2 * max(1, model.num_kv_heads // tp) * model.head_dim
        attention_out = heads * model.head_dim
    residual = math.ceil(tokens / tp) if flashcomm1 and tp > 1 else tokens
    dense_mlp = tokens * 3 * model.intermediate_size // tp
    mlp = dense_mlp
    if model.is_moe and model.num_experts_per_tok and model.moe_intermediate_size:
        mlp = max(_moe_rows_bytes(model, tokens, tp, layout, mode), dense_mlp if model.dense_layers else 0)
    attention_phase = tokens * (2 * hidden + qkv + attention_out)
    mlp_phase = 2 * tokens * hidden + mlp
    return dtype_bytes * (residual * hidden + max(attention_phase, mlp_phase))


def _moe_rows_bytes(model: ModelInfo, tokens: int, tp: int, layout: Layout, mode: str | None) -> int:
    """Elements of a MoE layer's activation on one rank (see `activation_bytes`)."""
    hidden, top_k = model.hidden_size, model.num_experts_per_tok or 1
    inter = model.moe_intermediate_size or 0
    if mode in (MC2, FUSED_MC2, ALLTOALL):
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


def logits_bytes(options: PlanOptions, model: ModelInfo, tokens: int, tp: int, dtype_bytes: int) -> int:
    """The logits phase of the profile run (NPUModelRunner._dummy_sampler_run): the final hidden
    states of all `tokens` still held, and compute_logits over max_num_seqs rows: each rank's
    vocabulary slice, then the gathered logits (vllm/model_executor/layers/logits_processor.py
    LogitsProcessor._get_logits: tensor_model_parallel_gather), in the model dtype."""
    rows = options.max_num_seqs
    vocab_slice = -(-model.vocab_size // tp)
    return dtype_bytes * (tokens * model.hidden_size + rows * (vocab_slice + model.vocab_size))

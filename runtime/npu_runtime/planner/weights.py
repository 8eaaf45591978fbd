"""Weights on the busiest device: what the checkpoint holds, split as the engine splits it.

Sources (vLLM 0.23.0 and vllm-ascend v0.23.0):
- split over TP x PP, replicated on every DP rank: vLLM's ColumnParallelLinear / RowParallelLinear
  and VocabParallelEmbedding (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py);
- kept whole on every TP rank (`ModelInfo.replicated_weight_bytes`): MLA's fused_qkv_a_proj
  (q_a_proj + kv_a_proj_with_mqa, `disable_tp=True` in vllm/model_executor/models/deepseek_v2.py),
  the MoE router gate (GateLinear / ReplicatedLinear), the MTP layer's eh_proj (an nn.Linear in
  deepseek_mtp.py);
- GQA K/V heads when TP exceeds the KV-head count: QKVParallelLinear keeps one KV head per rank
  (num_kv_head_replicas = tp / num_kv_heads, vllm/model_executor/layers/linear.py);
- MLA's absorbed copies: vllm-ascend's MLA process_weights_after_loading (attention/mla_v1.py) keeps
  kv_b_proj (bf16: it asserts an UnquantizedLinearMethod) and adds W_UK_T and W_UV, contiguous
  copies of the same per-rank slice in the model dtype (vLLM's MLA backends do the same,
  vllm/v1/attention/backends/mla/common.py);
- routed experts over the DP x TP ranks of a stage (FusedMoE): whole experts with EP, the busiest
  rank holding ceil((experts + redundant) / EP) (vllm_ascend/ops/fused_moe/fused_moe.py:
  local_num_experts = (num_experts + global_redundant_expert_num) // ep_size; the redundant ones
  come from additional_config eplb_config.num_redundant_experts, vllm_ascend/ascend_config.py);
- the MTP draft layers (vllm/config/speculative.py), at the precision the quantization gives them;
- ModelSlim's per-output-channel quantization parameters, which the shape estimate does not count,
  and vllm-ascend's copies of them (vllm_ascend/quantization/methods/w8a8_static.py
  get_perchannel_param: quant_bias int32, deq_scale fp32 for bf16 models, weight_scale and
  weight_offset in the dtype; w8a8_dynamic.py process_weights_after_loading: weight_scale,
  weight_offset and a weight_scale_fp32 copy, for linear layers and for the experts' w13 / w2):
  12 bytes per output channel for W8A8, 8 for the dynamic schemes. MLA's replicated q_a / kv_a
  projections and W8A8's input-side aclnn copies (3 x in_features x dtype per layer) are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from npu_runtime.contract import format_gib
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import DTYPE_BYTES, ModelInfo

__all__ = ["MTP_METHODS", "WeightTerms", "weight_terms", "weights_per_device"]

# vLLM's speculative methods that run the checkpoint's own MTP layers as the draft model
# (vllm/config/speculative.py: "mtp" and the per-architecture *_mtp names).
MTP_METHODS: Final = frozenset({"mtp", "deepseek_mtp"})


@dataclass(frozen=True)
class WeightTerms:
    """Weights on the busiest device, by how the engine places them (bytes)."""

    split: int
    """Dense parts split over TP x PP (attention, dense MLPs, shared experts, embeddings, kv_b_proj)."""
    replicated: int
    """Tensors every TP rank holds whole (their PP stage's share)."""
    kv_head_replicas: int
    """K/V projection heads repeated because TP exceeds the KV-head count."""
    mla_absorbed: int
    """MLA's W_UK_T and W_UV copies beside kv_b_proj."""
    experts: int
    """Routed experts on the busiest MoE rank."""
    quant_params: int = 0
    """Quantization parameters per output channel and vllm-ascend's copies of them (ModelSlim)."""

    @property
    def total(self) -> int:
        return (
            self.split + self.replicated + self.kv_head_replicas + self.mla_absorbed + self.experts + self.quant_params
        )


def weights_per_device(model: ModelInfo, dtype: str, layout: Layout, mtp: bool, warnings: list[str]) -> int:
    """Weights on the busiest device (`weight_terms(...).total`)."""
    return weight_terms(model, dtype, layout, mtp, warnings).total


def weight_terms(model: ModelInfo, dtype: str, layout: Layout, mtp: bool, warnings: list[str]) -> WeightTerms:
    """Weights on the busiest device, term by term (see the module's sources).

    Measured checkpoints (safetensors) give the total; which tensors are experts, replicated or
    absorbed is the shape's estimate. With MTP the checkpoint's draft layers are loaded too.
    """
    weights, experts = model.weight_bytes, model.expert_weight_bytes
    replicated = model.replicated_weight_bytes
    if model.weight_source != "estimated-from-shape":
        # DeepSeek-style checkpoints ship their MTP layers; vLLM loads them only as the draft model.
        weights -= min(model.draft_weight_bytes, weights - experts)
    stored = DTYPE_BYTES.get(model.dtype)
    wanted = DTYPE_BYTES.get(dtype) or 2
    if model.quantization is None and stored and stored != wanted:
        weights, experts = weights * wanted // stored, experts * wanted // stored
        replicated = replicated * wanted // stored
        warnings.append(f"weights stored as {model.dtype} are loaded as {dtype}: {format_gib(weights)} in all")
    layers = model.num_layers
    if mtp:
        weights += model.draft_weight_bytes
        experts += model.draft_expert_weight_bytes
        replicated += model.draft_replicated_weight_bytes
        layers += model.draft_layers
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    split = math.ceil(Fraction(weights - experts - replicated, tp * pp))
    expert_share = 0
    if experts:
        if layout.expert_parallel and layout.experts_per_rank and model.num_experts:
            expert_share = math.ceil(Fraction(experts * layout.experts_per_rank, model.num_experts * pp))
        else:
            expert_share = math.ceil(Fraction(experts, layout.moe_ranks * pp))
    return WeightTerms(
        split=split,
        replicated=math.ceil(Fraction(replicated, pp)),
        kv_head_replicas=_kv_head_replicas(model, tp, pp, wanted),
        mla_absorbed=_mla_absorbed(model, tp, pp, layers, wanted),
        experts=expert_share,
        quant_params=_quant_params(model, layout),
    )


# Bytes per output channel (see the module's sources): W8A8 quant_bias 4 + deq_scale 4 + weight_scale 2 +
# weight_offset 2; dynamic schemes weight_scale 2 + weight_offset 2 + weight_scale_fp32 4.
_STATIC_CHANNEL_BYTES: Final = 12
_DYNAMIC_CHANNEL_BYTES: Final = 8


def _quant_params(model: ModelInfo, layout: Layout) -> int:
    """ModelSlim's per-channel parameters on the busiest device: the output channels of the
    quantized linear layers this rank holds (q/k/v sliced over TP, o_proj and down_proj whole,
    gate/up sliced) and of its experts' w13 and w2, times the bytes per channel of the scheme."""
    if model.quantization != "ascend" or not (model.quant_bits or model.expert_quant_bits):
        return 0
    dynamic = "DYNAMIC" in (model.quant_scheme or "").upper()
    per_channel = _DYNAMIC_CHANNEL_BYTES if dynamic else _STATIC_CHANNEL_BYTES
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    layers = math.ceil(model.num_layers / pp)
    hidden, heads = model.hidden_size, model.num_attention_heads // tp
    channels = 0
    if model.quant_bits:
        if model.is_mla and model.qk_nope_head_dim:
            attention = heads * (model.qk_nope_head_dim + (model.qk_rope_head_dim or 0)) + hidden
        else:
            attention = (heads + 2 * max(1, model.num_kv_heads // tp)) * model.head_dim + hidden
        dense_layers = model.dense_layers if model.is_moe else model.num_layers
        mlp = 2 * model.intermediate_size // tp + hidden
        channels += layers * attention + math.ceil(dense_layers / pp) * mlp
    if model.expert_quant_bits and model.is_moe and model.num_experts and model.moe_intermediate_size:
        moe_layers = math.ceil((model.num_layers - model.dense_layers) / pp)
        inter = model.moe_intermediate_size
        if layout.expert_parallel and layout.experts_per_rank:
            per_layer = layout.experts_per_rank * (2 * inter + hidden)
        else:
            per_layer = model.num_experts * (2 * inter // layout.moe_tensor_parallel + hidden)
        channels += moe_layers * per_layer
    return channels * per_channel


def _kv_head_replicas(model: ModelInfo, tp: int, pp: int, dtype_bytes: int) -> int:
    """K and V projection weights beyond the TP share when tp > num_kv_heads: each rank holds one
    whole KV head (hidden x head_dim, twice) instead of num_kv_heads / tp of one."""
    if model.is_mla or tp <= model.num_kv_heads:
        return 0
    per_param = Fraction(model.quant_bits, 8) if model.quant_bits else Fraction(dtype_bytes)
    extra_heads = 1 - Fraction(model.num_kv_heads, tp)
    per_layer = 2 * model.hidden_size * model.head_dim * extra_heads * per_param
    return math.ceil(per_layer * math.ceil(model.num_layers / pp))


def _mla_absorbed(model: ModelInfo, tp: int, pp: int, layers: int, dtype_bytes: int) -> int:
    """W_UK_T and W_UV: kv_lora_rank x (heads / tp) x (qk_nope + v) per layer, in the model dtype."""
    if not (model.is_mla and model.kv_lora_rank and model.qk_nope_head_dim and model.v_head_dim):
        return 0
    heads = model.num_attention_heads // tp
    per_layer = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim) * dtype_bytes
    main = math.ceil(model.num_layers / pp)
    return per_layer * (main + (layers - model.num_layers))

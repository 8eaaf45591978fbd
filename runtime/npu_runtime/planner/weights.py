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
- the MTP draft layers (vllm/config/speculative.py), at the precision the quantization gives them.
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

    @property
    def total(self) -> int:
        return self.split + self.replicated + self.kv_head_replicas + self.mla_absorbed + self.experts


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
    )


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

"""Weights on the busiest device: what the checkpoint holds, split as the layout splits it.

Sources: the checkpoint's safetensors headers (`model.py`), vLLM's tensor-parallel linear layers
(split over TP x PP, replicated on every DP rank) and FusedMoE (experts over the DP x TP ranks of a
stage, whole experts with EP), the MTP draft layers (vllm/config/speculative.py).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Final

from npu_runtime.contract import format_gib
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import DTYPE_BYTES, ModelInfo

__all__ = ["MTP_METHODS", "weights_per_device"]

# vLLM's speculative methods that run the checkpoint's own MTP layers as the draft model
# (vllm/config/speculative.py: "mtp" and the per-architecture *_mtp names).
MTP_METHODS: Final = frozenset({"mtp", "deepseek_mtp"})


def weights_per_device(model: ModelInfo, dtype: str, layout: Layout, mtp: bool, warnings: list[str]) -> int:
    """Weights on the busiest device.

    Dense parts (attention, dense MLPs, shared experts, embeddings) are split over TP x PP and
    replicated on every DP rank; routed experts over the DP x TP ranks of each PP stage, whole
    experts with EP (the busiest rank holds ceil(experts / EP)), tensor-sliced without (see
    `Layout`). With MTP the checkpoint's draft layers are loaded too, split the same way.
    """
    weights, experts = model.weight_bytes, model.expert_weight_bytes
    if model.weight_source != "estimated-from-shape":
        # DeepSeek-style checkpoints ship their MTP layers; vLLM loads them only as the draft model.
        weights -= min(model.draft_weight_bytes, weights - experts)
    stored = DTYPE_BYTES.get(model.dtype)
    wanted = DTYPE_BYTES.get(dtype)
    if model.quantization is None and stored and wanted and stored != wanted:
        weights, experts = weights * wanted // stored, experts * wanted // stored
        warnings.append(f"weights stored as {model.dtype} are loaded as {dtype}: {format_gib(weights)} in all")
    if mtp:
        weights += model.draft_weight_bytes
        experts += model.draft_expert_weight_bytes
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    share = Fraction(weights - experts, tp * pp)
    if experts:
        if layout.expert_parallel and layout.experts_per_rank and model.num_experts:
            share += Fraction(experts * layout.experts_per_rank, model.num_experts * pp)
        else:
            share += Fraction(experts, layout.moe_ranks * pp)
    return math.ceil(share)

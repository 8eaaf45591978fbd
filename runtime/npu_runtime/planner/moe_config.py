"""Mixture-of-experts models: the expert fields, the dense layers and one MoE layer's parameters.

Covers DeepSeek-V2/V3 (n_routed_experts, first_k_dense_replace, n_shared_experts), Qwen2/3-MoE
(num_experts, decoder_sparse_step, mlp_only_layers, shared_expert_intermediate_size) and Mixtral
(num_local_experts, whose intermediate_size is the expert's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu_runtime.planner.config_fields import ConfigFields, ModelError

__all__ = ["dense_layer_count", "moe_fields", "moe_layer_params"]


def moe_fields(text: ConfigFields, source: Path) -> dict[str, Any]:
    """ModelInfo's MoE fields and the MLP widths (a Mixtral's intermediate_size is its expert's)."""
    num_experts = (
        text.opt_int("n_routed_experts") or text.opt_int("num_experts") or text.opt_int("num_local_experts") or None
    )
    is_moe = bool(num_experts and num_experts > 1)
    experts_per_tok = text.opt_int("num_experts_per_tok") if is_moe else None
    intermediate = text.opt_int("intermediate_size")
    moe_intermediate = text.opt_int("moe_intermediate_size") if is_moe else None
    if is_moe and moe_intermediate is None:
        moe_intermediate = intermediate  # Mixtral: intermediate_size is the expert's size
    if intermediate is None:
        if moe_intermediate is None:
            raise ModelError(f"{source}: missing field {text.prefix + 'intermediate_size'!r}")
        intermediate = moe_intermediate
    return {
        "is_moe": is_moe,
        "intermediate_size": intermediate,
        "num_experts": num_experts if is_moe else None,
        "num_experts_per_tok": experts_per_tok,
        "moe_intermediate_size": moe_intermediate,
    }


def moe_layer_params(text: ConfigFields, f: dict[str, Any]) -> tuple[int, int, int]:
    """(routed experts, shared experts, router) parameters of one MoE layer."""
    hidden, count, moe_inter = f["hidden_size"], f["num_experts"], f["moe_intermediate_size"]
    shared = (text.opt_int("n_shared_experts") or 0) * 3 * hidden * moe_inter
    shared_inter = text.opt_int("shared_expert_intermediate_size")
    if shared_inter:
        shared += 3 * hidden * shared_inter + hidden  # Qwen2-MoE shared expert and its gate
    return count * 3 * hidden * moe_inter, shared, hidden * count


def dense_layer_count(text: ConfigFields, layers: int) -> int:
    first_dense = text.opt_int("first_k_dense_replace")
    if first_dense is not None:
        return min(first_dense, layers)  # DeepSeek-V2/V3
    only_mlp = text.raw("mlp_only_layers")
    step = text.opt_int("decoder_sparse_step") or 1
    dense = {i for i in range(layers) if (i + 1) % step != 0}
    if isinstance(only_mlp, list):
        dense |= {i for i in only_mlp if isinstance(i, int)}
    return len(dense)  # Qwen2/3-MoE

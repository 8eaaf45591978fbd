"""Peak activation of vLLM's profile run, and the sampler's dummy run.

Sources: vLLM's gpu_model_runner profile_run (one forward pass over max_num_batched_tokens dummy
tokens, then the sampler over max_num_seqs rows), FusedMoE's dispatch buffers.
"""

from __future__ import annotations

from typing import Final

from npu_runtime.contract import MIB, PlanOptions
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import ModelInfo

__all__ = ["ACTIVATION_WORKSPACE", "activation_bytes", "sampler_bytes"]

ACTIVATION_WORKSPACE: Final = 256 * MIB  # kernels' workspaces, allocator slack during profile_run


def activation_bytes(model: ModelInfo, tokens: int, tp: int, dtype_bytes: int, layout: Layout) -> int:
    """Peak activation of one forward pass over `tokens` tokens (vLLM's profile_run), estimated.

    MoE layers: each routed token is copied once per chosen expert (the dispatch buffer, in and
    out) and runs the expert's gate/up/down; an expert's intermediate width is sliced over the MoE
    tensor-parallel ranks without EP and whole with EP, where a rank receives about tokens x top_k
    rows from the all-to-all / MC2 dispatch (balanced routing, as profile_run's dummy tokens are).
    """
    hidden = model.hidden_size
    qkv = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim // tp
    if model.is_moe and model.num_experts_per_tok and model.moe_intermediate_size:
        per_token = model.num_experts_per_tok * (
            2 * hidden + 3 * model.moe_intermediate_size // layout.moe_tensor_parallel
        )
    else:
        per_token = 3 * model.intermediate_size // tp
    return tokens * dtype_bytes * (4 * hidden + qkv + per_token) + ACTIVATION_WORKSPACE


def sampler_bytes(options: PlanOptions, model: ModelInfo) -> int:
    """The sampler's dummy run over max_num_seqs rows of the vocabulary.

    fp32 logits and probabilities plus an int64 sort order: 16 bytes per entry.
    """
    return options.max_num_seqs * (1 + options.speculative_tokens) * model.vocab_size * 16

"""Parameters estimated from a model's shape, by how they are stored and placed.

Embeddings, attention (MLA's latent projections apart: kv_b_proj and the replicated q_a / kv_a
projections), dense MLPs or experts, norms, an encoder, a vision tower, and DeepSeek's MTP draft
layers; `Params` turns them into bytes at given precisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from npu_runtime.planner.config_fields import ConfigFields
from npu_runtime.planner.moe_config import dense_layer_count, moe_layer_params

__all__ = ["Params", "draft_params", "estimate_params"]

# Activations whose MLP is gated (three projections: gate, up, down) rather than two.
_GATED_ACTS: Final = frozenset({"silu", "swiglu", "gelu_pytorch_tanh", "geglu", "swish"})
# Model types with q/k/v biases that the config does not announce with attention_bias.
_QKV_BIAS_TYPES: Final = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})


@dataclass(frozen=True)
class Params:
    """Parameters by how they are stored: linear layers (quantizable), routed experts, the rest."""

    linear: int
    experts: int
    other: int
    """Embeddings, lm_head, norms, router gates, a vision tower: kept in the dtype when quantized."""
    kv_b: int = 0
    """MLA's kv_b_proj (part of neither `linear` nor `other`: its precision is the method's)."""
    replicated_linear: int = 0
    """The part of `linear` every TP rank holds whole (MLA's q_a_proj + kv_a_proj_with_mqa, eh_proj)."""
    replicated_other: int = 0
    """The part of `other` every TP rank holds whole besides norms (the router gates)."""

    @property
    def total(self) -> int:
        return self.linear + self.experts + self.other + self.kv_b

    def expert_bytes(self, bits: int | None, dtype_bytes: int) -> int:
        return _bytes(self.experts, bits, dtype_bytes)

    def weight_bytes(
        self, dtype_bytes: int, linear_bits: int | None, expert_bits: int | None, kv_b_bits: int | None
    ) -> int:
        linear = _bytes(self.linear, linear_bits, dtype_bytes)
        kv_b = _bytes(self.kv_b, kv_b_bits, dtype_bytes)
        return linear + kv_b + self.expert_bytes(expert_bits, dtype_bytes) + self.other * dtype_bytes

    def replicated_bytes(self, dtype_bytes: int, linear_bits: int | None) -> int:
        return _bytes(self.replicated_linear, linear_bits, dtype_bytes) + self.replicated_other * dtype_bytes


def _bytes(params: int, bits: int | None, dtype_bytes: int) -> int:
    return params * bits // 8 if bits else params * dtype_bytes


def estimate_params(text: ConfigFields, top: ConfigFields, f: dict[str, Any]) -> Params:
    """Parameters from the shape (`f`: ModelInfo's fields so far): embeddings, attention, MLP or
    experts, norms, vision tower. `text` is the language model's config, `top` the whole file."""
    hidden, layers = f["hidden_size"], f["num_layers"]
    attn = _attention_params(text, f)
    dense_mlp = _mlp_matrices(text) * hidden * f["intermediate_size"]
    norms = 2 * hidden
    linear, experts, other = layers * attn.linear, 0, layers * norms
    replicated_other = 0

    if f["is_moe"]:
        routed, shared, router = moe_layer_params(text, f)
        dense_layers = dense_layer_count(text, layers)
        linear += dense_layers * dense_mlp + (layers - dense_layers) * shared
        experts = (layers - dense_layers) * routed
        other += (layers - dense_layers) * router
        replicated_other = (layers - dense_layers) * router
    else:
        linear += layers * dense_mlp
    if f["is_encoder_decoder"]:
        encoder_layers = top.opt_int("encoder_layers") or layers
        linear += encoder_layers * (attn.linear + dense_mlp)
        other += encoder_layers * norms
    embeddings = f["vocab_size"] * hidden * (1 if f["tie_word_embeddings"] else 2)
    return Params(
        linear,
        experts,
        other + embeddings + hidden + _vision_params(top.data, hidden),
        kv_b=layers * attn.kv_b,
        replicated_linear=layers * attn.replicated,
        replicated_other=replicated_other,
    )


def _mlp_matrices(text: ConfigFields) -> int:
    act = str(text.raw("hidden_act") or text.raw("activation_function") or "silu")
    return 3 if act in _GATED_ACTS else 2


@dataclass(frozen=True)
class _Attention:
    """One attention layer's parameters: linear (incl. `replicated`) and MLA's kv_b_proj apart."""

    linear: int
    kv_b: int = 0
    replicated: int = 0


def _attention_params(text: ConfigFields, f: dict[str, Any]) -> _Attention:
    hidden, heads, kv, hd = f["hidden_size"], f["num_attention_heads"], f["num_kv_heads"], f["head_dim"]
    if f["is_mla"]:
        nope = text.opt_int("qk_nope_head_dim") or hd
        rope = f["qk_rope_head_dim"] or 0
        v_dim = text.opt_int("v_head_dim") or nope
        q_lora = text.opt_int("q_lora_rank")
        kv_a = hidden * (f["kv_lora_rank"] + rope)
        # q_a_proj and kv_a_proj_with_mqa: one fused_qkv_a_proj with disable_tp=True (or two
        # ReplicatedLinear), vllm/model_executor/models/deepseek_v2.py DeepseekV2MLAAttention.
        replicated = kv_a + (hidden * q_lora if q_lora else 0)
        q = hidden * heads * (nope + rope) if not q_lora else hidden * q_lora + q_lora + q_lora * heads * (nope + rope)
        linear = q + kv_a + f["kv_lora_rank"] + heads * v_dim * hidden
        return _Attention(int(linear), kv_b=int(f["kv_lora_rank"] * heads * (nope + v_dim)), replicated=int(replicated))
    attn = hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden
    if text.flag("attention_bias", f["model_type"] in _QKV_BIAS_TYPES):
        attn += heads * hd + 2 * kv * hd
    if f["model_type"].startswith("qwen3"):
        attn += 2 * hd  # q_norm, k_norm
    return _Attention(int(attn))


def draft_params(text: ConfigFields, f: dict[str, Any], main: Params) -> Params:
    """DeepSeek's MTP layers (num_nextn_predict_layers): each one decoder layer (MoE when the model
    is) plus eh_proj (2h -> h) and three norms; embeddings and lm_head are shared with the main
    model (vllm/model_executor/models/deepseek_mtp.py; vLLM's proposer shares them when shapes match)."""
    count = f["draft_layers"]
    if not count:
        return Params(0, 0, 0)
    hidden = f["hidden_size"]
    attn = _attention_params(text, f)
    router = 0
    if f["is_moe"]:
        routed, shared, router = moe_layer_params(text, f)
        linear, experts, other = attn.linear + shared, routed, router
    else:
        linear, experts, other = attn.linear + _mlp_matrices(text) * hidden * f["intermediate_size"], 0, 0
    # eh_proj is a plain nn.Linear in vllm/model_executor/models/deepseek_mtp.py: never quantized,
    # never split over TP.
    eh_proj = 2 * hidden * hidden
    other += eh_proj + 5 * hidden  # input/post-attention norms, enorm, hnorm, shared_head.norm
    return Params(
        count * linear,
        count * experts,
        count * other,
        kv_b=count * attn.kv_b,
        replicated_linear=count * attn.replicated,
        replicated_other=count * (router + eh_proj),
    )


def _vision_params(config: dict[str, Any], text_hidden: int) -> int:
    """A ViT tower and its projector, roughly: depth x (4 h^2 + 2 h i) + projector."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    h = vision.get("hidden_size") or vision.get("embed_dim") or 0
    if not isinstance(h, int):
        return 0
    depth = vision.get("num_hidden_layers") or vision.get("depth") or 0
    inter = vision.get("intermediate_size") or 4 * h
    out = vision.get("out_hidden_size") or text_hidden
    if not all(isinstance(x, int) for x in (depth, inter, out)):
        return 0
    return int(depth * (4 * h * h + 2 * h * inter) + h * out + out * text_hidden)

"""Model inspection: what the planner needs to know about a model, read from its files only.

`inspect_model(path)` reads `config.json` (a model directory or the file itself), follows a
multimodal model's nested text config, and finds the weight size without loading a tensor:
`model.safetensors.index.json` (`metadata.total_size`), else the headers of the `*.safetensors`
files (8-byte little-endian header length, then a JSON header with each tensor's byte range),
else an estimate from the shape. `ModelInfo.weight_source` says which one was used.

Each part of the reading is its own module: `config_fields` (typed fields, `ModelError`),
`text_config` (multimodal nesting), `context_length`, `moe_config`, `quant_config`,
`param_estimate` (the shape estimate, MLA and MTP included) and `weight_files` (safetensors).
This module assembles their answers into a `ModelInfo`.

Pure standard library: no torch, no transformers. Errors are `config_fields.ModelError` with the
file and the field in the message.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from npu_runtime.planner.config_fields import ConfigFields, ModelError, read_json
from npu_runtime.planner.context_length import derived_max_len, sliding_window_layers
from npu_runtime.planner.moe_config import dense_layer_count, moe_fields
from npu_runtime.planner.param_estimate import draft_params, estimate_params
from npu_runtime.planner.quant_config import ASCEND_QUANTIZATION, Quant, read_quantization
from npu_runtime.planner.text_config import NESTED_TEXT_KEYS, text_config
from npu_runtime.planner.weight_files import measured_weight_bytes

__all__ = ["CONFIG_NAME", "DTYPE_BYTES", "ModelInfo", "canonical_dtype", "inspect_model"]

CONFIG_NAME: Final = "config.json"

# Bytes per element of the dtypes by their canonical names (`canonical_dtype`).
DTYPE_BYTES: Final = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
# Other names of the same dtypes: vLLM's --dtype accepts half and float; bf16 and fp16 are common.
_DTYPE_ALIASES: Final = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
# Suffixes of architectures that vLLM runs as pooling (embedding/classification) models.
_POOLING_SUFFIXES: Final = ("ForSequenceClassification", "ForRewardModel", "EmbeddingModel", "ForEmbedding")


@dataclass(frozen=True)
class ModelInfo:
    """What the planner knows about a model. JSON-serialisable with `dataclasses.asdict`."""

    path: str
    architecture: str
    model_type: str
    is_encoder_decoder: bool
    is_multimodal: bool
    is_mla: bool
    is_moe: bool
    is_pooling: bool
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    """The context length vLLM derives from the config (RoPE scaling applied as vLLM does)."""
    dtype: str
    """The checkpoint's dtype as the config states it (`torch_dtype` or `dtype`), by its canonical name."""
    weight_bytes: int
    weight_source: str
    """"safetensors-index", "safetensors-headers" or "estimated-from-shape"."""
    param_count: int
    """Parameters estimated from the shape (independent of the weight files)."""
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    sliding_window: int | None = None
    """Set only when every attention layer uses the window (otherwise the full length counts)."""
    sliding_layers: int = 0
    """How many layers use `sliding_window` (the others keep the full context)."""
    tie_word_embeddings: bool = False
    quantization: str | None = None
    """The method vLLM's --quantization takes: "ascend" for a ModelSlim checkpoint (a
    quant_model_description.json), else the config's quant_method (fp8, gptq, awq, ...)."""
    quant_bits: int | None = None
    """Bits per weight of the quantized linear layers (None: the dtype's)."""
    quant_scheme: str | None = None
    """ModelSlim's model_quant_type (W8A8, W8A8_DYNAMIC, W4A8_DYNAMIC, ...), when there is one."""
    expert_quant_bits: int | None = None
    """Bits per weight of the routed experts (None: the dtype's)."""
    draft_layers: int = 0
    """Built-in MTP draft layers (DeepSeek `num_nextn_predict_layers`)."""
    expert_weight_bytes: int = 0
    """The routed experts' share of weight_bytes (MoE models; split over the MoE ranks, not TP x PP)."""
    draft_weight_bytes: int = 0
    """The built-in MTP layers' weights, loaded only when MTP speculative decoding is on (estimated)."""
    draft_expert_weight_bytes: int = 0
    """The routed experts' share of draft_weight_bytes."""
    replicated_weight_bytes: int = 0
    """Tensors vLLM keeps whole on every tensor-parallel rank (estimated from the shape): MLA's
    fused_qkv_a_proj (q_a_proj + kv_a_proj_with_mqa, built with disable_tp=True in
    vllm/model_executor/models/deepseek_v2.py) and the MoE router gate (GateLinear, replicated)."""
    draft_replicated_weight_bytes: int = 0
    """The same for the MTP draft layers, plus their eh_proj (an nn.Linear in deepseek_mtp.py)."""
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    """MLA's per-head query/key (without RoPE) and value widths."""
    quantized_kv_b_proj: str | None = None
    """A kv_b_proj tensor a ModelSlim description quantizes (vllm-ascend's MLA refuses it)."""
    dense_layers: int = 0
    """MoE models: layers with a dense MLP instead of experts (DeepSeek's first_k_dense_replace)."""
    notes: tuple[str, ...] = ()

    def kv_bytes_per_token(self, *, tensor_parallel: int, pipeline_parallel: int, dtype_bytes: int) -> int:
        """KV cache bytes one token takes on one device, over the layers that device holds.

        GQA heads are split over tensor-parallel ranks and replicated when there are fewer KV heads
        than ranks (vLLM: max(1, num_kv_heads // tp)); an MLA latent cache (kv_lora_rank +
        qk_rope_head_dim per layer) is not split.
        """
        return math.ceil(self.num_layers / pipeline_parallel) * self.kv_bytes_per_layer(
            tensor_parallel=tensor_parallel, dtype_bytes=dtype_bytes
        )

    def kv_bytes_per_layer(self, *, tensor_parallel: int, dtype_bytes: int) -> int:
        """KV cache bytes one token takes in one attention layer on one device (see kv_bytes_per_token)."""
        if self.is_mla and self.kv_lora_rank:
            per_layer = (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) * dtype_bytes
        else:
            heads = max(1, self.num_kv_heads // tensor_parallel)
            per_layer = 2 * heads * self.head_dim * dtype_bytes
        return per_layer

    def summary(self) -> dict[str, Any]:
        """The fields a plan reports about its model."""
        return {
            "path": self.path,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "is_encoder_decoder": self.is_encoder_decoder,
            "is_multimodal": self.is_multimodal,
            "is_mla": self.is_mla,
            "is_moe": self.is_moe,
            "is_pooling": self.is_pooling,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "quant_scheme": self.quant_scheme,
            "weight_bytes": self.weight_bytes,
            "weight_source": self.weight_source,
            "param_count": self.param_count,
            "notes": list(self.notes),
        }


def canonical_dtype(name: str) -> str:
    """`half` and `fp16` -> `float16`, `bf16` -> `bfloat16`, `float` -> `float32`; others unchanged."""
    return _DTYPE_ALIASES.get(name, name)


def inspect_model(path: str | os.PathLike[str]) -> ModelInfo:
    """Read a model directory (or its config.json) into a ModelInfo, without loading tensors."""
    given = Path(path)
    if given.is_dir():
        directory, config_path = given, given / CONFIG_NAME
    else:
        directory, config_path = given.parent, given
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise ModelError(f"{config_path}: expected a JSON object at the top level")
    return _model_info(config, config_path, directory)


def _model_info(config: dict[str, Any], source: Path, directory: Path) -> ModelInfo:
    top = ConfigFields(config, source)
    text, notes = text_config(config, source)
    architectures, model_type = _architectures(config, top, text, source)
    dims = _dimensions(text, top)
    experts = moe_fields(text, source)
    dtype = _config_dtype(text, top, notes)
    quant = read_quantization(config, directory, dims["num_layers"])
    sliding_window, sliding_layers = sliding_window_layers(text, dims["num_layers"])
    is_mla, head_dim = dims["is_mla"], dims["head_dim"]
    info_args: dict[str, Any] = {
        "path": str(directory),
        "architecture": architectures[0] if architectures else model_type,
        "model_type": model_type,
        "is_encoder_decoder": top.flag("is_encoder_decoder", False),
        "is_multimodal": any(k in config for k in ("vision_config", "audio_config", *NESTED_TEXT_KEYS)),
        "is_pooling": any(a.endswith(_POOLING_SUFFIXES) for a in architectures),
        **dims,
        **experts,
        "max_position_embeddings": derived_max_len(text, top, directory, model_type, notes),
        "dtype": dtype,
        "sliding_window": sliding_window,
        "sliding_layers": sliding_layers,
        "tie_word_embeddings": top.flag("tie_word_embeddings", text.flag("tie_word_embeddings", False)),
        "quantization": quant.method,
        "quant_bits": quant.linear_bits,
        "quant_scheme": quant.scheme,
        "expert_quant_bits": quant.expert_bits,
        "draft_layers": text.opt_int("num_nextn_predict_layers") or 0,
        "dense_layers": dense_layer_count(text, dims["num_layers"]) if experts["is_moe"] else 0,
        "qk_nope_head_dim": (text.opt_int("qk_nope_head_dim") or head_dim) if is_mla else None,
        "v_head_dim": (text.opt_int("v_head_dim") or text.opt_int("qk_nope_head_dim") or head_dim) if is_mla else None,
    }
    return ModelInfo(**info_args, **_weight_fields(text, top, directory, info_args, quant, notes), notes=tuple(notes))


def _architectures(
    config: dict[str, Any], top: ConfigFields, text: ConfigFields, source: Path
) -> tuple[list[str], str]:
    """(the architectures the config lists, its model_type); one of them at least."""
    architectures = config.get("architectures") or text.raw("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelError(f"{source}: field 'architectures': expected a list of strings")
    model_type = top.opt_str("model_type") or text.opt_str("model_type") or ""
    if not architectures and not model_type:
        raise ModelError(f"{source}: missing field 'architectures' (and no 'model_type')")
    return architectures, model_type


def _dimensions(text: ConfigFields, top: ConfigFields) -> dict[str, Any]:
    """ModelInfo's layer, width, head and vocabulary fields, and MLA's latent cache (kv_lora_rank)."""
    num_layers = text.positive("num_hidden_layers")
    hidden = text.positive("hidden_size")
    heads = text.positive("num_attention_heads")
    dims: dict[str, Any] = {
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": text.opt_int("num_key_value_heads") or heads,
        "head_dim": text.opt_int("head_dim") or hidden // heads,
        "vocab_size": text.positive("vocab_size") if text.raw("vocab_size") is not None else top.positive("vocab_size"),
    }
    kv_lora_rank = text.opt_int("kv_lora_rank")
    is_mla = bool(kv_lora_rank)
    return {
        **dims,
        "is_mla": is_mla,
        "kv_lora_rank": kv_lora_rank if is_mla else None,
        "qk_rope_head_dim": text.opt_int("qk_rope_head_dim") if is_mla else None,
    }


def _config_dtype(text: ConfigFields, top: ConfigFields, notes: list[str]) -> str:
    """The checkpoint's dtype by its canonical name (bfloat16 when the config states none)."""
    dtype = text.opt_str("torch_dtype") or text.opt_str("dtype") or top.opt_str("torch_dtype") or top.opt_str("dtype")
    if dtype is None:
        notes.append("no torch_dtype in the config: bfloat16 assumed")
        dtype = "bfloat16"
    return canonical_dtype(dtype.removeprefix("torch."))


def _weight_fields(
    text: ConfigFields, top: ConfigFields, directory: Path, info_args: dict[str, Any], quant: Quant, notes: list[str]
) -> dict[str, Any]:
    """ModelInfo's byte counts: the weights measured (safetensors) or estimated from the shape, and
    the parts the layout places apart (experts, MTP draft layers, tensors replicated on every rank)."""
    params = estimate_params(text, top, info_args)
    dtype_bytes = DTYPE_BYTES.get(info_args["dtype"], 2)
    # vllm-ascend's MLA keeps kv_b_proj unquantized (attention/mla_v1.py asserts an
    # UnquantizedLinearMethod); ModelSlim descriptions mark it FLOAT. Other methods quantize it.
    kv_b_bits = None if quant.method == ASCEND_QUANTIZATION else quant.linear_bits
    estimated = params.weight_bytes(dtype_bytes, quant.linear_bits, quant.expert_bits, kv_b_bits)
    weight_bytes, weight_source = measured_weight_bytes(directory, notes)
    if weight_bytes is None:
        weight_bytes, weight_source = estimated, "estimated-from-shape"
    expert_bytes = params.expert_bytes(quant.expert_bits, dtype_bytes)
    if weight_source != "estimated-from-shape" and estimated:
        # Measured totals do not say which tensors are experts: keep the shape's proportion.
        expert_bytes = weight_bytes * expert_bytes // estimated
    draft = draft_params(text, info_args, params)
    # ModelSlim: the MTP layers have the precision the description gives their tensors
    # (vllm_ascend/quantization/modelslim_config.py looks every prefix up; its note on deepseek_mtp:
    # descriptions lack the MTP layer unless added by hand, as FLOAT). Other methods: the model's.
    if quant.method == ASCEND_QUANTIZATION:
        draft_bits = (quant.draft_linear_bits, quant.draft_expert_bits)
    else:
        draft_bits = (quant.linear_bits, quant.expert_bits)
    draft_kv_b_bits = None if quant.method == ASCEND_QUANTIZATION else draft_bits[0]
    return {
        "weight_bytes": weight_bytes,
        "weight_source": weight_source,
        "param_count": params.total,
        "expert_weight_bytes": expert_bytes,
        "draft_weight_bytes": draft.weight_bytes(dtype_bytes, *draft_bits, draft_kv_b_bits),
        "draft_expert_weight_bytes": draft.expert_bytes(draft_bits[1], dtype_bytes),
        "replicated_weight_bytes": params.replicated_bytes(dtype_bytes, quant.linear_bits),
        "draft_replicated_weight_bytes": draft.replicated_bytes(dtype_bytes, draft_bits[0]),
        "quantized_kv_b_proj": quant.quantized_kv_b_proj,
    }

"""Model inspection: what the planner needs to know about a model, read from its files only.

`inspect_model(path)` reads `config.json` (a model directory or the file itself), follows a
multimodal model's nested text config, and finds the weight size without loading a tensor:
`model.safetensors.index.json` (`metadata.total_size`), else the headers of the `*.safetensors`
files (8-byte little-endian header length, then a JSON header with each tensor's byte range),
else an estimate from the shape. `ModelInfo.weight_source` says which one was used.

Pure standard library: no torch, no transformers. Errors are `ModelError` with the file and the
field in the message.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from npu_runtime import files

CONFIG_NAME: Final = "config.json"
INDEX_NAME: Final = "model.safetensors.index.json"
# A safetensors header larger than this is not a header (the format caps it at 100 MB).
_MAX_HEADER_BYTES: Final = 100 * 1000 * 1000

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
# safetensors dtype codes -> bytes per element (https://github.com/huggingface/safetensors, format spec).
_SAFETENSORS_DTYPE_BYTES: Final = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}

# The keys vLLM reads, in order, to derive the maximum context length
# (vllm/transformers_utils/model_arch_config_convertor.py, derive_max_model_len_and_key: the minimum
# of those present).
_MAX_LEN_KEYS: Final = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings is already scaled, so vLLM does not multiply by `factor`
# (vllm/config/model.py, _get_and_verify_max_len).
_PRESCALED_ROPE: Final = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})

# Defaults of transformers' config classes for the fields the planner needs, used only when a
# nested text config leaves them out (llava-1.5's config.json relies on LlamaConfig's defaults).
_TEXT_DEFAULTS: Final[dict[str, dict[str, Any]]] = {
    "llama": {  # transformers LlamaConfig.__init__ defaults
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "vocab_size": 32000,
        "hidden_act": "silu",
    },
    "mistral": {  # transformers MistralConfig.__init__ defaults
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "vocab_size": 32000,
        "hidden_act": "silu",
    },
}

# Alternative names of the same field across architectures (GPT-2, T5, BART/Whisper, ChatGLM ...).
_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "num_hidden_layers": ("num_hidden_layers", "num_layers", "n_layer", "decoder_layers"),
    "hidden_size": ("hidden_size", "d_model", "n_embd", "model_dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "decoder_attention_heads"),
    "num_key_value_heads": ("num_key_value_heads", "multi_query_group_num", "num_kv_heads", "n_head_kv"),
    "intermediate_size": (
        "intermediate_size",
        "ffn_dim",
        "d_ff",
        "decoder_ffn_dim",
        "n_inner",
        "ffn_hidden_size",
    ),
}
# Where a multimodal model nests its language model's config, in the order they are looked for.
_NESTED_TEXT_KEYS: Final = ("text_config", "llm_config", "language_config")
# Activations whose MLP is gated (three projections: gate, up, down) rather than two.
_GATED_ACTS: Final = frozenset({"silu", "swiglu", "gelu_pytorch_tanh", "geglu", "swish"})
# Model types with q/k/v biases that the config does not announce with attention_bias.
_QKV_BIAS_TYPES: Final = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})
# Suffixes of architectures that vLLM runs as pooling (embedding/classification) models.
_POOLING_SUFFIXES: Final = ("ForSequenceClassification", "ForRewardModel", "EmbeddingModel", "ForEmbedding")


class ModelError(ValueError):
    """The model's files are missing, unreadable or lack a field the planner needs."""


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
    quant_bits: int | None = None
    draft_layers: int = 0
    """Built-in MTP draft layers (DeepSeek `num_nextn_predict_layers`)."""
    notes: tuple[str, ...] = ()

    def kv_bytes_per_token(self, *, tensor_parallel: int, pipeline_parallel: int, dtype_bytes: int) -> int:
        """KV cache bytes one token takes on one device, over the layers that device holds.

        GQA heads are split over tensor-parallel ranks and replicated when there are fewer KV heads
        than ranks (vLLM: max(1, num_kv_heads // tp)); an MLA latent cache (kv_lora_rank +
        qk_rope_head_dim per layer) is not split.
        """
        layers = math.ceil(self.num_layers / pipeline_parallel)
        if self.is_mla and self.kv_lora_rank:
            per_layer = (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) * dtype_bytes
        else:
            heads = max(1, self.num_kv_heads // tensor_parallel)
            per_layer = 2 * heads * self.head_dim * dtype_bytes
        return layers * per_layer

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
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise ModelError(f"{config_path}: expected a JSON object at the top level")
    return _model_info(config, config_path, directory)


# -- config.json ------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        text = files.read_text(path)
    except files.FileProblem as exc:
        raise ModelError(str(exc)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None


class _Fields:
    """Typed access to one config dict, with errors that name the file and the field."""

    def __init__(self, data: dict[str, Any], source: Path, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def _where(self, key: str) -> str:
        return f"{self.source}: field {self.prefix + key!r}"

    def raw(self, key: str) -> Any:
        for name in _ALIASES.get(key, (key,)):
            if self.data.get(name) is not None:
                return self.data[name]
        return None

    def opt_int(self, key: str) -> int | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise ModelError(f"{self._where(key)}: expected an integer, got {value!r}")
        if value < 0:
            raise ModelError(f"{self._where(key)}: expected zero or more, got {value!r}")
        return int(value)

    def req_int(self, key: str) -> int:
        value = self.opt_int(key)
        if value is None:
            names = " or ".join(repr(self.prefix + n) for n in _ALIASES.get(key, (key,)))
            raise ModelError(f"{self.source}: missing field {names}")
        return value

    def positive(self, key: str) -> int:
        value = self.req_int(key)
        if value < 1:
            raise ModelError(f"{self._where(key)}: expected a positive integer, got {value}")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ModelError(f"{self._where(key)}: expected a string, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelError(f"{self._where(key)}: expected true or false, got {value!r}")
        return value


def _text_config(config: dict[str, Any], source: Path) -> tuple[_Fields, list[str]]:
    """The dict that describes the language model, with defaults filled in for a nested one."""
    notes: list[str] = []
    for key in _NESTED_TEXT_KEYS:
        nested = config.get(key)
        if nested is None:
            continue
        if not isinstance(nested, dict):
            raise ModelError(f"{source}: field {key!r}: expected a JSON object")
        merged = dict(nested)
        defaults = _TEXT_DEFAULTS.get(str(nested.get("model_type", "")), {})
        filled = sorted(k for k in defaults if k not in nested)
        for k in filled:
            merged[k] = defaults[k]
        if filled:
            notes.append(f"{key} leaves {', '.join(filled)} unset: transformers' {nested['model_type']} defaults used")
        notes.append(f"language model read from {key}")
        return _Fields(merged, source, prefix=f"{key}."), notes
    return _Fields(config, source), notes


def _model_info(config: dict[str, Any], source: Path, directory: Path) -> ModelInfo:
    top = _Fields(config, source)
    text, notes = _text_config(config, source)

    architectures = config.get("architectures") or text.raw("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelError(f"{source}: field 'architectures': expected a list of strings")
    model_type = top.opt_str("model_type") or text.opt_str("model_type") or ""
    if not architectures and not model_type:
        raise ModelError(f"{source}: missing field 'architectures' (and no 'model_type')")
    architecture = architectures[0] if architectures else model_type

    num_layers = text.positive("num_hidden_layers")
    hidden = text.positive("hidden_size")
    heads = text.positive("num_attention_heads")
    kv_heads = text.opt_int("num_key_value_heads") or heads
    head_dim = text.opt_int("head_dim") or hidden // heads
    vocab = text.positive("vocab_size") if text.raw("vocab_size") is not None else top.positive("vocab_size")

    kv_lora_rank = text.opt_int("kv_lora_rank")
    is_mla = bool(kv_lora_rank)
    qk_rope = text.opt_int("qk_rope_head_dim") if is_mla else None

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

    dtype = text.opt_str("torch_dtype") or text.opt_str("dtype") or top.opt_str("torch_dtype") or top.opt_str("dtype")
    if dtype is None:
        notes.append("no torch_dtype in the config: bfloat16 assumed")
        dtype = "bfloat16"
    dtype = canonical_dtype(dtype.removeprefix("torch."))

    quantization, quant_bits = _quantization(config, directory)
    sliding_window, sliding_layers = _sliding_window(text, num_layers)
    encoder_decoder = top.flag("is_encoder_decoder", False)
    multimodal = any(k in config for k in ("vision_config", "audio_config", *_NESTED_TEXT_KEYS))
    pooling = any(a.endswith(_POOLING_SUFFIXES) for a in architectures)

    info_args: dict[str, Any] = {
        "path": str(directory),
        "architecture": architecture,
        "model_type": model_type,
        "is_encoder_decoder": encoder_decoder,
        "is_multimodal": multimodal,
        "is_mla": is_mla,
        "is_moe": is_moe,
        "is_pooling": pooling,
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": _derived_max_len(text, top, directory, model_type, notes),
        "dtype": dtype,
        "kv_lora_rank": kv_lora_rank if is_mla else None,
        "qk_rope_head_dim": qk_rope,
        "num_experts": num_experts if is_moe else None,
        "num_experts_per_tok": experts_per_tok,
        "moe_intermediate_size": moe_intermediate,
        "sliding_window": sliding_window,
        "sliding_layers": sliding_layers,
        "tie_word_embeddings": top.flag("tie_word_embeddings", text.flag("tie_word_embeddings", False)),
        "quantization": quantization,
        "quant_bits": quant_bits,
        "draft_layers": text.opt_int("num_nextn_predict_layers") or 0,
    }
    params = _estimate_params(text, top, info_args)
    weight_bytes, weight_source = _weight_bytes(directory, notes)
    if weight_bytes is None:
        weight_bytes = _estimated_weight_bytes(params, dtype, quant_bits)
        weight_source = "estimated-from-shape"
    return ModelInfo(
        **info_args,
        weight_bytes=weight_bytes,
        weight_source=weight_source,
        param_count=params,
        notes=tuple(notes),
    )


def _derived_max_len(text: _Fields, top: _Fields, directory: Path, model_type: str, notes: list[str]) -> int:
    """The context length vLLM derives when --max-model-len is not given (vllm/config/model.py)."""
    found = [v for v in (text.opt_int(k) or top.opt_int(k) for k in _MAX_LEN_KEYS) if v]
    if not found:
        notes.append("no context-length field in the config: vLLM assumes 2048")
        return 2048
    length = float(min(found))
    rope_key = "rope_scaling" if text.raw("rope_scaling") else "rope_parameters"
    rope = text.raw(rope_key)
    if isinstance(rope, dict) and "gemma3" not in model_type:
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type is not None and not isinstance(rope_type, str):
            raise ModelError(f"{text._where(rope_key)}: expected a string rope type, got {rope_type!r}")
        factor = rope.get("factor")
        if rope_type not in _PRESCALED_ROPE and isinstance(factor, int | float) and factor > 0:
            length *= factor
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():
        data = _read_json(tokenizer_config)
        limit = data.get("model_max_length") if isinstance(data, dict) else None
        if isinstance(limit, int | float) and 0 < limit < length:
            length = float(limit)
            notes.append(f"context length capped by tokenizer_config.json model_max_length={int(limit)}")
    return int(length)


def _sliding_window(text: _Fields, num_layers: int) -> tuple[int | None, int]:
    window = text.opt_int("sliding_window")
    if not window or not text.flag("use_sliding_window", True):
        return None, 0
    layer_types = text.raw("layer_types")
    if isinstance(layer_types, list) and layer_types:
        sliding = sum(1 for t in layer_types if t == "sliding_attention")
        return (window if sliding == len(layer_types) else None), sliding
    return window, num_layers


def _quantization(config: dict[str, Any], directory: Path) -> tuple[str | None, int | None]:
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        method = str(qc.get("quant_method") or qc.get("format") or "unknown")
        bits = qc.get("bits") or qc.get("w_bit") or qc.get("weight_bits")
        if not isinstance(bits, int):
            bits = 8 if "fp8" in method or "int8" in method or "w8" in method else None
        return method, bits
    # vllm-ascend's ModelSlim checkpoints describe their quantisation in a separate file.
    description = directory / "quant_model_description.json"
    if description.is_file():
        data = _read_json(description)
        kind = str(data.get("model_quant_type", "ascend")) if isinstance(data, dict) else "ascend"
        return f"ascend-{kind.lower()}", 4 if "W4" in kind.upper() else 8
    return None, None


# -- parameters and weight bytes -------------------------------------------------------------------


def _estimate_params(text: _Fields, top: _Fields, f: dict[str, Any]) -> int:
    """Parameters from the shape (`f`: ModelInfo's fields so far): embeddings, attention, MLP or
    experts, norms, vision tower. `text` is the language model's config, `top` the whole file."""
    hidden, layers, heads = f["hidden_size"], f["num_layers"], f["num_attention_heads"]
    kv, hd, vocab = f["num_kv_heads"], f["head_dim"], f["vocab_size"]
    act = str(text.raw("hidden_act") or text.raw("activation_function") or "silu")
    mlp_mats = 3 if act in _GATED_ACTS else 2

    if f["is_mla"]:
        nope = text.opt_int("qk_nope_head_dim") or hd
        rope = f["qk_rope_head_dim"] or 0
        v_dim = text.opt_int("v_head_dim") or nope
        q_lora = text.opt_int("q_lora_rank")
        q = hidden * heads * (nope + rope) if not q_lora else hidden * q_lora + q_lora + q_lora * heads * (nope + rope)
        attn = q + hidden * (f["kv_lora_rank"] + rope) + f["kv_lora_rank"]
        attn += f["kv_lora_rank"] * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        attn = hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden
        if text.flag("attention_bias", f["model_type"] in _QKV_BIAS_TYPES):
            attn += heads * hd + 2 * kv * hd
        if f["model_type"].startswith("qwen3"):
            attn += 2 * hd  # q_norm, k_norm
    dense_mlp = mlp_mats * hidden * f["intermediate_size"]
    per_layer_dense = attn + dense_mlp + 2 * hidden

    if f["is_moe"]:
        experts, moe_inter = f["num_experts"], f["moe_intermediate_size"]
        shared = (text.opt_int("n_shared_experts") or 0) * 3 * hidden * moe_inter
        shared_inter = text.opt_int("shared_expert_intermediate_size")
        if shared_inter:
            shared += 3 * hidden * shared_inter + hidden  # Qwen2-MoE shared expert and its gate
        moe = experts * 3 * hidden * moe_inter + hidden * experts + shared
        dense_layers = _dense_layer_count(text, layers)
        body = dense_layers * per_layer_dense + (layers - dense_layers) * (attn + moe + 2 * hidden)
    else:
        body = layers * per_layer_dense
    if f["is_encoder_decoder"]:
        encoder_layers = top.opt_int("encoder_layers") or layers
        body += encoder_layers * per_layer_dense
    embeddings = vocab * hidden * (1 if f["tie_word_embeddings"] else 2)
    return int(body + embeddings + hidden + _vision_params(top.data, hidden))


def _dense_layer_count(text: _Fields, layers: int) -> int:
    first_dense = text.opt_int("first_k_dense_replace")
    if first_dense is not None:
        return min(first_dense, layers)  # DeepSeek-V2/V3
    only_mlp = text.raw("mlp_only_layers")
    step = text.opt_int("decoder_sparse_step") or 1
    dense = {i for i in range(layers) if (i + 1) % step != 0}
    if isinstance(only_mlp, list):
        dense |= {i for i in only_mlp if isinstance(i, int)}
    return len(dense)  # Qwen2/3-MoE


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


def _estimated_weight_bytes(params: int, dtype: str, quant_bits: int | None) -> int:
    if quant_bits:
        return params * quant_bits // 8
    return params * DTYPE_BYTES.get(dtype, 2)


def _weight_bytes(directory: Path, notes: list[str]) -> tuple[int | None, str]:
    index = directory / INDEX_NAME
    if index.is_file():
        total, shards = _index_entries(index, _read_json(index))
        if total is not None:
            return total, "safetensors-index"
        present = [directory / s for s in shards if (directory / s).is_file()]
        if shards and len(present) == len(shards):
            return sum(safetensors_data_bytes(p) for p in present), "safetensors-headers"
        notes.append(f"{index.name} has no metadata.total_size and its shards are not all present")
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return sum(safetensors_data_bytes(p) for p in files), "safetensors-headers"
    return None, "estimated-from-shape"


def _index_entries(index: Path, data: Any) -> tuple[int | None, list[str]]:
    """(metadata.total_size when a positive integer, the shard file names) of a safetensors index."""
    if not isinstance(data, dict):
        return None, []
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ModelError(f"{index}: field 'metadata': expected a JSON object, got {metadata!r}")
    weight_map = data.get("weight_map", {})
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelError(f"{index}: field 'weight_map': expected an object of tensor name -> file name")
    total = metadata.get("total_size")
    return (total if isinstance(total, int) and total > 0 else None), sorted(set(weight_map.values()))


def safetensors_data_bytes(path: Path) -> int:
    """Bytes of tensor data in one .safetensors file, from its header alone."""
    try:
        with files.open_regular(path) as handle:
            head = handle.read(8)
            if len(head) != 8:
                raise ModelError(f"{path}: too short for a safetensors header")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER_BYTES:
                raise ModelError(f"{path}: header length {length} is not plausible")
            raw = handle.read(length)
    except files.FileProblem as exc:
        raise ModelError(str(exc)) from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc}") from None
    if len(raw) != length:
        raise ModelError(f"{path}: header is truncated ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelError(f"{path}: header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: header is not a JSON object")
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = tensor["data_offsets"]
            dtype, shape = tensor["dtype"], tensor["shape"]
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: tensor {name!r} lacks dtype, shape or data_offsets") from None
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise ModelError(f"{path}: tensor {name!r} has invalid data_offsets {tensor['data_offsets']!r}")
        if not isinstance(dtype, str):
            raise ModelError(f"{path}: tensor {name!r} has invalid dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ModelError(f"{path}: tensor {name!r} has invalid shape {shape!r}: expected a list of sizes")
        expected = math.prod(shape) * _SAFETENSORS_DTYPE_BYTES.get(dtype, 0)
        if dtype in _SAFETENSORS_DTYPE_BYTES and expected != end - start:
            raise ModelError(
                f"{path}: tensor {name!r}: {dtype}{shape} needs {expected} bytes, offsets span {end - start}"
            )
        total += end - start
    return total

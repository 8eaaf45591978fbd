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
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from npu_runtime import files

CONFIG_NAME: Final = "config.json"
# vllm_ascend/quantization/modelslim_config.py MODELSLIM_CONFIG_FILENAME, and the method name
# detect_quantization_method returns for it (ASCEND_QUANTIZATION_METHOD, `--quantization ascend`).
MODELSLIM_DESCRIPTION: Final = "quant_model_description.json"
ASCEND_QUANTIZATION: Final = "ascend"
# ModelSlim quant types: W8A8, W8A8_DYNAMIC, W8A16, W4A8_DYNAMIC, W4A16, W4A4_... (weight bits first).
_SCHEME: Final = re.compile(r"^W(\d+)A")
_LAYER_INDEX: Final = re.compile(r"\.layers\.(\d+)\.")
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
    architectures, model_type = _architectures(config, top, text, source)
    dims = _dimensions(text, top)
    experts = _experts(text, source)
    dtype = _config_dtype(text, top, notes)
    quant = _quantization(config, directory, dims["num_layers"])
    sliding_window, sliding_layers = _sliding_window(text, dims["num_layers"])
    is_mla, head_dim = dims["is_mla"], dims["head_dim"]
    info_args: dict[str, Any] = {
        "path": str(directory),
        "architecture": architectures[0] if architectures else model_type,
        "model_type": model_type,
        "is_encoder_decoder": top.flag("is_encoder_decoder", False),
        "is_multimodal": any(k in config for k in ("vision_config", "audio_config", *_NESTED_TEXT_KEYS)),
        "is_pooling": any(a.endswith(_POOLING_SUFFIXES) for a in architectures),
        **dims,
        **experts,
        "max_position_embeddings": _derived_max_len(text, top, directory, model_type, notes),
        "dtype": dtype,
        "sliding_window": sliding_window,
        "sliding_layers": sliding_layers,
        "tie_word_embeddings": top.flag("tie_word_embeddings", text.flag("tie_word_embeddings", False)),
        "quantization": quant.method,
        "quant_bits": quant.linear_bits,
        "quant_scheme": quant.scheme,
        "expert_quant_bits": quant.expert_bits,
        "draft_layers": text.opt_int("num_nextn_predict_layers") or 0,
        "dense_layers": _dense_layer_count(text, dims["num_layers"]) if experts["is_moe"] else 0,
        "qk_nope_head_dim": (text.opt_int("qk_nope_head_dim") or head_dim) if is_mla else None,
        "v_head_dim": (text.opt_int("v_head_dim") or text.opt_int("qk_nope_head_dim") or head_dim) if is_mla else None,
    }
    return ModelInfo(**info_args, **_weight_fields(text, top, directory, info_args, quant, notes), notes=tuple(notes))


def _architectures(config: dict[str, Any], top: _Fields, text: _Fields, source: Path) -> tuple[list[str], str]:
    """(the architectures the config lists, its model_type); one of them at least."""
    architectures = config.get("architectures") or text.raw("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelError(f"{source}: field 'architectures': expected a list of strings")
    model_type = top.opt_str("model_type") or text.opt_str("model_type") or ""
    if not architectures and not model_type:
        raise ModelError(f"{source}: missing field 'architectures' (and no 'model_type')")
    return architectures, model_type


def _dimensions(text: _Fields, top: _Fields) -> dict[str, Any]:
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


def _experts(text: _Fields, source: Path) -> dict[str, Any]:
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


def _config_dtype(text: _Fields, top: _Fields, notes: list[str]) -> str:
    """The checkpoint's dtype by its canonical name (bfloat16 when the config states none)."""
    dtype = text.opt_str("torch_dtype") or text.opt_str("dtype") or top.opt_str("torch_dtype") or top.opt_str("dtype")
    if dtype is None:
        notes.append("no torch_dtype in the config: bfloat16 assumed")
        dtype = "bfloat16"
    return canonical_dtype(dtype.removeprefix("torch."))


def _weight_fields(
    text: _Fields, top: _Fields, directory: Path, info_args: dict[str, Any], quant: _Quant, notes: list[str]
) -> dict[str, Any]:
    """ModelInfo's byte counts: the weights measured (safetensors) or estimated from the shape, and
    the parts the layout places apart (experts, MTP draft layers, tensors replicated on every rank)."""
    params = _estimate_params(text, top, info_args)
    dtype_bytes = DTYPE_BYTES.get(info_args["dtype"], 2)
    # vllm-ascend's MLA keeps kv_b_proj unquantized (attention/mla_v1.py asserts an
    # UnquantizedLinearMethod); ModelSlim descriptions mark it FLOAT. Other methods quantize it.
    kv_b_bits = None if quant.method == ASCEND_QUANTIZATION else quant.linear_bits
    estimated = params.weight_bytes(dtype_bytes, quant.linear_bits, quant.expert_bits, kv_b_bits)
    weight_bytes, weight_source = _weight_bytes(directory, notes)
    if weight_bytes is None:
        weight_bytes, weight_source = estimated, "estimated-from-shape"
    expert_bytes = params.expert_bytes(quant.expert_bits, dtype_bytes)
    if weight_source != "estimated-from-shape" and estimated:
        # Measured totals do not say which tensors are experts: keep the shape's proportion.
        expert_bytes = weight_bytes * expert_bytes // estimated
    draft = _draft_params(text, info_args, params)
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


@dataclass(frozen=True)
class _Quant:
    """What a checkpoint's quantization means for the byte count (None everywhere: not quantized)."""

    method: str | None = None
    scheme: str | None = None
    linear_bits: int | None = None
    expert_bits: int | None = None
    draft_linear_bits: int | None = None
    draft_expert_bits: int | None = None
    """ModelSlim: the MTP layers' own types (None: FLOAT, as the description's note asks)."""
    quantized_kv_b_proj: str | None = None


def _quantization(config: dict[str, Any], directory: Path, num_layers: int) -> _Quant:
    """The quantization from quant_model_description.json (ModelSlim, vllm-ascend's "ascend" method,
    which vllm_ascend/quantization/utils.py detect_quantization_method looks for first) or from the
    config's quantization_config block; byte counts only, no tensor is read."""
    description = directory / MODELSLIM_DESCRIPTION
    if description.is_file():
        return _modelslim(description, _read_json(description), num_layers)
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        method = str(qc.get("quant_method") or qc.get("format") or "unknown")
        bits = qc.get("bits") or qc.get("w_bit") or qc.get("weight_bits")
        if not isinstance(bits, int):
            lowered = method.lower()
            bits = 8 if "fp8" in lowered or "int8" in lowered or "w8" in lowered else None
            bits = 4 if any(k in lowered for k in ("fp4", "w4", "int4")) else bits
        return _Quant(method, None, bits, bits)
    return _Quant()


def _scheme_bits(scheme: str, where: str) -> int | None:
    """Bits per weight of a ModelSlim quant type: W8A8_DYNAMIC -> 8, W4A8_DYNAMIC -> 4, FLOAT -> None."""
    if scheme.upper() == "FLOAT":
        return None
    match = _SCHEME.match(scheme.upper())
    if not match:
        raise ModelError(f"{where}: unknown quantization type {scheme!r} (expected FLOAT or W<bits>A<bits>...)")
    return int(match.group(1))


def _modelslim(path: Path, data: Any, num_layers: int) -> _Quant:
    """A ModelSlim description: `model_quant_type` plus one quant type per tensor name.

    The experts' width is the most common quantized type among `*.experts.*.weight` entries, the
    other linear layers' the most common among the remaining `*proj.weight` entries (a class with
    only FLOAT entries stays in the dtype); each class falls back to model_quant_type when the
    file lists none. kv_b_proj is counted in the dtype (MLA keeps it unquantized); a description
    that quantizes it is recorded (`quantized_kv_b_proj`) for the plan to refuse. Entries of
    layers at or above num_hidden_layers are the MTP layers' own and give their precision (FLOAT
    when none is listed). A trimmed description (a layer's worth of entries) gives the same
    answer as the full one.
    """
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object of tensor name -> quantization type")
    scheme = data.get("model_quant_type")
    if scheme is not None and not isinstance(scheme, str):
        raise ModelError(f"{path}: field 'model_quant_type': expected a string, got {scheme!r}")
    experts: dict[str, int] = {}
    linear: dict[str, int] = {}
    draft_experts: dict[str, int] = {}
    draft_linear: dict[str, int] = {}
    quantized_kv_b: list[str] = []
    for name, kind in data.items():
        if not name.endswith(".weight") or not isinstance(kind, str):
            continue
        layer = _LAYER_INDEX.search(name)
        is_draft = layer is not None and int(layer.group(1)) >= num_layers
        if name.endswith("kv_b_proj.weight"):
            if kind.upper() != "FLOAT":
                quantized_kv_b.append(name)
            continue
        if ".experts." in name:
            counts = draft_experts if is_draft else experts
        elif name.removesuffix(".weight").endswith("proj"):
            counts = draft_linear if is_draft else linear
        else:
            continue
        counts[kind] = counts.get(kind, 0) + 1
    default = scheme or "W8A8"

    def width(counts: dict[str, int], fallback: str) -> str:
        quantized = {k: n for k, n in counts.items() if k.upper() != "FLOAT"}
        if quantized:
            return max(quantized, key=lambda k: quantized[k])
        return "FLOAT" if counts else fallback

    linear_kind, expert_kind = width(linear, default), width(experts, default)
    return _Quant(
        method=ASCEND_QUANTIZATION,
        scheme=scheme or linear_kind,
        linear_bits=_scheme_bits(linear_kind, f"{path}: linear layers"),
        expert_bits=_scheme_bits(expert_kind, f"{path}: experts"),
        draft_linear_bits=_scheme_bits(width(draft_linear, "FLOAT"), f"{path}: MTP layers"),
        draft_expert_bits=_scheme_bits(width(draft_experts, "FLOAT"), f"{path}: MTP experts"),
        quantized_kv_b_proj=min(quantized_kv_b, key=_natural_key) if quantized_kv_b else None,
    )


def _natural_key(name: str) -> tuple[int, str]:
    layer = _LAYER_INDEX.search(name)
    return (int(layer.group(1)) if layer else -1, name)


# -- parameters and weight bytes -------------------------------------------------------------------


@dataclass(frozen=True)
class _Params:
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


def _estimate_params(text: _Fields, top: _Fields, f: dict[str, Any]) -> _Params:
    """Parameters from the shape (`f`: ModelInfo's fields so far): embeddings, attention, MLP or
    experts, norms, vision tower. `text` is the language model's config, `top` the whole file."""
    hidden, layers = f["hidden_size"], f["num_layers"]
    attn = _attention_params(text, f)
    dense_mlp = _mlp_matrices(text) * hidden * f["intermediate_size"]
    norms = 2 * hidden
    linear, experts, other = layers * attn.linear, 0, layers * norms
    replicated_other = 0

    if f["is_moe"]:
        routed, shared, router = _moe_params(text, f)
        dense_layers = _dense_layer_count(text, layers)
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
    return _Params(
        linear,
        experts,
        other + embeddings + hidden + _vision_params(top.data, hidden),
        kv_b=layers * attn.kv_b,
        replicated_linear=layers * attn.replicated,
        replicated_other=replicated_other,
    )


def _mlp_matrices(text: _Fields) -> int:
    act = str(text.raw("hidden_act") or text.raw("activation_function") or "silu")
    return 3 if act in _GATED_ACTS else 2


@dataclass(frozen=True)
class _Attention:
    """One attention layer's parameters: linear (incl. `replicated`) and MLA's kv_b_proj apart."""

    linear: int
    kv_b: int = 0
    replicated: int = 0


def _attention_params(text: _Fields, f: dict[str, Any]) -> _Attention:
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


def _moe_params(text: _Fields, f: dict[str, Any]) -> tuple[int, int, int]:
    """(routed experts, shared experts, router) parameters of one MoE layer."""
    hidden, count, moe_inter = f["hidden_size"], f["num_experts"], f["moe_intermediate_size"]
    shared = (text.opt_int("n_shared_experts") or 0) * 3 * hidden * moe_inter
    shared_inter = text.opt_int("shared_expert_intermediate_size")
    if shared_inter:
        shared += 3 * hidden * shared_inter + hidden  # Qwen2-MoE shared expert and its gate
    return count * 3 * hidden * moe_inter, shared, hidden * count


def _draft_params(text: _Fields, f: dict[str, Any], main: _Params) -> _Params:
    """DeepSeek's MTP layers (num_nextn_predict_layers): each one decoder layer (MoE when the model
    is) plus eh_proj (2h -> h) and three norms; embeddings and lm_head are shared with the main
    model (vllm/model_executor/models/deepseek_mtp.py; vLLM's proposer shares them when shapes match)."""
    count = f["draft_layers"]
    if not count:
        return _Params(0, 0, 0)
    hidden = f["hidden_size"]
    attn = _attention_params(text, f)
    router = 0
    if f["is_moe"]:
        routed, shared, router = _moe_params(text, f)
        linear, experts, other = attn.linear + shared, routed, router
    else:
        linear, experts, other = attn.linear + _mlp_matrices(text) * hidden * f["intermediate_size"], 0, 0
    # eh_proj is a plain nn.Linear in vllm/model_executor/models/deepseek_mtp.py: never quantized,
    # never split over TP.
    eh_proj = 2 * hidden * hidden
    other += eh_proj + 5 * hidden  # input/post-attention norms, enorm, hnorm, shared_head.norm
    return _Params(
        count * linear,
        count * experts,
        count * other,
        kv_b=count * attn.kv_b,
        replicated_linear=count * attn.replicated,
        replicated_other=count * (router + eh_proj),
    )


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

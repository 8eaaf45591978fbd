"""The context length vLLM derives from a model's config, and the layers a sliding window limits."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from npu_runtime.planner.config_fields import ConfigFields, ModelError, read_json

__all__ = ["derived_max_len", "sliding_window_layers"]

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


def derived_max_len(text: ConfigFields, top: ConfigFields, directory: Path, model_type: str, notes: list[str]) -> int:
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
            raise ModelError(f"{text.where(rope_key)}: expected a string rope type, got {rope_type!r}")
        factor = rope.get("factor")
        if rope_type not in _PRESCALED_ROPE and isinstance(factor, int | float) and factor > 0:
            length *= factor
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():
        data = read_json(tokenizer_config)
        limit = data.get("model_max_length") if isinstance(data, dict) else None
        if isinstance(limit, int | float) and 0 < limit < length:
            length = float(limit)
            notes.append(f"context length capped by tokenizer_config.json model_max_length={int(limit)}")
    return int(length)


def sliding_window_layers(text: ConfigFields, num_layers: int) -> tuple[int | None, int]:
    window = text.opt_int("sliding_window")
    if not window or not text.flag("use_sliding_window", True):
        return None, 0
    layer_types = text.raw("layer_types")
    if isinstance(layer_types, list) and layer_types:
        sliding = sum(1 for t in layer_types if t == "sliding_attention")
        return (window if sliding == len(layer_types) else None), sliding
    return window, num_layers

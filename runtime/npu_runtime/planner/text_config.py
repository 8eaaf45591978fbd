"""A multimodal model's language model: the nested text config, with transformers' defaults filled in."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from npu_runtime.planner.config_fields import ConfigFields, ModelError

__all__ = ["NESTED_TEXT_KEYS", "text_config"]

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

# Where a multimodal model nests its language model's config, in the order they are looked for.
NESTED_TEXT_KEYS: Final = ("text_config", "llm_config", "language_config")


def text_config(config: dict[str, Any], source: Path) -> tuple[ConfigFields, list[str]]:
    """The dict that describes the language model, with defaults filled in for a nested one."""
    notes: list[str] = []
    for key in NESTED_TEXT_KEYS:
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
        return ConfigFields(merged, source, prefix=f"{key}."), notes
    return ConfigFields(config, source), notes

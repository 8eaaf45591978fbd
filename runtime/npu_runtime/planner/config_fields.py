"""Typed reading of a model's JSON files: `ModelError`, `read_json` and `ConfigFields`.

`ConfigFields` reads one config dict by the planner's field names, trying each architecture's
alternative names (`_ALIASES`), and raises `ModelError` naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from npu_runtime import files

__all__ = ["ConfigFields", "ModelError", "read_json"]

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


class ModelError(ValueError):
    """The model's files are missing, unreadable or lack a field the planner needs."""


def read_json(path: Path) -> Any:
    try:
        text = files.read_text(path)
    except files.FileProblem as exc:
        raise ModelError(str(exc)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None


class ConfigFields:
    """Typed access to one config dict, with errors that name the file and the field."""

    def __init__(self, data: dict[str, Any], source: Path, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def where(self, key: str) -> str:
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
            raise ModelError(f"{self.where(key)}: expected an integer, got {value!r}")
        if value < 0:
            raise ModelError(f"{self.where(key)}: expected zero or more, got {value!r}")
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
            raise ModelError(f"{self.where(key)}: expected a positive integer, got {value}")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ModelError(f"{self.where(key)}: expected a string, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelError(f"{self.where(key)}: expected true or false, got {value!r}")
        return value

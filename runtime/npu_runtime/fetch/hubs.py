"""The hub behind a name, and the token's variable: what the model's fetch and the adapters' fetch share."""

from __future__ import annotations

from typing import Final

from npu_runtime.fetch.hub import HUGGING_FACE, MODEL_SCOPE, Hub, not_a_hub
from npu_runtime.fetch.huggingface import HuggingFaceHub
from npu_runtime.fetch.modelscope import ModelScopeHub

TOKEN_ENV: Final = "NPU_MODEL_TOKEN"


def hub_for(name: str) -> Hub:
    if name == HUGGING_FACE:
        return HuggingFaceHub()
    if name == MODEL_SCOPE:
        return ModelScopeHub()
    raise not_a_hub(name)

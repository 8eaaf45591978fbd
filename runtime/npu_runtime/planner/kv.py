"""The KV cache one sequence needs on one device.

Sources: the model's KV cache spec (`ModelInfo.kv_bytes_per_token`: full attention, MLA's latent,
sliding-window layers), vLLM's KVCacheSpec for the MTP draft layers.
"""

from __future__ import annotations

from npu_runtime.planner.model import ModelInfo

__all__ = ["kv_sequence_bytes"]


def kv_sequence_bytes(model: ModelInfo, per_token: int, length: int) -> int:
    """KV cache of one sequence of `length` tokens on one device (`per_token` bytes each, as
    ModelInfo.kv_bytes_per_token gives them); sliding-window layers keep the window."""
    if not model.sliding_layers or not model.sliding_window:
        return per_token * length
    # Hybrid models (layer_types) are not windowed as a whole: sliding_window is None there.
    return per_token * min(length, model.sliding_window)

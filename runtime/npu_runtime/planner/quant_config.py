"""A checkpoint's quantization: ModelSlim's description (vllm-ascend's "ascend") or quantization_config.

Byte counts only, no tensor is read: bits per weight of the linear layers, the routed experts and
the MTP draft layers, and a kv_b_proj that a ModelSlim description quantizes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from npu_runtime.planner.config_fields import ModelError, read_json

__all__ = ["ASCEND_QUANTIZATION", "MODELSLIM_DESCRIPTION", "Quant", "read_quantization"]

# vllm_ascend/quantization/modelslim_config.py MODELSLIM_CONFIG_FILENAME, and the method name
# detect_quantization_method returns for it (ASCEND_QUANTIZATION_METHOD, `--quantization ascend`).
MODELSLIM_DESCRIPTION: Final = "quant_model_description.json"
ASCEND_QUANTIZATION: Final = "ascend"
# ModelSlim quant types: W8A8, W8A8_DYNAMIC, W8A16, W4A8_DYNAMIC, W4A16, W4A4_... (weight bits first).
_SCHEME: Final = re.compile(r"^W(\d+)A")
_LAYER_INDEX: Final = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Quant:
    """What a checkpoint's quantization means for the byte count (None everywhere: not quantized)."""

    method: str | None = None
    scheme: str | None = None
    linear_bits: int | None = None
    expert_bits: int | None = None
    draft_linear_bits: int | None = None
    draft_expert_bits: int | None = None
    """ModelSlim: the MTP layers' own types (None: FLOAT, as the description's note asks)."""
    quantized_kv_b_proj: str | None = None


def read_quantization(config: dict[str, Any], directory: Path, num_layers: int) -> Quant:
    """The quantization from quant_model_description.json (ModelSlim, vllm-ascend's "ascend" method,
    which vllm_ascend/quantization/utils.py detect_quantization_method looks for first) or from the
    config's quantization_config block; byte counts only, no tensor is read."""
    description = directory / MODELSLIM_DESCRIPTION
    if description.is_file():
        return _modelslim(description, read_json(description), num_layers)
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        method = str(qc.get("quant_method") or qc.get("format") or "unknown")
        bits = qc.get("bits") or qc.get("w_bit") or qc.get("weight_bits")
        if not isinstance(bits, int):
            lowered = method.lower()
            bits = 8 if "fp8" in lowered or "int8" in lowered or "w8" in lowered else None
            bits = 4 if any(k in lowered for k in ("fp4", "w4", "int4")) else bits
        return Quant(method, None, bits, bits)
    return Quant()


def _scheme_bits(scheme: str, where: str) -> int | None:
    """Bits per weight of a ModelSlim quant type: W8A8_DYNAMIC -> 8, W4A8_DYNAMIC -> 4, FLOAT -> None."""
    if scheme.upper() == "FLOAT":
        return None
    match = _SCHEME.match(scheme.upper())
    if not match:
        raise ModelError(f"{where}: unknown quantization type {scheme!r} (expected FLOAT or W<bits>A<bits>...)")
    return int(match.group(1))


def _modelslim(path: Path, data: Any, num_layers: int) -> Quant:
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
    return Quant(
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

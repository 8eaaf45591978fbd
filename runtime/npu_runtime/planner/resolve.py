"""Option resolution: what a plan runs with where the options leave it to the model, device or environment.

The dtype, max_model_len, --quantization, the graph mode the rules predict, and vllm-ascend's
flashcomm1 and fused MC2 switches; each `resolve_*` function takes the options first.
"""

from __future__ import annotations

from collections.abc import Mapping

from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import modes
from npu_runtime.planner.model import ModelInfo, canonical_dtype
from npu_runtime.planner.modes import Downgrade
from npu_runtime.planner.probe import DeviceInfo
from npu_runtime.planner.quant_config import ASCEND_QUANTIZATION, MODELSLIM_DESCRIPTION

__all__ = [
    "resolve_dtype",
    "resolve_flashcomm1",
    "resolve_fused_mc2",
    "resolve_graph_mode",
    "resolve_max_model_len",
    "resolve_quantization",
]


def resolve_dtype(options: PlanOptions, model: ModelInfo, family: str) -> str:
    if options.dtype not in ("auto", ""):
        return canonical_dtype(options.dtype)
    if family == "310P":
        return "float16"
    # vLLM "auto": the checkpoint's dtype, except that float32 checkpoints run in 16 bits
    # (vllm/config/model.py _resolve_auto_dtype).
    return "bfloat16" if model.dtype == "float32" else model.dtype


def resolve_max_model_len(options: PlanOptions, model: ModelInfo, env: dict[str, str], warnings: list[str]) -> int:
    derived = model.max_position_embeddings
    if options.max_model_len is None:
        return derived
    if options.max_model_len > derived:
        # vllm/config/model.py _get_and_verify_max_len raises unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set.
        if env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true"):
            warnings.append(f"max_model_len {options.max_model_len} exceeds the model's {derived} (allowed by env)")
        else:
            raise PlanError(
                "max_model_len",
                f"{options.max_model_len} is above the model's context length {derived}; vLLM refuses it "
                "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
            )
    return options.max_model_len


def resolve_quantization(options: PlanOptions, model: ModelInfo, warnings: list[str]) -> str | None:
    """The --quantization vLLM gets: the requested one, else what the checkpoint declares.

    vllm-ascend detects ModelSlim checkpoints itself (maybe_auto_detect_quantization) and keeps an
    explicit --quantization that disagrees, with a warning; the plan says so too.
    """
    requested = options.quantization or None
    detected = model.quantization
    if requested is None:
        return detected
    if requested == ASCEND_QUANTIZATION and detected != ASCEND_QUANTIZATION:
        raise PlanError(
            "quantization",
            f"ascend needs ModelSlim's {MODELSLIM_DESCRIPTION} in the model directory; {model.path} has none",
        )
    if detected and requested != detected:
        warnings.append(
            f"--quantization {requested} differs from the checkpoint's {detected}; the engine keeps {requested}"
        )
    return requested


def resolve_graph_mode(
    options: PlanOptions, device: DeviceInfo, model: ModelInfo, resolve_mode: bool, warnings: list[str]
) -> tuple[str, list[Downgrade]]:
    """(the mode to plan for, the downgrades the rules predict): the rules' mode, or with
    resolve_mode=False the requested one, the predicted downgrades then being warnings."""
    requested = options.graph_mode
    predicted, downgrades, mode_warnings = modes.resolve_mode(
        requested, device=device, model=model, enforce_eager=options.enforce_eager
    )
    warnings += mode_warnings
    if resolve_mode:
        return predicted, list(downgrades)
    warnings += [f"the engine is expected to downgrade {d.message} ({d.reason})" for d in downgrades]
    return requested, []


def resolve_flashcomm1(options: PlanOptions, device: DeviceInfo, env: Mapping[str, str]) -> bool:
    """vllm-ascend's flashcomm1 (vllm_ascend/utils.py enable_sp): --flashcomm1 (serve reads
    additional_config enable_flashcomm1), else VLLM_ASCEND_ENABLE_FLASHCOMM1; NPUs only."""
    if device.kind != "npu":
        return False
    if options.flashcomm1 is not None:
        return options.flashcomm1
    return env.get("VLLM_ASCEND_ENABLE_FLASHCOMM1", "0").strip() not in ("", "0")


def resolve_fused_mc2(options: PlanOptions, env: Mapping[str, str]) -> int:
    """vllm-ascend's enable_fused_mc2 (vllm_ascend/ascend_config.py): --fused-mc2, else
    VLLM_ASCEND_ENABLE_FUSED_MC2, else 0."""
    if options.fused_mc2 is not None:
        return options.fused_mc2
    text = env.get("VLLM_ASCEND_ENABLE_FUSED_MC2", "0").strip()
    return int(text) if text.isdigit() else 0

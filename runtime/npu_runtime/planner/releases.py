"""The engine's rules that differ by release, as data, and the capture-size algorithm they drive.

`RULES` has one row per engine release of the compatibility matrix (npu_runtime.engines.RELEASES):
what that release does to the capture sizes and which of our caps it enforces, each with the
function it comes from. A new release is a new row with its citations; `select` picks the row
(`npu-runtime plan --engine-release`, else the installed vllm-ascend, else the images' default).

`engine_capture_sizes` is the list the release captures for a configuration, step by step, in the
order the engine runs them:

1. ceiling: vllm-ascend's platform default min(max_num_seqs x (1 + k), 512) when neither a ceiling
   nor a list is given (vllm_ascend/platform.py NPUPlatform._get_default_max_cudagraph_capture_size,
   injected by apply_config_platform_defaults, so vLLM's "* 2" is not applied), clipped to
   max_num_batched_tokens (vllm/config/vllm.py VllmConfig._set_cudagraph_sizes);
2. grid: 1, 2, 4, steps of 8 below 256, steps of 16 up to the ceiling, plus max_num_batched_tokens
   when it is within the ceiling; an explicit list is de-duplicated, sorted and clipped to
   max_num_batched_tokens instead (same function);
3. flashcomm1: with TP > 1, a graph mode and flashcomm1 on, only multiples of TP are kept
   (vllm_ascend/platform.py NPUPlatform.check_and_update_config calling
   VllmConfig.update_sizes_for_sequence_parallelism; the engine asserts one is left);
4. spec-decode rounding: with FULL decode graphs and k > 0 every size is rounded up to a multiple
   of 1 + k (of max(1 + k, TP) under flashcomm1, which vllm-ascend's update_pass_config turns into
   pass_config.enable_sp for this call) and kept when within the largest
   (vllm/config/compilation.py CompilationConfig.adjust_cudagraph_sizes_for_spec_decode, called by
   resolve_cudagraph_mode_and_sizes from NPUModelRunner._check_and_update_cudagraph_mode);
5. decode range: the dispatcher's keys (vllm/v1/cudagraph_dispatcher.py
   CudagraphDispatcher.initialize_cudagraph_keys): every size for a mixed graph mode (PIECEWISE,
   FULL, FULL_AND_PIECEWISE), only 1 + k <= size <= max_num_seqs x (1 + k) for FULL_DECODE_ONLY.
   vllm-ascend captures the sizes of those keys (its capture_sizes, set_graph_params).

Pure: no I/O, no torch or vllm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from npu_runtime.contract import PlanError
from npu_runtime.planner import modes

__all__ = [
    "DEFAULT_RELEASE",
    "RULES",
    "CaptureStep",
    "ReleaseRules",
    "engine_capture_sizes",
    "grid",
    "release_of",
    "select",
]

# vllm_ascend/platform.py _get_default_max_cudagraph_capture_size: "capped at 512".
_DEFAULT_CEILING_CAP: Final = 512
_GRID_FINE_STEP: Final = 8
_GRID_COARSE_FROM: Final = 256
_GRID_COARSE_STEP: Final = 16


@dataclass(frozen=True)
class ReleaseRules:
    """What one engine release does to the capture sizes and which caps it enforces."""

    release: str
    """vllm-ascend's version, as the compatibility matrix names it."""
    vllm: str
    """The vLLM version it is built with (its Dockerfile's VLLM_TAG)."""
    default_ceiling_cap: int
    stream_budget: int | None
    """ACL graph streams the release's own update_aclgraph_sizes allows; None: it enforces none."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """step -> the function it comes from in this release."""
    lora_tp_graphs: bool = False
    """LoRA with TP > 1 runs in a graph mode (vllm-ascend #11940: the attention replay pairs the
    per-LoRA-case captures with their layers); False: the plan runs it eagerly."""
    moe_lora_ep: bool = False
    """MoE LoRA with expert parallel (vllm-ascend #12451, AlltoAll + EP + LoRA, non-quantized)."""


def _sources(ascend: str, vllm: str) -> dict[str, str]:
    return {
        "ceiling": f"vllm-ascend {ascend} vllm_ascend/platform.py NPUPlatform._get_default_max_cudagraph_capture_size"
        f" + vLLM {vllm} vllm/config/vllm.py VllmConfig._set_cudagraph_sizes",
        "grid": f"vLLM {vllm} vllm/config/vllm.py VllmConfig._set_cudagraph_sizes",
        "flashcomm1": f"vllm-ascend {ascend} vllm_ascend/platform.py NPUPlatform.check_and_update_config"
        f" -> vLLM {vllm} vllm/config/vllm.py VllmConfig.update_sizes_for_sequence_parallelism",
        "spec-decode": f"vLLM {vllm} vllm/config/compilation.py "
        "CompilationConfig.adjust_cudagraph_sizes_for_spec_decode"
        f" (vllm-ascend {ascend} vllm_ascend/worker/model_runner_v1.py NPUModelRunner._check_and_update_cudagraph_mode"
        ", update_pass_config)",
        "decode-range": f"vLLM {vllm} vllm/v1/cudagraph_dispatcher.py CudagraphDispatcher.initialize_cudagraph_keys",
        "streams": f"vllm-ascend {ascend}: no update_aclgraph_sizes (removed before v0.21.0rc1, #9962)",
        # git log of the tag (github:vllm-project/vllm-ascend): #11940 "Fix Qwen3.5 densemodel LoRA
        # scenarios with tp, fully_sharded_loras and aclgraph" is on main only (backported to
        # releases/v0.26.0rc as #14228), not in v0.23.0 nor v0.25.1rc1; issue #10897.
        "lora-tp-graphs": f"vllm-ascend {ascend}: without #11940 (issue #10897, LoRA + TP > 1 + graph mode fails;"
        " the captures of each cudagraph_specialize_lora case, replayed in vllm_ascend/attention/attention_v1.py)",
        # docs/source/user_guide/feature_guide/lora.md of the tag: "we haven't supported expert-parallel
        # (EP) or quantization yet when you run MoE models with LoRA"; main's adds "Fused MC2, and
        # dynamic EPLB are not supported with LoRA".
        "moe-lora": f"vllm-ascend {ascend} docs/source/user_guide/feature_guide/lora.md (MoE LoRA: "
        "#10977/#11828, non-quantized; no fused MC2, no dynamic EPLB)",
    }


RULES: Final[Mapping[str, ReleaseRules]] = {
    "0.23.0": ReleaseRules(
        release="0.23.0",
        vllm="0.23.0",
        default_ceiling_cap=_DEFAULT_CEILING_CAP,
        stream_budget=None,
        sources=_sources("v0.23.0", "v0.23.0"),
    ),
    # 0.23.0.post1 ships the same platform and worker code as 0.23.0 with vLLM 0.23.0.
    "0.23.0.post1": ReleaseRules(
        release="0.23.0.post1",
        vllm="0.23.0",
        default_ceiling_cap=_DEFAULT_CEILING_CAP,
        stream_budget=None,
        sources=_sources("0.23.0.post1", "v0.23.0"),
    ),
    # v0.25.1rc1 with vLLM v0.25.1 (its Dockerfile's VLLM_TAG): the same five steps; vLLM's
    # _set_cudagraph_sizes only reads num_speculative_tokens through VllmConfig now.
    "0.25.1rc1": ReleaseRules(
        release="0.25.1rc1",
        vllm="0.25.1",
        default_ceiling_cap=_DEFAULT_CEILING_CAP,
        stream_budget=None,
        sources=_sources("v0.25.1rc1", "v0.25.1"),
        # git log v0.25.1rc1 has ce229dc2dd "Support AlltoAll + EP + LoRA in non-quantized mode
        # (#12451)" (its lora.md was not updated and still says EP is unsupported).
        moe_lora_ep=True,
    ),
}
DEFAULT_RELEASE: Final = "0.23.0"  # the images' default until a final release after it exists


def release_of(versions: Mapping[str, str]) -> ReleaseRules | None:
    """The row for an engine release of the compatibility matrix (its distributions' versions);
    None for a release without vllm-ascend (the CPU build)."""
    return RULES.get(versions.get("vllm-ascend", ""))


def select(requested: str | None, installed: str | None = None) -> ReleaseRules:
    """The row for `requested` (PlanError when unknown), else for the installed vllm-ascend when the
    table has it, else the default."""
    if requested:
        key = requested.removeprefix("v")
        if key not in RULES:
            raise PlanError("engine_release", f"{requested!r} is not one of {', '.join(RULES)}")
        return RULES[key]
    if installed and installed in RULES:
        return RULES[installed]
    return RULES[DEFAULT_RELEASE]


@dataclass(frozen=True)
class CaptureStep:
    """One step of the engine's algorithm: the sizes after it and where the rule comes from."""

    step: str
    sizes: tuple[int, ...]
    source: str
    removed: tuple[int, ...] = ()


def grid(ceiling: int) -> list[int]:
    """vLLM's default grid up to `ceiling`: 1, 2, 4, then steps of 8 below 256, then steps of 16."""
    sizes = [n for n in (1, 2, 4) if n <= ceiling]
    if ceiling >= _GRID_FINE_STEP:
        sizes += list(range(_GRID_FINE_STEP, min(ceiling + 1, _GRID_COARSE_FROM), _GRID_FINE_STEP))
    if ceiling >= _GRID_COARSE_FROM:
        sizes += list(range(_GRID_COARSE_FROM, ceiling + 1, _GRID_COARSE_STEP))
    return sizes


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def engine_capture_sizes(
    rules: ReleaseRules,
    *,
    mode: str,
    max_num_seqs: int,
    decode_query_len: int,
    max_num_batched_tokens: int,
    tensor_parallel: int,
    flashcomm1: bool,
    explicit: Sequence[int] | None = None,
    max_capture_size: int | None = None,
) -> tuple[CaptureStep, ...]:
    """The steps of the engine's capture-size algorithm (see the module); the last one's sizes are
    what it captures. PlanError where the engine itself refuses the configuration."""
    if mode == modes.NONE:
        return (CaptureStep("mode", (), "graph mode NONE: nothing is captured"),)
    q, tp, src = decode_query_len, tensor_parallel, rules.sources
    steps: list[CaptureStep] = []
    if explicit is None:
        ceiling = max_capture_size or min(max_num_seqs * q, rules.default_ceiling_cap)
        ceiling = min(ceiling, max_num_batched_tokens)
        steps.append(CaptureStep("ceiling", (ceiling,), src["ceiling"]))
        sizes = grid(ceiling)
        if max_num_batched_tokens <= ceiling:
            sizes.append(max_num_batched_tokens)
        current = tuple(sorted(set(sizes)))
        steps.append(CaptureStep("grid", current, src["grid"]))
    else:
        current = tuple(sorted({s for s in explicit if s <= max_num_batched_tokens}))
        removed = tuple(sorted(set(explicit) - set(current)))
        steps.append(CaptureStep("grid", current, src["grid"] + " (explicit list, clipped)", removed))
    if tp > 1 and flashcomm1:
        kept = tuple(s for s in current if s % tp == 0)
        if not kept:
            raise PlanError(
                "capture_sizes", f"no capture size in {list(current)} is a multiple of TP {tp}, flashcomm1 needs one"
            )
        steps.append(CaptureStep("flashcomm1", kept, src["flashcomm1"], tuple(s for s in current if s % tp)))
        current = kept
    if modes.decode_mode(mode) == modes.FULL and q > 1:
        multiple = max(q, tp) if tp > 1 and flashcomm1 else q
        if multiple % q or (multiple % tp and tp > 1 and flashcomm1):
            raise PlanError(
                "speculative_tokens",
                f"no capture size is a multiple of both 1 + k = {q} and TP {tp} (flashcomm1); the engine refuses it",
            )
        largest = current[-1]
        rounded = tuple(sorted({_round_up(s, multiple) for s in current if _round_up(s, multiple) <= largest}))
        if not rounded and multiple <= largest:
            rounded = (multiple,)
        if not rounded:
            raise PlanError("capture_sizes", f"no capture size is left after rounding to a multiple of {multiple}")
        steps.append(
            CaptureStep("spec-decode", rounded, src["spec-decode"], tuple(sorted(set(current) - set(rounded))))
        )
        current = rounded
    if mode == modes.FULL_DECODE_ONLY:
        kept = tuple(s for s in current if q <= s <= max_num_seqs * q)
        steps.append(CaptureStep("decode-range", kept, src["decode-range"], tuple(sorted(set(current) - set(kept)))))
        current = kept
    else:
        steps.append(CaptureStep("decode-range", current, src["decode-range"] + " (mixed mode: every size)"))
    return tuple(steps)

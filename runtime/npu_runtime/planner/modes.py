"""Graph-mode resolution: the mode the engine will really run, and why it differs from the request.

`RULES` is the one table. Each rule names the engine code (or issue) it encodes; rules are
applied in the order the engine applies them (vLLM's VllmConfig.__post_init__, then the
platform's check_and_update_config, then the model runner's resolve_cudagraph_mode_and_sizes),
each to the mode the previous ones left. A rule that changes the mode yields one `Downgrade` with
a stable CamelCase reason. Cases the table does not know keep the mode and add a warning: the
planner never guesses silently.

Targets: vLLM 0.31 and vllm-ascend main of 2026-08 (commit 182b75ea).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from npu_runtime.contract import DEVICE_KINDS, GraphMode
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.probe import DeviceInfo, device_family

# The names of contract.GraphMode, as the plain strings that plans, reports and status carry.
NONE: Final = GraphMode.NONE.value
PIECEWISE: Final = GraphMode.PIECEWISE.value
FULL: Final = GraphMode.FULL.value
FULL_DECODE_ONLY: Final = GraphMode.FULL_DECODE_ONLY.value
FULL_AND_PIECEWISE: Final = GraphMode.FULL_AND_PIECEWISE.value

# CUDAGraphMode's structure (vllm/config/compilation.py): what decode batches and mixed batches run as.
_DECODE: Final = {
    NONE: NONE,
    PIECEWISE: PIECEWISE,
    FULL: FULL,
    FULL_DECODE_ONLY: FULL,
    FULL_AND_PIECEWISE: FULL,
}
_MIXED: Final = {
    NONE: NONE,
    PIECEWISE: PIECEWISE,
    FULL: FULL,
    FULL_DECODE_ONLY: NONE,
    FULL_AND_PIECEWISE: PIECEWISE,
}
# CUDAGraphMode.without_piecewise: what is left when piecewise graphs cannot be had.
_WITHOUT_PIECEWISE: Final = {PIECEWISE: NONE, FULL_AND_PIECEWISE: FULL_DECODE_ONLY}

# Architectures whose attention the table below describes (standard GQA/MHA or MLA decoders and
# the multimodal wrappers around them). Others keep their mode with a warning.
KNOWN_ARCHITECTURES: Final = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "LlavaForConditionalGeneration",
    }
)


def decode_mode(mode: str) -> str:
    """What a uniform decode batch runs as under `mode` (CUDAGraphMode.decode_mode)."""
    return _DECODE[mode]


def decode_mode_is_graph(mode: str) -> bool:
    """Whether uniform decode batches replay a graph under `mode`."""
    return _DECODE[mode] != NONE


def without_piecewise(mode: str) -> str:
    """PIECEWISE -> NONE, FULL_AND_PIECEWISE -> FULL_DECODE_ONLY; other modes stay."""
    return _WITHOUT_PIECEWISE.get(mode, mode)


def has_full_graphs(mode: str) -> bool:
    return FULL in (_DECODE[mode], _MIXED[mode])


def has_piecewise_graphs(mode: str) -> bool:
    return PIECEWISE in (_DECODE[mode], _MIXED[mode])


@dataclass(frozen=True)
class Downgrade:
    """One change of graph mode, with the reason the engine (or the plan) has for it."""

    from_mode: str
    to_mode: str
    reason: str
    """A stable CamelCase code, e.g. "CpuHasNoGraphs"."""
    message: str


@dataclass(frozen=True)
class ModeContext:
    """Everything the rules look at."""

    device_kind: str
    device_family: str
    architecture: str
    is_mla: bool
    is_encoder_decoder: bool
    is_pooling: bool
    enforce_eager: bool


# The modes a rule can name: every graph mode, and those that capture full graphs.
_GRAPHS: Final = frozenset(_DECODE) - {NONE}
_FULL_GRAPHS: Final = frozenset(m for m in _DECODE if has_full_graphs(m))


def _always(ctx: ModeContext) -> bool:
    return True


@dataclass(frozen=True)
class Rule:
    """On a device of `devices`, a mode of `changes` becomes `to` when `when` holds for the model and engine."""

    reason: str
    changes: frozenset[str]
    to: str | Mapping[str, str]
    """The mode it becomes, or that mode per device kind."""
    message: str
    source: str
    devices: frozenset[str] = frozenset(DEVICE_KINDS)
    when: Callable[[ModeContext], bool] = _always

    def applies(self, mode: str, ctx: ModeContext) -> bool:
        return ctx.device_kind in self.devices and mode in self.changes and self.when(ctx)

    def target(self, ctx: ModeContext) -> str:
        return self.to if isinstance(self.to, str) else self.to[ctx.device_kind]


RULES: Final[tuple[Rule, ...]] = (
    Rule(
        reason="CpuHasNoGraphs",
        devices=frozenset({"cpu"}),
        changes=_GRAPHS,
        to=NONE,
        message="the CPU platform has no static graphs; vLLM runs every step eagerly",
        source="vllm/config/vllm.py VllmConfig.__post_init__: support_static_graph_mode() is False "
        "(platforms/interface.py default; platforms/cpu.py does not override it) -> NONE",
    ),
    Rule(
        reason="EnforceEager",
        when=lambda ctx: ctx.enforce_eager,
        changes=_GRAPHS,
        to=NONE,
        message="--enforce-eager disables graph capture",
        source="vllm/config/vllm.py VllmConfig.__post_init__ ('Cudagraph is disabled under eager mode'); "
        "vllm_ascend/platform.py NPUPlatform.check_and_update_config (0.23.0; later in _update_compilation_modes)",
    ),
    Rule(
        reason="PoolingModelNoFullGraphs",
        devices=frozenset({"npu", "cuda"}),
        when=lambda ctx: ctx.is_pooling,
        changes=_FULL_GRAPHS,
        to=PIECEWISE,
        message="pooling models do not support full graphs",
        source="vllm/config/vllm.py VllmConfig.__post_init__ ('Pooling models do not support full cudagraphs')",
    ),
    Rule(
        reason="EncoderDecoderPiecewiseOnly",
        devices=frozenset({"npu"}),
        when=lambda ctx: ctx.is_encoder_decoder,
        changes=_GRAPHS - {PIECEWISE},
        to=PIECEWISE,
        message="vllm-ascend runs encoder-decoder models in PIECEWISE mode only",
        source="vllm_ascend/platform.py NPUPlatform.check_and_update_config ('Encoder-decoder models currently "
        "only support PIECEWISE mode'; 0.23.0, later moved to _update_compilation_modes)",
    ),
    Rule(
        reason="EncoderDecoderFullDecodeOnly",
        devices=frozenset({"cuda"}),
        when=lambda ctx: ctx.is_encoder_decoder,
        changes=_GRAPHS - {FULL_DECODE_ONLY},
        to=FULL_DECODE_ONLY,
        message="vLLM runs encoder-decoder models in FULL_DECODE_ONLY mode",
        source="vllm/config/vllm.py VllmConfig.__post_init__ ('Encoder-decoder models do not support ...')",
    ),
    Rule(
        reason="MlaNoMixedBatchGraphs",
        devices=frozenset({"npu", "cuda"}),
        when=lambda ctx: ctx.is_mla,
        changes=frozenset({FULL}),
        # resolve_cudagraph_mode_and_sizes: FULL_AND_PIECEWISE when the splitting ops contain attention,
        # else FULL_DECODE_ONLY. vllm-ascend empties splitting_ops for full-graph modes
        # (_setup_compile_backend); vLLM's default splitting ops on CUDA contain attention
        # (CompilationConfig.set_splitting_ops_for_v1).
        to={"npu": FULL_DECODE_ONLY, "cuda": FULL_AND_PIECEWISE},
        message="MLA attention supports full graphs for uniform decode batches only (UNIFORM_BATCH), "
        "not for mixed prefill-decode batches",
        source="vllm/config/compilation.py resolve_cudagraph_mode_and_sizes (mixed_mode FULL needs "
        "AttentionCGSupport.ALWAYS); vllm_ascend/attention/mla_v1.py AscendMLAMetadataBuilder."
        "get_cudagraph_support -> UNIFORM_BATCH; vllm/v1/attention/backends/mla/* (UNIFORM_BATCH)",
    ),
    Rule(
        reason="FlashAttention2NoMixedBatchGraphs",
        devices=frozenset({"cuda"}),
        when=lambda ctx: not ctx.is_mla and ctx.device_family == "ampere-ada",
        changes=frozenset({FULL}),
        to=FULL_AND_PIECEWISE,
        message="FlashAttention 2 supports full graphs for uniform batches only (UNIFORM_BATCH)",
        source="vllm/v1/attention/backends/flash_attn.py FlashAttentionMetadataBuilder._cudagraph_support "
        "(ALWAYS with FA3, UNIFORM_BATCH otherwise); compilation.py resolve_cudagraph_mode_and_sizes",
    ),
)


def resolve_mode(
    requested: str,
    *,
    device: DeviceInfo,
    model: ModelInfo,
    enforce_eager: bool = False,
) -> tuple[str, tuple[Downgrade, ...], tuple[str, ...]]:
    """(effective mode, downgrades in the order they happen, warnings for cases the table lacks)."""
    ctx = ModeContext(
        device_kind=device.kind,
        device_family=device_family(device),
        architecture=model.architecture,
        is_mla=model.is_mla,
        is_encoder_decoder=model.is_encoder_decoder,
        is_pooling=model.is_pooling,
        enforce_eager=enforce_eager,
    )
    mode = requested
    downgrades: list[Downgrade] = []
    for rule in RULES:
        if rule.applies(mode, ctx):
            target = rule.target(ctx)
            if target != mode:
                downgrades.append(Downgrade(mode, target, rule.reason, f"{mode} -> {target}: {rule.message}"))
                mode = target
    return mode, tuple(downgrades), _unknown_cases(mode, ctx)


def _unknown_cases(mode: str, ctx: ModeContext) -> tuple[str, ...]:
    """Warnings for what the table cannot decide: the mode is kept as it is."""
    if mode == NONE:
        return ()
    warnings: list[str] = []
    if ctx.architecture not in KNOWN_ARCHITECTURES:
        warnings.append(
            f"architecture {ctx.architecture} is not in the planner's table; its attention backend's graph "
            f"support is unknown, so {mode} is kept as requested"
        )
    if ctx.device_kind == "npu" and ctx.device_family == "unknown":
        warnings.append(
            "NPU family unknown (device name not 910B*, 910C/910_93*, 310P*, 950): vllm-ascend's "
            f"family-specific rules were not applied, {mode} kept"
        )
    if ctx.device_family == "310P" and mode not in (FULL_DECODE_ONLY,):
        # vllm-ascend docs, tutorials/hardwares/310p:
        # "supports FULL_DECODE_ONLY graph mode on Atlas 300I DUO".
        warnings.append(f"vllm-ascend documents only FULL_DECODE_ONLY graphs on 310P; {mode} is untested there")
    if ctx.device_kind == "cuda" and mode == FULL and ctx.device_family not in ("hopper", "ampere-ada"):
        warnings.append(
            "FULL graphs need an attention backend with AttentionCGSupport.ALWAYS; "
            f"on {ctx.device_family} GPUs "
            "the backend is not known here, so FULL is kept (the engine may switch to FULL_AND_PIECEWISE)"
        )
    return tuple(warnings)

"""LoRA adapters' device memory and graph capture cases, as vLLM 0.31 preallocates them (issue 47).

With --enable-lora vLLM wraps every LoRA-capable layer at start and allocates `max_loras` slots of
`max_lora_rank` for each (vllm/lora/model_manager.py LoRAModelManager._create_lora_modules ->
vllm/lora/utils.py from_layer -> each wrapper's create_lora_weights, with max_loras =
LoRAModelManager.lora_slots = lora_config.max_loras). The slots are torch.zeros on the device, held
for the engine's life, so they come out of the KV cache like the weights do. `max_cpu_loras` are
host copies (vllm/lora/model_manager.py LRUCacheLoRAModelManager) and cost no device memory.

Which layers are wrapped (vllm/lora/utils.py get_supported_lora_modules, is_supported_lora_module):
every LinearBase (so qkv_proj, o_proj, gate_up_proj, down_proj and the MoE router GateLinear, a
ReplicatedLinear), every MoERunner (the routed experts, vllm/lora/layers/fused_moe.py), and the
embeddings only when the model class lists them in `embedding_modules` (Qwen2ForCausalLM does not;
LlamaForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM do: `_EMBEDDING_LORA_ARCHITECTURES`).

The element counts per wrapper are in `_dense_attention`, `_dense_mlp`, `_moe_mlp` and
`_embeddings`, each citing its create_lora_weights. The dtype is lora_dtype "auto", the model's
(vllm/config/lora.py LoRAConfig.verify_with_model_config). Not counted: the punica wrapper's
index buffers (max_num_batched_tokens ints, vllm/lora/punica_wrapper/punica_base.py) and the
shrink kernels' scratch (tokens x rank per slice): kilobytes to a few MiB.

Capture cases: each graph is captured once per LoRA case (`capture_cases`).

Pure: no torch, no vllm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import modes
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.modes import Downgrade
from npu_runtime.planner.releases import ReleaseRules

__all__ = [
    "DEFAULT_MAX_LORA_RANK",
    "MAX_LORA_RANKS",
    "LoraMemory",
    "LoraTerm",
    "capture_cases",
    "lora_memory",
    "release_check",
]

# vllm/config/lora.py LoRAConfig.max_lora_rank: the default, and the ranks vLLM accepts (MaxLoRARanks).
DEFAULT_MAX_LORA_RANK: Final = 16
MAX_LORA_RANKS: Final = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vllm/lora/layers/logits_processor.py LogitsProcessorWithLoRA.create_lora_weights: "When using
# LoRA, vocab size must be <= 258048" (only where the lm_head is LoRA'd).
MAX_LORA_VOCAB: Final = 258048
# Model classes whose `embedding_modules` name embed_tokens and lm_head (grep '"lm_head":
# "output_embeddings"' in vllm/model_executor/models/*.py): their embeddings and lm_head get LoRA slots.
_EMBEDDING_LORA_ARCHITECTURES: Final = frozenset(
    {
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "MixtralForCausalLM",
        "GraniteForCausalLM",
        "MiniCPMForCausalLM",
        "NemotronForCausalLM",
        "PhiMoEForCausalLM",
    }
)
# Model classes with is_3d_moe_weight = True (vllm/model_executor/models/*.py): FusedMoE3DWithLoRA,
# one fused w13 slice.
_MOE_3D_ARCHITECTURES: Final = frozenset({"GptOssForCausalLM", "Qwen3VLMoeForConditionalGeneration"})


@dataclass(frozen=True)
class LoraTerm:
    """One wrapped module on one device: its wrapper, how many of it, and the elements of one."""

    module: str
    wrapper: str
    """The vllm/lora/layers class that allocates it."""
    count: int
    """Layers holding it on this device (1 for the embeddings)."""
    elements: int
    """lora_a + lora_b elements of one module, all max_loras slots and slices together."""
    bytes: int


@dataclass(frozen=True)
class LoraMemory:
    """The adapters' device memory: max_loras slots of max_lora_rank for every wrapped module."""

    bytes: int
    max_loras: int
    max_lora_rank: int
    dtype_bytes: int
    fully_sharded: bool
    capture_cases: int
    """Graphs captured per capture size (`capture_cases`)."""
    terms: tuple[LoraTerm, ...]


@dataclass(frozen=True)
class _Dims:
    """The per-device widths the wrappers see (vLLM's *_per_partition sizes)."""

    slots: int
    rank: int
    rank_a: int
    """lora_a's rank dimension: rank, or rank / TP with fully_sharded_loras (column-parallel A)."""
    tp: int
    fully_sharded: bool


def capture_cases(max_loras: int | None, *, specialize: bool = True, specialize_active: bool = False) -> int:
    """Graphs captured per capture size: vllm/v1/cudagraph_dispatcher.py CudagraphDispatcher._get_lora_cases
    (the V1 runner, which vllm-ascend's NPUModelRunner extends): no LoRA [0]; with
    compilation_config.cudagraph_specialize_lora (default True) [0] + get_captured_lora_counts, else
    [max_loras + 1]. vllm/lora/utils.py get_captured_lora_counts: [max_loras + 1], or with
    lora_config.specialize_active_lora (default False) the powers of 2 up to max_loras plus max_loras + 1.
    (The V2 runner's vllm/v1/worker/gpu/lora_utils.py get_lora_capture_cases returns [0, max_loras + 1]
    without specialization: 2 there, 1 here.)"""
    if max_loras is None:
        return 1
    if not specialize:
        return 1
    if not specialize_active:
        return 2
    counts = [n for n in range(1, max_loras + 2) if (n & (n - 1)) == 0 or n == max_loras + 1]
    return 1 + len(counts)


def lora_memory(options: PlanOptions, model: ModelInfo, layout: Layout, dtype_bytes: int) -> LoraMemory | None:
    """The adapters' bytes on one device (the busiest PP stage); None when LoRA is off.

    PlanError (naming the flag) where vLLM refuses the configuration at start."""
    if options.max_loras is None:
        return None
    rank = options.max_lora_rank if options.max_lora_rank is not None else DEFAULT_MAX_LORA_RANK
    _check(options, model, layout, rank)
    tp = options.tensor_parallel
    dims = _Dims(
        slots=options.max_loras,
        rank=rank,
        rank_a=rank // tp if options.fully_sharded_loras else rank,
        tp=tp,
        fully_sharded=options.fully_sharded_loras,
    )
    layers = math.ceil(model.num_layers / options.pipeline_parallel)
    moe_layers = max(layers - model.dense_layers, 0) if model.is_moe else 0
    raw = [
        *_dense_attention(model, dims, layers),
        *_dense_mlp(model, dims, layers - moe_layers),
        *_moe_mlp(model, dims, layout, moe_layers),
        *_embeddings(model, dims),
    ]
    terms = tuple(
        LoraTerm(name, wrapper, count, elements, count * elements * dtype_bytes)
        for name, wrapper, count, elements in raw
        if count > 0
    )
    return LoraMemory(
        bytes=sum(t.bytes for t in terms),
        max_loras=options.max_loras,
        max_lora_rank=rank,
        dtype_bytes=dtype_bytes,
        fully_sharded=options.fully_sharded_loras,
        capture_cases=capture_cases(options.max_loras),
        terms=terms,
    )


def _check(options: PlanOptions, model: ModelInfo, layout: Layout, rank: int) -> None:
    """What vLLM refuses at start (each check cites the line that raises)."""
    if rank not in MAX_LORA_RANKS:
        # vllm/config/lora.py LoRAConfig.max_lora_rank: MaxLoRARanks, a Literal pydantic validates.
        raise PlanError("max_lora_rank", f"{rank} is not one of vLLM's ranks {', '.join(map(str, MAX_LORA_RANKS))}")
    if options.max_cpu_loras is not None and options.max_cpu_loras < (options.max_loras or 0):
        # vllm/config/lora.py LoRAConfig._validate_lora_config.
        raise PlanError(
            "max_cpu_loras", f"max_cpu_loras ({options.max_cpu_loras}) must be >= max_loras ({options.max_loras})"
        )
    if options.fully_sharded_loras and rank % options.tensor_parallel:
        # vllm/lora/layers/base_linear.py create_lora_weights: divide(max_lora_rank, tp_size) asserts.
        raise PlanError(
            "fully_sharded_loras", f"max_lora_rank {rank} is not divisible by tensor parallel {options.tensor_parallel}"
        )
    if options.fully_sharded_loras and layout.expert_parallel:
        # vllm/lora/layers/fused_moe.py FusedMoEWithLoRA._verify_ep_fs asserts.
        raise PlanError("fully_sharded_loras", "vLLM's MoE LoRA does not support it together with expert parallel")
    if model.architecture in _EMBEDDING_LORA_ARCHITECTURES and model.vocab_size > MAX_LORA_VOCAB:
        raise PlanError("max_loras", f"with LoRA vLLM needs vocab size <= {MAX_LORA_VOCAB}, got {model.vocab_size}")
    if model.is_mla:
        # Not modelled: DeepSeek's MLA projections (fused_qkv_a_proj, q_b_proj, kv_b_proj) are wrapped
        # too; refused rather than under-counted.
        raise PlanError("max_loras", "the planner does not model LoRA memory for MLA models (DeepSeek) yet")


def _kv_heads_per_rank(model: ModelInfo, tp: int) -> int:
    # vllm/model_executor/layers/linear.py QKVParallelLinear: num_kv_heads = max(1, total // tp)
    # (heads are replicated when TP exceeds them).
    return max(1, model.num_kv_heads // tp)


def _dense_attention(model: ModelInfo, d: _Dims, layers: int) -> list[tuple[str, str, int, int]]:
    """qkv_proj and o_proj, per layer.

    qkv_proj: MergedQKVParallelLinearWithLoRA (packed q, k, v: 3 slices; vllm/lora/layers/
    column_parallel_linear.py MergedColumnParallelLinearWithLoRA.create_lora_weights): lora_a per slice
    (max_loras, 1, rank_a, hidden), lora_b per slice (max_loras, 1, slice_out, rank) with the slices
    (q heads x head_dim / TP, kv heads per rank x head_dim twice).
    o_proj: RowParallelLinearWithLoRA (vllm/lora/layers/base_linear.py create_lora_weights, input =
    input_size_per_partition in row_parallel_linear.py): lora_a (max_loras, 1, rank, heads x head_dim / TP),
    lora_b (max_loras, 1, hidden (/ TP fully sharded), rank).
    """
    hidden, head_dim = model.hidden_size, model.head_dim
    q_out = model.num_attention_heads * head_dim // d.tp
    kv_out = _kv_heads_per_rank(model, d.tp) * head_dim
    qkv = d.slots * (3 * d.rank_a * hidden + (q_out + 2 * kv_out) * d.rank)
    o = d.slots * (d.rank * q_out + _row_out(hidden, d) * d.rank)
    return [
        ("qkv_proj", "MergedQKVParallelLinearWithLoRA", layers, qkv),
        ("o_proj", "RowParallelLinearWithLoRA", layers, o),
    ]


def _row_out(output: int, d: _Dims) -> int:
    # vllm/lora/layers/base_linear.py create_lora_weights: a RowParallelLinear's lora_b output is
    # divided by TP only with fully_sharded_loras.
    return output // d.tp if d.fully_sharded else output


def _dense_mlp(model: ModelInfo, d: _Dims, layers: int) -> list[tuple[str, str, int, int]]:
    """gate_up_proj (MergedColumnParallelLinearWithLoRA, 2 slices: lora_a (max_loras, 1, rank_a,
    hidden), lora_b (max_loras, 1, intermediate / TP, rank) each) and down_proj (RowParallelLinearWithLoRA:
    lora_a (max_loras, 1, rank, intermediate / TP), lora_b (max_loras, 1, hidden, rank)); same sources
    as `_dense_attention`."""
    hidden, inter = model.hidden_size, model.intermediate_size // d.tp
    gate_up = d.slots * 2 * (d.rank_a * hidden + inter * d.rank)
    down = d.slots * (d.rank * inter + _row_out(hidden, d) * d.rank)
    return [
        ("gate_up_proj", "MergedColumnParallelLinearWithLoRA", layers, gate_up),
        ("down_proj", "RowParallelLinearWithLoRA", layers, down),
    ]


def _moe_mlp(model: ModelInfo, d: _Dims, layout: Layout, layers: int) -> list[tuple[str, str, int, int]]:
    """The routed experts and the router, per MoE layer.

    experts: FusedMoEWithLoRA (vllm/lora/layers/fused_moe.py _create_lora_a_weights,
    _create_lora_b_weights), with E = local experts, I = moe_intermediate / the MoE TP size
    (moe_parallel_config.tp_size: 1 under EP) and w13 slices = 2 (gate, up):
    w13 lora_a slices x (max_loras, E, rank_a, hidden), w2 lora_a (max_loras, E, rank, I),
    w13 lora_b slices x (max_loras, E, I, rank), w2 lora_b (max_loras, E, hidden (/ TP fs), rank).
    FusedMoE3DWithLoRA (is_3d_moe_weight models): one w13 slice whose lora_b is (max_loras, E, 2 I, rank).
    gate: GateLinear is a ReplicatedLinear -> ReplicatedLinearWithLoRA (base_linear.py
    create_lora_weights): lora_a (max_loras, 1, rank, hidden), lora_b (max_loras, 1, experts, rank).
    Shared experts (Qwen2-MoE, DeepSeek) are dense MLPs LoRA'd too; ModelInfo has not their width, so
    they are not counted.
    """
    if layers == 0 or not model.num_experts:
        return []
    hidden, rank, moe_tp = model.hidden_size, d.rank, layout.moe_tensor_parallel
    local = layout.experts_per_rank or model.num_experts
    inter = (model.moe_intermediate_size or model.intermediate_size) // moe_tp
    rank_a = rank // moe_tp if d.fully_sharded else rank
    w2_b_out = hidden // moe_tp if d.fully_sharded else hidden
    w2 = local * (rank * inter + w2_b_out * rank)
    if model.architecture in _MOE_3D_ARCHITECTURES:
        wrapper, w13 = "FusedMoE3DWithLoRA", local * (rank_a * hidden + 2 * inter * rank)
    else:
        wrapper, w13 = "FusedMoEWithLoRA", 2 * local * (rank_a * hidden + inter * rank)
    gate = d.slots * (rank * hidden + model.num_experts * rank)
    return [
        ("experts", wrapper, layers, d.slots * (w13 + w2)),
        ("gate", "ReplicatedLinearWithLoRA", layers, gate),
    ]


def _embeddings(model: ModelInfo, d: _Dims) -> list[tuple[str, str, int, int]]:
    """embed_tokens (VocabParallelEmbeddingWithLoRA: lora_a (max_loras, vocab, rank), lora_b
    (max_loras, 1, hidden, rank); vllm/lora/layers/vocab_parallel_embedding.py create_lora_weights)
    and lm_head (LogitsProcessorWithLoRA: lora_a (max_loras, 1, rank, hidden), lora_b (max_loras, 1,
    vocab, rank), unsharded; vllm/lora/layers/logits_processor.py create_lora_weights), for the model
    classes that list them in embedding_modules. Counted on every device (the busiest PP stage is
    taken to hold both)."""
    if model.architecture not in _EMBEDDING_LORA_ARCHITECTURES:
        return []
    vocab, hidden, rank = model.vocab_size, model.hidden_size, d.rank
    embed = d.slots * (vocab * rank + hidden * rank)
    head = d.slots * (rank * hidden + vocab * rank)
    return [
        ("embed_tokens", "VocabParallelEmbeddingWithLoRA", 1, embed),
        ("lm_head", "LogitsProcessorWithLoRA", 1, head),
    ]


def release_check(
    options: PlanOptions,
    model: ModelInfo,
    layout: Layout,
    rules: ReleaseRules,
    mode: str,
    fused_mc2: int,
    resolve_mode: bool,
    warnings: list[str],
) -> tuple[str, Downgrade | None]:
    """(the graph mode, its downgrade) under the vllm-ascend release's LoRA rules (`ReleaseRules`
    lora_tp_graphs, moe_lora_ep, with their sources); PlanError naming --max-loras where the
    release cannot serve LoRA for this model at all. Call on NPU plans only."""
    if options.max_loras is None:
        return mode, None
    src = rules.sources
    if model.is_moe:
        if model.quantization is not None:
            raise PlanError(
                "max_loras", f"vllm-ascend {rules.release} runs MoE LoRA non-quantized only ({src['moe-lora']})"
            )
        if fused_mc2:
            raise PlanError("max_loras", f"vllm-ascend's MoE LoRA does not support fused MC2 ({src['moe-lora']})")
        if layout.expert_parallel and not rules.moe_lora_ep:
            raise PlanError(
                "max_loras",
                f"vllm-ascend {rules.release} runs MoE LoRA without expert parallel only ({src['moe-lora']})",
            )
    if options.tensor_parallel == 1 or rules.lora_tp_graphs or mode == modes.NONE:
        return mode, None
    message = (
        f"{mode} -> {modes.NONE}: LoRA with tensor parallel {options.tensor_parallel} fails in graph mode on "
        f"vllm-ascend {rules.release} ({src['lora-tp-graphs']})"
    )
    if not resolve_mode:
        warnings.append(f"expect the engine to fail: {message}")
        return mode, None
    return modes.NONE, Downgrade(mode, modes.NONE, "LoraTensorParallelGraphs", message)

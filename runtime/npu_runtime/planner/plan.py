"""The plan: graph mode, capture sizes, memory and streams, decided before the model loads.

`make_plan(options, device, model)` is pure (no I/O, no clock): it resolves the graph mode
(`modes.RULES`), lists the capture sizes that cover every decode batch up to max_num_seqs
(`sizes.covering_sizes`), fits them to device memory and, on NPUs, to the ACL graph stream
budget, and returns the vLLM arguments that carry the decision. `plan_for(options, path)` adds
the probe and the model inspection.

Memory model, per device (all figures in bytes; see docs/planner.md):

    budget     = total * gpu_memory_utilization
    budget    >= weights + activation + margin + graphs + kv_cache
    graphs     = first_capture + (sizes - 1) * per_size          (vLLM's profile_cudagraph_memory)
    kv_cache   = what remains; it must hold at least one max_model_len sequence

Weights are measured (safetensors) or estimated (shape); activation, margin and graphs are
estimates; the engine measures them again at startup.

Errors: `PlanError` for invalid input (exit 2, `.field` names the option), `DoesNotFitError` when
the model cannot fit (exit 3, the message gives the numbers).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from npu_runtime.contract import DEVICE_KINDS, GIB, GRAPH_MODES, KIB, MIB, PlanError, PlanOptions, format_gib
from npu_runtime.planner import modes, sizes
from npu_runtime.planner.model import (
    ASCEND_QUANTIZATION,
    DTYPE_BYTES,
    MODELSLIM_DESCRIPTION,
    ModelInfo,
    canonical_dtype,
    inspect_model,
)
from npu_runtime.planner.modes import Downgrade
from npu_runtime.planner.probe import DeviceInfo, device_family, device_from_options

__all__ = [
    "DEFAULT_STREAM_BUDGET",
    "DEVICE_STREAMS",
    "DoesNotFitError",
    "Layout",
    "MemoryPlan",
    "NodeShare",
    "Plan",
    "PlanError",
    "StreamPlan",
    "largest_decode_batch",
    "make_plan",
    "node_engine_args",
    "plan_for",
]

# vllm-ascend's historical ACL graph budget: "we can only capture 1800 graphs at most ... bounded by
# the number of streams, which is 2048, we save 248 streams as a buffer" (vllm_ascend/utils.py
# update_aclgraph_sizes, removed in #9962 after newer HDK/CANN stacks raised the limit).
DEFAULT_STREAM_BUDGET: Final = 1800
DEVICE_STREAMS: Final = 2048
# Non-AIV HCCL expansion: each communication group costs about 40 streams up front (same source).
_STREAMS_PER_COMM_GROUP: Final = 40
# 310P with TP > 1: hardware event ids limit the graphs; vllm-ascend's 310P guide reports that
# Qwen3-32B "can capture and replay 2 graphs" (docs/.../tutorials/hardwares/310p). No limit at TP=1.
_310P_TP_MAX_SIZES: Final = 2
# A5 (950) PIECEWISE: vllm_ascend/platform.py _prune_capture_sizes_for_950 keeps 4 sizes.
_A5_PIECEWISE_MAX_SIZES: Final = 4

# vLLM's speculative methods that run the checkpoint's own MTP layers as the draft model
# (vllm/config/speculative.py: "mtp" and the per-architecture *_mtp names).
MTP_METHODS: Final = frozenset({"mtp", "deepseek_mtp"})

# Estimates (docs/planner.md says where each comes from).
_ACTIVATION_WORKSPACE: Final = 256 * MIB  # kernels' workspaces, allocator slack during profile_run
_NON_TORCH_BASE: Final = 512 * MIB  # runtime context (ACL/CUDA), not seen by the torch allocator
_COMM_BUFFERS: Final = 400 * MIB  # HCCL_BUFFSIZE default 200 MB, in and out, per communication group
_NPU_REDUNDANCY: Final = 150 * MIB  # vllm_ascend/worker/worker.py: "A 150 MiB buffer is kept"
_GRAPH_POOL_OVERHEAD: Final = 64 * MIB  # graph pool bookkeeping and attention metadata buffers
_PER_GRAPH_MIN: Final = 1 * MIB  # vLLM: "Use at least 1 MiB per graph for driver overhead"
_PER_PIECE: Final = 256 * KIB  # one piecewise sub-graph


class DoesNotFitError(Exception):
    """The model cannot run on this device as configured: the CLI exits 3; the message has the numbers."""


@dataclass(frozen=True)
class MemoryPlan:
    """Per-device memory, in bytes. weights + activation + margin + graph + kv_cache <= budget."""

    total_bytes: int
    budget_bytes: int
    """total * gpu_memory_utilization: what the engine may use."""
    weights_bytes: int
    kv_cache_bytes: int
    graph_bytes: int
    activation_bytes: int
    margin_bytes: int
    """Non-torch memory (runtime context, communication buffers) and a safety buffer."""
    free_bytes: int | None
    weights_source: str
    graph_first_capture_bytes: int
    graph_per_size_bytes: int
    kv_bytes_per_token: int
    kv_cache_tokens: int
    min_kv_cache_bytes: int
    """One sequence of max_model_len: the engine refuses to start with less."""
    full_kv_cache_bytes: int
    """max_num_seqs sequences of max_model_len each."""
    engine_gpu_memory_utilization: float
    """The value passed to vLLM: lower than requested when the plan, not the engine, reserves the graphs."""
    graph_reserved_by: str
    """"engine" (vLLM deducts its own graph estimate), "plan" (the utilisation is lowered) or "none"."""


@dataclass(frozen=True)
class StreamPlan:
    """ACL graph streams per device (NPU only): estimate <= budget."""

    applies: bool
    budget: int
    device_streams: int
    per_size: int
    fixed: int
    estimate: int
    max_sizes: int | None
    hccl_op_expansion_mode: str
    communication_groups: int
    formula: str


@dataclass(frozen=True)
class NodeShare:
    """What one node of a replica runs (`vllm serve` flags of vLLM's multi-node data parallel launcher)."""

    node: int
    role: str
    """"leader" (the API server and its local DP ranks) or "worker" (--headless, DP ranks only)."""
    data_parallel_start_rank: int
    data_parallel_ranks: tuple[int, ...]
    devices: int


@dataclass(frozen=True)
class Layout:
    """How one replica's ranks are laid out over its nodes, and how its MoE layers are split.

    vLLM groups the DP x TP ranks of a PP stage for MoE layers (vllm/model_executor/layers/fused_moe/
    config.py FusedMoEParallelConfig.make: "flatten TP across DP"): with --enable-expert-parallel
    each rank owns whole experts (EP size = DP x TP), without it every expert is tensor-sliced
    over the same DP x TP ranks (vllm_ascend/xlite/xlite.py: moe_ep_size / moe_tp_size).
    """

    nodes: int
    devices_per_node: int
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    data_parallel_local: int
    expert_parallel: bool
    """EP in effect: requested, and a MoE model with DP x TP > 1."""
    moe_ranks: int
    """DP x TP: the ranks a MoE layer is split over (1 for dense models)."""
    ep_size: int
    moe_tensor_parallel: int
    experts_per_rank: int | None
    """Routed experts one device holds (the busiest EP rank: ceil(experts / EP)); None for dense models."""
    per_node: tuple[NodeShare, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: lists, not tuples."""
        data = dataclasses.asdict(self)
        data["per_node"] = [
            {**dataclasses.asdict(share), "data_parallel_ranks": list(share.data_parallel_ranks)}
            for share in self.per_node
        ]
        return data


@dataclass(frozen=True)
class Plan:
    """What the runtime will ask vLLM for, and why. `to_dict()` is the JSON of `npu-runtime plan --json`."""

    requested_mode: str
    effective_mode: str
    capture_sizes: tuple[int, ...]
    downgrades: tuple[Downgrade, ...]
    memory: MemoryPlan
    streams: StreamPlan
    vllm_args: tuple[str, ...]
    warnings: tuple[str, ...]
    device: DeviceInfo
    model: ModelInfo
    mode_resolved_by: str
    """"plan" or "engine" (serve --engine-resolves-mode: the requested mode goes to vLLM unchanged)."""
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    decode_query_len: int
    max_capture_size: int
    """The ceiling: the largest decode batch, in tokens, that the plan covers with a graph."""
    eager_decode_batches: tuple[int, int] | None
    """Decode batches (first, last, in requests) that run eagerly although graphs are on."""
    dtype: str
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    layout: Layout
    quantization: str | None
    """The --quantization vLLM gets (requested, else detected from the checkpoint)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested_mode": self.requested_mode,
            "effective_mode": self.effective_mode,
            "mode_resolved_by": self.mode_resolved_by,
            "capture_sizes": list(self.capture_sizes),
            "max_capture_size": self.max_capture_size,
            "eager_decode_batches": list(self.eager_decode_batches) if self.eager_decode_batches else None,
            "downgrades": [dataclasses.asdict(d) for d in self.downgrades],
            "memory": dataclasses.asdict(self.memory),
            "streams": dataclasses.asdict(self.streams),
            "vllm_args": list(self.vllm_args),
            "warnings": list(self.warnings),
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "decode_query_len": self.decode_query_len,
            "dtype": self.dtype,
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "data_parallel": self.data_parallel,
            "layout": self.layout.to_dict(),
            "quantization": self.quantization,
            "device": dataclasses.asdict(self.device),
            "model": self.model.summary(),
        }


def plan_for(
    options: PlanOptions,
    model_path: str,
    *,
    resolve_mode: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Plan:
    """Inspect the model, probe the device (or take the overrides), plan (see `make_plan`).

    The model first: reading its config is fast, a probe may take long. `environ` None means
    os.environ. Raises ModelError, PlanError (the probe's DeviceError is one) or DoesNotFitError.
    """
    model = inspect_model(model_path)
    device = device_from_options(options)
    return make_plan(
        options, device, model, resolve_mode=resolve_mode, environ=os.environ if environ is None else environ
    )


def make_plan(
    options: PlanOptions,
    device: DeviceInfo,
    model: ModelInfo,
    *,
    resolve_mode: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Plan:
    """The plan for `model` on `device`. Pure.

    resolve_mode=False: the requested mode goes to the engine unchanged (serve's
    --engine-resolves-mode); the rules' expected downgrades become warnings and the capture
    sizes are still planned. `environ` holds the variables the engine reads that change the plan
    (HCCL_OP_EXPANSION_MODE, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, ...); None means none set.
    """
    env = dict(environ or {})
    family = device_family(device)
    dtype = _dtype(options, model, family)
    _validate(options, device, model, family, dtype, env)
    warnings: list[str] = []
    max_model_len = _max_model_len(options, model, env, warnings)
    layout = _layout(options, device, model, warnings)
    quantization = _quantization(options, model, warnings)

    requested = options.graph_mode
    predicted, downgrades_list, mode_warnings = modes.resolve_mode(
        requested, device=device, model=model, enforce_eager=options.enforce_eager
    )
    warnings += mode_warnings
    downgrades = list(downgrades_list)
    if resolve_mode:
        mode = predicted
    else:
        mode = requested
        warnings += [f"the engine is expected to downgrade {d.message} ({d.reason})" for d in downgrades]
        downgrades = []

    q = 1 + options.speculative_tokens
    ceiling, candidates = _candidate_sizes(options, mode, q, warnings)
    batched_tokens = _batched_tokens(options, ceiling)

    fit_warnings: list[str] = []
    budget = _budget(
        options=options,
        device=device,
        model=model,
        family=family,
        env=env,
        candidates=candidates,
        dtype=dtype,
        max_model_len=max_model_len,
        batched_tokens=batched_tokens,
        resolve_mode=resolve_mode,
        layout=layout,
        warnings=fit_warnings,
    )
    fit = _fit(budget, mode, fit_warnings)
    warnings += fit.warnings
    downgrades += fit.downgrades
    mode = fit.mode

    eager: tuple[int, int] | None = None
    if modes.decode_mode_is_graph(mode):
        missed = sizes.uncovered(fit.sizes, options.max_num_seqs, q)
        if missed:
            eager = (missed.start, missed.stop - 1)
            warnings.append(
                f"decode batches of {eager[0]}..{eager[1]} requests are above the largest captured size "
                f"{max(fit.sizes)} and run eagerly"
            )

    vllm_args = _vllm_args(options, mode, fit.sizes, fit.memory, dtype, max_model_len, batched_tokens, layout)
    if quantization is not None and (options.quantization or quantization == ASCEND_QUANTIZATION):
        # vLLM reads a config's quantization_config itself; ModelSlim checkpoints are named, as
        # vllm-ascend's tutorials do (--quantization ascend).
        vllm_args += ("--quantization", quantization)
    return Plan(
        requested_mode=requested,
        effective_mode=mode,
        capture_sizes=fit.sizes,
        downgrades=tuple(downgrades),
        memory=fit.memory,
        streams=fit.streams,
        vllm_args=vllm_args,
        warnings=tuple(warnings),
        device=device,
        model=model,
        mode_resolved_by="plan" if resolve_mode else "engine",
        max_num_seqs=options.max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched_tokens,
        decode_query_len=q,
        max_capture_size=max(fit.sizes, default=0),
        eager_decode_batches=eager,
        dtype=dtype,
        tensor_parallel=options.tensor_parallel,
        pipeline_parallel=options.pipeline_parallel,
        data_parallel=options.data_parallel,
        layout=layout,
        quantization=quantization,
    )


# -- validation ------------------------------------------------------------------------------------


def _validate(
    options: PlanOptions, device: DeviceInfo, model: ModelInfo, family: str, dtype: str, env: dict[str, str]
) -> None:
    """Raise PlanError for invalid input; `dtype` is the resolved one (`_dtype`)."""
    if options.graph_mode not in GRAPH_MODES:
        raise PlanError("graph_mode", f"{options.graph_mode!r} is not one of {', '.join(GRAPH_MODES)}")
    if device.kind not in DEVICE_KINDS:
        raise PlanError("device_kind", f"{device.kind!r} is not one of {', '.join(DEVICE_KINDS)}")
    for field in ("max_num_seqs", "tensor_parallel", "pipeline_parallel", "data_parallel", "nodes"):
        if getattr(options, field) < 1:
            raise PlanError(field, f"must be a positive integer, got {getattr(options, field)}")
    if options.max_capture_size is not None and options.max_capture_size < 1:
        raise PlanError("max_capture_size", f"must be a positive integer, got {options.max_capture_size}")
    if options.max_model_len is not None and options.max_model_len < 1:
        raise PlanError("max_model_len", f"must be a positive integer, got {options.max_model_len}")
    if not 0.0 < options.gpu_memory_utilization <= 1.0:
        raise PlanError("gpu_memory_utilization", f"must be in (0, 1], got {options.gpu_memory_utilization}")
    if options.stream_budget is not None and options.stream_budget < 1:
        raise PlanError("stream_budget", f"must be a positive integer, got {options.stream_budget}")
    if options.speculative_tokens < 0:
        raise PlanError("speculative_tokens", f"must be zero or more, got {options.speculative_tokens}")
    if options.speculative_tokens and not options.speculative_method:
        raise PlanError("speculative_method", "speculative tokens are set but no speculative method (e.g. mtp, ngram)")
    if options.speculative_method and not options.speculative_tokens:
        raise PlanError("speculative_tokens", f"speculative method {options.speculative_method!r} needs a token count")
    if device.total_bytes < 1:
        raise PlanError("device_memory", f"must be positive, got {device.total_bytes}")
    world = options.tensor_parallel * options.pipeline_parallel * options.data_parallel
    if options.nodes > 1:
        # vLLM's multi-node data parallel launcher (--data-parallel-size-local, --headless): every
        # node runs whole DP ranks, so a DP rank's TP x PP devices never span nodes.
        if options.data_parallel % options.nodes:
            raise PlanError(
                "data_parallel",
                f"{options.data_parallel} data-parallel ranks cannot be split evenly over {options.nodes} nodes; "
                "each node runs whole ranks (--data-parallel-size-local)",
            )
        if device.kind != "cpu" and options.tensor_parallel * options.pipeline_parallel > device.count:
            raise PlanError(
                "tensor_parallel",
                f"tensor {options.tensor_parallel} x pipeline {options.pipeline_parallel} spans more than one "
                f"node's {device.count} devices; across nodes use data parallel ranks",
            )
    if device.kind != "cpu" and world > device.count * options.nodes:
        raise PlanError(
            "tensor_parallel",
            f"tensor {options.tensor_parallel} x pipeline {options.pipeline_parallel} x data "
            f"{options.data_parallel} = {world} devices, but {device.count} are visible"
            + (f" on each of {options.nodes} nodes" if options.nodes > 1 else ""),
        )
    # vllm/config/parallel.py / model.py verify_with_parallel_config: heads must split evenly.
    if model.num_attention_heads % options.tensor_parallel:
        raise PlanError(
            "tensor_parallel",
            f"{model.num_attention_heads} attention heads cannot be split over {options.tensor_parallel} ranks",
        )
    if options.pipeline_parallel > model.num_layers:
        raise PlanError("pipeline_parallel", f"{options.pipeline_parallel} stages for {model.num_layers} layers")
    if family == "310P" and model.is_mla:
        # vllm_ascend/_310p/model_runner_310p.py initialize_kv_cache_tensors:
        # "MLAAttention is not supported for 310P."
        raise PlanError("model", f"{model.architecture} uses MLA attention, which vllm-ascend does not support on 310P")
    if family == "310P" and dtype == "bfloat16":
        # vllm-ascend tutorials (Qwen3.5-27B, PaddleOCR-VL): "On Atlas 300I DUO, only float16 is supported."
        raise PlanError("dtype", "310P supports float16 only, not bfloat16")
    if (
        device.kind == "npu"
        and env.get("ASCEND_LAUNCH_BLOCKING", "0") == "1"
        and options.graph_mode != modes.NONE
        and not options.enforce_eager
    ):
        # vllm_ascend/platform.py _setup_compile_backend raises:
        # "ACL graph is incompatible with ASCEND_LAUNCH_BLOCKING=1".
        raise PlanError("ASCEND_LAUNCH_BLOCKING", "ACL graphs are incompatible with ASCEND_LAUNCH_BLOCKING=1; unset it")


def _layout(options: PlanOptions, device: DeviceInfo, model: ModelInfo, warnings: list[str]) -> Layout:
    """The replica's ranks per node and its MoE split (see `Layout`)."""
    tp, pp, dp, nodes = options.tensor_parallel, options.pipeline_parallel, options.data_parallel, options.nodes
    moe_ranks = dp * tp if model.is_moe else 1
    ep = options.enable_expert_parallel and moe_ranks > 1
    if options.enable_expert_parallel and not model.is_moe:
        warnings.append(f"--enable-expert-parallel has no effect: {model.architecture} has no experts")
    experts_per_rank = None
    if model.is_moe and model.num_experts:
        # vllm/model_executor/layers/fused_moe/layer.py determine_expert_map: the first
        # experts % EP ranks get one more expert.
        experts_per_rank = -(-model.num_experts // moe_ranks) if ep else model.num_experts
        if ep and model.num_experts % moe_ranks:
            warnings.append(
                f"{model.num_experts} experts do not divide evenly over EP {moe_ranks}: the busiest rank holds "
                f"{experts_per_rank}"
            )
    local = dp // nodes if nodes > 1 else dp
    per_node = tuple(
        NodeShare(
            node=n,
            role="leader" if n == 0 else "worker",
            data_parallel_start_rank=n * local,
            data_parallel_ranks=tuple(range(n * local, (n + 1) * local)),
            devices=local * tp * pp,
        )
        for n in range(nodes)
    )
    return Layout(
        nodes=nodes,
        devices_per_node=device.count,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        data_parallel_local=local,
        expert_parallel=ep,
        moe_ranks=moe_ranks,
        ep_size=moe_ranks if ep else 1,
        moe_tensor_parallel=1 if ep else moe_ranks,
        experts_per_rank=experts_per_rank,
        per_node=per_node,
    )


def _quantization(options: PlanOptions, model: ModelInfo, warnings: list[str]) -> str | None:
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


def node_engine_args(layout: Layout, node: int, address: str, rpc_port: int) -> tuple[str, ...]:
    """vLLM's multi-node data parallel flags for one node of the replica (none on a single node).

    As vllm-ascend's DeepSeek-R1 tutorial runs two nodes: every node --data-parallel-size-local,
    --data-parallel-address (the leader's) and --data-parallel-rpc-port; workers add --headless and
    --data-parallel-start-rank.
    """
    if layout.nodes == 1:
        return ()
    if not 0 <= node < layout.nodes:
        raise PlanError("node_rank", f"{node} is not a node of this {layout.nodes}-node replica")
    share = layout.per_node[node]
    args = [
        "--data-parallel-size-local",
        str(layout.data_parallel_local),
        "--data-parallel-address",
        address,
        "--data-parallel-rpc-port",
        str(rpc_port),
    ]
    if share.role == "worker":
        args += ["--headless", "--data-parallel-start-rank", str(share.data_parallel_start_rank)]
    return tuple(args)


def _max_model_len(options: PlanOptions, model: ModelInfo, env: dict[str, str], warnings: list[str]) -> int:
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


def _dtype(options: PlanOptions, model: ModelInfo, family: str) -> str:
    if options.dtype not in ("auto", ""):
        return canonical_dtype(options.dtype)
    if family == "310P":
        return "float16"
    # vLLM "auto": the checkpoint's dtype, except that float32 checkpoints run in 16 bits
    # (vllm/config/model.py _resolve_auto_dtype).
    return "bfloat16" if model.dtype == "float32" else model.dtype


# -- capture sizes -----------------------------------------------------------------------------------


def largest_decode_batch(options: PlanOptions) -> int:
    """The largest decode batch, in requests, that a plan for `options` runs in a captured graph.

    It depends on the spec alone, never on the device or the model: every plan keeps its ceiling
    when it thins the candidates (`sizes.thin` keeps the largest size, `_choose_sizes`), and a
    decode step of n requests is a batch of n x (1 + speculative tokens) tokens. 0 for graph mode
    NONE. A planner downgrade on the device (to NONE, or a capture that failed) is the pods' to
    report (status.graph). Raises PlanError for options make_plan would refuse the same way.
    """
    if options.graph_mode == modes.NONE or options.enforce_eager:
        return 0
    q = 1 + options.speculative_tokens
    ceiling, _ = _candidate_sizes(options, options.graph_mode, q, [])
    return min(ceiling // q, options.max_num_seqs)


def _candidate_sizes(options: PlanOptions, mode: str, q: int, warnings: list[str]) -> tuple[int, tuple[int, ...]]:
    """(ceiling, the sizes before fitting). The ceiling is the largest decode batch in tokens."""
    full_decode = modes.decode_mode(mode) == modes.FULL
    decode_ceiling = options.max_num_seqs * q
    ceiling = options.max_capture_size if options.max_capture_size is not None else decode_ceiling
    if full_decode and q > 1 and ceiling % q:
        raise PlanError(
            "max_capture_size",
            f"{ceiling} is not a multiple of 1 + speculative tokens = {q}; FULL decode graphs need whole requests",
        )
    if options.capture_sizes is not None:
        explicit = tuple(options.capture_sizes)
        problem = sizes.validate_sizes(explicit, ceiling, q if full_decode else 1)
        if problem:
            raise PlanError("capture_sizes", problem)
        if options.max_capture_size is not None and explicit[-1] != options.max_capture_size:
            # vllm/config/vllm.py _set_cudagraph_sizes raises when both are given and disagree.
            raise PlanError(
                "max_capture_size",
                f"{options.max_capture_size} differs from the largest capture size {explicit[-1]}; vLLM refuses that",
            )
        return explicit[-1], explicit
    if ceiling < decode_ceiling:
        warnings.append(
            f"max capture size {ceiling} is below max_num_seqs x (1 + speculative tokens) = {decode_ceiling}"
        )
    return ceiling, sizes.covering_sizes(options.max_num_seqs, q, ceiling)


def _batched_tokens(options: PlanOptions, ceiling: int) -> int:
    """max_num_batched_tokens the plan pins (and budgets the activation for).

    At least vLLM's smallest default for the OpenAI server (sizes.ENGINE_MIN_BATCHED_TOKENS); it must
    be at least max_num_seqs (SchedulerConfig) and at least the largest capture size, or vLLM drops
    that size (_set_cudagraph_sizes keeps sizes <= max_num_batched_tokens). The value does not
    depend on device memory, so more memory never changes the activation budget. A value given
    (--max-num-batched-tokens, as vllm-ascend's tutorials set it) is kept when it meets those bounds.
    """
    needed = max(ceiling, options.max_num_seqs * (1 + options.speculative_tokens))
    given = options.max_num_batched_tokens
    if given is not None:
        if given < 1:
            raise PlanError("max_num_batched_tokens", f"must be a positive integer, got {given}")
        if given < needed:
            raise PlanError(
                "max_num_batched_tokens",
                f"{given} is below the largest decode batch of {needed} tokens (max_num_seqs x (1 + speculative "
                "tokens), or the largest capture size); vLLM would drop the capture sizes above it",
            )
        return given
    return max(sizes.ENGINE_MIN_BATCHED_TOKENS, needed)


# -- fitting ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fit:
    mode: str
    sizes: tuple[int, ...]
    memory: MemoryPlan
    streams: StreamPlan
    downgrades: tuple[Downgrade, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class _Budget:
    """What one device has to give, and what is spent before any graph or KV cache. Frozen.

    Invariant (checked by `_budget`): fixed + min_kv <= budget, where fixed = weights + activation
    + margin; every later step only divides what is left.
    """

    options: PlanOptions
    device: DeviceInfo
    model: ModelInfo
    family: str
    env: Mapping[str, str]
    candidates: tuple[int, ...]
    max_model_len: int
    resolve_mode: bool
    layout: Layout
    dtype_bytes: int
    total: int
    budget: int
    weights: int
    activation: int
    margin: int
    kv_per_token: int
    min_kv: int
    """One sequence of max_model_len."""
    full_kv: int
    """max_num_seqs sequences of max_model_len."""

    @property
    def fixed(self) -> int:
        return self.weights + self.activation + self.margin


@dataclass(frozen=True)
class _GraphChoice:
    """The mode that fits and how many of the candidate sizes it may keep (`keep`, limited by `why`)."""

    mode: str
    keep: int
    why: str
    streams: StreamPlan
    first: int
    per_size: int
    downgrades: tuple[Downgrade, ...]


def _fit(b: _Budget, mode: str, warnings: list[str]) -> _Fit:
    """Fit the candidates to the budget: the mode and its cap, the sizes, the KV cache, in that order."""
    choice = _choose_graphs(b, mode)
    chosen, streams, graph_bytes = _choose_sizes(b, choice, warnings)
    kv_cache, tokens = _kv_cache(b, graph_bytes, warnings)
    memory = _memory_plan(b, choice, graph_bytes, kv_cache, tokens, warnings)
    return _Fit(choice.mode, chosen, memory, streams, choice.downgrades, tuple(warnings))


def _budget(
    *,
    options: PlanOptions,
    device: DeviceInfo,
    model: ModelInfo,
    family: str,
    env: dict[str, str],
    candidates: tuple[int, ...],
    dtype: str,
    max_model_len: int,
    batched_tokens: int,
    resolve_mode: bool,
    layout: Layout,
    warnings: list[str],
) -> _Budget:
    """The fixed terms: weights, activation, margin and the KV cache one sequence needs.

    Invariant: the result satisfies fixed + min_kv <= budget; otherwise DoesNotFitError with the
    numbers (weights above the device's memory, or no room for one max_model_len sequence).
    """
    tp, pp = options.tensor_parallel, options.pipeline_parallel
    dtype_bytes = DTYPE_BYTES.get(dtype, 2)
    total = device.total_bytes
    budget = math.floor(total * options.gpu_memory_utilization)

    mtp = options.speculative_method in MTP_METHODS and options.speculative_tokens > 0
    weights = _weights_per_device(model, dtype, layout, mtp, warnings)
    if weights > total:
        raise DoesNotFitError(
            f"the weights alone do not fit: {format_gib(weights)} per device ({format_gib(model.weight_bytes)} in all, "
            f"{_split_words(layout)}, {model.weight_source}) > {format_gib(total)} device memory; "
            f"{_layout_hint(model, dtype, layout, mtp, budget)}"
        )
    activation = _activation_bytes(model, batched_tokens, tp, dtype_bytes, layout) + _sampler_bytes(options, model)
    if family == "310P":
        # vllm-ascend 310P guide: AttentionMaskBuilder310 builds a [max_model_len, max_model_len]
        # float16 mask.
        activation += max_model_len * max_model_len * 2
        if options.max_model_len is None:
            warnings.append(
                f"on 310P set --max-model-len explicitly (vllm-ascend's 310P guide): the attention mask "
                f"for the derived {max_model_len} tokens takes {format_gib(max_model_len * max_model_len * 2)}"
            )
    margin = _margin(options, device, model, layout)
    kv_per_token = model.kv_bytes_per_token(tensor_parallel=tp, pipeline_parallel=pp, dtype_bytes=dtype_bytes)
    if mtp and model.draft_layers:
        # The MTP layers are attention layers with their own KV cache (the draft model's KV cache spec).
        kv_per_token += model.draft_layers * model.kv_bytes_per_layer(tensor_parallel=tp, dtype_bytes=dtype_bytes)
    min_kv = _kv_sequence_bytes(model, kv_per_token, max_model_len)
    fixed = weights + activation + margin
    if fixed + min_kv > budget:
        room = budget - fixed
        longest = max(room // kv_per_token, 0) if kv_per_token else 0
        raise DoesNotFitError(
            f"no room for the KV cache of one {max_model_len}-token sequence: budget {format_gib(budget)} "
            f"({options.gpu_memory_utilization} of {format_gib(total)}) - weights {format_gib(weights)} - activation "
            f"{format_gib(activation)} - margin {format_gib(margin)} = {format_gib(room)} < {format_gib(min_kv)}; "
            f"lower --max-model-len (about {longest} tokens fit), add tensor parallel ranks or memory"
        )
    return _Budget(
        options=options,
        device=device,
        model=model,
        family=family,
        env=env,
        candidates=candidates,
        max_model_len=max_model_len,
        resolve_mode=resolve_mode,
        layout=layout,
        dtype_bytes=dtype_bytes,
        total=total,
        budget=budget,
        weights=weights,
        activation=activation,
        margin=margin,
        kv_per_token=kv_per_token,
        min_kv=min_kv,
        full_kv=min_kv * options.max_num_seqs,
    )


def _choose_graphs(b: _Budget, mode: str) -> _GraphChoice:
    """The mode and the number of sizes it may keep: the smallest of every cap (memory, streams, device).

    Invariant: with resolve_mode, the result keeps at least one size or its mode is NONE; a
    downgrade (streams first, then memory) changes the mode and so the cost, so the caps are
    recomputed until they hold. Without resolve_mode the mode is the engine's and never changes here.
    """
    options, family, tp = b.options, b.family, b.options.tensor_parallel
    downgrades: list[Downgrade] = []
    while True:
        streams = _stream_plan(options, b.device, b.model, dict(b.env), mode, b.layout)
        first, per_size = (
            _graph_cost(b.model, mode, max(b.candidates), tp, b.dtype_bytes, b.layout) if mode != modes.NONE else (0, 0)
        )
        caps: list[tuple[int, str]] = [(len(b.candidates), "")]
        if mode != modes.NONE:
            room = b.budget - b.fixed - b.min_kv - first
            caps.append((0 if room < 0 else 1 + room // per_size, "memory"))
            if streams.max_sizes is not None:
                caps.append((streams.max_sizes, "streams"))
            if family == "310P" and tp > 1:
                caps.append((_310P_TP_MAX_SIZES, "310P"))
            if family == "A5" and modes.has_piecewise_graphs(mode):
                caps.append((_A5_PIECEWISE_MAX_SIZES, "A5"))
        keep, why = min(caps, key=lambda cap: cap[0])
        if mode == modes.NONE or keep >= 1 or not b.resolve_mode:
            return _GraphChoice(mode, keep, why, streams, first, per_size, tuple(downgrades))
        target = modes.without_piecewise(mode) if why == "streams" and modes.has_piecewise_graphs(mode) else modes.NONE
        reason = "StreamBudgetExceeded" if why == "streams" else "GraphMemoryExceedsBudget"
        detail = (
            f"one capture size needs {streams.fixed + streams.per_size} streams, budget {streams.budget}"
            if why == "streams"
            else f"the largest graph ({format_gib(first)}) does not fit beside the weights, activation and one "
            f"sequence of KV cache in {format_gib(b.budget)}"
        )
        downgrades.append(Downgrade(mode, target, reason, f"{mode} -> {target}: {detail}"))
        mode = target


def _choose_sizes(b: _Budget, choice: _GraphChoice, warnings: list[str]) -> tuple[tuple[int, ...], StreamPlan, int]:
    """(sizes, streams with their estimate, graph bytes): the candidates thinned to `choice.keep`.

    Invariant: the sizes are a subset of the candidates that keeps the largest (sizes.thin), empty
    only in mode NONE; graph bytes = first + (sizes - 1) x per_size.
    """
    candidates, streams = b.candidates, choice.streams
    if choice.mode == modes.NONE:
        chosen: tuple[int, ...] = ()
    elif choice.keep < 1:
        # Only with resolve_mode=False: the mode is the engine's to change, so keep the ceiling and say so.
        chosen = sizes.thin(candidates, 1)
        limit = "stream budget" if choice.why == "streams" else "memory"
        warnings.append(
            f"not even the largest capture size fits the {limit}: "
            "expect the engine to fail at capture or to run eagerly"
        )
    else:
        chosen = sizes.thin(candidates, choice.keep)
        if len(chosen) < len(candidates):
            warnings.append(_thinning_message(choice.why, len(candidates), len(chosen), streams, b.family))
    graph_bytes = choice.first + (len(chosen) - 1) * choice.per_size if chosen else 0
    if streams.applies:  # an NPU graph mode: at least one size is chosen
        streams = dataclasses.replace(streams, estimate=streams.fixed + len(chosen) * streams.per_size)
    return chosen, streams, graph_bytes


def _kv_cache(b: _Budget, graph_bytes: int, warnings: list[str]) -> tuple[int, int]:
    """(KV cache bytes, tokens): what remains after the fixed terms and the graphs.

    Invariant: KV cache >= min_kv (one max_model_len sequence), or DoesNotFitError when the CPU
    backend's VLLM_CPU_KVCACHE_SPACE caps it below that.
    """
    kv_cache = b.budget - b.fixed - graph_bytes
    cpu_space = b.env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if b.device.kind == "cpu" and cpu_space.isdigit() and int(cpu_space) > 0:
        # vllm/platforms/cpu.py: VLLM_CPU_KVCACHE_SPACE (GiB) becomes kv_cache_memory_bytes.
        kv_cache = min(kv_cache, int(cpu_space) * GIB)
        if kv_cache < b.min_kv:
            raise DoesNotFitError(
                f"VLLM_CPU_KVCACHE_SPACE={cpu_space} GiB cannot hold one {b.max_model_len}-token sequence "
                f"({format_gib(b.min_kv)}); raise it or lower --max-model-len"
            )
    tokens = kv_cache // b.kv_per_token if b.kv_per_token else 0
    if kv_cache < b.full_kv:
        warnings.append(
            f"the KV cache holds about {tokens} tokens: {kv_cache // b.min_kv} sequences of "
            f"{b.max_model_len} tokens "
            f"at once, fewer than max_num_seqs={b.options.max_num_seqs} at full length"
        )
    return kv_cache, tokens


def _memory_plan(
    b: _Budget, choice: _GraphChoice, graph_bytes: int, kv_cache: int, tokens: int, warnings: list[str]
) -> MemoryPlan:
    """The memory plan, with the utilisation vLLM is given.

    Invariant: when the plan reserves the graphs, the engine's utilisation leaves them out of its
    budget (engine_util x total <= budget - graphs); free memory below what vLLM will request is
    DoesNotFitError.
    """
    device, total = b.device, b.total
    reserved_by = _graph_reserved_by(device, dict(b.env), graph_bytes)
    engine_util = b.options.gpu_memory_utilization
    if reserved_by == "plan":
        # vllm-ascend's NPUWorker.determine_available_memory gives the KV cache all of
        # requested - non_kv memory and captures graphs afterwards (#8260; the pre-KV estimate of #9865
        # was reverted by #11562), so the graphs must fit in what the utilisation leaves out.
        engine_util = math.floor((b.budget - graph_bytes) / total * 10_000) / 10_000
    if device.kind != "cpu" and device.free_bytes is not None:
        wanted = math.ceil(total * engine_util)
        if device.free_bytes < wanted:
            # vllm/v1/worker/utils.py request_memory: free memory below total x utilisation is an error.
            raise DoesNotFitError(
                f"free device memory {format_gib(device.free_bytes)} is below the {format_gib(wanted)} "
                f"vLLM will request ({engine_util} of {format_gib(total)}); lower --gpu-memory-utilization to "
                f"{math.floor(device.free_bytes / total * 100) / 100} or free the device"
            )
    if device.kind == "cpu" and not b.env.get("VLLM_CPU_KVCACHE_SPACE", ""):
        # vllm/v1/worker/cpu_worker.py: without it, --gpu-memory-utilization is the share of host memory.
        warnings.append(
            "on CPU, --gpu-memory-utilization is a share of host memory; set VLLM_CPU_KVCACHE_SPACE (GiB) "
            "to fix the KV cache size instead"
        )
    return MemoryPlan(
        total_bytes=total,
        budget_bytes=b.budget,
        weights_bytes=b.weights,
        kv_cache_bytes=kv_cache,
        graph_bytes=graph_bytes,
        activation_bytes=b.activation,
        margin_bytes=b.margin,
        free_bytes=device.free_bytes,
        weights_source=b.model.weight_source,
        graph_first_capture_bytes=choice.first,
        graph_per_size_bytes=choice.per_size,
        kv_bytes_per_token=b.kv_per_token,
        kv_cache_tokens=tokens,
        min_kv_cache_bytes=b.min_kv,
        full_kv_cache_bytes=b.full_kv,
        engine_gpu_memory_utilization=engine_util,
        graph_reserved_by=reserved_by,
    )


def _split_words(layout: Layout) -> str:
    devices = layout.tensor_parallel * layout.pipeline_parallel
    if layout.moe_ranks <= 1:
        return f"over TP x PP = {devices} devices"
    split = f"dense parts over TP x PP = {devices}"
    if layout.moe_ranks > 1:
        how = f"EP {layout.ep_size}" if layout.expert_parallel else f"TP {layout.moe_tensor_parallel}"
        split += f", experts over DP x TP = {layout.moe_ranks} ({how})"
    return split


def _layout_hint(model: ModelInfo, dtype: str, layout: Layout, mtp: bool, budget: int) -> str:
    """The smallest layout whose weights fit the budget.

    Dense models: the smallest tensor-parallel size (DP replicates weights). MoE models: the fewest
    devices DP x TP (TP within one node) with the experts split over them, as EP when requested.
    """
    heads, per_node = model.num_attention_heads, max(layout.devices_per_node, 1)
    tps = [tp for tp in range(1, heads + 1) if heads % tp == 0]
    trials: list[tuple[int, int]] = []  # (dp, tp)
    if model.is_moe:
        tps = sorted((tp for tp in tps if tp <= per_node), reverse=True) or tps[:1]
        for world in range(1, 1025):
            trials += [(world // tp, tp) for tp in tps if world % tp == 0]
    else:
        trials = [(layout.data_parallel, tp) for tp in tps]
    for dp, tp in trials:
        nodes = -(-dp * tp * layout.pipeline_parallel // per_node)
        if model.is_moe and nodes > 1 and dp % nodes:
            continue  # every node runs whole DP ranks
        moe_ranks = dp * tp if model.is_moe else 1
        ep = layout.expert_parallel and moe_ranks > 1
        trial = dataclasses.replace(
            layout,
            tensor_parallel=tp,
            data_parallel=dp,
            moe_ranks=moe_ranks,
            expert_parallel=ep,
            ep_size=moe_ranks if ep else 1,
            moe_tensor_parallel=1 if ep else moe_ranks,
            experts_per_rank=-(-model.num_experts // moe_ranks) if ep and model.num_experts else None,
        )
        weights = _weights_per_device(model, dtype, trial, mtp, [])
        if weights < budget:
            if not model.is_moe:
                return f"tensor parallel {tp} is the smallest that holds them"
            how = "with --enable-expert-parallel" if ep else "experts tensor-sliced"
            return (
                f"data parallel {dp} x tensor parallel {tp} ({dp * tp * layout.pipeline_parallel} devices, "
                f"{nodes} node(s) of {per_node}; {how}) is the smallest that holds them: {format_gib(weights)} "
                "per device"
            )
    return "no layout holds them on this device"


def _thinning_message(why: str, before: int, after: int, streams: StreamPlan, family: str) -> str:
    reason = {
        "memory": "device memory",
        "streams": f"the stream budget ({streams.budget} streams, {streams.per_size} per size)",
        "310P": "310P's graph limit with tensor parallel > 1 (vllm-ascend 310P guide: 2 graphs)",
        "A5": "vllm-ascend's 4-size limit for PIECEWISE on 950 (_prune_capture_sizes_for_950)",
    }.get(why, why)
    return f"capture sizes thinned from {before} to {after} to fit {reason}; the smallest and largest are kept"


def _graph_reserved_by(device: DeviceInfo, env: dict[str, str], graph_bytes: int) -> str:
    if graph_bytes == 0 or device.kind == "cpu":
        return "none"
    if device.kind == "cuda" and env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1") != "0":
        # vllm/v1/worker/gpu_worker.py determine_available_memory subtracts profile_cudagraph_memory()
        # from the KV budget (envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, default on).
        return "engine"
    return "plan"


# -- memory estimates ----------------------------------------------------------------------------------


def _weights_per_device(model: ModelInfo, dtype: str, layout: Layout, mtp: bool, warnings: list[str]) -> int:
    """Weights on the busiest device.

    Dense parts (attention, dense MLPs, shared experts, embeddings) are split over TP x PP and
    replicated on every DP rank; routed experts over the DP x TP ranks of each PP stage, whole
    experts with EP (the busiest rank holds ceil(experts / EP)), tensor-sliced without (see
    `Layout`). With MTP the checkpoint's draft layers are loaded too, split the same way.
    """
    weights, experts = model.weight_bytes, model.expert_weight_bytes
    if model.weight_source != "estimated-from-shape":
        # DeepSeek-style checkpoints ship their MTP layers; vLLM loads them only as the draft model.
        weights -= min(model.draft_weight_bytes, weights - experts)
    stored = DTYPE_BYTES.get(model.dtype)
    wanted = DTYPE_BYTES.get(dtype)
    if model.quantization is None and stored and wanted and stored != wanted:
        weights, experts = weights * wanted // stored, experts * wanted // stored
        warnings.append(f"weights stored as {model.dtype} are loaded as {dtype}: {format_gib(weights)} in all")
    if mtp:
        weights += model.draft_weight_bytes
        experts += model.draft_expert_weight_bytes
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    share = Fraction(weights - experts, tp * pp)
    if experts:
        if layout.expert_parallel and layout.experts_per_rank and model.num_experts:
            share += Fraction(experts * layout.experts_per_rank, model.num_experts * pp)
        else:
            share += Fraction(experts, layout.moe_ranks * pp)
    return math.ceil(share)


def _activation_bytes(model: ModelInfo, tokens: int, tp: int, dtype_bytes: int, layout: Layout) -> int:
    """Peak activation of one forward pass over `tokens` tokens (vLLM's profile_run), estimated.

    MoE layers: each routed token is copied once per chosen expert (the dispatch buffer, in and
    out) and runs the expert's gate/up/down; an expert's intermediate width is sliced over the MoE
    tensor-parallel ranks without EP and whole with EP, where a rank receives about tokens x top_k
    rows from the all-to-all / MC2 dispatch (balanced routing, as profile_run's dummy tokens are).
    """
    hidden = model.hidden_size
    qkv = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim // tp
    if model.is_moe and model.num_experts_per_tok and model.moe_intermediate_size:
        per_token = model.num_experts_per_tok * (
            2 * hidden + 3 * model.moe_intermediate_size // layout.moe_tensor_parallel
        )
    else:
        per_token = 3 * model.intermediate_size // tp
    return tokens * dtype_bytes * (4 * hidden + qkv + per_token) + _ACTIVATION_WORKSPACE


def _sampler_bytes(options: PlanOptions, model: ModelInfo) -> int:
    """The sampler's dummy run over max_num_seqs rows of the vocabulary.

    fp32 logits and probabilities plus an int64 sort order: 16 bytes per entry.
    """
    return options.max_num_seqs * (1 + options.speculative_tokens) * model.vocab_size * 16


def _margin(options: PlanOptions, device: DeviceInfo, model: ModelInfo, layout: Layout) -> int:
    """Non-torch memory: the runtime context, HCCL buffers per communication group, a buffer on NPUs.

    A MoE model over DP x TP > 1 adds vLLM's EP group (its all-gather or all-to-all); with EP on an
    NPU, vllm-ascend's MC2 group too (vllm_ascend/distributed/parallel_state.py creates "mc2" over
    the same ranks; its buffer is HCCL_BUFFSIZE, vllm_ascend/utils.py get_hccl_config_for_pg_options).
    """
    groups = sum(n > 1 for n in (options.tensor_parallel, options.pipeline_parallel, options.data_parallel))
    groups += _moe_comm_groups(device, layout)
    margin = _NON_TORCH_BASE + groups * _COMM_BUFFERS
    if device.kind == "npu":
        margin += _NPU_REDUNDANCY
    return margin


def _moe_comm_groups(device: DeviceInfo, layout: Layout) -> int:
    """Communication groups a MoE layout adds to TP, PP and DP: EP, and MC2 with EP on an NPU."""
    if layout.moe_ranks <= 1 or (layout.data_parallel <= 1 and not layout.expert_parallel):
        return 0  # DP 1 without EP: the MoE group is the TP group
    return 1 + (1 if layout.expert_parallel and device.kind == "npu" else 0)


def _kv_sequence_bytes(model: ModelInfo, per_token: int, length: int) -> int:
    """KV cache of one sequence of `length` tokens on one device (`per_token` bytes each, as
    ModelInfo.kv_bytes_per_token gives them); sliding-window layers keep the window."""
    if not model.sliding_layers or not model.sliding_window:
        return per_token * length
    # Hybrid models (layer_types) are not windowed as a whole: sliding_window is None there.
    return per_token * min(length, model.sliding_window)


def _graph_cost(
    model: ModelInfo, mode: str, largest: int, tp: int, dtype_bytes: int, layout: Layout
) -> tuple[int, int]:
    """(first capture, each further size), estimated as vLLM's profile_cudagraph_memory measures them.

    The first (largest) capture allocates the graph pool: the activations of one decode step of
    `largest` tokens. Each further size adds driver/graph bookkeeping: at least 1 MiB per graph
    (vLLM's floor), a sub-graph per layer in piecewise mode. FULL_AND_PIECEWISE keeps both families.
    """
    first_one = (
        _activation_bytes(model, largest, tp, dtype_bytes, layout) - _ACTIVATION_WORKSPACE + _GRAPH_POOL_OVERHEAD
    )
    pieces = model.num_layers + 1
    piecewise = max(_PER_GRAPH_MIN, pieces * _PER_PIECE)
    if mode == modes.FULL_AND_PIECEWISE:
        return 2 * first_one, piecewise + _PER_GRAPH_MIN
    if mode == modes.PIECEWISE:
        return first_one, piecewise
    return first_one, _PER_GRAPH_MIN


# -- streams ---------------------------------------------------------------------------------------


def _stream_plan(
    options: PlanOptions, device: DeviceInfo, model: ModelInfo, env: dict[str, str], mode: str, layout: Layout
) -> StreamPlan:
    """ACL graph streams, after vllm-ascend's update_aclgraph_sizes (vllm_ascend/utils.py before #9962).

    The estimate is left at 0: `_fit` fills it in once the sizes are chosen.

    Per captured size: PIECEWISE about layers + 1 sub-graphs (plus a draft model's layers + 1), a
    FULL graph about one; times a communication factor: with HCCL_OP_EXPANSION_MODE=AIV
    1 + groups (+ 1 with expert parallel, + 1 for a MoE model with DP > 1, + a fixed block for
    dense models' all-reduce), otherwise 1 + 2 x groups plus 40 streams per group up front.
    FULL_AND_PIECEWISE adds one full graph per size.
    """
    budget = options.stream_budget or DEFAULT_STREAM_BUDGET
    groups = sum(n > 1 for n in (options.tensor_parallel, options.data_parallel))
    aiv = env.get("HCCL_OP_EXPANSION_MODE", "").upper() == "AIV"
    expansion = "AIV" if aiv else "default"
    if device.kind != "npu" or mode == modes.NONE:
        return StreamPlan(False, budget, DEVICE_STREAMS, 0, 0, 0, None, expansion, groups, "not an NPU graph mode")
    draft = model.draft_layers if options.speculative_method in MTP_METHODS else 0
    if modes.has_piecewise_graphs(mode):
        per_graph = model.num_layers + 1 + (draft + 1 if draft else 0)
        shape = f"(layers {model.num_layers} + 1{f' + draft {draft} + 1' if draft else ''})"
    else:
        per_graph = 1 + (1 if draft else 0)
        shape = "1 full graph" + (" + 1 draft graph" if draft else "")
    if aiv:
        # update_aclgraph_sizes: parallel_factor = 1 + groups + int(enable_expert_parallel), + 1 for a
        # MoE model with DP > 1.
        factor = 1 + groups + (1 if options.enable_expert_parallel else 0)
        moe_dp = model.is_moe and options.data_parallel > 1
        if moe_dp:
            factor += 1
        fixed = 0 if model.is_moe else factor * per_graph
        ep_words = (" + EP" if options.enable_expert_parallel else "") + (" + MoE with DP" if moe_dp else "")
        formula = f"{shape} x (1 + {groups} comm groups{ep_words}) per size" + (
            "" if model.is_moe else " + one dense block"
        )
    else:
        factor = 1 + 2 * groups
        fixed = groups * _STREAMS_PER_COMM_GROUP
        formula = f"{shape} x (1 + 2 x {groups} comm groups) per size + 40 x {groups}"
    per_size = per_graph * factor
    if mode == modes.FULL_AND_PIECEWISE:
        per_size += 1
        formula += " + 1 full graph per size"
    max_sizes = max((budget - fixed) // per_size, 0)
    return StreamPlan(True, budget, DEVICE_STREAMS, per_size, fixed, 0, max_sizes, expansion, groups, formula)


# -- vLLM arguments ----------------------------------------------------------------------------------


def _vllm_args(
    options: PlanOptions,
    mode: str,
    chosen: tuple[int, ...],
    memory: MemoryPlan,
    dtype: str,
    max_model_len: int,
    batched_tokens: int,
    layout: Layout,
) -> tuple[str, ...]:
    """Flags for `python -m vllm.entrypoints.openai.api_server` (names from vllm/engine/arg_utils.py)."""
    compilation: dict[str, Any] = {"cudagraph_mode": mode}
    if mode != modes.NONE:
        compilation["cudagraph_capture_sizes"] = list(chosen)
    args = [
        "--compilation-config",
        json.dumps(compilation, separators=(",", ":")),
        "--max-num-seqs",
        str(options.max_num_seqs),
        "--max-num-batched-tokens",
        str(batched_tokens),
        "--gpu-memory-utilization",
        f"{memory.engine_gpu_memory_utilization:g}",
        "--tensor-parallel-size",
        str(options.tensor_parallel),
        "--pipeline-parallel-size",
        str(options.pipeline_parallel),
        "--dtype",
        dtype,
    ]
    if options.max_model_len is not None:
        args += ["--max-model-len", str(max_model_len)]
    if options.data_parallel > 1:
        args += ["--data-parallel-size", str(options.data_parallel)]
    if options.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if options.speculative_tokens:
        spec: dict[str, Any] = {
            "method": options.speculative_method,
            "num_speculative_tokens": options.speculative_tokens,
        }
        if options.speculative_model:
            spec["model"] = options.speculative_model  # vllm/config/speculative.py SpeculativeConfig.model
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if mode == modes.NONE:
        args.append("--enforce-eager")
    return tuple(args)

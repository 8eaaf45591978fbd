"""Fitting: the fixed terms, then the graph mode and its sizes, then the KV cache, in that order.

Every term comes from its own module (weights, activation, margin, kv, graphs, lora); this module only
adds them up against the budget (total x gpu_memory_utilization) and decides what to drop when they
do not fit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from npu_runtime.contract import GIB, PlanOptions, format_gib
from npu_runtime.planner import modes, sizes, traffic_sizes
from npu_runtime.planner.activation import activation_bytes, logits_bytes, mc2_capacity, moe_comm_mode
from npu_runtime.planner.calibration import Calibration
from npu_runtime.planner.communication import Communicator, communicators, hccl_buffsize
from npu_runtime.planner.graphs import StreamPlan, graph_cost, graph_reserved_by, stream_plan
from npu_runtime.planner.kv import kv_sequence_bytes
from npu_runtime.planner.layout import Layout, moe_split
from npu_runtime.planner.lora import LoraMemory, lora_memory
from npu_runtime.planner.margin import margin_bytes, safety_bytes
from npu_runtime.planner.model import DTYPE_BYTES, ModelInfo
from npu_runtime.planner.modes import Downgrade
from npu_runtime.planner.probe import DeviceInfo
from npu_runtime.planner.releases import DEFAULT_RELEASE, RULES, ReleaseRules
from npu_runtime.planner.traffic_sizes import SizeChoice
from npu_runtime.planner.weights import MTP_METHODS, WeightTerms, weight_terms, weights_per_device

__all__ = ["BudgetInputs", "DoesNotFitError", "Fit", "MemoryPlan", "fit_budget", "make_budget"]

# 310P with TP > 1: hardware event ids limit the graphs; vllm-ascend's 310P guide reports that
# Qwen3-32B "can capture and replay 2 graphs" (docs/.../tutorials/hardwares/310p). No limit at TP=1.
_310P_TP_MAX_SIZES: Final = 2
# A5 (950) PIECEWISE: vllm_ascend/platform.py _prune_capture_sizes_for_950 keeps 4 sizes.
_A5_PIECEWISE_MAX_SIZES: Final = 4


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
    weight_terms: WeightTerms
    """weights_bytes by placement (split, replicated, KV-head replicas, MLA absorbed copies, experts)."""
    communication_bytes: int
    """The communicators' buffers (part of margin_bytes)."""
    communicators: tuple[Communicator, ...]
    hccl_buffsize_mb: int | None
    """HCCL_BUFFSIZE the MC2 group uses (NPU only)."""
    moe_dispatch: dict[str, str | None]
    """The MoE communication vllm-ascend picks for the profile run and for the largest decode graph."""
    lora_bytes: int = 0
    """The LoRA adapters' preallocated slots (`lora.lora_memory`); taken from the KV cache."""
    lora: LoraMemory | None = None
    """Their breakdown and graph capture cases; None: LoRA is off."""


@dataclass(frozen=True)
class Fit:
    """The fitted plan: the mode, its capture sizes, memory and streams, and what changed on the way."""

    mode: str
    sizes: tuple[int, ...]
    memory: MemoryPlan
    streams: StreamPlan
    downgrades: tuple[Downgrade, ...]
    warnings: tuple[str, ...]
    traffic: SizeChoice | None = None
    """How the sizes were chosen from the recorded decode batches (None: no graphs or an explicit list)."""


@dataclass(frozen=True)
class BudgetInputs:
    """What the plan decided before fitting: built once by make_plan, read by every fitting step."""

    options: PlanOptions
    device: DeviceInfo
    model: ModelInfo
    family: str
    """The device family (`probe.device_family`)."""
    env: Mapping[str, str]
    """The variables the engine reads that change the plan."""
    candidates: tuple[int, ...]
    """The capture sizes before fitting."""
    dtype: str
    max_model_len: int
    batched_tokens: int
    resolve_mode: bool
    layout: Layout
    calibrated: Calibration | None = None
    """The calibration record when its key is this plan's (its measured figures replace estimates)."""
    rules: ReleaseRules = RULES[DEFAULT_RELEASE]
    """The engine release's row (`releases.select`)."""
    flashcomm1: bool = False
    """vllm-ascend's flashcomm1 (sequence parallelism over TP) is on."""
    fused_mc2: int = 0
    """vllm-ascend's enable_fused_mc2 (0, 1 or 2)."""


@dataclass(frozen=True)
class _Budget:
    """What one device has to give, and what is spent before any graph or KV cache. Frozen.

    Invariant (checked by `make_budget`): fixed + min_kv <= budget, where fixed = weights + activation
    + margin; every later step only divides what is left.
    """

    inputs: BudgetInputs
    dtype_bytes: int
    total: int
    budget: int
    weights: int
    activation: int
    margin: int
    weight_terms: WeightTerms
    communicators: tuple[Communicator, ...]
    moe_dispatch: dict[str, str | None]
    kv_per_token: int
    min_kv: int
    """One sequence of max_model_len."""
    full_kv: int
    """max_num_seqs sequences of max_model_len."""
    lora: LoraMemory | None = None

    @property
    def lora_bytes(self) -> int:
        return self.lora.bytes if self.lora else 0

    @property
    def lora_cases(self) -> int:
        """Graphs captured per capture size (1 without LoRA)."""
        return self.lora.capture_cases if self.lora else 1

    @property
    def fixed(self) -> int:
        return self.weights + self.activation + self.margin + self.lora_bytes


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


def fit_budget(b: _Budget, mode: str, warnings: list[str]) -> Fit:
    """Fit the candidates to the budget: the mode and its cap, the sizes, the KV cache, in that order."""
    choice = _choose_graphs(b, mode)
    chosen, streams, graph_bytes, traffic = _choose_sizes(b, choice, warnings)
    kv_cache, tokens = _kv_cache(b, graph_bytes, warnings)
    if b.lora is not None:
        warnings.append(_lora_message(b, b.lora, mode, chosen, graph_bytes))
    memory = _memory_plan(b, choice, graph_bytes, kv_cache, tokens, warnings)
    return Fit(choice.mode, chosen, memory, streams, choice.downgrades, tuple(warnings), traffic)


def make_budget(inputs: BudgetInputs, warnings: list[str]) -> _Budget:
    """The fixed terms: weights, activation, margin and the KV cache one sequence needs.

    Invariant: the result satisfies fixed + min_kv <= budget; otherwise DoesNotFitError with the
    numbers (weights above the device's memory, or no room for one max_model_len sequence).
    """
    options = inputs.options
    dtype_bytes = DTYPE_BYTES.get(inputs.dtype, 2)
    total = inputs.device.total_bytes
    budget = math.floor(total * options.gpu_memory_utilization)
    mtp = options.speculative_method in MTP_METHODS and options.speculative_tokens > 0
    terms, weights = _weights(inputs, mtp, budget, warnings)
    moe_dispatch = _moe_dispatch(inputs)
    activation = _activation(inputs, dtype_bytes, moe_dispatch, warnings)
    held = communicators(
        options, inputs.device, inputs.layout, inputs.env, moe_dispatch.values() if inputs.model.is_moe else None
    )  # once per budget: HCCL_BUFFSIZE parsed here
    margin = margin_bytes(inputs.device, sum(c.bytes for c in held))
    kv_per_token = _kv_per_token(inputs, dtype_bytes, mtp)
    min_kv = kv_sequence_bytes(inputs.model, kv_per_token, inputs.max_model_len)
    lora = lora_memory(options, inputs.model, inputs.layout, dtype_bytes)
    fixed = weights + activation + margin + (lora.bytes if lora else 0)
    if fixed + min_kv > budget:
        room = budget - fixed
        longest = max(room // kv_per_token, 0) if kv_per_token else 0
        raise DoesNotFitError(
            f"no room for the KV cache of one {inputs.max_model_len}-token sequence: budget {format_gib(budget)} "
            f"({options.gpu_memory_utilization} of {format_gib(total)}) - weights {format_gib(weights)} - activation "
            f"{format_gib(activation)} - margin {format_gib(margin)}{_lora_words(lora)} = {format_gib(room)} < "
            f"{format_gib(min_kv)}; "
            f"lower --max-model-len (about {longest} tokens fit), add tensor parallel ranks or memory"
        )
    return _Budget(
        inputs=inputs,
        dtype_bytes=dtype_bytes,
        total=total,
        budget=budget,
        weights=weights,
        activation=activation,
        margin=margin,
        weight_terms=terms,
        communicators=held,
        moe_dispatch=moe_dispatch,
        kv_per_token=kv_per_token,
        min_kv=min_kv,
        full_kv=min_kv * options.max_num_seqs,
        lora=lora,
    )


def _lora_message(b: _Budget, lora: LoraMemory, mode: str, chosen: tuple[int, ...], graph_bytes: int) -> str:
    """What the adapters cost: their KV cache (bytes and tokens), the extra graphs, and the capture
    sizes the same budget keeps without them but not with them."""
    base = dataclasses.replace(b, lora=None)
    base_choice = _choose_graphs(base, mode)
    base_sizes, _, base_graphs, _ = _choose_sizes(base, base_choice, [])
    dropped = sorted(set(base_sizes) - set(chosen))
    tokens = lora.bytes // b.kv_per_token if b.kv_per_token else 0
    words = (
        f"LoRA adapters ({lora.max_loras} slots of rank {lora.max_lora_rank}, {lora.dtype_bytes}-byte dtype"
        f"{', fully sharded' if lora.fully_sharded else ''}): {lora.bytes} bytes ({format_gib(lora.bytes)}) "
        f"preallocated, about {tokens} tokens of KV cache"
    )
    if chosen:
        words += (
            f"; each capture size is captured {lora.capture_cases} times (LoRA cases), graphs "
            f"{format_gib(graph_bytes)} instead of {format_gib(base_graphs)}"
        )
    if dropped:
        words += f"; capture sizes dropped for them: {dropped}"
    return words


def _lora_words(lora: LoraMemory | None) -> str:
    return f" - LoRA adapters {format_gib(lora.bytes)}" if lora else ""


def _weights(inputs: BudgetInputs, mtp: bool, budget: int, warnings: list[str]) -> tuple[WeightTerms, int]:
    """(the weights by placement, the bytes one device holds): measured when calibrated, else estimated.

    DoesNotFitError when they exceed the device's memory, with the smallest layout that holds them.
    """
    model, layout, total = inputs.model, inputs.layout, inputs.device.total_bytes
    terms = weight_terms(model, inputs.dtype, layout, mtp, warnings)
    weights = terms.total
    measured_weights = inputs.calibrated.with_margin("weights_bytes") if inputs.calibrated else None
    if measured_weights is not None:
        weights = measured_weights  # the engine's model_memory_usage after load, plus the margin
    if weights > total:
        raise DoesNotFitError(
            f"the weights alone do not fit: {format_gib(weights)} per device ({format_gib(model.weight_bytes)} in all, "
            f"{_split_words(layout)}, {model.weight_source}) > {format_gib(total)} device memory; "
            f"{_layout_hint(model, inputs.dtype, layout, mtp, budget)}"
        )
    return terms, weights


def _moe_dispatch(inputs: BudgetInputs) -> dict[str, str | None]:
    """The MoE communication vllm-ascend picks for the profile run and for the largest decode graph."""
    model, layout, family, candidates = inputs.model, inputs.layout, inputs.family, inputs.candidates
    capacity = mc2_capacity(max(candidates, default=inputs.batched_tokens), inputs.options.tensor_parallel)
    fused = inputs.fused_mc2
    return {
        "profile": moe_comm_mode(model, layout, family, inputs.batched_tokens, capacity, fused),
        "decode": moe_comm_mode(model, layout, family, max(candidates, default=1), capacity, fused),
    }


def _activation(
    inputs: BudgetInputs, dtype_bytes: int, moe_dispatch: dict[str, str | None], warnings: list[str]
) -> int:
    """The profile run's peak: its forward pass or its logits, the larger; plus 310P's attention mask."""
    options, model, max_model_len = inputs.options, inputs.model, inputs.max_model_len
    tp, tokens = options.tensor_parallel, inputs.batched_tokens
    forward = activation_bytes(
        model, tokens, tp, dtype_bytes, inputs.layout, moe_dispatch["profile"], inputs.flashcomm1
    )
    activation = max(forward, logits_bytes(options, model, tokens, tp, dtype_bytes))
    if inputs.family == "310P":
        # vllm-ascend 310P guide: AttentionMaskBuilder310 builds a [max_model_len, max_model_len]
        # float16 mask.
        activation += max_model_len * max_model_len * 2
        if options.max_model_len is None:
            warnings.append(
                f"on 310P set --max-model-len explicitly (vllm-ascend's 310P guide): the attention mask "
                f"for the derived {max_model_len} tokens takes {format_gib(max_model_len * max_model_len * 2)}"
            )
    return activation


def _kv_per_token(inputs: BudgetInputs, dtype_bytes: int, mtp: bool) -> int:
    """KV cache bytes one token takes on one device, the MTP draft layers' included."""
    model, tp = inputs.model, inputs.options.tensor_parallel
    kv_per_token = model.kv_bytes_per_token(
        tensor_parallel=tp, pipeline_parallel=inputs.options.pipeline_parallel, dtype_bytes=dtype_bytes
    )
    if mtp and model.draft_layers:
        # The MTP layers are attention layers with their own KV cache (the draft model's KV cache spec).
        kv_per_token += model.draft_layers * model.kv_bytes_per_layer(tensor_parallel=tp, dtype_bytes=dtype_bytes)
    return kv_per_token


def _choose_graphs(b: _Budget, mode: str) -> _GraphChoice:
    """The mode and the number of sizes it may keep: the smallest of every cap (memory, streams, device).

    Invariant: with resolve_mode, the result keeps at least one size or its mode is NONE; a
    downgrade (streams first, then memory) changes the mode and so the cost, so the caps are
    recomputed until they hold. Without resolve_mode the mode is the engine's and never changes here.
    """
    i = b.inputs
    options, family, tp = i.options, i.family, i.options.tensor_parallel
    downgrades: list[Downgrade] = []
    while True:
        streams = stream_plan(
            options,
            i.device,
            i.model,
            dict(i.env),
            mode,
            i.layout,
            i.rules.stream_budget,
            i.rules.release,
            b.lora_cases,
        )
        first, per_size = (
            graph_cost(
                i.model,
                mode,
                max(i.candidates),
                tp,
                b.dtype_bytes,
                i.layout,
                b.moe_dispatch["decode"],
                i.flashcomm1,
                b.lora_cases,
            )
            if mode != modes.NONE
            else (0, 0)
        )
        if i.calibrated and mode != modes.NONE:
            # Measured by the observer (capture memory per size): the largest capture and the increment.
            first = i.calibrated.with_margin("graph_first_capture_bytes") or first
            per_size = i.calibrated.with_margin("graph_per_size_bytes") or per_size
        caps: list[tuple[int, str]] = [(len(i.candidates), "")]
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
        if mode == modes.NONE or keep >= 1 or not i.resolve_mode:
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


def _choose_sizes(
    b: _Budget, choice: _GraphChoice, warnings: list[str]
) -> tuple[tuple[int, ...], StreamPlan, int, SizeChoice | None]:
    """(sizes, streams with their estimate, graph bytes, the traffic choice): the candidates thinned
    to `choice.keep`, then, with a recorded decode-batch distribution, the sizes that pad it least
    in at most as many graphs (`_from_traffic`).

    Invariant: the sizes keep the largest candidate (sizes.thin, traffic_sizes.optimal_sizes) and
    are never more than `choice.keep`, empty only in mode NONE; graph bytes = first + (sizes - 1) x
    per_size.
    """
    candidates, streams = b.inputs.candidates, choice.streams
    traffic: SizeChoice | None = None
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
            warnings.append(_thinning_message(choice.why, len(candidates), len(chosen), streams, b.inputs.family))
        if b.inputs.options.capture_sizes is None:  # issue 37: an explicit list is the user's
            traffic = _from_traffic(b, choice, chosen)
            chosen = traffic.sizes
    graph_bytes = choice.first + (len(chosen) - 1) * choice.per_size if chosen else 0
    if streams.applies:  # an NPU graph mode: at least one size is chosen
        streams = dataclasses.replace(streams, estimate=streams.fixed + len(chosen) * streams.per_size)
    return chosen, streams, graph_bytes, traffic


def _from_traffic(b: _Budget, choice: _GraphChoice, grid: tuple[int, ...]) -> SizeChoice:
    """The sizes for the recorded decode batches (traffic_sizes.choose_sizes), at most `choice.keep`,
    under the release's rules; the thinned grid when there is no distribution."""
    i = b.inputs
    batches = i.calibrated.decode_batches if i.calibrated else None
    rules = traffic_sizes.size_rules(
        query_len=1 + i.options.speculative_tokens,
        full_decode=modes.decode_mode(choice.mode) == modes.FULL,
        tensor_parallel=i.options.tensor_parallel,
        flashcomm1=i.flashcomm1,
    )
    budget = traffic_sizes.TrafficBudget(choice.keep, traffic_sizes.capture_seconds(batches, i.device.kind))
    return traffic_sizes.choose_sizes(batches, grid=grid, rules=rules, budget=budget)


def _kv_cache(b: _Budget, graph_bytes: int, warnings: list[str]) -> tuple[int, int]:
    """(KV cache bytes, tokens): what remains after the fixed terms and the graphs.

    Invariant: KV cache >= min_kv (one max_model_len sequence), or DoesNotFitError when the CPU
    backend's VLLM_CPU_KVCACHE_SPACE caps it below that.
    """
    kv_cache = b.budget - b.fixed - graph_bytes
    measured_kv = b.inputs.calibrated.measured.get("kv_cache_bytes") if b.inputs.calibrated else None
    if measured_kv is not None and b.min_kv <= measured_kv:
        # What the engine allocated for this key: never promise more; where it allocated more, the
        # planner's own safety term (margin.safety_bytes) is given back, and nothing beyond it.
        kv_cache = min(measured_kv, kv_cache + safety_bytes(b.inputs.device))
    cpu_space = b.inputs.env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if b.inputs.device.kind == "cpu" and cpu_space.isdigit() and int(cpu_space) > 0:
        # vllm/platforms/cpu.py: VLLM_CPU_KVCACHE_SPACE (GiB) becomes kv_cache_memory_bytes.
        kv_cache = min(kv_cache, int(cpu_space) * GIB)
        if kv_cache < b.min_kv:
            raise DoesNotFitError(
                f"VLLM_CPU_KVCACHE_SPACE={cpu_space} GiB cannot hold one {b.inputs.max_model_len}-token sequence "
                f"({format_gib(b.min_kv)}); raise it or lower --max-model-len"
            )
    tokens = kv_cache // b.kv_per_token if b.kv_per_token else 0
    if kv_cache < b.full_kv:
        warnings.append(
            f"the KV cache holds about {tokens} tokens: {kv_cache // b.min_kv} sequences of "
            f"{b.inputs.max_model_len} tokens "
            f"at once, fewer than max_num_seqs={b.inputs.options.max_num_seqs} at full length"
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
    device, total = b.inputs.device, b.total
    reserved_by = graph_reserved_by(device, dict(b.inputs.env), graph_bytes)
    engine_util = b.inputs.options.gpu_memory_utilization
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
    if device.kind == "cpu" and not b.inputs.env.get("VLLM_CPU_KVCACHE_SPACE", ""):
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
        weights_source="calibration"
        if b.inputs.calibrated and "weights_bytes" in b.inputs.calibrated.measured
        else b.inputs.model.weight_source,
        graph_first_capture_bytes=choice.first,
        graph_per_size_bytes=choice.per_size,
        kv_bytes_per_token=b.kv_per_token,
        kv_cache_tokens=tokens,
        min_kv_cache_bytes=b.min_kv,
        full_kv_cache_bytes=b.full_kv,
        engine_gpu_memory_utilization=engine_util,
        graph_reserved_by=reserved_by,
        weight_terms=b.weight_terms,
        communication_bytes=sum(c.bytes for c in b.communicators),
        communicators=b.communicators,
        hccl_buffsize_mb=_hccl_buffsize(b) if device.kind == "npu" else None,
        moe_dispatch=b.moe_dispatch,
        lora_bytes=b.lora_bytes,
        lora=b.lora,
    )


def _hccl_buffsize(b: _Budget) -> int:
    """The MC2 communicator's HCCL_BUFFSIZE when there is one (already parsed), else the option's."""
    mc2 = [c.buffer_mb for c in b.communicators if c.group == "mc2"]
    return mc2[0] if mc2 else hccl_buffsize(b.inputs.options, b.inputs.env)


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
        split = moe_split(
            model,
            tensor_parallel=tp,
            data_parallel=dp,
            expert_parallel=layout.expert_parallel,
            redundant=layout.redundant_experts,
        )
        ep = split.expert_parallel
        trial = dataclasses.replace(layout, tensor_parallel=tp, data_parallel=dp, **dataclasses.asdict(split))
        weights = weights_per_device(model, dtype, trial, mtp, [])
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
        "streams": f"the stream budget ({streams.budget} streams, {streams.per_size} per size, set by "
        f"{streams.enforced_by})",
        "310P": "310P's graph limit with tensor parallel > 1 (vllm-ascend 310P guide: 2 graphs)",
        "A5": "vllm-ascend's 4-size limit for PIECEWISE on 950 (_prune_capture_sizes_for_950)",
    }.get(why, why)
    return f"capture sizes thinned from {before} to {after} to fit {reason}; the smallest and largest are kept"

"""The plan: graph mode, capture sizes, memory and streams, decided before the model loads.

`make_plan(options, device, model)` is pure (no I/O, no clock): it resolves the graph mode
(`modes.RULES`), lists the capture sizes that cover every decode batch up to max_num_seqs
(`sizes.covering_sizes`) and keeps those the engine release captures (`releases`), fits them to
device memory and to a stream cap where one is set (`fit`), and returns the vLLM arguments that
carry the decision. `plan_for(options, path)`
adds the probe and the model inspection.

Memory model, per device (all figures in bytes; see docs/planner.md). Each term is its own module
with its sources:

    budget     = total * gpu_memory_utilization
    budget    >= weights + activation + margin + graphs + kv_cache
                 (weights.py, activation.py, margin.py + communication.py, graphs.py, kv.py)
    graphs     = first_capture + (sizes - 1) * per_size          (vLLM's profile_cudagraph_memory)
    kv_cache   = what remains; it must hold at least one max_model_len sequence

Weights are measured (safetensors) or estimated (shape); activation, margin and graphs are
estimates; the engine measures them again at startup.

Errors: `PlanError` for invalid input (exit 2, `.field` names the option), `DoesNotFitError` when
the model cannot fit (exit 3, the message gives the numbers).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npu_runtime import engines
from npu_runtime.contract import DEVICE_KINDS, GRAPH_CAPTURE_OOM, GRAPH_MODES, PlanError, PlanOptions
from npu_runtime.planner import calibration, modes, releases, sizes
from npu_runtime.planner.fit import BudgetInputs, DoesNotFitError, Fit, MemoryPlan, fit_budget, make_budget
from npu_runtime.planner.graphs import DEVICE_STREAMS, StreamPlan
from npu_runtime.planner.layout import Layout, NodeShare, make_layout, node_engine_args
from npu_runtime.planner.model import (
    ASCEND_QUANTIZATION,
    MODELSLIM_DESCRIPTION,
    ModelInfo,
    canonical_dtype,
    inspect_model,
)
from npu_runtime.planner.modes import Downgrade
from npu_runtime.planner.probe import DeviceInfo, device_family, device_from_options
from npu_runtime.planner.weights import MTP_METHODS

__all__ = [
    "DEVICE_STREAMS",
    "MTP_METHODS",
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
    calibration: dict[str, Any]
    """The calibration key of this plan, whether a record applied, which measured figures it used."""
    capture_sizes_from: dict[str, Any] | None = None
    """Issue 37: where the sizes come from (grid, traffic, previous) and the expected padding
    per decode step with the grid and with them (traffic_sizes.SizeChoice.to_dict); None: no decode
    batches recorded (or no graphs, or an explicit list): the grid."""
    engine_release: str = releases.DEFAULT_RELEASE
    """The vllm-ascend release whose rules the plan follows (`releases.RULES`)."""
    flashcomm1: bool = False
    capture_size_steps: tuple[releases.CaptureStep, ...] = ()
    """The engine's capture-size algorithm run on the plan's list: its last step is capture_sizes."""
    engine_default_sizes: tuple[int, ...] = ()
    """What the engine would capture with no list from the plan (its own default), for comparison."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested_mode": self.requested_mode,
            "effective_mode": self.effective_mode,
            "mode_resolved_by": self.mode_resolved_by,
            "capture_sizes": list(self.capture_sizes),
            "max_capture_size": self.max_capture_size,
            "eager_decode_batches": list(self.eager_decode_batches) if self.eager_decode_batches else None,
            "downgrades": [dataclasses.asdict(d) for d in self.downgrades],
            "memory": {
                **dataclasses.asdict(self.memory),
                "communicators": [dataclasses.asdict(c) for c in self.memory.communicators],
            },
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
            "calibration": self.calibration,
            "engine_release": self.engine_release,
            "flashcomm1": self.flashcomm1,
            "capture_size_steps": [
                {"step": s.step, "sizes": list(s.sizes), "removed": list(s.removed), "source": s.source}
                for s in self.capture_size_steps
            ],
            "engine_default_sizes": list(self.engine_default_sizes),
            "device": dataclasses.asdict(self.device),
            "model": self.model.summary(),
            # issue 37: only once decode batches were recorded (plans without traffic stay as they were)
            **({"capture_sizes_from": self.capture_sizes_from} if self.capture_sizes_from else {}),
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
    record = calibration.load_record(options.calibration) if options.calibration else None
    identity = (calibration.config_digest(model_path), calibration.engine_release())
    if options.engine_release is None:
        # Serving: the image's own vllm-ascend selects the rules when the table has a row for it.
        installed = engines.installed_version("vllm-ascend")
        if installed is not None and installed[1] in releases.RULES:
            options = dataclasses.replace(options, engine_release=installed[1])
    return make_plan(
        options,
        device,
        model,
        resolve_mode=resolve_mode,
        environ=os.environ if environ is None else environ,
        calibration_record=record,
        identity=identity,
    )


def make_plan(
    options: PlanOptions,
    device: DeviceInfo,
    model: ModelInfo,
    *,
    resolve_mode: bool = True,
    environ: Mapping[str, str] | None = None,
    calibration_record: calibration.Calibration | None = None,
    identity: tuple[str | None, str | None] = (None, None),
) -> Plan:
    """The plan for `model` on `device`. Pure.

    `calibration_record` (an earlier engine's measurements, `calibration`) replaces estimates when
    its key equals this plan's; `identity` is the (config digest, engine release) part of the key.

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
    layout = make_layout(options, device, model, warnings)
    quantization = _quantization(options, model, warnings)
    mode, downgrades = _graph_mode(options, device, model, resolve_mode, warnings)
    rules = releases.select(options.engine_release)
    flashcomm1 = _flashcomm1(options, device, env)
    q = 1 + options.speculative_tokens
    ceiling, candidates = _candidate_sizes(options, mode, q, warnings, flashcomm1)
    batched_tokens = _batched_tokens(options, ceiling)
    candidates = _engine_kept(rules, options, mode, candidates, batched_tokens, flashcomm1, warnings)
    key = calibration.plan_key(
        config_digest=identity[0] or "",
        quantization=quantization,
        device_name=device.name,
        layout=layout,
        engine=identity[1] or "",
        role=options.role,
    )
    inputs = BudgetInputs(
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
        rules=rules,
        flashcomm1=flashcomm1,
        fused_mc2=_fused_mc2(options, env),
    )
    calibrated = _calibrated(calibration_record, key, warnings)
    # The estimates first: a record never makes fit what they cannot (DoesNotFitError here), and
    # every measured figure is judged against them (`calibration.plausible`).
    estimate = _fitted(inputs, mode, downgrades, warnings, quantization, key, calibration_record, None)
    if calibrated is None:
        return estimate
    kept = calibrated.only(_plausible_figures(calibrated, estimate.memory, device, warnings))
    try:
        return _fitted(inputs, mode, downgrades, warnings, quantization, key, calibration_record, kept)
    except DoesNotFitError as exc:
        warnings.append(f"the calibrated plan does not fit ({exc}): the estimates are used")
    return _fitted(inputs, mode, downgrades, warnings, quantization, key, calibration_record, kept.only({}))


def _fitted(
    inputs: BudgetInputs,
    mode: str,
    downgrades: list[Downgrade],
    warnings: list[str],
    quantization: str | None,
    key: dict[str, str | None],
    record: calibration.Calibration | None,
    calibrated: calibration.Calibration | None,
) -> Plan:
    """The plan of `inputs` with `calibrated` (its measured figures and its capture cap) or without a
    record; `warnings` and `downgrades` are copied, so each try starts from the same ones."""
    warnings = list(warnings)
    candidates, mode, capped = _cap_below_failed_capture(
        calibrated, inputs.candidates, mode, inputs.resolve_mode, warnings
    )
    inputs = dataclasses.replace(inputs, candidates=candidates, calibrated=calibrated)
    fit_warnings: list[str] = []
    fit = fit_budget(make_budget(inputs, fit_warnings), mode, fit_warnings)
    report = _calibration_report(key, record, calibrated, capped)
    all_downgrades = [*downgrades, *([capped] if capped else []), *fit.downgrades]
    return _plan(inputs, fit, all_downgrades, warnings + list(fit.warnings), quantization, report)


def _plausible_figures(
    record: calibration.Calibration, estimated: MemoryPlan, device: DeviceInfo, warnings: list[str]
) -> dict[str, int]:
    """The record's measured figures that are plausible for this plan (`calibration.plausible`);
    a warning for each of the others, which are not used."""
    kept: dict[str, int] = {}
    for figure, value in sorted(record.measured.items()):
        why = calibration.plausible(value, getattr(estimated, figure, None), device.total_bytes)
        if why is None:
            kept[figure] = value
        else:
            warnings.append(f"calibration: measured {figure} not used: {why}")
    return kept


def _graph_mode(
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


def _cap_below_failed_capture(
    calibrated: calibration.Calibration | None,
    candidates: tuple[int, ...],
    mode: str,
    resolve_mode: bool,
    warnings: list[str],
) -> tuple[tuple[int, ...], str, Downgrade | None]:
    """(candidates, mode, the downgrade when capped): the sizes below the one an earlier engine
    failed to capture, NONE when none is left; unchanged when the record has no failure."""
    if not calibrated or calibrated.failed_size is None or mode == modes.NONE:
        return candidates, mode, None
    below = tuple(size for size in candidates if size < calibrated.failed_size)
    cause = "out of memory" if calibrated.failed_class == GRAPH_CAPTURE_OOM else "out of streams"
    if not below and not resolve_mode:
        # Without resolve_mode the mode is the engine's (fit._choose_graphs never changes it):
        # keep the mode and the largest size, as _choose_sizes does when none fits, and say so.
        warnings.append(
            f"an earlier engine ran {cause} ({calibrated.failed_class}) capturing size "
            f"{calibrated.failed_size} and no capture size is below it: the mode is the engine's, "
            "so the largest size is kept; expect the engine to fail at capture or to run eagerly"
        )
        return sizes.thin(candidates, 1), mode, None
    target = mode if below else modes.NONE
    downgrade = Downgrade(
        mode,
        target,
        "CaptureFailedBefore",
        f"an earlier engine ran {cause} ({calibrated.failed_class}) capturing size "
        f"{calibrated.failed_size}: capture sizes capped below it"
        + ("" if below else f"; none is left, {mode} -> {modes.NONE}"),
    )
    return below, target, downgrade


def _calibration_report(
    key: dict[str, str | None],
    record: calibration.Calibration | None,
    calibrated: calibration.Calibration | None,
    capped: Downgrade | None,
) -> dict[str, Any]:
    """The plan's `calibration` section: its key, whether a record applied, which figures it used."""
    return {
        "key": key,
        "record": "none" if record is None else "applied" if calibrated else "other-key",
        "margin": calibration.MARGIN,
        "measured_used": sorted(calibrated.measured) if calibrated else [],
        "capped_below": calibrated.failed_size if calibrated and capped else None,
    }


def _plan(
    inputs: BudgetInputs,
    fit: Fit,
    downgrades: list[Downgrade],
    warnings: list[str],
    quantization: str | None,
    calibration_report: dict[str, Any],
) -> Plan:
    """The Plan of a fitted budget: the decode batches left eager, the engine's arguments."""
    options, mode = inputs.options, fit.mode
    q = 1 + options.speculative_tokens
    eager = _eager_decode_batches(mode, fit.sizes, options.max_num_seqs, q, warnings)
    vllm_args = _vllm_args(
        options, mode, fit.sizes, fit.memory, inputs.dtype, inputs.max_model_len, inputs.batched_tokens, inputs.layout
    )
    if quantization is not None and (options.quantization or quantization == ASCEND_QUANTIZATION):
        # vLLM reads a config's quantization_config itself; ModelSlim checkpoints are named, as
        # vllm-ascend's tutorials do (--quantization ascend).
        vllm_args += ("--quantization", quantization)
    engine = functools.partial(
        releases.engine_capture_sizes,
        inputs.rules,
        mode=mode,
        max_num_seqs=options.max_num_seqs,
        decode_query_len=q,
        max_num_batched_tokens=inputs.batched_tokens,
        tensor_parallel=options.tensor_parallel,
        flashcomm1=inputs.flashcomm1,
    )
    steps = engine(explicit=fit.sizes) if fit.sizes else ()
    default = engine()[-1].sizes
    return Plan(
        requested_mode=options.graph_mode,
        effective_mode=mode,
        capture_sizes=fit.sizes,
        downgrades=tuple(downgrades),
        memory=fit.memory,
        streams=fit.streams,
        vllm_args=vllm_args,
        warnings=tuple(warnings),
        device=inputs.device,
        model=inputs.model,
        mode_resolved_by="plan" if inputs.resolve_mode else "engine",
        max_num_seqs=options.max_num_seqs,
        max_model_len=inputs.max_model_len,
        max_num_batched_tokens=inputs.batched_tokens,
        decode_query_len=q,
        max_capture_size=max(fit.sizes, default=0),
        eager_decode_batches=eager,
        dtype=inputs.dtype,
        tensor_parallel=options.tensor_parallel,
        pipeline_parallel=options.pipeline_parallel,
        data_parallel=options.data_parallel,
        layout=inputs.layout,
        quantization=quantization,
        calibration=calibration_report,
        capture_sizes_from=fit.traffic.to_dict() if fit.traffic is not None and fit.traffic.steps else None,
        engine_release=inputs.rules.release,
        flashcomm1=inputs.flashcomm1,
        capture_size_steps=steps,
        engine_default_sizes=default,
    )


def _flashcomm1(options: PlanOptions, device: DeviceInfo, env: Mapping[str, str]) -> bool:
    """vllm-ascend's flashcomm1 (vllm_ascend/utils.py enable_sp): --flashcomm1 (serve reads
    additional_config enable_flashcomm1), else VLLM_ASCEND_ENABLE_FLASHCOMM1; NPUs only."""
    if device.kind != "npu":
        return False
    if options.flashcomm1 is not None:
        return options.flashcomm1
    return env.get("VLLM_ASCEND_ENABLE_FLASHCOMM1", "0").strip() not in ("", "0")


def _fused_mc2(options: PlanOptions, env: Mapping[str, str]) -> int:
    """vllm-ascend's enable_fused_mc2 (vllm_ascend/ascend_config.py): --fused-mc2, else
    VLLM_ASCEND_ENABLE_FUSED_MC2, else 0."""
    if options.fused_mc2 is not None:
        return options.fused_mc2
    text = env.get("VLLM_ASCEND_ENABLE_FUSED_MC2", "0").strip()
    return int(text) if text.isdigit() else 0


def _engine_kept(
    rules: releases.ReleaseRules,
    options: PlanOptions,
    mode: str,
    candidates: tuple[int, ...],
    batched_tokens: int,
    flashcomm1: bool,
    warnings: list[str],
) -> tuple[int, ...]:
    """The candidates the engine keeps: the release's algorithm run on the plan's explicit list
    (`releases.engine_capture_sizes`), so that the plan lists only sizes the engine captures; each
    size it drops is named with the step and the source that drop it."""
    if mode == modes.NONE or not candidates:
        return candidates
    steps = releases.engine_capture_sizes(
        rules,
        explicit=candidates,
        mode=mode,
        max_num_seqs=options.max_num_seqs,
        decode_query_len=1 + options.speculative_tokens,
        max_num_batched_tokens=batched_tokens,
        tensor_parallel=options.tensor_parallel,
        flashcomm1=flashcomm1,
    )
    for step in steps:
        if step.removed:
            warnings.append(
                f"capture sizes {list(step.removed)} left out: vllm-ascend {rules.release} drops them at its "
                f"{step.step} step ({step.source})"
            )
    kept = steps[-1].sizes
    if not kept:
        raise PlanError("capture_sizes", f"vllm-ascend {rules.release} keeps none of {list(candidates)}")
    return kept


def _eager_decode_batches(
    mode: str, chosen: tuple[int, ...], max_num_seqs: int, q: int, warnings: list[str]
) -> tuple[int, int] | None:
    """Decode batches (first, last, in requests) above the largest captured size, though graphs are on."""
    if not modes.decode_mode_is_graph(mode):
        return None
    missed = sizes.uncovered(chosen, max_num_seqs, q)
    if not missed:
        return None
    eager = (missed.start, missed.stop - 1)
    warnings.append(
        f"decode batches of {eager[0]}..{eager[1]} requests are above the largest captured size "
        f"{max(chosen)} and run eagerly"
    )
    return eager


def _calibrated(
    record: calibration.Calibration | None, key: dict[str, str | None], warnings: list[str]
) -> calibration.Calibration | None:
    """The record when its key is this plan's; a warning when it is another key's."""
    if record is None:
        return None
    if record.key != key:
        differs = ", ".join(f"{k} {record.key.get(k)!r} != {key.get(k)!r}" for k in key if record.key.get(k) != key[k])
        warnings.append(f"the calibration record is for another key ({differs}): estimates used")
        return None
    return record


def _validate(
    options: PlanOptions, device: DeviceInfo, model: ModelInfo, family: str, dtype: str, env: dict[str, str]
) -> None:
    """Raise PlanError for invalid input; `dtype` is the resolved one (`_dtype`)."""
    _validate_values(options, device)
    _validate_parallelism(options, device)
    _validate_model_split(options, model)
    _validate_engine_support(options, device, model, family, dtype, env)


def _validate_values(options: PlanOptions, device: DeviceInfo) -> None:
    """Each option's own range: known names, positive counts, speculative tokens with their method."""
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


def _validate_parallelism(options: PlanOptions, device: DeviceInfo) -> None:
    """TP x PP x DP against the devices: whole DP ranks per node, no more devices than are visible."""
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


def _validate_model_split(options: PlanOptions, model: ModelInfo) -> None:
    """The model against the layout: heads over TP, layers over PP, MLA's kv_b_proj unquantized."""
    # vllm/config/parallel.py / model.py verify_with_parallel_config: heads must split evenly.
    if model.num_attention_heads % options.tensor_parallel:
        raise PlanError(
            "tensor_parallel",
            f"{model.num_attention_heads} attention heads cannot be split over {options.tensor_parallel} ranks",
        )
    if options.pipeline_parallel > model.num_layers:
        raise PlanError("pipeline_parallel", f"{options.pipeline_parallel} stages for {model.num_layers} layers")
    if model.is_mla and model.quantized_kv_b_proj:
        # vllm_ascend/attention/mla_v1.py process_weights_after_loading: "We currently do not
        # support quant kv_b_proj" (asserts an UnquantizedLinearMethod); the engine would fail after
        # loading every weight.
        raise PlanError(
            "quantization",
            f"{MODELSLIM_DESCRIPTION} quantizes {model.quantized_kv_b_proj}; vllm-ascend's MLA attention needs "
            "kv_b_proj unquantized (FLOAT): fix the description or requantize without it",
        )


def _validate_engine_support(
    options: PlanOptions, device: DeviceInfo, model: ModelInfo, family: str, dtype: str, env: dict[str, str]
) -> None:
    """What the engine refuses: HCCL buffer and redundant experts out of range, 310P's limits, ACL graphs
    under ASCEND_LAUNCH_BLOCKING."""
    for field in ("hccl_buffsize", "redundant_experts"):
        value = getattr(options, field)
        if value is not None and value < (1 if field == "hccl_buffsize" else 0):
            raise PlanError(field, f"must be a {'positive' if field == 'hccl_buffsize' else 'non-negative'} integer")
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
    decode step of n requests is a batch of n x (1 + speculative tokens) tokens. What the engine
    release keeps of the candidates (`_engine_kept`: flashcomm1 given in the options) is applied
    as make_plan applies it. 0 for graph mode NONE. A planner downgrade on the device (to NONE, or
    a capture that failed) is the pods' to report (status.graph). Raises PlanError for options
    make_plan would refuse the same way.
    """
    if options.graph_mode == modes.NONE or options.enforce_eager:
        return 0
    q = 1 + options.speculative_tokens
    flashcomm1 = bool(options.flashcomm1)
    ceiling, candidates = _candidate_sizes(options, options.graph_mode, q, [], flashcomm1)
    rules = releases.select(options.engine_release)
    kept = _engine_kept(
        rules, options, options.graph_mode, candidates, _batched_tokens(options, ceiling), flashcomm1, []
    )
    return min(max(kept) // q, options.max_num_seqs)


def batched_token_budget(options: PlanOptions) -> int:
    """max_num_batched_tokens of a plan for `options`: the prompt tokens one engine (DP rank) takes
    into one step. Like `largest_decode_batch`, from the options alone (the requested mode's
    ceiling, flashcomm1 as given in the options; `_batched_tokens` does not depend on the device).
    Raises PlanError as make_plan would."""
    q = 1 + options.speculative_tokens
    ceiling, _ = _candidate_sizes(options, options.graph_mode, q, [], bool(options.flashcomm1))
    return _batched_tokens(options, ceiling)


def _candidate_sizes(
    options: PlanOptions, mode: str, q: int, warnings: list[str], flashcomm1: bool = False
) -> tuple[int, tuple[int, ...]]:
    """(ceiling, the sizes before fitting). The ceiling is the largest decode batch in tokens.

    Our own additions to vLLM's grid, passed to the engine as an explicit list so that it captures
    them too: the off-grid ceiling max_num_seqs x (1 + k) (vllm-ascend's default leaves it out,
    #16049); under flashcomm1 with TP > 1 and a mixed graph mode, the ceiling rounded up to a
    multiple of TP, since the engine keeps only multiples of TP (FULL_DECODE_ONLY keeps no size
    above max_num_seqs x (1 + k): there the largest multiple below it, and the batches above it
    run eagerly).
    """
    full_decode = modes.decode_mode(mode) == modes.FULL
    decode_ceiling = options.max_num_seqs * q
    tp = options.tensor_parallel
    if flashcomm1 and tp > 1 and mode != modes.FULL_DECODE_ONLY and options.max_capture_size is None:
        multiple = max(q, tp) if full_decode else tp
        decode_ceiling = -(-decode_ceiling // multiple) * multiple
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
    if ceiling < options.max_num_seqs * q:
        warnings.append(
            f"max capture size {ceiling} is below max_num_seqs x (1 + speculative tokens) = {options.max_num_seqs * q}"
        )
    covering = sizes.covering_sizes(options.max_num_seqs, q, ceiling)
    if flashcomm1 and tp > 1 and mode == modes.FULL_DECODE_ONLY:
        # The engine keeps no size above max_num_seqs x (1 + k) here: the largest multiple it keeps
        # below the ceiling covers the most batches a graph can.
        multiple = max(q, tp) if full_decode else tp
        below = ceiling // multiple * multiple
        covering = tuple(sorted({*covering, below})) if below else covering
    return ceiling, covering


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

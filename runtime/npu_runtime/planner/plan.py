"""The plan: graph mode, capture sizes, memory and streams, decided before the model loads.

`make_plan(options, device, model)` is pure (no I/O, no clock): it resolves the graph mode
(`modes.RULES`), lists the capture sizes that cover every decode batch up to max_num_seqs
(`sizes.covering_sizes`) and keeps those the engine release captures (`releases`), fits them to
device memory and to a stream cap where one is set (`fit`), and returns the vLLM arguments that
carry the decision. `plan_for(options, path)` adds the probe and the model inspection.

Each step is its own module: `resolve` (dtype, max_model_len, quantization, graph mode, vllm-ascend
switches), `validation` (PlanError), `capture_candidates` (the sizes before fitting),
`calibrated` (what a calibration record changes), `fit` (the budget) and `vllm_args` (the flags);
this module runs them in order and assembles the `Plan`.

Memory model, per device (all figures in bytes; see docs/planner.md). Each term is its own module
with its sources, and `fit.make_budget` adds them up (a new term is a new module called there):

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
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npu_runtime import engines
from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import calibration, releases
from npu_runtime.planner.calibrated import (
    calibration_section,
    cap_below_failed_capture,
    matching_record,
    plausible_figures,
)
from npu_runtime.planner.capture_candidates import (
    batched_tokens_for,
    candidate_sizes,
    eager_decode_batches,
    engine_kept,
)
from npu_runtime.planner.fit import BudgetInputs, DoesNotFitError, Fit, MemoryPlan, fit_budget, make_budget
from npu_runtime.planner.graphs import StreamPlan
from npu_runtime.planner.layout import Layout, make_layout, node_engine_args
from npu_runtime.planner.lora import DEFAULT_MAX_LORA_RANK, release_check
from npu_runtime.planner.model import ModelInfo, inspect_model
from npu_runtime.planner.modes import Downgrade
from npu_runtime.planner.probe import DeviceInfo, device_family, device_from_options
from npu_runtime.planner.resolve import (
    resolve_dtype,
    resolve_flashcomm1,
    resolve_fused_mc2,
    resolve_graph_mode,
    resolve_max_model_len,
    resolve_quantization,
)
from npu_runtime.planner.validation import validate
from npu_runtime.planner.vllm_args import vllm_args

__all__ = ["DoesNotFitError", "Plan", "PlanError", "make_plan", "node_engine_args", "plan_for"]


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
            "memory": self._memory_dict(),
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
            **({"graphs": self._lora_graphs()} if self.memory.lora else {}),
        }

    def _memory_dict(self) -> dict[str, Any]:
        """The memory section; its LoRA keys only with LoRA on (issue 47: plans without it stay as they were)."""
        memory = {
            **dataclasses.asdict(self.memory),
            "communicators": [dataclasses.asdict(c) for c in self.memory.communicators],
        }
        if self.memory.lora is None:
            del memory["lora_bytes"], memory["lora"]
        return memory

    def _lora_graphs(self) -> dict[str, int]:
        """Graphs the engine captures: each capture size once per LoRA case (`lora.capture_cases`)."""
        cases = self.memory.lora.capture_cases if self.memory.lora else 1
        return {"lora_cases": cases, "captured": len(self.capture_sizes) * cases}


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
    dtype = resolve_dtype(options, model, family)
    validate(options, device, model, family, dtype, env)
    warnings: list[str] = []
    max_model_len = resolve_max_model_len(options, model, env, warnings)
    layout = make_layout(options, device, model, warnings)
    quantization = resolve_quantization(options, model, warnings)
    mode, downgrades = resolve_graph_mode(options, device, model, resolve_mode, warnings)
    rules = releases.select(options.engine_release)
    fused_mc2 = resolve_fused_mc2(options, env)
    if device.kind == "npu":
        mode, lora_downgrade = release_check(options, model, layout, rules, mode, fused_mc2, resolve_mode, warnings)
        downgrades += [lora_downgrade] if lora_downgrade else []
    flashcomm1 = resolve_flashcomm1(options, device, env)
    q = 1 + options.speculative_tokens
    ceiling, candidates = candidate_sizes(options, mode, q, warnings, flashcomm1)
    batched_tokens = batched_tokens_for(options, ceiling)
    candidates = engine_kept(rules, options, mode, candidates, batched_tokens, flashcomm1, warnings)
    key = calibration.plan_key(
        config_digest=identity[0] or "",
        quantization=quantization,
        device_name=device.name,
        layout=layout,
        engine=identity[1] or "",
        role=options.role,
        lora=f"{options.max_loras}x{options.max_lora_rank or DEFAULT_MAX_LORA_RANK}" if options.max_loras else None,
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
        fused_mc2=fused_mc2,
    )
    calibrated = matching_record(calibration_record, key, warnings)
    # The estimates first: a record never makes fit what they cannot (DoesNotFitError here), and
    # every measured figure is judged against them (`calibration.plausible`).
    estimate = _fitted(inputs, mode, downgrades, warnings, quantization, key, calibration_record, None)
    if calibrated is None:
        return estimate
    kept = calibrated.only(plausible_figures(calibrated, estimate.memory, device, warnings))
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
    candidates, mode, capped = cap_below_failed_capture(
        calibrated, inputs.candidates, mode, inputs.resolve_mode, warnings
    )
    inputs = dataclasses.replace(inputs, candidates=candidates, calibrated=calibrated)
    fit_warnings: list[str] = []
    fit = fit_budget(make_budget(inputs, fit_warnings), mode, fit_warnings)
    report = calibration_section(key, record, calibrated, capped)
    all_downgrades = [*downgrades, *([capped] if capped else []), *fit.downgrades]
    return _plan(inputs, fit, all_downgrades, warnings + list(fit.warnings), quantization, report)


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
    eager = eager_decode_batches(mode, fit.sizes, options.max_num_seqs, q, warnings)
    args = vllm_args(
        options, mode, fit.sizes, fit.memory, inputs.dtype, inputs.max_model_len, inputs.batched_tokens, quantization
    )
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
        vllm_args=args,
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

"""The runtime's view of itself and its engine: the /status document and the metric values.

`RuntimeStatus` is written by `serve` (state, plan, engine pid, exit, failure) and read by the
HTTP server's threads; the engine side comes from the observer's per-process reports, read and
aggregated on every request (a handful of small files).

Aggregation over the engine's processes: tensor-parallel workers each capture and replay the
same graphs and see the same decode steps, so per-key values take the largest over processes
(capture memory and time: the worst device), and a replay histogram is taken from the process
with the most timed replays. Instrumentation errors add up (each process's hooks fail alone).
The effective mode is the one a worker resolved, else the final VllmConfig's, else the plan's, else
unknown (null) while the plan is being made.

Capture sizes the engine changed: once capture has finished, the sizes the observer saw captured
are compared with the plan's; any difference is an engine-stage downgrade-like entry with reason
`CaptureSizesOverridden` (planned and captured sizes in it), listed in /status's downgrades and
counted in npu_graph_downgrades_total, so the operator's graph events report it as well. The
planner follows the engine release's own capture-size algorithm (planner/releases.py), so this
names a release whose rules the table does not describe, never silently.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from npu_runtime import metrics, reports
from npu_runtime.serving import batches, measured
from npu_runtime.serving.failures import Failure

STATES: Final = ("starting", "loading", "capturing", "ready", "failed", "stopping")
CAPTURE_SIZES_OVERRIDDEN: Final = "CaptureSizesOverridden"
STATUS_SCHEMA: Final = 1


class Adapters(Protocol):
    """The LoRA adapters' side of the status (`serving.lora.AdapterSync`; none without --lora-adapters)."""

    list_error: str | None

    def document(self) -> list[dict[str, Any]]: ...
    def loaded(self) -> dict[str, bool]: ...
    def settled(self) -> bool: ...


@functools.cache
def runtime_version() -> str:
    """This package's version, looked up once, when a /status first shows it: the lookup scans
    every installed distribution (about 25 ms of CPU in an engine's image), not worth a wait
    before the engine starts."""
    try:
        from importlib.metadata import version

        return version("npu-inference")
    except Exception:
        return "0+unknown"


@dataclasses.dataclass
class EngineView:
    """What the observer reports say, aggregated over the engine's processes."""

    effective_mode: str | None = None
    effective_source: str | None = None  # "engine" (a worker resolved it) or "config" (final VllmConfig)
    phase: str | None = None
    vllm_version: str | None = None
    downgrades: list[dict[str, str]] = dataclasses.field(default_factory=list)
    captures: dict[tuple[str, int], dict[str, Any]] = dataclasses.field(default_factory=dict)
    replay: dict[tuple[str, int], dict[str, Any]] = dataclasses.field(default_factory=dict)
    eager_fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)
    decode_steps: int = 0
    # issue 37: decode batch size (tokens) -> exact count / decayed weight (serving/batches.py)
    decode_batch_counts: dict[int, int] = dataclasses.field(default_factory=dict)
    decode_batch_weights: dict[int, float] = dataclasses.field(default_factory=dict)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    memory: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    processes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # issue 47: requests per LoRA adapter, counted by the API server's observer (observer/lora_requests.py)
    lora_requests: dict[str, int] = dataclasses.field(default_factory=dict)


def aggregate(engine_reports: Sequence[Mapping[str, Any]]) -> EngineView:
    view = EngineView()
    seen_downgrades: set[tuple[str, str, str]] = set()
    phases: set[str] = set()
    for report in engine_reports:
        view.processes.append(
            {
                "pid": report.get("pid"),
                "process": report.get("process"),
                "phase": report.get("phase"),
                "hooks": (report.get("hooks") or {}).get("installed", []),
                "unavailable": (report.get("hooks") or {}).get("unavailable", []),
            }
        )
        view.vllm_version = view.vllm_version or report.get("vllm_version")
        if report.get("phase"):
            phases.add(str(report["phase"]))
        resolved = report.get("resolved_mode")
        config_mode = report.get("config_mode") or {}
        if resolved and view.effective_source != "engine":
            view.effective_mode, view.effective_source = str(resolved), "engine"
        elif config_mode.get("final") and view.effective_source is None:
            view.effective_mode, view.effective_source = str(config_mode["final"]), "config"
        for downgrade in report.get("downgrades") or []:
            key = (downgrade.get("from_mode", ""), downgrade.get("to_mode", ""), downgrade.get("reason", ""))
            if key not in seen_downgrades:
                seen_downgrades.add(key)
                view.downgrades.append({**downgrade, "stage": "engine"})
        for capture in report.get("captures") or []:
            key2 = (str(capture["mode"]), int(capture["size"]))
            known = view.captures.get(key2)
            memory = capture.get("memory_bytes")
            if known is None:
                view.captures[key2] = {"memory_bytes": memory, "seconds": float(capture.get("seconds") or 0.0)}
            else:
                if memory is not None:
                    known["memory_bytes"] = max(known["memory_bytes"] or 0, memory)
                known["seconds"] = max(known["seconds"], float(capture.get("seconds") or 0.0))
        for replay in report.get("replay") or []:
            key2 = (str(replay["mode"]), int(replay["size"]))
            known = view.replay.get(key2)
            if known is None or int(replay.get("timed", 0)) > int(known.get("timed", 0)):
                merged = dict(replay)
                if known is not None:
                    merged["count"] = max(int(known["count"]), int(replay.get("count", 0)))
                view.replay[key2] = merged
            else:
                known["count"] = max(int(known["count"]), int(replay.get("count", 0)))
        for reason, count in (report.get("eager_fallbacks") or {}).items():
            view.eager_fallbacks[reason] = max(view.eager_fallbacks.get(reason, 0), int(count))
        view.decode_steps = max(view.decode_steps, int(report.get("decode_steps") or 0))
        batches.merge_process(view.decode_batch_counts, view.decode_batch_weights, report)
        for hook, count in (report.get("errors") or {}).items():
            view.errors[hook] = view.errors.get(hook, 0) + int(count)
        for adapter, count in (report.get("lora_requests") or {}).items():  # each API server counts its own
            view.lora_requests[str(adapter)] = view.lora_requests.get(str(adapter), 0) + int(count)
        memory_report = report.get("memory") or {}
        device = memory_report.get("device")
        if device:
            for kind in metrics.DEVICE_MEMORY_KINDS:
                if isinstance(memory_report.get(kind), int):
                    view.memory[(str(device), kind)] = int(memory_report[kind])
    if "capturing" in phases:
        view.phase = "capturing"
    elif "captured" in phases:
        view.phase = "captured"
    elif phases:
        view.phase = "loaded"
    return view


@dataclasses.dataclass(frozen=True)
class PlanView:
    """What serve took from the plan (kept as plain data, so this module needs no planner)."""

    requested_mode: str
    effective_mode: str | None  # None until the plan is made: nothing is claimed before it is known
    plan: Mapping[str, Any]
    downgrades: Sequence[Mapping[str, str]] = ()  # stage "plan"
    memory: Mapping[str, int] = dataclasses.field(default_factory=dict)  # kind -> bytes, planned
    # Which part of the replica this pod runs: {"rank": node, "nodes": n, "data_parallel_ranks": [...]}
    # (the node rank it was started with and its DP ranks in the plan's layout); empty before the plan.
    node: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _sizes_text(sizes: Sequence[int]) -> str:
    return "[" + ", ".join(str(size) for size in sizes) + "]"


def capture_overrides(plan: PlanView, view: EngineView) -> list[dict[str, str]]:
    """A `CaptureSizesOverridden` entry when the engine captured other sizes than the plan listed
    (judged once every process finished capturing: phase "captured"); none otherwise."""
    planned = sorted({int(size) for size in plan.plan.get("capture_sizes") or ()})
    captured = sorted({size for _mode, size in view.captures})
    if not planned or view.phase != "captured" or not captured or captured == planned:
        return []
    mode = view.effective_mode or plan.effective_mode or ""
    dropped = [size for size in planned if size not in captured]
    added = [size for size in captured if size not in planned]
    changes = "; ".join(
        part
        for part in (
            f"dropped {_sizes_text(dropped)}" if dropped else "",
            f"added {_sizes_text(added)}" if added else "",
        )
        if part
    )
    return [
        {
            "from_mode": mode,
            "to_mode": mode,
            "reason": CAPTURE_SIZES_OVERRIDDEN,
            "message": f"planned capture sizes {_sizes_text(planned)}, the engine captured {_sizes_text(captured)} "
            f"({changes})",
            "planned": _sizes_text(planned),
            "captured": _sizes_text(captured),
            "stage": "engine",
        }
    ]


class RuntimeStatus:
    """This runtime's state; thread-safe."""

    def __init__(self, observer_dir: str | None, requested_mode: str) -> None:
        self.observer_dir = observer_dir
        self._lock = threading.Lock()
        self._state = "starting"
        self._plan = PlanView(requested_mode=requested_mode, effective_mode=None, plan={})
        self._failure: Failure | None = None
        self._engine_pid: int | None = None
        self._exit_code: int | None = None
        # serve --data-parallel-external: each local rank's API server (rank, port, devices, pid, ready).
        self._ranks: list[dict[str, Any]] = []
        self._adapters: Adapters | None = None  # serve --lora-adapters

    @property
    def state(self) -> str:
        return self._state

    def set_state(self, state: str) -> None:
        assert state in STATES, state
        with self._lock:
            if self._state in ("failed", "stopping") and state not in ("failed", "stopping"):
                return  # terminal: a late health answer must not resurrect a stopping runtime
            self._state = state

    def set_plan(self, plan: PlanView) -> None:
        with self._lock:
            self._plan = plan

    def set_engine(self, pid: int | None) -> None:
        with self._lock:
            self._engine_pid = pid

    def set_exit(self, code: int | None) -> None:
        with self._lock:
            self._exit_code = code

    def set_ranks(self, ranks: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            self._ranks = [dict(rank) for rank in ranks]

    def update_ranks(self, ready: Sequence[bool]) -> None:
        """Each rank's readiness, in the order of `set_ranks`."""
        with self._lock:
            for rank, answered in zip(self._ranks, ready, strict=False):
                rank["ready"] = answered

    def set_adapters(self, adapters: Adapters) -> None:
        with self._lock:
            self._adapters = adapters

    def adapters_settled(self) -> bool:
        """No adapter list, or its first sync with the engine is done (/readyz waits for it)."""
        adapters = self._adapters
        return adapters is None or adapters.settled()

    def fail(self, failure: Failure) -> None:
        with self._lock:
            self._failure = failure
            self._state = "failed"

    def engine_view(self) -> EngineView:
        return aggregate(reports.read_reports(self.observer_dir))

    # ----- /status -----

    def document(self, view: EngineView | None = None) -> dict[str, Any]:
        view = self.engine_view() if view is None else view
        with self._lock:
            plan, state, failure = self._plan, self._state, self._failure
            pid, exit_code = self._engine_pid, self._exit_code
            ranks = [dict(rank) for rank in self._ranks]
        effective = view.effective_mode or plan.effective_mode
        downgrades = (
            [{**dict(d), "stage": "plan"} for d in plan.downgrades] + view.downgrades + capture_overrides(plan, view)
        )
        captures = [
            {"mode": mode, "size": size, "memory_bytes": entry["memory_bytes"], "seconds": entry["seconds"]}
            for (mode, size), entry in sorted(view.captures.items())
        ]
        replay = [
            {
                "mode": mode,
                "size": size,
                "count": int(entry.get("count", 0)),
                "p50_seconds": entry.get("p50_seconds"),
                "p99_seconds": entry.get("p99_seconds"),
            }
            for (mode, size), entry in sorted(view.replay.items())
        ]
        memory: dict[str, dict[str, int]] = {}
        for (device, kind), value in sorted(self._memory(plan, view).items()):
            memory.setdefault(device, {})[kind] = value
        document = {
            "schema": STATUS_SCHEMA,
            "runtime_version": runtime_version(),
            "state": state,
            "requested_mode": plan.requested_mode,
            "effective_mode": effective,
            "effective_mode_source": view.effective_source or "plan",
            "plan": dict(plan.plan),
            "node": dict(plan.node) or None,
            "captures": captures,
            "downgrades": downgrades,
            "replay": replay,
            "eager_fallbacks": dict(sorted(view.eager_fallbacks.items())),
            "decode_steps": view.decode_steps,
            "failure": failure.to_dict() if failure is not None else None,
            "engine": {"pid": pid, "exit_code": exit_code, "vllm_version": view.vllm_version},
            "memory": memory,
            "calibration": self._calibration(plan, view, failure),
            "instrumentation_errors": dict(sorted(view.errors.items())),
            "observer": {"processes": view.processes},
        }
        if ranks:  # serve --data-parallel-external: one API server per rank, each one's state
            document["ranks"] = ranks
        adapters = self._adapters
        if adapters is not None:  # serve --lora-adapters: each listed adapter's state
            document["adapters"] = adapters.document()
            document["adapter_list_error"] = adapters.list_error
        return document

    @staticmethod
    def _calibration(plan: PlanView, view: EngineView, failure: Failure | None) -> dict[str, Any] | None:
        section = measured.calibration_section(
            plan.plan, view.captures, view.memory, failure.to_dict() if failure is not None else None
        )
        if section is not None:  # issue 37: the decode batches, for the next plan's capture sizes
            seconds = [float(entry["seconds"]) for entry in view.captures.values() if entry.get("seconds")]
            section["decode_batches"] = batches.section(
                plan.plan, view.decode_batch_counts, view.decode_batch_weights, seconds
            )
        return section

    @staticmethod
    def _memory(plan: PlanView, view: EngineView) -> dict[tuple[str, str], int]:
        memory = {("plan", kind): int(value) for kind, value in plan.memory.items()}
        memory.update(view.memory)
        return memory

    # ----- /metrics -----

    def metric_values(self, view: EngineView | None = None) -> metrics.MetricValues:
        view = self.engine_view() if view is None else view
        with self._lock:
            plan = self._plan
        downgrades: dict[tuple[str, str, str, str], int] = {}
        engine_downgrades = view.downgrades + capture_overrides(plan, view)
        for stage, items in (("plan", plan.downgrades), ("engine", engine_downgrades)):
            for d in items:
                key = (str(d.get("from_mode")), str(d.get("to_mode")), str(d.get("reason")), stage)
                downgrades[key] = downgrades.get(key, 0) + 1
        capture_sizes: dict[str, int] = {}
        for mode, _size in view.captures:
            capture_sizes[mode] = capture_sizes.get(mode, 0) + 1
        replay = {
            key: metrics.HistogramValue(
                buckets=tuple(int(b) for b in entry.get("buckets") or ()),
                sum=float(entry.get("sum_seconds") or 0.0),
            )
            for key, entry in view.replay.items()
        }
        return metrics.MetricValues(
            requested_mode=plan.requested_mode,
            effective_mode=view.effective_mode or plan.effective_mode,
            downgrades=downgrades,
            capture_sizes=capture_sizes,
            capture_memory={
                key: int(entry["memory_bytes"])
                for key, entry in view.captures.items()
                if entry["memory_bytes"] is not None
            },
            capture_seconds={key: float(entry["seconds"]) for key, entry in view.captures.items()},
            replay=replay,
            eager_fallbacks=dict(view.eager_fallbacks),
            device_memory=self._memory(plan, view),
            instrumentation_errors=dict(view.errors),
            decode_batches=dict(view.decode_batch_counts),
            lora_loaded=self._adapters.loaded() if self._adapters is not None else {},
            lora_requests=dict(view.lora_requests),
        )

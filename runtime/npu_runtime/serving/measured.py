"""Estimated versus measured, per memory term: the /status section the operator calibrates from.

`calibration_section(plan, captures, memory, failure)` is pure: it takes the plan document, the
observer's captures (mode, size) -> memory and its per-device memory (weights after load, KV cache,
graphs), and the runtime's failure, and returns

    {"key": {...},                          # the plan's calibration key (planner/calibration.py)
     "estimated": {term: bytes},            # weights, activation, margin, kv_cache, graphs, ...
     "measured": {term: bytes},             # what the engine measured (the busiest device)
     "ratio": {term: measured / estimated}, # where both are known
     "device_bytes": int|null,              # the plan's per-device memory (the bound of any figure)
     "captured_size": int|null,             # the largest size captured (a failure there is over)
     "capture_failure": {"size", "error_class"}|null}

The measured names are the record's (planner/calibration.py MEASURED_FIGURES). A capture failure is
a GraphCaptureOutOfMemory or StreamResourcesExhausted exit while capturing; its size is the largest
planned size the observer had not seen captured (vLLM captures the largest first).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any, Final

from npu_runtime.contract import CAPTURE_FAILURE_CLASSES

__all__ = ["CAPTURE_FAILURES", "calibration_section"]

CAPTURE_FAILURES: Final = CAPTURE_FAILURE_CLASSES  # one definition, in contract.py
_ESTIMATED: Final = (
    "weights_bytes",
    "activation_bytes",
    "margin_bytes",
    "kv_cache_bytes",
    "graph_bytes",
    "graph_first_capture_bytes",
    "graph_per_size_bytes",
)
# observer memory kind -> record figure
_MEASURED_KINDS: Final = {"weights": "weights_bytes", "kv_cache": "kv_cache_bytes", "graphs": "graph_bytes"}


def calibration_section(
    plan: Mapping[str, Any],
    captures: Mapping[tuple[str, int], Mapping[str, Any]],
    memory: Mapping[tuple[str, str], int],
    failure: Mapping[str, str] | None,
) -> dict[str, Any] | None:
    """The section (see the module); None before the plan is made."""
    planned = plan.get("memory")
    if not isinstance(planned, Mapping):
        return None
    estimated = {name: int(planned[name]) for name in _ESTIMATED if isinstance(planned.get(name), int)}
    measured: dict[str, int] = {}
    for (device, kind), value in memory.items():
        name = _MEASURED_KINDS.get(kind)
        if device != "plan" and name and value > 0:
            measured[name] = max(measured.get(name, 0), int(value))
    by_size = {size: int(entry["memory_bytes"]) for (_, size), entry in captures.items() if entry.get("memory_bytes")}
    if by_size:
        largest = max(by_size)
        measured["graph_first_capture_bytes"] = by_size[largest]
        others = [value for size, value in by_size.items() if size != largest]
        if others:
            measured["graph_per_size_bytes"] = max(int(statistics.median(others)), 1)
    ratio = {name: round(measured[name] / estimated[name], 4) for name in measured if estimated.get(name, 0) > 0}
    return {
        "key": dict(plan.get("calibration", {}).get("key") or {}),
        "estimated": estimated,
        "measured": measured,
        "ratio": ratio,
        "device_bytes": (plan.get("device") or {}).get("total_bytes"),
        "captured_size": max(by_size) if by_size else None,
        "capture_failure": _capture_failure(plan, by_size, failure),
    }


def _capture_failure(
    plan: Mapping[str, Any], captured: Mapping[int, int], failure: Mapping[str, str] | None
) -> dict[str, Any] | None:
    if failure is None or failure.get("reason") not in CAPTURE_FAILURES:
        return None
    sizes = [size for size in plan.get("capture_sizes") or [] if isinstance(size, int) and size not in captured]
    if not sizes:
        return None
    return {"size": max(sizes), "error_class": failure["reason"]}

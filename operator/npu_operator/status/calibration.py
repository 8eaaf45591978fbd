"""Calibration records: what a resource's pods measured, kept for its later pods when they agree.

The runtime's /status carries a `calibration` section (npu_runtime.serving.measured): the plan's
key, the estimated and the measured figures per memory term, the device's memory, the largest
size captured and a capture failure. This module folds the sections into a bounded record the
operator stores in one ConfigMap per NPUInference (`<name>-calibration`, created by the operator
before any pod, owned by the resource, key `record.json`), which the pod template mounts
read-only and the runtime reads with `--calibration` (npu_runtime.planner.calibration).

Trust (what pods say is untrusted input; docs/planner.md "Calibration", docs/security.md):
- bounded: only the record's known figures, whole bytes below 16 TiB, key strings of at most 256
  characters; `parse_section` never raises, anything else is dropped; at most MAX_REPORTS runs
  are remembered;
- plausible: a figure at or above the reported device memory, or outside the runtime's
  PLAUSIBLE_BAND (1/8x to 8x) of the reporter's own estimate, is never kept; the report is
  `Implausible` (status.graph.calibration.implausible, a CalibrationRejected condition and its
  Warning Event), and the runtime checks the band again against its own estimate;
- the key's layout must be the one the operator computes from the spec it owns (TP, PP, DP, EP,
  nodes, EPLB's redundant experts) and its role the role whose pods report: a report for another
  layout or role is ignored, so a pod cannot file figures under a layout or role it does not run;
- agreed: a measured figure replaces the estimate only when at least QUORUM different pods (pod
  uids) reported it within AGREEMENT of their median; the record holds the higher median of those
  (so one pod's low figure never wins over honest ones, and one pod alone never decides);
- a capture failure counts when at least QUORUM different runs (pod uid and its kubelet restart
  count: a pod that failed and restarted counts twice, one forged report once) reported one: the
  cap is the QUORUM-th smallest failed size, so one lying run cannot lower it below an honest one;
  a later run that captured at or above a failed size drops that failure;
- the key follows the pods: it changes only when no current report is for it (the model, device
  or engine changed), to the key most current reports give;
- one record per resource, named after it and owned by it: what a pod reports can only change its
  own resource's record, never another resource's budget.

The status loop (`controller.reconcile.store_calibration`) folds the current reports of the
resource's own pods into the stored record with `fold_record` each tick and applies the ConfigMap
only when the record changed; `graph_section` is what `status.graph.calibration` shows. The
ConfigMap is not part of the pod template (only its name is), so a new record never rolls the
pods: the next pod that starts (a restart, a rollout, a scale out) plans with it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.planner.calibration import (
    CAPTURE_FAILURE_CLASSES,
    KEY_FIELDS,
    MAX_FIGURE,
    MAX_RECORD_BYTES,
    MEASURED_FIGURES,
    PLAUSIBLE_BAND,
    SCHEMA,
    plausible,
    with_later_fields,
)

from npu_operator.children.kinds import CALIBRATION_RECORD
from npu_operator.kube.names import RECORD_FILE, RECORD_MOUNT
from npu_operator.status.decode_batches import QUORUM, DecodeBatchesSection
from npu_operator.status.decode_batches import parse_section as parse_decode_batches

__all__ = [
    "AGREEMENT",
    "MAX_RECORD_BYTES",
    "QUORUM",
    "RECORD_FILE",
    "RECORD_MOUNT",
    "CalibrationSection",
    "Reporter",
    "configmap",
    "configmap_name",
    "expected_layouts",
    "fold_record",
    "graph_section",
    "implausible",
    "parse_section",
    "ratios",
    "rejected_message",
    "stored_record",
]

MAX_KEY_CHARS: Final = 256
# How close to their median the agreeing pods' figures must be (relative).
AGREEMENT: Final = 0.25
# Runs remembered in the record (the oldest dropped first): ~300 bytes each, far below 64 KiB.
MAX_REPORTS: Final = 16
_ESTIMATED: Final = (*MEASURED_FIGURES, "activation_bytes", "margin_bytes")


@dataclasses.dataclass(frozen=True)
class CalibrationSection:
    """A checked `calibration` section of one pod's /status."""

    key: dict[str, str | None]
    estimated: dict[str, int]
    measured: dict[str, int]
    capture_failure: tuple[int, str] | None
    decode_batches: DecodeBatchesSection | None = None  # issue 37 (status/decode_batches.py)
    device_bytes: int | None = None
    captured_size: int | None = None


@dataclasses.dataclass(frozen=True)
class Reporter:
    """Who reported a section: the pod's name (for messages), its uid and its kubelet restart count
    (both from the pod object the watch holds, never from the pod's own answer)."""

    pod: str
    uid: str
    restarts: int = 0

    @property
    def run(self) -> str:
        return f"{self.uid}/{self.restarts}"


def parse_section(value: Any) -> CalibrationSection | None:
    """The checked section in `value`; None when absent or unusable. Never raises."""
    if not isinstance(value, Mapping):
        return None
    key_in = value.get("key")
    if isinstance(key_in, Mapping):  # a runtime from before the role or LoRA was in the key
        key_in = with_later_fields(key_in)
    if not isinstance(key_in, Mapping) or set(key_in) != set(KEY_FIELDS):
        return None
    key: dict[str, str | None] = {}
    for name in KEY_FIELDS:
        item = key_in[name]
        if item is not None and not (isinstance(item, str) and len(item) <= MAX_KEY_CHARS):
            return None
        key[name] = item
    failure = value.get("capture_failure")
    failed: tuple[int, str] | None = None
    failure_ok = isinstance(failure, Mapping) and _figure(failure.get("size"))
    if failure_ok and isinstance(failure, Mapping) and failure.get("error_class") in CAPTURE_FAILURE_CLASSES:
        failed = (int(failure["size"]), str(failure["error_class"]))
    device, captured = value.get("device_bytes"), value.get("captured_size")
    return CalibrationSection(
        key=key,
        estimated=_figures(value.get("estimated"), _ESTIMATED),
        measured=_figures(value.get("measured"), MEASURED_FIGURES),
        capture_failure=failed,
        decode_batches=parse_decode_batches(value.get("decode_batches")),  # issue 37
        device_bytes=_whole(device),
        captured_size=_whole(captured),
    )


def expected_layouts(
    tensor: int, pipeline: int, data: int, nodes: int, *, expert: bool, redundant: int = 0
) -> frozenset[str]:
    """The layout keys (npu_runtime.planner.calibration.layout_key) a pod of this spec can report:
    EP is TP x DP with expert parallelism on a MoE model, 1 on a dense one (the operator does not
    read the model), and EPLB's redundant experts count only with EP."""
    base = f"tp{tensor}-pp{pipeline}-dp{data}"
    found = {f"{base}-ep1-nodes{nodes}"}
    if expert and tensor * data > 1:
        found.add(f"{base}-ep{tensor * data}-nodes{nodes}" + (f"-redundant{redundant}" if redundant else ""))
    return frozenset(found)


def implausible(section: CalibrationSection) -> dict[str, str]:
    """The section's measured figures that cannot be measurements of its own plan, and why
    (`npu_runtime.planner.calibration.plausible`: below the device, within the band of the estimate)."""
    found: dict[str, str] = {}
    for name, value in sorted(section.measured.items()):
        estimated = section.estimated.get(name)
        if estimated is None:
            continue  # no estimate to judge it by: not used, not a lie (the runtime plans without it)
        why = plausible(value, estimated, section.device_bytes)
        if why is not None:
            found[name] = why
    return found


def rejected_message(rejected: Mapping[str, Sequence[str]]) -> str | None:
    """The CalibrationRejected condition's message for the figures, by pod, that were not kept; None: none."""
    if not rejected:
        return None
    listed = "; ".join(f"pod {pod}: {', '.join(figures)}" for pod, figures in sorted(rejected.items()))
    low, high = PLAUSIBLE_BAND
    return (
        f"implausible calibration figures not kept (at or above the device's memory, or outside "
        f"{low:g}x..{high:g}x of the pod's own estimate): {listed}"
    )


def fold_record(
    previous: Mapping[str, Any] | None,
    sections: Sequence[tuple[Reporter, CalibrationSection]],
    layouts: frozenset[str],
    role: str | None = None,
) -> dict[str, Any] | None:
    """The record after the pods' current `sections` (in pod-name order), from the stored
    `previous`; None while there is none to keep. Sections of another layout or role are ignored;
    the key changes only when no current section is for the stored one (see the module)."""
    usable = [(who, s) for who, s in sections if s.key.get("layout") in layouts and s.key.get("role") == role]
    record_key = previous.get("key") if previous is not None else None
    keys = [s.key for _, s in usable]
    if keys and record_key not in keys:
        record_key = max(keys, key=keys.count)  # the most reported; the first of those in pod-name order
    if not isinstance(record_key, dict):
        return None
    same = previous is not None and previous.get("key") == record_key
    reports = _reports(previous) if same and previous is not None else []
    for who, section in usable:
        if section.key == record_key:
            reports = _merged(reports, who, section)
    measured, failure = _agreed(reports)
    return {
        "schema": SCHEMA,
        "key": dict(record_key),
        "measured": measured,
        "capture_failure": failure,
        "reports": reports,
    }


def _merged(reports: list[dict[str, Any]], who: Reporter, section: CalibrationSection) -> list[dict[str, Any]]:
    """`reports` with `who`'s run as `section` tells it: its plausible figures, its capture failure
    and largest capture. A run whose entry changed moves to the end (it is the latest); a capture
    at or above an earlier run's failed size drops that failure."""
    bad = implausible(section)
    kept = {k: v for k, v in section.measured.items() if k not in bad and k in section.estimated}
    before = next((r for r in reports if r.get("run") == who.run), None)
    if before is not None:  # a run measures more as it goes (weights, then KV, then graphs): kept together
        kept = {**before.get("measured", {}), **kept}
    entry: dict[str, Any] = {
        "run": who.run,
        "pod": who.uid,
        "measured": dict(sorted(kept.items())),
        "failed": None
        if section.capture_failure is None
        else {"size": section.capture_failure[0], "error_class": section.capture_failure[1]},
        "captured": section.captured_size,
    }
    if any({k: v for k, v in r.items() if k != "dropped"} == entry for r in reports):
        return reports  # a steady report (its failure dropped or not): the record stays as it is
    earlier = [r for r in reports if r.get("run") != who.run]
    if entry["captured"] is not None:
        for old in earlier:
            failed = old.get("failed")
            if isinstance(failed, Mapping) and int(failed.get("size", 0)) <= entry["captured"]:
                old["dropped"] = True  # kept, so that the same report read again does not bring it back
    return [*earlier, entry][-MAX_REPORTS:]


def _agreed(reports: Sequence[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, Any] | None]:
    """(the measured figures at least QUORUM pods agree on, the capture failure at least QUORUM runs saw)."""
    latest: dict[str, dict[str, int]] = {}
    for report in reports:  # per pod, the latest run that measured a figure speaks for it
        latest.setdefault(str(report.get("pod")), {}).update(report.get("measured") or {})
    measured: dict[str, int] = {}
    for name in MEASURED_FIGURES:
        values = [int(figures[name]) for figures in latest.values() if name in figures]
        if len(values) < QUORUM:
            continue
        middle = statistics.median_high(values)
        agreeing = [v for v in values if abs(v - middle) <= AGREEMENT * middle]
        if len(agreeing) >= QUORUM:
            measured[name] = statistics.median_high(agreeing)
    failures = sorted(
        (int(r["failed"]["size"]), str(r["failed"]["error_class"]))
        for r in reports
        if isinstance(r.get("failed"), Mapping) and not r.get("dropped")
    )
    if len(failures) < QUORUM:
        return measured, None
    size, error_class = failures[QUORUM - 1]
    return measured, {"size": size, "error_class": error_class}


def _reports(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runs a stored record remembers (its own bookkeeping; a hand edit that is none is dropped)."""
    found: list[dict[str, Any]] = []
    for item in record.get("reports") or []:
        if (
            not isinstance(item, Mapping)
            or not isinstance(item.get("run"), str)
            or not isinstance(item.get("pod"), str)
        ):
            continue
        measured = _figures(item.get("measured"), MEASURED_FIGURES)
        failed = item.get("failed")
        if not (
            isinstance(failed, Mapping)
            and _figure(failed.get("size"))
            and failed.get("error_class") in CAPTURE_FAILURE_CLASSES
        ):
            failed = None
        captured = item.get("captured")
        entry: dict[str, Any] = {
            "run": item["run"],
            "pod": item["pod"],
            "measured": measured,
            "failed": None if failed is None else {"size": int(failed["size"]), "error_class": failed["error_class"]},
            "captured": _whole(captured),
        }
        if item.get("dropped") is True:
            entry["dropped"] = True
        found.append(entry)
    return found[-MAX_REPORTS:]


def stored_record(configmap: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The record a live ConfigMap holds; None when there is none or it is not one (a hand edit):
    the next report then writes a fresh one. Never raises."""
    text = ((configmap or {}).get("data") or {}).get(RECORD_FILE)
    if not isinstance(text, str) or len(text) > MAX_RECORD_BYTES:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA or not isinstance(record.get("key"), dict):
        return None
    return record


def graph_section(
    sections: Sequence[CalibrationSection],
    record: Mapping[str, Any] | None,
    resource: str,
    rejected: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any] | None:
    """`status.graph.calibration`: the stored record (its ConfigMap, layout, the measured figures
    it holds, a failed capture size), measured / estimated per term, the largest over the pods
    (the term the plan underestimated most), to 3 significant digits so that a steady engine
    costs no status write, and `implausible`: the figures not kept, by pod (`implausible`)."""
    if record is None and not sections:
        return None
    worst: dict[str, float] = {}
    for section in sections:
        for name, ratio in ratios(section).items():
            worst[name] = max(worst.get(name, 0.0), ratio)
    shown: dict[str, Any] = {}
    if worst:
        shown["ratios"] = {name: float(f"{ratio:.3g}") for name, ratio in sorted(worst.items())}
    if record is not None:
        shown["record"] = configmap_name(resource)
        shown["layout"] = str(record["key"].get("layout"))
        shown["measured"] = sorted(record.get("measured") or {})
        failure = record.get("capture_failure")
        if isinstance(failure, Mapping):
            shown["cappedBelow"] = int(failure["size"])
            shown["captureFailure"] = str(failure["error_class"])
    if rejected:
        shown["implausible"] = {pod: sorted(figures) for pod, figures in sorted(rejected.items())}
    return shown or None


def ratios(section: CalibrationSection) -> dict[str, float]:
    """measured / estimated per term, for status.graph (rounded to 4 digits)."""
    return {
        name: round(section.measured[name] / section.estimated[name], 4)
        for name in sorted(section.measured)
        if section.estimated.get(name, 0) > 0
    }


def configmap_name(resource: str) -> str:
    """`<resource>-calibration`, shortened like every child's name (`children.kinds.ChildKind.child_name`)."""
    return CALIBRATION_RECORD.child_name(resource)


def configmap(
    resource: str, namespace: str, labels: Mapping[str, str], record: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The ConfigMap that holds `resource`'s record (the caller adopts it: owner reference); without
    a record, the empty one the operator creates before any pod mounts the name."""
    data = {} if record is None else {RECORD_FILE: json.dumps(record, sort_keys=True, separators=(",", ":"))}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(resource), "namespace": namespace, "labels": dict(sorted(labels.items()))},
        "data": data,
    }


def _figures(value: Any, names: tuple[str, ...]) -> dict[str, int]:
    if not isinstance(value, Mapping):
        return {}
    found: dict[str, int] = {}
    for name in names:
        item = value.get(name)
        if isinstance(item, float) and math.isfinite(item) and item.is_integer():
            item = int(item)
        if isinstance(item, int) and _figure(item):
            found[name] = item
    return found


def _whole(value: Any) -> int | None:
    return int(value) if _figure(value) else None


def _figure(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_FIGURE

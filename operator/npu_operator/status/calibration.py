"""Calibration records: what a resource's pods measured, kept for its later pods.

The runtime's /status carries a `calibration` section (npu_runtime.serving.measured): the plan's
key, the estimated and the measured figures per memory term, and a capture failure. This module
turns it into a bounded record the operator stores in one ConfigMap per NPUInference
(`<name>-calibration`, owned by the resource, key `record.json`), which the pod template mounts
read-only and the runtime reads with `--calibration` (npu_runtime.planner.calibration: a record
applies only when its key equals the plan's, with a 10 % margin on every measured figure).

Trust (what pods say is untrusted input):
- bounded: only the record's known figures, whole bytes below 16 TiB, key strings of at most 256
  characters; `parse_section` never raises, anything else is dropped;
- the layout part of the key must be the one the operator computes from the spec it owns (TP, PP,
  DP, nodes); a report for another layout is ignored, so a pod cannot file figures under a layout
  it does not run;
- one record per resource, named after it and owned by it: what a pod reports can only change
  its own resource's record, never another resource's budget; a new key replaces the record
  (the model, device or engine changed), the same key updates it;
- a capture failure only ever lowers the cap (the smallest failed size is kept), so a pod that
  lies about a failure can make its own resource capture fewer sizes, never more.

The status loop (`controller.reconcile.store_calibration`) folds the current reports of the resource's own
pods into the stored record with `fold_record` each tick and applies the ConfigMap only when the
record changed; `graph_section` is what `status.graph.calibration` shows. The ConfigMap is not part
of the pod template (only its name is), so a new record never rolls the pods: the next pod that
starts (a restart, a rollout, a scale out) plans with it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.planner.calibration import (
    CAPTURE_FAILURE_CLASSES,
    KEY_FIELDS,
    MAX_FIGURE,
    MAX_RECORD_BYTES,
    MEASURED_FIGURES,
    SCHEMA,
)

from npu_operator.children.kinds import CALIBRATION_RECORD
from npu_operator.kube.names import RECORD_FILE, RECORD_MOUNT
from npu_operator.status.decode_batches import DecodeBatchesSection
from npu_operator.status.decode_batches import parse_section as parse_decode_batches

__all__ = [
    "MAX_RECORD_BYTES",
    "RECORD_FILE",
    "RECORD_MOUNT",
    "CalibrationSection",
    "configmap",
    "configmap_name",
    "fold_record",
    "graph_section",
    "merge_record",
    "parse_section",
    "ratios",
    "spec_layout",
    "stored_record",
]

MAX_KEY_CHARS: Final = 256
_ESTIMATED: Final = (*MEASURED_FIGURES, "activation_bytes", "margin_bytes")
_LAYOUT: Final = re.compile(r"tp(\d+)-pp(\d+)-dp(\d+)-ep(\d+)-nodes(\d+)")


@dataclasses.dataclass(frozen=True)
class CalibrationSection:
    """A checked `calibration` section of one pod's /status."""

    key: dict[str, str | None]
    estimated: dict[str, int]
    measured: dict[str, int]
    capture_failure: tuple[int, str] | None
    decode_batches: DecodeBatchesSection | None = None  # issue 37 (status/decode_batches.py)


def parse_section(value: Any) -> CalibrationSection | None:
    """The checked section in `value`; None when absent or unusable. Never raises."""
    if not isinstance(value, Mapping):
        return None
    key_in = value.get("key")
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
    return CalibrationSection(
        key=key,
        estimated=_figures(value.get("estimated"), _ESTIMATED),
        measured=_figures(value.get("measured"), MEASURED_FIGURES),
        capture_failure=failed,
        decode_batches=parse_decode_batches(value.get("decode_batches")),  # issue 37
    )


def spec_layout(tensor: int, pipeline: int, data: int, nodes: int) -> tuple[int, int, int, int]:
    """The layout the operator computes from its spec (TP, PP, DP, nodes)."""
    return (tensor, pipeline, data, nodes)


def merge_record(
    previous: Mapping[str, Any] | None, section: CalibrationSection, layout: tuple[int, int, int, int]
) -> dict[str, Any] | None:
    """The record to store after `section`; None when the section must be ignored (another layout).

    Same key: the new measurements replace the old ones figure by figure (the latest engine is the
    truth), and the smallest failed capture size is kept. New key: a fresh record.
    """
    match = _LAYOUT.fullmatch(section.key.get("layout") or "")
    if match is None:
        return None
    tp, pp, dp, _, nodes = (int(g) for g in match.groups())
    if (tp, pp, dp, nodes) != layout:
        return None
    same = previous is not None and previous.get("key") == section.key
    measured = dict(previous.get("measured") or {}) if same and previous is not None else {}
    measured.update(section.measured)
    failure: dict[str, Any] | None = None
    if same and previous is not None and isinstance(previous.get("capture_failure"), Mapping):
        failure = dict(previous["capture_failure"])
    if section.capture_failure is not None:
        size, error_class = section.capture_failure
        if failure is None or size < int(failure["size"]):
            failure = {"size": size, "error_class": error_class}
    if not measured and failure is None:
        return dict(previous) if same and previous is not None else None
    return {"schema": SCHEMA, "key": dict(section.key), "measured": measured, "capture_failure": failure}


def fold_record(
    previous: Mapping[str, Any] | None,
    sections: Sequence[CalibrationSection],
    layout: tuple[int, int, int, int],
) -> dict[str, Any] | None:
    """The record after the pods' current `sections` (in pod-name order), from the stored
    `previous`: each section merged in turn (`merge_record`); None while there is none to keep."""
    record = dict(previous) if previous is not None else None
    for section in sections:
        merged = merge_record(record, section, layout)
        if merged is not None:
            record = merged
    return record


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
    sections: Sequence[CalibrationSection], record: Mapping[str, Any] | None, resource: str
) -> dict[str, Any] | None:
    """`status.graph.calibration`: the stored record (its ConfigMap, layout, the measured figures
    it holds, a failed capture size) and measured / estimated per term, the largest over the pods
    (the term the plan underestimated most), to 3 significant digits so that a steady engine
    costs no status write."""
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


def configmap(resource: str, namespace: str, labels: Mapping[str, str], record: Mapping[str, Any]) -> dict[str, Any]:
    """The ConfigMap that holds `resource`'s record (the caller adopts it: owner reference)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(resource), "namespace": namespace, "labels": dict(sorted(labels.items()))},
        "data": {RECORD_FILE: json.dumps(record, sort_keys=True, separators=(",", ":"))},
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


def _figure(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_FIGURE

"""The decode batches a resource's pods really run: checked, folded into its calibration record,
and what `status.graph` says about the sizes chosen from them (docs/planner.md, "Sizes from traffic").

Each runtime's /status carries `calibration.decode_batches` (npu_runtime.serving.batches): the
decayed weight per decode batch size in tokens, the steps behind it, the capture sizes it ran
with and the measured capture time of one size. The status loop folds the pods' sections into
the record's `decode_batches` (`fold`), which the next pod's plan reads
(npu_runtime.planner.traffic_sizes.parse_decode_batches) to choose its capture sizes.

Trust (what pods say is untrusted input), as for the record's other measurements:
- bounded: at most MAX_RECORD_SIZES sizes from a pod and MAX_SIZES (the heaviest) in the
  record, whole sizes, finite weights >= 0, whole step counts;
  `parse_section` never raises, anything else is dropped;
- plausible for the spec the operator owns: the section's 1 + speculative tokens must be the
  spec's, and a weight above the spec's largest decode batch (max_num_seqs x (1 + k)) is dropped,
  so a pod cannot make the next plan shape sizes for batches the spec never runs;
- only under the record's key: the distribution is kept while the record's key stays (a new key,
  a new record: fold starts again), and only a fold with at least MIN_FOLD_STEPS steps replaces
  it, so a pod that just started (few steps) does not wipe what the others recorded;
- it can only move capture sizes within the plan's own budget: the planner keeps the ceiling and
  never more sizes than its grid, whatever the record says.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.planner.traffic_sizes import MAX_BATCH_TOKENS, MAX_RECORD_SIZES

from npu_operator.api.spec import NPUInferenceSpec

__all__ = [
    "MIN_FOLD_STEPS",
    "DecodeBatchesSection",
    "SpecLimits",
    "fold",
    "graph_fields",
    "parse_section",
    "record_fields",
    "spec_limits",
]

# The record keeps the 1024 heaviest sizes (about 16 KiB of its 64 KiB, MAX_RECORD_BYTES); a
# pod's section may list up to the planner's bound.
MAX_SIZES: Final = 1024
MIN_FOLD_STEPS: Final = 100
_MAX_STEPS: Final = 1 << 62
_SOURCES: Final = ("grid", "traffic", "previous")


@dataclasses.dataclass(frozen=True)
class DecodeBatchesSection:
    """One pod's checked `calibration.decode_batches`."""

    query_len: int
    steps: int
    weights: dict[int, float]
    sizes: tuple[int, ...]
    capture_seconds_per_size: float | None


@dataclasses.dataclass(frozen=True)
class SpecLimits:
    """What the spec allows: 1 + speculative tokens and max_num_seqs."""

    query_len: int
    max_num_seqs: int

    @property
    def ceiling(self) -> int:
        return self.query_len * self.max_num_seqs


def spec_limits(spec: NPUInferenceSpec) -> SpecLimits:
    """The spec's 1 + speculative tokens and max_num_seqs (the decode role's, for a P/D resource:
    prefill instances decode next to nothing)."""
    speculative = spec.engine.speculative
    return SpecLimits(1 + (speculative.num_tokens if speculative else 0), spec.engine.max_num_seqs)


def parse_section(value: Any) -> DecodeBatchesSection | None:
    """The checked section; None when absent or unusable. Never raises."""
    if not isinstance(value, Mapping):
        return None
    query_len: Any = value.get("query_len")
    steps: Any = value.get("steps")
    if not _whole(query_len, 1, 64) or not _whole(steps, 0, _MAX_STEPS):
        return None
    raw = value.get("weights")
    if not isinstance(raw, Mapping) or len(raw) > MAX_RECORD_SIZES:
        return None
    weights: dict[int, float] = {}
    for key, weight in raw.items():
        if isinstance(key, str) and key.isdigit() and 1 <= int(key) <= MAX_BATCH_TOKENS and _weight(weight):
            weights[int(key)] = float(weight)
    listed = value.get("sizes")
    sizes = listed if isinstance(listed, list) and len(listed) <= MAX_SIZES else []
    seconds: Any = value.get("capture_seconds_per_size")
    return DecodeBatchesSection(
        query_len=int(query_len),
        steps=int(steps),
        weights=weights,
        sizes=tuple(sorted({int(s) for s in sizes if _whole(s, 1, MAX_BATCH_TOKENS)})),
        capture_seconds_per_size=float(seconds) if _weight(seconds) and float(seconds) < 3600 else None,
    )


def fold(
    previous: Mapping[str, Any] | None,
    record: Mapping[str, Any] | None,
    sections: Sequence[tuple[Mapping[str, Any], DecodeBatchesSection]],
    limits: SpecLimits,
) -> dict[str, Any] | None:
    """`record` (the calibration record after the other measurements were folded) with its
    `decode_batches`: the current sections (key, section) of the pods under the record's key,
    summed, when they hold at least MIN_FOLD_STEPS steps; else the one `previous` held under the
    same key; none under a new key."""
    if record is None:
        return None
    out = dict(record)
    same_key = previous is not None and previous.get("key") == record.get("key")
    kept = previous.get("decode_batches") if same_key and previous is not None else None
    usable = [s for key, s in sections if key == record.get("key") and s.query_len == limits.query_len]
    steps = sum(s.steps for s in usable)
    if usable and steps >= MIN_FOLD_STEPS:
        weights: dict[int, float] = {}
        for section in usable:
            for size, weight in section.weights.items():
                if size <= limits.ceiling:
                    weights[size] = weights.get(size, 0.0) + weight
        heaviest = sorted(weights.items(), key=lambda item: (-item[1], item[0]))[:MAX_SIZES]
        busiest = max(usable, key=lambda s: s.steps)
        seconds = [s.capture_seconds_per_size for s in usable if s.capture_seconds_per_size is not None]
        kept = {
            "query_len": limits.query_len,
            "steps": steps,
            "weights": {str(size): float(f"{weight:.4g}") for size, weight in sorted(heaviest)},
            "sizes": [size for size in busiest.sizes if size <= limits.ceiling],
            "capture_seconds_per_size": max(seconds) if seconds else None,
        }
    if isinstance(kept, Mapping):
        out["decode_batches"] = dict(kept)
    else:
        out.pop("decode_batches", None)
    return out


def record_fields(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """`status.graph.calibration.decodeBatchSteps`: the decode steps behind the record's distribution."""
    found = (record or {}).get("decode_batches")
    if isinstance(found, Mapping) and _whole(found.get("steps"), 0, _MAX_STEPS):
        return {"decodeBatchSteps": int(found["steps"])}
    return {}


def graph_fields(plan: Any) -> dict[str, Any]:
    """`status.graph`'s captureSizesFrom and expectedPadding from one pod's plan document (its
    `capture_sizes_from`, npu_runtime.planner.traffic_sizes.SizeChoice.to_dict); {} without one."""
    if not isinstance(plan, Mapping) or not isinstance(found := plan.get("capture_sizes_from"), Mapping):
        return {}
    source = found.get("source")
    if source not in _SOURCES:
        return {}
    fields: dict[str, Any] = {"captureSizesFrom": source}
    padding = found.get("expected_padding")
    if isinstance(padding, Mapping) and _weight(padding.get("grid")) and _weight(padding.get("chosen")):
        fields["expectedPadding"] = {
            "grid": float(f"{float(padding['grid']):.3g}"),
            "chosen": float(f"{float(padding['chosen']):.3g}"),
        }
    if _whole(found.get("steps"), 0, _MAX_STEPS):
        fields["decodeStepsBehind"] = int(found["steps"])
    return fields


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _weight(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

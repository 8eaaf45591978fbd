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
- one pod, one vote: each pod's distribution is kept apart in the record's `decode_batch_votes`
  (the operator's own bookkeeping, which the planner does not read), keyed by the pod's uid from
  the pod object the watch holds, normalised to shares that sum to 1 and cut to its VOTE_SIZES
  heaviest sizes; a pod votes once it has MIN_FOLD_STEPS steps behind it (one that just started
  does not replace its own earlier vote), and the MAX_VOTES latest pods' votes are kept. However
  many steps or how heavy the weights a pod claims, it moves the distribution by one vote;
- agreed: the record's `decode_batches` (what the next plan reads) exists only once at least
  QUORUM pods voted (as for the measured figures: a single replica gets one after a second pod
  ran, a restart or a rollout), and is the mean of the votes' shares; its steps count each vote
  at most twice the votes' median, its capture seconds per size is the votes' median, its sizes
  those most votes ran with; votes cast under another 1 + k (the record's key does not follow the
  spec's max_num_seqs or speculative tokens) are kept but not counted, sizes above the ceiling never;
- only under the record's key: a new key, a new record: the votes start again;
- it can only move capture sizes within the plan's own budget: the planner keeps the ceiling and
  never more sizes than its grid, whatever the record says.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.planner.traffic_sizes import MAX_BATCH_TOKENS, MAX_RECORD_SIZES

from npu_operator.api.spec import NPUInferenceSpec

__all__ = [
    "MAX_VOTES",
    "MIN_FOLD_STEPS",
    "QUORUM",
    "VOTES_FIELD",
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
# Different pods (uids) that must report a figure (status.calibration) or vote for a distribution
# before it is used, and runs a capture failure.
QUORUM: Final = 2
# The pods whose votes a record keeps, and the sizes of each vote (its heaviest): 8 votes of 96
# sizes and the 1024 of the distribution keep a record well below half its 64 KiB.
MAX_VOTES: Final = 8
VOTE_SIZES: Final = 96
VOTES_FIELD: Final = "decode_batch_votes"
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
    sections: Sequence[tuple[str, Mapping[str, Any], DecodeBatchesSection]],
    limits: SpecLimits,
) -> dict[str, Any] | None:
    """`record` (the calibration record after the other measurements were folded) with the pods'
    votes and, once QUORUM pods voted, their `decode_batches`. `sections`: (the pod's uid, the key
    of its report, its section) for the current reports; `previous`: the stored record, whose
    votes carry on under the same key."""
    if record is None:
        return None
    out = dict(record)
    same_key = previous is not None and previous.get("key") == record.get("key")
    votes = stored_votes(previous) if same_key and previous is not None else []
    for voter, key, section in sections:
        if key != record.get("key") or section.query_len != limits.query_len or section.steps < MIN_FOLD_STEPS:
            continue
        vote = _vote(voter, section, limits)
        if vote is not None:
            votes = [v for v in votes if v["pod"] != voter] + [vote]
    votes = votes[-MAX_VOTES:]
    out.pop(VOTES_FIELD, None)
    out.pop("decode_batches", None)
    if votes:
        out[VOTES_FIELD] = votes
    # Votes cast under another spec (its 1 + k, its ceiling) are kept, not counted: the record's key
    # does not follow max_num_seqs or the speculative tokens.
    counted = [v for v in votes if v["query_len"] == limits.query_len]
    if len(counted) >= QUORUM:
        out["decode_batches"] = _agreed(counted, limits)
    return out


def stored_votes(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The votes a stored record keeps (a hand edit that is none is dropped), at most MAX_VOTES."""
    found: list[dict[str, Any]] = []
    for item in record.get(VOTES_FIELD) or []:
        if not isinstance(item, Mapping) or not isinstance(item.get("pod"), str):
            continue
        weights, sizes = item.get("weights"), item.get("sizes")
        if (
            not _whole(item.get("steps"), 0, _MAX_STEPS)
            or not _whole(item.get("query_len"), 1, 64)
            or not isinstance(weights, Mapping)
            or len(weights) > VOTE_SIZES
            or not all(
                isinstance(k, str) and k.isdigit() and 1 <= int(k) <= MAX_BATCH_TOKENS and _weight(w)
                for k, w in weights.items()
            )
            or not isinstance(sizes, list)
            or len(sizes) > MAX_SIZES
            or not all(_whole(size, 1, MAX_BATCH_TOKENS) for size in sizes)
            or not (item.get("capture_seconds_per_size") is None or _weight(item.get("capture_seconds_per_size")))
        ):
            continue
        found.append(dict(item))
    return found[-MAX_VOTES:]


def _vote(voter: str, section: DecodeBatchesSection, limits: SpecLimits) -> dict[str, Any] | None:
    """One pod's vote: its shares of the decode steps by size (within the spec), its heaviest sizes."""
    weights = {size: weight for size, weight in section.weights.items() if size <= limits.ceiling and weight > 0}
    total = sum(weights.values())
    if not total:
        return None
    heaviest = sorted(weights.items(), key=lambda item: (-item[1], item[0]))[:VOTE_SIZES]
    return {
        "pod": voter,
        "query_len": section.query_len,
        "steps": section.steps,
        "weights": {str(size): float(f"{weight / total:.4g}") for size, weight in sorted(heaviest)},
        "sizes": [size for size in section.sizes if size <= limits.ceiling],
        "capture_seconds_per_size": section.capture_seconds_per_size,
    }


def _agreed(votes: Sequence[Mapping[str, Any]], limits: SpecLimits) -> dict[str, Any]:
    """The distribution the votes agree on: the mean of their shares, one vote per pod."""
    shares: dict[int, float] = {}
    for vote in votes:
        for size, share in vote["weights"].items():
            if int(size) <= limits.ceiling:
                shares[int(size)] = shares.get(int(size), 0.0) + float(share) / len(votes)
    heaviest = sorted(shares.items(), key=lambda item: (-item[1], item[0]))[:MAX_SIZES]
    cap = 2 * statistics.median_high(int(vote["steps"]) for vote in votes)
    ran = [tuple(size for size in vote["sizes"] if size <= limits.ceiling) for vote in votes]
    sizes = max(reversed(ran), key=ran.count)  # the sizes most votes ran with (a tie: the latest)
    seconds = [float(v["capture_seconds_per_size"]) for v in votes if v.get("capture_seconds_per_size") is not None]
    return {
        "query_len": limits.query_len,
        "steps": sum(min(int(vote["steps"]), cap) for vote in votes),
        "weights": {str(size): float(f"{share:.4g}") for size, share in sorted(heaviest)},
        "sizes": list(sizes),
        "capture_seconds_per_size": statistics.median_high(seconds) if seconds else None,
    }


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

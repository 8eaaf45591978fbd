"""The decode batch distribution the engine runs, as /status and /metrics show it.

Each engine process reports exact counts and decayed weights per decode batch size in tokens
(`npu_runtime.observer.batches`). Over the processes: tensor-parallel workers see the same decode
steps, so each size takes the largest count and weight over processes, as `decode_steps` does.

`section(...)` is the `decode_batches` part of /status's calibration section (the operator folds
it into the resource's record; the next plan reads it, `npu_runtime.planner.traffic_sizes`):

    {"query_len": int,                  # 1 + speculative tokens of this plan
     "ceiling": int,                    # max_num_seqs x query_len: the largest decode batch
     "steps": int,                      # decode steps counted at or below the ceiling
     "above_ceiling": int,              # steps counted above it (never expected; not kept)
     "weights": {"<tokens>": float},    # decayed, 4 significant digits, at most MAX_SIZES sizes
     "sizes": [int],                    # the capture sizes this engine runs with
     "capture_seconds_per_size": float|null}   # median capture time of one size, measured

Pure: plain data in, plain data out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["MAX_SIZES", "merge_process", "section"]

MAX_SIZES: Final = 4096  # the record's bound (npu_runtime.planner.traffic_sizes.MAX_RECORD_SIZES)


def merge_process(counts: dict[int, int], weights: dict[int, float], report: Mapping[str, Any]) -> None:
    """Fold one process's `decode_batches` report into `counts` and `weights` (largest per size)."""
    found = report.get("decode_batches")
    if not isinstance(found, Mapping):
        return
    for size, count in _entries(found.get("counts")):
        counts[size] = max(counts.get(size, 0), int(count))
    for size, weight in _entries(found.get("weights")):
        weights[size] = max(weights.get(size, 0.0), float(weight))


def _entries(values: Any) -> list[tuple[int, float]]:
    if not isinstance(values, Mapping):
        return []
    return [
        (int(key), value)
        for key, value in values.items()
        if isinstance(key, str) and key.isdigit() and isinstance(value, int | float) and not isinstance(value, bool)
    ]


def section(
    plan: Mapping[str, Any],
    counts: Mapping[int, int],
    weights: Mapping[int, float],
    capture_seconds: Sequence[float],
) -> dict[str, Any] | None:
    """The /status `calibration.decode_batches` (see the module); None before the plan is made."""
    query_len, max_num_seqs = plan.get("decode_query_len"), plan.get("max_num_seqs")
    if not isinstance(query_len, int) or not isinstance(max_num_seqs, int) or query_len < 1:
        return None
    ceiling = max_num_seqs * query_len
    kept = {size: weight for size, weight in weights.items() if 0 < size <= ceiling and weight > 0}
    if len(kept) > MAX_SIZES:  # only with more distinct sizes than any decode batch has: keep the heaviest
        kept = dict(sorted(kept.items(), key=lambda item: -item[1])[:MAX_SIZES])
    sizes = [size for size in plan.get("capture_sizes") or [] if isinstance(size, int)]
    return {
        "query_len": query_len,
        "ceiling": ceiling,
        "steps": sum(count for size, count in counts.items() if size <= ceiling),
        "above_ceiling": sum(count for size, count in counts.items() if size > ceiling),
        "weights": {str(size): float(f"{weight:.4g}") for size, weight in sorted(kept.items())},
        "sizes": sizes,
        "capture_seconds_per_size": round(statistics.median(capture_seconds), 4) if capture_seconds else None,
    }

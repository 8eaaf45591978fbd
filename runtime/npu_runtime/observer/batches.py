"""The decode batches one engine process really runs: exact counts per size, and a decayed copy.

The batch_dispatch hook (and model runner v2's dispatch) calls `DecodeBatchCounter.count(tokens)`
once per uniform decode step, with the step's token count before padding (n requests x (1 + k)
speculative tokens). The decode path does one dict update; nothing else.

Two views leave the process in its report (`to_report`, written by the recorder's flush thread):
- `counts`: exact, monotonic counts per size (the npu_graph_decode_batches_total counter);
- `weights`: the same counts exponentially decayed with a half-life (HALF_LIFE_SECONDS, or
  NPU_GRAPH_OBSERVER_BATCH_HALF_LIFE_SECONDS), so the distribution follows the traffic; an idle
  engine decays every size alike, which leaves the distribution unchanged. Only the flush thread
  touches the weights: it folds in the counts added since its last fold, so the decode path
  never races a decay.

Bounded: at most MAX_SIZES distinct sizes (a decode batch is at most max_num_seqs x (1 + k)
tokens, far below it); a step of a size beyond that is counted in `dropped`, never stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

MAX_SIZES: Final = 4096
HALF_LIFE_SECONDS: Final = 3600.0
_FORGET_BELOW: Final = 1e-6  # a weight decayed below this is removed


class DecodeBatchCounter:
    """Counts per decode batch size (tokens) and their decayed weights."""

    def __init__(
        self,
        *,
        half_life_seconds: float = HALF_LIFE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_sizes: int = MAX_SIZES,
    ) -> None:
        self.half_life_seconds = max(half_life_seconds, 1e-3)
        self.clock = clock
        self.max_sizes = max_sizes
        self.counts: dict[int, int] = {}
        self.dropped = 0
        self._weights: dict[int, float] = {}
        self._folded: dict[int, int] = {}
        self._decayed_at = clock()

    def count(self, tokens: int) -> None:
        """One decode step of `tokens` tokens (decode path: one dict update)."""
        counts = self.counts
        if tokens in counts:
            counts[tokens] += 1
        elif tokens > 0 and len(counts) < self.max_sizes:
            counts[tokens] = 1
        else:
            self.dropped += 1

    def weights(self) -> dict[int, float]:
        """The decayed weights now (flush thread only): decay, then fold in the new counts."""
        now = self.clock()
        factor = 0.5 ** (max(now - self._decayed_at, 0.0) / self.half_life_seconds)
        self._decayed_at = now
        weights = self._weights
        for size in list(weights):
            weights[size] *= factor
            if weights[size] < _FORGET_BELOW:
                del weights[size]
        for size, total in list(self.counts.items()):
            added = total - self._folded.get(size, 0)
            if added > 0:
                weights[size] = weights.get(size, 0.0) + added
                self._folded[size] = total
        return dict(weights)

    def to_report(self) -> dict[str, Any]:
        """The report's `decode_batches` (sizes as strings: JSON object keys)."""
        weights = self.weights()
        return {
            "counts": {str(size): total for size, total in sorted(self.counts.copy().items())},
            "weights": {str(size): round(weight, 6) for size, weight in sorted(weights.items())},
            "dropped": self.dropped,
            "half_life_seconds": self.half_life_seconds,
        }

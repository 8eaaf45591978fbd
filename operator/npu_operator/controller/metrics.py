"""The operator's own Prometheus metrics (names are a contract: docs/design.md, "Contract 2")."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Histogram

RECONCILES: Final = Counter(
    "npu_operator_reconciles",
    "Reconciles of NPUInference resources, by result (unchanged, changed, invalid, error).",
    ["result"],
)
RECONCILE_DURATION: Final = Histogram(
    "npu_operator_reconcile_duration_seconds",
    "Time one reconcile took, by result.",
    ["result"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

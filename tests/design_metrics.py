"""DESIGN.md's metric table, held once for every test that checks it: name -> (type, labels).

The names are a contract with the chart's dashboard and alerts and with users' own queries.
tests/runtime/test_status_metrics.py holds the runtime's definitions to it (types and labels),
tests/chart/test_metric_names.py the operator's definitions and the dashboard (names and types).
"""

from __future__ import annotations

from typing import Final

DESIGN_TABLE: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "npu_graph_mode_info": ("gauge", ("requested", "effective")),
    "npu_graph_downgrades_total": ("counter", ("from_mode", "to_mode", "reason", "stage")),
    "npu_graph_capture_sizes": ("gauge", ("mode",)),
    "npu_graph_capture_memory_bytes": ("gauge", ("mode", "size")),
    "npu_graph_capture_seconds": ("gauge", ("mode", "size")),
    "npu_graph_replay_latency_seconds": ("histogram", ("mode", "size")),
    "npu_graph_eager_fallbacks_total": ("counter", ("reason",)),
    "npu_device_memory_bytes": ("gauge", ("device", "kind")),
    "npu_graph_instrumentation_errors_total": ("counter", ("hook",)),
    "npu_operator_reconciles_total": ("counter", ("result",)),
    "npu_operator_reconcile_duration_seconds": ("histogram", ("result",)),
}
OPERATOR_PREFIX: Final = "npu_operator_"
RUNTIME_TABLE: Final = {name: row for name, row in DESIGN_TABLE.items() if not name.startswith(OPERATOR_PREFIX)}

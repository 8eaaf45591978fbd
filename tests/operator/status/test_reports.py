"""Pod reports are untrusted: any JSON value parses into a bounded report, and the fold stays small."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_operator.status import graph as aggregate
from npu_operator.status.findings import PodReport, pod_findings
from npu_operator.status.graph import graph_status
from npu_operator.status.reports import MAX_MESSAGE, parse_report

NOW = "2026-12-01T00:00:00Z"
# The largest status.graph the fold may produce, whatever the pods report (see worst_case_graph).
GRAPH_BYTES_BOUND = 20 * 1024

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=300),
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=12), children, max_size=8),
    max_leaves=60,
)
FIELDS = [
    "state",
    "effective_mode",
    "plan",
    "captures",
    "replay",
    "downgrades",
    "decode_steps",
    "eager_fallbacks",
    "failure",
]
report_keys = st.sampled_from(FIELDS)
# Documents shaped like a report, with any value in any field: the fields the parser must check.
report_like = st.dictionaries(report_keys, json_values, max_size=9)


# The documents of the fault-injection pass that froze a resource's status (every reconcile raised).
TYPE_CONFUSION = [
    {"replay": {"mode": "FULL", "size": 1}},
    {"plan": [1, 2, 3]},
    {"captures": [{"mode": "FULL", "size": "big"}]},
    {"downgrades": "xyz"},
    {"replay": [{"mode": "FULL", "size": 4, "count": 3, "p99_seconds": math.inf}]},
    {"captures": [{"size": True, "memory_bytes": -5}], "decode_steps": "many", "eager_fallbacks": [1]},
    {"failure": "boom", "state": {"x": 1}, "effective_mode": ["FULL"]},
]


@pytest.mark.parametrize("document", TYPE_CONFUSION)
def test_a_wrong_type_is_dropped_and_counted_not_raised(document: dict[str, Any]) -> None:
    report = parse_report(document)
    assert report.dropped >= 1
    graph = graph_status("FULL_DECODE_ONLY", [PodReport("a", report)], {}, now=NOW, same_generation=True)
    assert graph["reportingPods"] == 1
    assert "replay" not in graph or all(math.isfinite(row["p99Seconds"]) for row in graph["replay"])


def test_a_good_report_keeps_every_field() -> None:
    report = parse_report(
        {
            "state": "ready",
            "effective_mode": "FULL_DECODE_ONLY",
            "plan": {"capture_sizes": [1, 2, 4]},
            "captures": [{"mode": "FULL", "size": 1, "memory_bytes": 2048, "seconds": 0.1}],
            "replay": [{"mode": "FULL", "size": 1, "count": 5, "p50_seconds": 0.001, "p99_seconds": 0.002}],
            "downgrades": [{"from_mode": "FULL", "to_mode": "NONE", "reason": "CpuHasNoGraphs", "message": "m"}],
            "decode_steps": 10,
            "eager_fallbacks": {"above_max": 2},
            "failure": {"reason": "GraphCaptureOutOfMemory", "message": "out of memory\nat capture"},
        }
    )
    assert report.dropped == 0
    assert report.planned_sizes == (1, 2, 4)
    assert report.downgrades[0].stage == "engine"
    assert report.eager_fallbacks == 2
    assert report.failure is not None and report.failure.message == "out of memory at capture"


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, report_like))
def test_any_json_value_parses_into_a_bounded_report(document: Any) -> None:
    report = parse_report(document)
    assert len(report.captures) <= 64 and len(report.replay) <= 64 and len(report.downgrades) <= 8
    assert all(len(d.message) <= MAX_MESSAGE for d in report.downgrades)
    assert all(math.isfinite(row.p50_seconds) and math.isfinite(row.p99_seconds) for row in report.replay)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(json_values, report_like), max_size=6), st.one_of(json_values, report_like))
def test_any_reports_fold_into_a_bounded_status(documents: list[Any], previous: Any) -> None:
    reports = [PodReport(f"p{i}", parse_report(d)) for i, d in enumerate(documents)]
    old = previous if isinstance(previous, dict) else {}
    graph = graph_status("FULL_DECODE_ONLY", reports, old, now=NOW, same_generation=True)
    assert len(json.dumps(graph, ensure_ascii=False).encode()) <= GRAPH_BYTES_BOUND
    pod_findings([], reports, None)


def _adversarial_report(pod: int) -> dict[str, Any]:
    """A report at every limit at once, distinct from every other pod's."""
    token = "M" * 63
    return {
        "state": "ready",
        "effective_mode": f"{token[:-4]}{pod:04d}",
        "plan": {"capture_sizes": list(range(1, 200))},
        "captures": [{"mode": token, "size": size, "memory_bytes": 2**61} for size in range(1, 200)],
        "replay": [
            {"mode": f"{token[:-4]}{pod:04d}", "size": size, "count": 1, "p50_seconds": 1e-7, "p99_seconds": 3e-7}
            for size in range(1, 200)
        ],
        "downgrades": [
            {"from_mode": token, "to_mode": token, "reason": f"R{pod:05d}x{i:03d}" + "r" * 50, "message": "é" * 5000}
            for i in range(300)
        ],
        "decode_steps": 2**62,
        "eager_fallbacks": {f"k{i}": 2**62 for i in range(100)},
        "failure": {"reason": "GraphCaptureOutOfMemory", "message": "x" * 10**6},
    }


def worst_case_graph(pods: int) -> dict[str, Any]:
    """status.graph after `pods` adversarial reports, folded into a status that was already full."""
    reports = [PodReport(f"pod-{'p' * 200}-{i}", parse_report(_adversarial_report(i))) for i in range(pods)]
    first = graph_status("FULL_DECODE_ONLY", reports[: pods // 2], {}, now=NOW, same_generation=True)
    return graph_status("FULL_DECODE_ONLY", reports, first, now=NOW, same_generation=True)


def test_the_largest_status_reachable_from_pod_reports_is_small() -> None:
    graph = worst_case_graph(200)
    size = len(json.dumps(graph, ensure_ascii=False).encode())
    print(f"largest status.graph from pod reports: {size} bytes")
    assert size <= GRAPH_BYTES_BOUND
    assert len(graph["downgrades"]) == aggregate.MAX_DOWNGRADES
    assert len(graph["modes"]) == aggregate.MAX_MODES
    findings = pod_findings(
        [{"metadata": {"name": f"pod-{i}"}, "status": {}} for i in range(200)],
        [PodReport(f"pod-{i}", parse_report(_adversarial_report(i))) for i in range(200)],
        None,
    )
    assert findings.worst is not None and len(findings.worst.message) < 2 * 1024


def test_downgrades_no_pod_reports_any_more_age_out() -> None:
    downgrade = {"from_mode": "FULL", "to_mode": "NONE", "reason": "Gone", "message": "m"}
    seen = graph_status(
        "FULL", [PodReport("a", parse_report({"downgrades": [downgrade]}))], {}, now=NOW, same_generation=True
    )
    soon = graph_status("FULL", [], seen, now="2026-12-01T00:30:00Z", same_generation=True)
    assert [d["pods"] for d in soon["downgrades"]] == [0]
    later = graph_status("FULL", [], soon, now="2026-12-01T01:00:01Z", same_generation=True)
    assert "downgrades" not in later

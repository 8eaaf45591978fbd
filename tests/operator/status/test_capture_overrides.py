"""A capture size the engine changed reaches the runtime's /status, its metrics and the resource's Events.

The runtime compares the plan's capture sizes with the sizes its observer saw captured
(npu_runtime.serving.status.capture_overrides); the operator reads /status like any downgrade
(status/reports.py parse_report, status/graph.py graph_status) and announces it once
(status/resource.py graph_events).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu_operator.status import resource
from npu_operator.status.findings import PodReport
from npu_operator.status.graph import graph_status
from npu_operator.status.reports import parse_report
from npu_runtime import reports
from npu_runtime.serving.server import exposition
from npu_runtime.serving.status import CAPTURE_SIZES_OVERRIDDEN, PlanView, RuntimeStatus
from prometheus_client.parser import text_string_to_metric_families

NOW = "2026-12-01T00:00:00Z"
PLANNED = [1, 2, 4, 8]


def worker(sizes: list[int], phase: str = "captured") -> dict[str, Any]:
    return {
        "schema": reports.SCHEMA,
        "pid": 7,
        "process": "VllmWorker-7",
        "phase": phase,
        "resolved_mode": "FULL_DECODE_ONLY",
        "downgrades": [],
        "captures": [{"mode": "FULL", "size": s, "memory_bytes": 1 << 20, "seconds": 0.1, "graphs": 1} for s in sizes],
    }


def runtime(tmp_path: Path, captured: list[int], phase: str = "captured") -> RuntimeStatus:
    tmp_path.mkdir(parents=True, exist_ok=True)
    reports.write_report(tmp_path, 7, worker(captured, phase))
    status = RuntimeStatus(str(tmp_path), "FULL_DECODE_ONLY")
    status.set_plan(
        PlanView(
            requested_mode="FULL_DECODE_ONLY",
            effective_mode="FULL_DECODE_ONLY",
            plan={"requested_mode": "FULL_DECODE_ONLY", "capture_sizes": PLANNED},
        )
    )
    status.set_state("ready")
    return status


def overridden_downgrades(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in document["downgrades"] if d["reason"] == CAPTURE_SIZES_OVERRIDDEN]


def test_sizes_the_engine_dropped_reach_status_metrics_and_events(tmp_path: Path) -> None:
    # flashcomm1 with TP 4 keeps only multiples of 4 (VllmConfig.update_sizes_for_sequence_parallelism).
    status = runtime(tmp_path, [4, 8])
    document = status.document()
    (entry,) = overridden_downgrades(document)
    assert (entry["from_mode"], entry["to_mode"], entry["stage"]) == ("FULL_DECODE_ONLY", "FULL_DECODE_ONLY", "engine")
    assert (entry["planned"], entry["captured"]) == ("[1, 2, 4, 8]", "[4, 8]")
    assert "dropped [1, 2]" in entry["message"]

    families = {f.name: f for f in text_string_to_metric_families(exposition(status).decode())}
    counted = {(s.labels["reason"], s.labels["stage"]): s.value for s in families["npu_graph_downgrades"].samples}
    assert counted == {(CAPTURE_SIZES_OVERRIDDEN, "engine"): 1.0}

    graph = graph_status(
        "FULL_DECODE_ONLY", [PodReport("pod-0", parse_report(document))], {}, now=NOW, same_generation=True
    )
    assert [d["reason"] for d in graph["downgrades"]] == [CAPTURE_SIZES_OVERRIDDEN]
    (event,) = resource.graph_events({}, graph)
    assert event.type == "Warning" and event.reason == resource.GRAPH_MODE_DOWNGRADED
    assert CAPTURE_SIZES_OVERRIDDEN in event.message and "the engine captured [4, 8]" in event.message
    assert resource.graph_events(graph, graph) == []  # announced once


def test_nothing_is_reported_when_the_engine_captured_the_plan_or_is_still_capturing(tmp_path: Path) -> None:
    assert overridden_downgrades(runtime(tmp_path / "same", PLANNED).document()) == []
    assert overridden_downgrades(runtime(tmp_path / "busy", [1, 2], phase="capturing").document()) == []

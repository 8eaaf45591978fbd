"""Aggregation of the observer's reports into /status and /metrics, and the metric contract itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from npu_runtime import metrics, reports
from npu_runtime.serving.failures import Failure
from npu_runtime.serving.status import EngineView, PlanView, RuntimeStatus, aggregate
from prometheus_client.parser import text_string_to_metric_families

from tests.design_metrics import RUNTIME_TABLE


def test_metric_definitions_are_exactly_designs_table() -> None:
    assert {spec.name: (spec.kind, spec.labels) for spec in metrics.RUNTIME_METRICS} == RUNTIME_TABLE


def worker(pid: int, **overrides: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema": reports.SCHEMA,
        "pid": pid,
        "process": f"VllmWorker-{pid}",
        "vllm_version": "0.31.0",
        "phase": "captured",
        "config_mode": None,
        "resolved_mode": "FULL_DECODE_ONLY",
        "downgrades": [],
        "captures": [
            {"mode": "FULL", "size": 1, "memory_bytes": 10 << 20, "seconds": 0.5, "graphs": 1},
            {"mode": "FULL", "size": 8, "memory_bytes": 2 << 20, "seconds": 0.2, "graphs": 1},
        ],
        "replay": [
            {
                "mode": "FULL",
                "size": 8,
                "count": 100,
                "timed": 100,
                "sum_seconds": 0.1,
                "buckets": [0, 0, 0, 100] + [0] * 10,
                "p50_seconds": 0.001,
                "p99_seconds": 0.0012,
            }
        ],
        "eager_fallbacks": {"BatchAboveMaxCaptureSize": 3},
        "decode_steps": 120,
        "errors": {},
        "hooks": {"installed": ["x"], "unavailable": []},
        "memory": {"device": f"npu:{pid % 10}", "total": 64 << 30, "graphs": 12 << 20},
    }
    report.update(overrides)
    return report


def api_server() -> dict[str, Any]:
    return {
        "schema": reports.SCHEMA,
        "pid": 1,
        "process": "MainProcess",
        "phase": "loaded",
        "config_mode": {"requested": "FULL_AND_PIECEWISE", "final": "FULL_DECODE_ONLY"},
        "downgrades": [
            {
                "from_mode": "FULL_AND_PIECEWISE",
                "to_mode": "FULL_DECODE_ONLY",
                "reason": "PlatformConfig",
                "message": "m",
                "stage": "engine",
            }
        ],
    }


def test_tensor_parallel_workers_are_not_counted_twice() -> None:
    second = worker(
        12,
        captures=[{"mode": "FULL", "size": 1, "memory_bytes": 11 << 20, "seconds": 0.4, "graphs": 1}],
        decode_steps=119,
        errors={"batch_dispatch": 1},
    )
    view = aggregate([api_server(), worker(11, errors={"batch_dispatch": 1}), second])
    assert view.captures[("FULL", 1)] == {"memory_bytes": 11 << 20, "seconds": 0.5}  # the worst device
    assert view.replay[("FULL", 8)]["count"] == 100
    assert view.decode_steps == 120
    assert view.eager_fallbacks == {"BatchAboveMaxCaptureSize": 3}
    assert view.errors == {"batch_dispatch": 2}  # each process's hooks fail on their own
    assert view.memory[("npu:1", "total")] == 64 << 30
    assert view.memory[("npu:2", "graphs")] == 12 << 20


def test_the_mode_a_worker_resolved_beats_the_config_and_the_plan() -> None:
    assert aggregate([api_server()]).effective_mode == "FULL_DECODE_ONLY"
    assert aggregate([api_server()]).effective_source == "config"
    view = aggregate([api_server(), worker(5, resolved_mode="PIECEWISE")])
    assert (view.effective_mode, view.effective_source) == ("PIECEWISE", "engine")
    assert aggregate([]).effective_mode is None


def test_downgrades_from_several_processes_are_deduplicated() -> None:
    downgrade = {"from_mode": "FULL", "to_mode": "NONE", "reason": "X", "message": "m", "stage": "engine"}
    view = aggregate([worker(2, downgrades=[downgrade]), worker(3, downgrades=[downgrade])])
    assert len(view.downgrades) == 1


def test_phase_is_capturing_while_any_process_captures() -> None:
    assert aggregate([worker(2, phase="capturing"), worker(3)]).phase == "capturing"
    assert aggregate([worker(2)]).phase == "captured"


def plan_view() -> PlanView:
    return PlanView(
        requested_mode="FULL_DECODE_ONLY",
        effective_mode="FULL_DECODE_ONLY",
        plan={"requested_mode": "FULL_DECODE_ONLY", "capture_sizes": [1, 8]},
        downgrades=[{"from_mode": "FULL", "to_mode": "FULL_DECODE_ONLY", "reason": "R", "message": "m"}],
        memory={"total": 64 << 30, "weights": 15 << 30},
    )


@pytest.fixture
def status(tmp_path: Path) -> RuntimeStatus:
    for report in (api_server(), worker(11)):
        reports.write_report(tmp_path, report["pid"], report)
    runtime = RuntimeStatus(str(tmp_path), "FULL_DECODE_ONLY")
    runtime.set_plan(plan_view())
    runtime.set_engine(4242)
    return runtime


def test_status_document_keeps_the_contract_keys(status: RuntimeStatus) -> None:
    status.set_state("ready")
    doc = status.document()
    assert doc["schema"] == 1
    assert set(doc) >= {
        "schema",
        "runtime_version",
        "state",
        "requested_mode",
        "effective_mode",
        "plan",
        "captures",
        "downgrades",
        "replay",
        "eager_fallbacks",
        "decode_steps",
        "failure",
        "engine",
    }
    assert doc["state"] == "ready"
    assert doc["effective_mode"] == "FULL_DECODE_ONLY"
    assert doc["captures"] == [
        {"mode": "FULL", "size": 1, "memory_bytes": 10 << 20, "seconds": 0.5},
        {"mode": "FULL", "size": 8, "memory_bytes": 2 << 20, "seconds": 0.2},
    ]
    assert [(d["reason"], d["stage"]) for d in doc["downgrades"]] == [("R", "plan"), ("PlatformConfig", "engine")]
    assert doc["replay"] == [{"mode": "FULL", "size": 8, "count": 100, "p50_seconds": 0.001, "p99_seconds": 0.0012}]
    assert doc["eager_fallbacks"] == {"BatchAboveMaxCaptureSize": 3}
    assert doc["decode_steps"] == 120
    assert doc["failure"] is None
    assert doc["engine"] == {"pid": 4242, "exit_code": None, "vllm_version": "0.31.0"}


def test_a_failure_is_terminal_and_shown(status: RuntimeStatus) -> None:
    status.fail(Failure("GraphCaptureOutOfMemory", "out of memory"))
    status.set_state("ready")  # a late health answer does not resurrect it
    doc = status.document()
    assert doc["state"] == "failed"
    assert doc["failure"] == {"reason": "GraphCaptureOutOfMemory", "message": "out of memory"}


def scrape(status: RuntimeStatus) -> dict[str, Any]:
    from npu_runtime.serving.server import exposition

    text = exposition(status).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(family: Any) -> list[tuple[str, dict[str, str], float]]:
    return [(sample.name, sample.labels, sample.value) for sample in family.samples]


def test_metrics_exposition_matches_the_status(status: RuntimeStatus) -> None:
    families = scrape(status)
    assert samples(families["npu_graph_mode_info"]) == [
        ("npu_graph_mode_info", {"requested": "FULL_DECODE_ONLY", "effective": "FULL_DECODE_ONLY"}, 1.0)
    ]
    downgrades = {(s.labels["reason"], s.labels["stage"]): s.value for s in families["npu_graph_downgrades"].samples}
    assert downgrades == {("R", "plan"): 1.0, ("PlatformConfig", "engine"): 1.0}
    assert samples(families["npu_graph_capture_sizes"]) == [("npu_graph_capture_sizes", {"mode": "FULL"}, 2.0)]
    memory = {s.labels["size"]: s.value for s in families["npu_graph_capture_memory_bytes"].samples}
    assert memory == {"1": float(10 << 20), "8": float(2 << 20)}
    replay = {(s.name, s.labels.get("le")): s.value for s in families["npu_graph_replay_latency_seconds"].samples}
    assert replay[("npu_graph_replay_latency_seconds_count", None)] == 100
    assert replay[("npu_graph_replay_latency_seconds_bucket", "0.0005")] == 0
    assert replay[("npu_graph_replay_latency_seconds_bucket", "0.001")] == 100
    assert replay[("npu_graph_replay_latency_seconds_bucket", "+Inf")] == 100
    fallbacks = samples(families["npu_graph_eager_fallbacks"])
    assert fallbacks == [("npu_graph_eager_fallbacks_total", {"reason": "BatchAboveMaxCaptureSize"}, 3.0)]
    device = {(s.labels["device"], s.labels["kind"]): s.value for s in families["npu_device_memory_bytes"].samples}
    assert device[("plan", "weights")] == 15 << 30
    assert device[("npu:1", "total")] == 64 << 30


def test_every_exported_family_is_a_defined_metric(status: RuntimeStatus) -> None:
    defined = {spec.family_name for spec in metrics.RUNTIME_METRICS}
    assert set(scrape(status)) == defined


def test_bucket_helpers() -> None:
    assert metrics.bucket_index(0.0) == 0
    assert metrics.bucket_index(0.001) == 3
    assert metrics.bucket_index(10.0) == len(metrics.REPLAY_LATENCY_BUCKETS)
    cumulative = metrics.cumulative_buckets([1, 2])
    assert cumulative[0] == ("0.0001", 1)
    assert cumulative[1] == ("0.00025", 3)
    assert cumulative[-1] == ("+Inf", 3)


def test_reports_are_replaced_atomically_and_foreign_files_ignored(tmp_path: Path) -> None:
    reports.write_report(tmp_path, 7, {"schema": reports.SCHEMA, "pid": 7, "phase": "a"})
    reports.write_report(tmp_path, 7, {"schema": reports.SCHEMA, "pid": 7, "phase": "b"})
    (tmp_path / "observer-8.json").write_text("{half")
    (tmp_path / "observer-9.json").write_text('{"schema": 99, "pid": 9}')
    assert [r["phase"] for r in reports.read_reports(tmp_path)] == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["observer-7.json", "observer-8.json", "observer-9.json"]
    assert reports.read_reports(tmp_path / "missing") == []


def test_serve_hands_the_plan_to_the_status_as_plain_data() -> None:
    from npu_runtime.cli import render_plan
    from npu_runtime.contract import PlanOptions
    from npu_runtime.planner.plan import make_plan
    from npu_runtime.serving.serve import describe_plan, plan_view

    from tests.runtime.conftest import DEVICES, load_model

    plan = make_plan(PlanOptions(), DEVICES["CPU-64GiB"], load_model("llama-3.1-8b"), environ={})
    view = plan_view(plan)
    assert (view.requested_mode, view.effective_mode) == (plan.requested_mode, plan.effective_mode)
    assert view.plan == plan.to_dict()
    assert [dict(d) for d in view.downgrades] == [
        {"from_mode": d.from_mode, "to_mode": d.to_mode, "reason": d.reason, "message": d.message}
        for d in plan.downgrades
    ]
    assert [d["reason"] for d in view.downgrades] == ["CpuHasNoGraphs"]
    assert view.memory["total"] == plan.memory.total_bytes
    assert describe_plan(plan) == render_plan(plan.to_dict())
    assert view.node == {"rank": 0, "nodes": 1, "data_parallel_ranks": [0]}


def test_status_says_which_node_and_data_parallel_ranks_the_pod_runs() -> None:
    from npu_runtime.contract import PlanOptions
    from npu_runtime.planner.plan import make_plan
    from npu_runtime.serving.serve import plan_view

    from tests.runtime.conftest import DEVICES, load_model

    options = PlanOptions(nodes=2, data_parallel=2, graph_mode="NONE")
    plan = make_plan(options, DEVICES["CPU-64GiB"], load_model("llama-3.1-8b"), environ={})
    runtime = RuntimeStatus(None, "NONE")
    runtime.set_plan(plan_view(plan, 1))
    assert runtime.document(EngineView())["node"] == {"rank": 1, "nodes": 2, "data_parallel_ranks": [1]}
    assert RuntimeStatus(None, "NONE").document(EngineView())["node"] is None  # before the plan


def test_nothing_is_claimed_about_the_mode_before_the_plan_is_made(tmp_path: Path) -> None:
    from npu_runtime.serving.server import exposition

    starting = RuntimeStatus(str(tmp_path), "FULL_DECODE_ONLY")
    document = starting.document()
    assert document["requested_mode"] == "FULL_DECODE_ONLY"
    assert document["effective_mode"] is None
    families = {f.name: f for f in text_string_to_metric_families(exposition(starting).decode())}
    assert families["npu_graph_mode_info"].samples == []

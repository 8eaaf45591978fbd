"""Multi-node replicas, rank by rank: the per-rank view, its bound, worst-rank mode, group restarts, Events."""

from __future__ import annotations

import json
from typing import Any

from npu_operator.api.spec import parse_spec
from npu_operator.controller import reconcile
from npu_operator.status import findings as status_findings
from npu_operator.status import graph as status_graph
from npu_operator.status import resource as status
from npu_operator.status.findings import PodReport, group_findings
from npu_operator.status.graph import compact_ranks, graph_status, rank_view, worst_mode
from npu_operator.status.reports import parse_report

from tests.examples import example
from tests.operator.status.test_reports import GRAPH_BYTES_BOUND, _adversarial_report

NOW = "2026-12-01T00:00:00Z"
HCCL = {
    "from_mode": "FULL_DECODE_ONLY",
    "to_mode": "NONE",
    "reason": "HcclBufferShortfall",
    "message": "HCCL_BUFFSIZE too small for the graphs on this node",
    "stage": "engine",
}


def runtime(mode: str = "FULL_DECODE_ONLY", *, node: int = 0, state: str = "ready", **extra: Any) -> Any:
    captures = [{"mode": "FULL", "size": size, "memory_bytes": 64 * 2**20} for size in (1, 2, 4, 8)]
    document = {
        "state": state,
        "effective_mode": mode,
        "captures": captures,
        "node": {"rank": node, "nodes": 2, "data_parallel_ranks": [2 * node, 2 * node + 1]},
        **extra,
    }
    return parse_report(document)


def ranked(group: int, node: int, report: Any = None, **flags: Any) -> PodReport:
    name = f"r1-{group}" + (f"-{node}" if node else "")
    return PodReport(name, report if report is not None else runtime(node=node), rank=(group, node), **flags)


def lws_pod(group: int, node: int, *, ready: bool = True, **extra: Any) -> dict[str, Any]:
    name = f"r1-{group}" + (f"-{node}" if node else "")
    labels = {
        "leaderworkerset.sigs.k8s.io/group-index": str(group),
        "leaderworkerset.sigs.k8s.io/worker-index": str(node),
    }
    status_ = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    status_.update(extra.pop("status", {}))
    return {"metadata": {"name": name, "uid": name, "labels": labels, **extra}, "status": status_}


def test_modes_from_worst_to_best_in_one_place() -> None:
    assert worst_mode(["FULL_DECODE_ONLY", "NONE", "PIECEWISE"]) == "NONE"
    assert worst_mode(["FULL_AND_PIECEWISE", "FULL", "FULL_DECODE_ONLY"]) == "FULL_DECODE_ONLY"
    assert worst_mode(["FULL_DECODE_ONLY", "SomethingNew"]) == "SomethingNew"  # unknown: nothing promised


def test_both_ranks_of_a_group_are_shown_and_the_worst_decides_the_mode() -> None:
    reports = [ranked(0, 0), ranked(0, 1, runtime("NONE", node=1, downgrades=[HCCL]))]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True, nodes=2)
    assert graph["effectiveMode"] == "NONE"  # a single-node resource would show the most common one
    assert graph["rankCount"] == 2
    assert graph["rankModes"] == {"FULL_DECODE_ONLY": "0:0", "NONE": "0:1"}
    worst, other = graph["ranks"]
    assert worst == {
        "group": 0,
        "node": 1,
        "pod": "r1-0-1",
        "dataParallelRanks": "2-3",
        "mode": "NONE",
        "state": "ready",
        "downgrade": "HcclBufferShortfall",
        "captureSizes": {"count": 4, "max": 8},
        "captureMemoryBytes": 256 * 2**20,
    }
    assert (other["node"], other["mode"], other["dataParallelRanks"]) == (0, "FULL_DECODE_ONLY", "0-1")


def test_unread_and_stale_ranks_say_so_and_show_no_old_state() -> None:
    reports = [
        ranked(0, 0),
        ranked(0, 1, runtime(state="loading", node=1), stale=True),
        ranked(1, 0, reachable=False),
    ]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True, nodes=2)
    by_rank = {(r["group"], r["node"]): r for r in graph["ranks"]}
    assert by_rank[(0, 1)] == {"group": 0, "node": 1, "pod": "r1-0-1", "dataParallelRanks": "2-3", "reading": "Stale"}
    assert by_rank[(1, 0)]["reading"] == "Unreachable" and by_rank[(1, 0)]["mode"] == "FULL_DECODE_ONLY"
    # Unread ranks come before read ones; of those, the one with nothing to show first.
    assert [(r["group"], r["node"]) for r in graph["ranks"]] == [(0, 1), (1, 0), (0, 0)]
    assert (graph["reportingPods"], graph["unreachablePods"], graph["stalePods"]) == (1, 1, 1)


def test_ranks_as_compact_text() -> None:
    whole = [(g, n) for g in range(63) for n in range(4)]
    assert compact_ranks(whole, 4) == "0-62:*"
    assert compact_ranks([*whole, (63, 0), (63, 2), (63, 3)], 4) == "0-62:* 63:0,2-3"
    assert compact_ranks([(0, 0), (0, 1), (2, 0), (2, 1), (3, 1)], 2) == "0:* 2:* 3:1"
    scattered = compact_ranks([(g, 1) for g in range(0, 2000, 2)], 4)
    assert len(scattered) <= status_graph.MAX_RANKS_TEXT and scattered.endswith(" …")


def test_a_64_group_4_node_resource_at_every_limit_stays_small() -> None:
    """256 ranks, each report at every limit at once and distinct: the per-rank view is bounded."""
    reports = []
    for group in range(64):
        for node in range(4):
            document = _adversarial_report(group * 4 + node)
            document["node"] = {"rank": node, "data_parallel_ranks": list(range(0, 4000, 3))}
            document["downgrades"][0]["to_mode"] = "NONE"
            name = f"{'p' * 50}-{group}-{node}"
            reports.append(PodReport(name, parse_report(document), rank=(group, node)))
    first = graph_status("FULL_DECODE_ONLY", reports[:128], {}, now=NOW, same_generation=True, nodes=4)
    graph = graph_status("FULL_DECODE_ONLY", reports, first, now=NOW, same_generation=True, nodes=4)
    graph["restartingGroups"] = list(range(status_findings.MAX_GROUPS_LISTED))
    size = len(json.dumps(graph, ensure_ascii=False).encode())
    print(f"status.graph of 64 groups x 4 nodes, every field at its limit: {size} bytes")
    assert size <= GRAPH_BYTES_BOUND
    assert graph["rankCount"] == 256 and len(graph["ranks"]) == status_graph.MAX_RANKS_LISTED
    assert len(graph["rankModes"]) == status_graph.MAX_MODES
    view = rank_view(reports, 4)
    assert len(json.dumps(view).encode()) < GRAPH_BYTES_BOUND // 2
    # As DeepSeek-R1 on 64 groups of 4 nodes would report it, one node of one group downgraded.
    real = [
        ranked(
            g,
            n,
            runtime(
                "NONE" if (g, n) == (63, 1) else "FULL_DECODE_ONLY",
                node=n,
                downgrades=[HCCL] if (g, n) == (63, 1) else [],
            ),
        )
        for g in range(64)
        for n in range(4)
    ]
    typical = graph_status("FULL_DECODE_ONLY", real, {}, now=NOW, same_generation=True, nodes=4)
    typical_size = len(json.dumps(typical).encode())
    print(f"status.graph of 64 groups x 4 nodes, one rank downgraded: {typical_size} bytes")
    assert typical["rankModes"] == {"FULL_DECODE_ONLY": "0-62:* 63:0,2-3", "NONE": "63:1"}
    assert typical_size < 4 * 1024


def test_a_restarted_worker_marks_its_group_restarting_until_the_new_group_serves() -> None:
    spec = parse_spec(
        {**example("sandbox-cpu.yaml")["spec"], "npu": {"count": 0, "nodes": 2}, "parallelism": {"data": 2}}
    )
    lws = {
        "metadata": {"generation": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1},
    }
    exited = {"lastState": {"terminated": {"message": "EngineExited: the engine exited with code 137"}}}
    killed = lws_pod(
        0, 1, ready=False, status={"containerStatuses": [{"name": "runtime", "restartCount": 1, **exited}]}
    )

    serving = group_findings([lws_pod(0, 0), lws_pod(0, 1)], [], 2, {})
    assert serving == status_findings.GroupFindings()
    conditions = {c.type: c for c in status.assess(spec, status.Observed(workload=lws, groups=serving))}
    assert conditions["Ready"].status and conditions["Ready"].reason == "Serving"

    restarting = group_findings([lws_pod(0, 0), killed], [], 2, {})
    assert list(restarting.restarting) == [0] and "EngineExited" in restarting.restarting[0]
    conditions = {c.type: c for c in status.assess(spec, status.Observed(workload=lws, groups=restarting))}
    assert (conditions["Ready"].status, conditions["Ready"].reason) == (False, "GroupRestarting")
    assert (conditions["Progressing"].status, conditions["Progressing"].reason) == (True, "GroupRestarting")
    assert "group 0: pod r1-0-1 (node 1) restarted (EngineExited" in conditions["Progressing"].message

    # The old group is gone; the new leader is up, its worker not ready yet: still the same restart.
    remembered = {"restartingGroups": status_findings.restarting_groups(restarting)}
    again = group_findings([lws_pod(0, 0), lws_pod(0, 1, ready=False)], [], 2, remembered)
    assert list(again.restarting) == [0] and "1/2 pods ready" in again.restarting[0]
    deleting = group_findings([lws_pod(0, 0, deletionTimestamp=NOW)], [], 2, {})
    assert "being deleted" in deleting.restarting[0]
    between = group_findings([], [], 2, remembered, replicas=1)  # old pods gone, new ones not made yet
    assert list(between.restarting) == [0]
    assert group_findings([], [], 2, remembered, replicas=0).restarting == {}  # scaled away: not coming back

    back = group_findings([lws_pod(0, 0), lws_pod(0, 1)], [], 2, remembered)
    conditions = {c.type: c for c in status.assess(spec, status.Observed(workload=lws, groups=back))}
    assert conditions["Ready"].status and conditions["Progressing"].reason == "RolloutComplete"


def test_a_rank_that_does_not_serve_keeps_the_resource_from_ready() -> None:
    """The LeaderWorkerSet counts its group ready, but one rank's runtime failed: not Ready."""
    failed = PodReport("r1-0-1", runtime(state="failed", node=1), rank=(0, 1))
    findings = group_findings([lws_pod(0, 0), lws_pod(0, 1)], [failed], 2, {})
    assert findings.not_serving == ("group 0 node 1 (pod r1-0-1): its runtime failed",)
    assert group_findings([lws_pod(0, 0)], [], 2, {}).not_serving == ("group 0: 1 of 2 pods",)


def test_a_rank_that_downgrades_or_fails_gives_one_event_naming_group_and_node() -> None:
    healthy = graph_status("FULL_DECODE_ONLY", [ranked(0, 0), ranked(0, 1)], {}, now=NOW, same_generation=True, nodes=2)
    failure = {"reason": "GraphCaptureOutOfMemory", "message": "out of memory"}
    worse = [ranked(0, 0), ranked(0, 1, runtime("NONE", node=1, downgrades=[HCCL], failure=failure))]
    graph = graph_status("FULL_DECODE_ONLY", worse, healthy, now=NOW, same_generation=True, nodes=2)
    result = reconcile._result({"graph": healthy}, {"graph": graph}, ())
    messages = sorted((e.reason, e.message) for e in result.events)
    assert messages == [
        (
            "GraphModeDowngraded",
            "group 0 node 1 (pod r1-0-1): FULL_DECODE_ONLY -> NONE (HcclBufferShortfall, engine stage): "
            "HCCL_BUFFSIZE too small for the graphs on this node",
        ),
        ("RankFailed", "group 0 node 1 (pod r1-0-1): GraphCaptureOutOfMemory"),
    ]
    assert reconcile._result({"graph": graph}, {"graph": graph}, ()).events == ()  # once, not per tick

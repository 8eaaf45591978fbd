"""Folding pods and runtime reports into status.graph and findings: disagreement, gaps, old runtimes."""

from __future__ import annotations

from typing import Any

from npu_operator.status.findings import PodReport, pod_findings, termination_cause
from npu_operator.status.graph import graph_status, new_downgrades
from npu_operator.status.reports import RuntimeReport, parse_report

NOW, LATER = "2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z"
CPU_DOWNGRADE = {
    "from_mode": "FULL_DECODE_ONLY",
    "to_mode": "NONE",
    "reason": "CpuHasNoGraphs",
    "message": "the CPU platform has no static graphs",
    "stage": "plan",
}


def report(mode: str = "NONE", **extra: Any) -> RuntimeReport:
    return parse_report(
        {"schema": 1, "state": "ready", "requested_mode": "FULL_DECODE_ONLY", "effective_mode": mode, **extra}
    )


def pod(name: str, *, ready: bool = True, **status: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": {"name": name, "uid": name}, "status": {"conditions": conditions, **status}}


def test_pods_that_agree() -> None:
    reports = [PodReport("a", report(downgrades=[CPU_DOWNGRADE])), PodReport("b", report(downgrades=[CPU_DOWNGRADE]))]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True)
    assert graph["effectiveMode"] == "NONE"
    assert "modes" not in graph
    assert graph["downgrades"] == [
        {
            "fromMode": "FULL_DECODE_ONLY",
            "toMode": "NONE",
            "reason": "CpuHasNoGraphs",
            "stage": "plan",
            "message": "the CPU platform has no static graphs",
            "pods": 2,
            "firstSeen": NOW,
        }
    ]
    assert graph["reportingPods"] == 2


def test_pods_that_disagree_show_the_most_common_mode_and_the_count_per_mode() -> None:
    reports = [
        PodReport("a", report("FULL_DECODE_ONLY")),
        PodReport("b", report("FULL_DECODE_ONLY")),
        PodReport("c", report("PIECEWISE")),
    ]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True)
    assert graph["effectiveMode"] == "FULL_DECODE_ONLY"
    assert graph["modes"] == {"FULL_DECODE_ONLY": 2, "PIECEWISE": 1}


def test_unreachable_pods_are_counted_once_and_their_last_report_kept() -> None:
    """A pod whose last read failed is unreachable, never also reporting; what it said before is kept."""
    reports = [PodReport("a", report(), reachable=False), PodReport("b", None, reachable=False)]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True)
    assert graph["effectiveMode"] == "NONE"
    assert graph["reportingPods"] == 0
    assert graph["unreachablePods"] == 2


def test_a_stale_report_is_not_the_current_state() -> None:
    """Read before the pod's last transition: not folded in, not counted as reporting."""
    loading = report("PIECEWISE", state="loading")
    reports = [PodReport("a", loading, reachable=False, stale=True), PodReport("b", loading, stale=True)]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=False)
    assert "effectiveMode" not in graph
    assert (graph["reportingPods"], graph["unreachablePods"], graph["stalePods"]) == (0, 1, 1)
    pods = [pod("a", ready=True), pod("b", ready=False)]
    assert pod_findings(pods, reports, None).starting == {}  # "loading" is what they said before
    assert pod_findings(pods, [PodReport("b", loading)], None).starting == {"loading": 1}


def test_no_report_keeps_the_previous_mode_and_downgrades_until_the_spec_changes() -> None:
    first = graph_status(
        "FULL_DECODE_ONLY", [PodReport("a", report(downgrades=[CPU_DOWNGRADE]))], {}, now=NOW, same_generation=True
    )
    gap = graph_status("FULL_DECODE_ONLY", [], first, now=LATER, same_generation=True)
    assert gap["effectiveMode"] == "NONE"
    assert gap["downgrades"][0]["pods"] == 0
    assert gap["downgrades"][0]["firstSeen"] == NOW
    back = graph_status(
        "FULL_DECODE_ONLY", [PodReport("b", report(downgrades=[CPU_DOWNGRADE]))], gap, now=LATER, same_generation=True
    )
    assert new_downgrades(gap, back) == []
    assert back["downgrades"][0]["firstSeen"] == NOW
    changed = graph_status("FULL_DECODE_ONLY", [], back, now=LATER, same_generation=False)
    assert "effectiveMode" not in changed
    assert "downgrades" not in changed


def test_a_new_downgrade_is_new_once() -> None:
    before = graph_status("FULL_DECODE_ONLY", [PodReport("a", report())], {}, now=NOW, same_generation=True)
    after = graph_status(
        "FULL_DECODE_ONLY",
        [PodReport("a", report(downgrades=[CPU_DOWNGRADE]))],
        before,
        now=LATER,
        same_generation=True,
    )
    assert [d["reason"] for d in new_downgrades(before, after)] == ["CpuHasNoGraphs"]
    again = graph_status(
        "FULL_DECODE_ONLY", [PodReport("a", report(downgrades=[CPU_DOWNGRADE]))], after, now=LATER, same_generation=True
    )
    assert new_downgrades(after, again) == []


def test_old_runtime_reports_without_optional_fields() -> None:
    old = [parse_report({"effective_mode": "FULL_DECODE_ONLY"}), parse_report({"schema": 1})]
    reports = [PodReport("a", old[0]), PodReport("b", old[1])]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True)
    assert graph == {"requestedMode": "FULL_DECODE_ONLY", "effectiveMode": "FULL_DECODE_ONLY", "reportingPods": 2}


def test_captures_replay_and_eager_fallbacks_are_summarized_and_rounded() -> None:
    captures = [
        {"mode": "FULL", "size": 1, "memory_bytes": 100 * 2**20 + 1234, "seconds": 0.5},
        {"mode": "FULL", "size": 8, "memory_bytes": 50 * 2**20, "seconds": 0.4},
    ]
    replay_a = [{"mode": "FULL", "size": 8, "count": 10, "p50_seconds": 0.0012345, "p99_seconds": 0.0031}]
    replay_b = [
        {"mode": "FULL", "size": 8, "count": 5, "p50_seconds": 0.0011, "p99_seconds": 0.0049},
        {"mode": "FULL", "size": 1, "count": 0, "p50_seconds": 0.0, "p99_seconds": 0.0},
    ]
    reports = [
        PodReport(
            "a",
            report(
                "FULL_DECODE_ONLY",
                captures=captures,
                replay=replay_a,
                decode_steps=900,
                eager_fallbacks={"batch_above_largest_size": 9},
            ),
        ),
        PodReport(
            "b",
            report("FULL_DECODE_ONLY", captures=captures[:1], replay=replay_b, decode_steps=100, eager_fallbacks={}),
        ),
    ]
    graph = graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True)
    assert graph["captureSizes"] == [1, 8]
    assert graph["captureMemory"] == {"maxPodBytes": 150 * 2**20, "totalBytes": 250 * 2**20}
    assert graph["replay"] == [{"mode": "FULL", "size": 8, "p50Seconds": 0.0012, "p99Seconds": 0.0049}]
    assert graph["eagerFallbackRate"] == 0.009


def test_planned_sizes_stand_in_until_captures_are_seen() -> None:
    reports = [PodReport("a", report("FULL_DECODE_ONLY", plan={"capture_sizes": [1, 2, 4, 12]}, captures=[]))]
    assert graph_status("FULL_DECODE_ONLY", reports, {}, now=NOW, same_generation=True)["captureSizes"] == [1, 2, 4, 12]


def test_termination_message_names_the_cause() -> None:
    crashed = pod(
        "a",
        containerStatuses=[
            {
                "name": "runtime",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {"exitCode": 1, "message": "GraphCaptureOutOfMemory: NPU out of memory at size 64\n"}
                },
            }
        ],
    )
    assert termination_cause(crashed) == ("GraphCaptureOutOfMemory", "NPU out of memory at size 64")
    findings = pod_findings([crashed], [], "huawei.com/Ascend910")
    assert findings.worst is not None
    assert findings.worst.reason == "GraphCaptureFailed"
    assert "a: GraphCaptureOutOfMemory" in findings.worst.message


def test_runtime_failure_in_status_wins_over_a_generic_crash_loop() -> None:
    looping = pod(
        "a",
        containerStatuses=[
            {
                "name": "runtime",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
            }
        ],
    )
    plain = pod_findings([looping], [], "huawei.com/Ascend910")
    assert plain.worst is not None and plain.worst.reason == "CrashLoop"
    failed = report(state="failed", failure={"reason": "ModelNotFound", "message": "/models/x: no such directory"})
    specific = pod_findings([looping], [PodReport("a", failed)], "huawei.com/Ascend910")
    assert specific.worst is not None and specific.worst.reason == "ModelLoadFailed"


def test_unschedulable_for_lack_of_npus_is_insufficient_npu() -> None:
    pending = pod(
        "a",
        ready=False,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient huawei.com/Ascend910.",
            }
        ],
    )
    findings = pod_findings([pending], [], "huawei.com/Ascend910")
    assert findings.worst is not None and findings.worst.reason == "InsufficientNPU"
    assert findings.worst.message == (
        "a: asks huawei.com/Ascend910; the scheduler: 0/4 nodes are available: 4 Insufficient huawei.com/Ascend910."
    )
    # Refused for something else than the NPUs asked: still said, never silent.
    other = pod_findings([pending], [], "huawei.com/Ascend310P")
    assert other.worst is not None and other.worst.reason == "Unschedulable"
    assert other.worst.message.startswith("a: asks huawei.com/Ascend310P; the scheduler: 0/4 nodes are available")


def test_the_most_specific_problem_comes_first_and_starting_phases_are_counted() -> None:
    stream = pod(
        "a",
        containerStatuses=[
            {"name": "runtime", "lastState": {"terminated": {"message": "StreamResourcesExhausted: ACL error 207008"}}}
        ],
    )
    looping = pod("b", containerStatuses=[{"name": "runtime", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}])
    loading = pod("c", ready=False)
    findings = pod_findings([looping, stream, loading], [PodReport("c", report(state="loading"))], None)
    assert [f.reason for f in findings.problems] == ["CrashLoop", "GraphCaptureFailed"]
    assert findings.worst is not None and findings.worst.reason == "GraphCaptureFailed"
    assert findings.starting == {"loading": 1}


def test_an_unknown_runtime_failure_does_not_hide_a_known_termination_message() -> None:
    crashed = pod(
        "a",
        containerStatuses=[
            {"name": "runtime", "lastState": {"terminated": {"message": "ModelNotFound: /models/x: no such directory"}}}
        ],
    )
    newer = report(state="failed", failure={"reason": "SomethingNewer", "message": "a reason this operator predates"})
    findings = pod_findings([crashed], [PodReport("a", newer)], None)
    assert findings.worst is not None
    assert findings.worst.reason == "ModelLoadFailed"


def test_every_runtime_failure_reason_has_a_condition() -> None:
    from npu_operator.status.findings import FAILURE_CONDITIONS
    from npu_runtime.serving.failures import REASONS

    assert set(FAILURE_CONDITIONS) == set(REASONS)

"""Status as a unit: conditions from the Deployment, stable transition times, events from transitions."""

from __future__ import annotations

from typing import Any

from npu_operator.api.spec import SpecError, parse_spec
from npu_operator.status import resource as status

from tests.examples import example

SPEC = parse_spec(example("qwen2.5-7b-910b.yaml")["spec"])  # 2 replicas
T0, T1 = "2026-12-01T00:00:00Z", "2026-12-01T00:05:00Z"


def deployment(
    ready: int,
    updated: int = 2,
    replicas: int = 2,
    generation: int = 1,
    observed: int = 1,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "status": {
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "replicas": replicas,
            "observedGeneration": observed,
            "conditions": conditions or [],
        },
    }


def by_type(conditions: list[status.Condition]) -> dict[str, status.Condition]:
    return {c.type: c for c in conditions}


def test_no_deployment_yet_is_pending_and_progressing() -> None:
    found = by_type(status.assess(SPEC, status.Observed()))
    assert (found["Ready"].status, found["Progressing"].status, found["Degraded"].status) == (False, True, False)
    assert status.summarize(list(found.values()), created=False) == ("Pending", "Creating")


def test_all_replicas_ready_and_updated_is_ready() -> None:
    found = status.assess(SPEC, status.Observed(workload=deployment(ready=2)))
    assert by_type(found)["Ready"].reason == "Serving"
    assert by_type(found)["Progressing"].reason == "RolloutComplete"
    assert status.summarize(found, created=True) == ("Ready", "")


def test_a_deployment_that_has_not_seen_its_new_generation_is_still_rolling_out() -> None:
    found = by_type(status.assess(SPEC, status.Observed(workload=deployment(ready=2, generation=2, observed=1))))
    assert found["Ready"].status is False
    assert found["Progressing"].reason == "RollingOut"


def test_old_pods_still_running_keep_it_progressing() -> None:
    found = by_type(status.assess(SPEC, status.Observed(workload=deployment(ready=2, replicas=3))))
    assert found["Progressing"].status is True


def test_partially_ready() -> None:
    found = by_type(status.assess(SPEC, status.Observed(workload=deployment(ready=1))))
    assert (found["Ready"].reason, found["Ready"].message) == ("PartiallyReady", "1/2 replicas ready")


def test_progress_deadline_exceeded_is_degraded() -> None:
    stuck = deployment(
        ready=0,
        conditions=[
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}
        ],
    )
    found = status.assess(SPEC, status.Observed(workload=stuck))
    assert by_type(found)["Degraded"] == status.Condition("Degraded", True, "ProgressDeadlineExceeded", "too slow")
    assert status.summarize(found, created=True) == ("Degraded", "ProgressDeadlineExceeded")


def test_replica_failure_is_degraded() -> None:
    failing = deployment(
        ready=0,
        conditions=[
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "exceeded quota"}
        ],
    )
    assert by_type(status.assess(SPEC, status.Observed(workload=failing)))["Degraded"].reason == "ReplicaFailure"


def test_scaled_to_zero_is_ready() -> None:
    zero = parse_spec({**example("qwen2.5-7b-910b.yaml")["spec"], "replicas": 0})
    found = by_type(status.assess(zero, status.Observed(workload=deployment(ready=0, updated=0, replicas=0))))
    assert (found["Ready"].status, found["Ready"].reason) == (True, "ScaledToZero")


def test_transition_time_moves_only_when_the_status_flips() -> None:
    first = status.merge_conditions([], [status.Condition("Ready", False, "Starting", "0/2")], now=T0, generation=1)
    same = status.merge_conditions(
        first, [status.Condition("Ready", False, "PartiallyReady", "1/2")], now=T1, generation=1
    )
    assert same[0]["lastTransitionTime"] == T0 and same[0]["reason"] == "PartiallyReady"
    flipped = status.merge_conditions(same, [status.Condition("Ready", True, "Serving", "2/2")], now=T1, generation=1)
    assert flipped[0]["lastTransitionTime"] == T1


def test_events_come_from_transitions_only() -> None:
    before = status.merge_conditions(
        [], status.assess(SPEC, status.Observed(workload=deployment(ready=0))), now=T0, generation=1
    )
    after = status.merge_conditions(
        before, status.assess(SPEC, status.Observed(workload=deployment(ready=2))), now=T1, generation=1
    )
    assert status.transition_events(before, after) == [status.Event("Normal", "Ready", "2/2 replicas serving")]
    assert status.transition_events(after, after) == []


def test_degraded_reason_change_is_a_new_warning() -> None:
    one = [{"type": "Degraded", "status": "True", "reason": "ReplicaFailure", "message": "a"}]
    two = [{"type": "Degraded", "status": "True", "reason": "ProgressDeadlineExceeded", "message": "b"}]
    assert status.transition_events(one, two) == [status.Event("Warning", "ProgressDeadlineExceeded", "b")]


def test_invalid_status_names_the_fields_and_keeps_other_fields() -> None:
    previous = {"endpoint": "http://x", "conditions": []}
    new = status.invalid_status(3, [SpecError("spec.npu.resourceName", "bad")], previous, T0)
    assert new["phase"] == "Failed" and new["reason"] == "InvalidSpec" and new["observedGeneration"] == 3
    assert new["endpoint"] == "http://x"
    degraded = next(c for c in new["conditions"] if c["type"] == "Degraded")
    assert degraded["message"] == "spec.npu.resourceName: bad"


def test_status_patch_holds_only_changes() -> None:
    assert status.status_patch({"a": 1, "b": 2}, {"a": 1, "b": 3}) == {"b": 3}
    assert status.status_patch({"a": 1, "gone": 1}, {"a": 1}) == {"gone": None}
    assert status.status_patch({"a": [1]}, {"a": [1]}) == {}
    # A merge patch merges nested objects: what left one needs its own null, or it stays.
    before = {"graph": {"effectiveMode": "NONE", "unreachablePods": 1, "rankModes": {"NONE": "0:1", "FULL": "0:0"}}}
    after = {"graph": {"effectiveMode": "FULL", "rankModes": {"FULL": "0:*"}}}
    assert status.status_patch(before, after) == {
        "graph": {"effectiveMode": "FULL", "unreachablePods": None, "rankModes": {"NONE": None, "FULL": "0:*"}}
    }

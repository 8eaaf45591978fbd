"""Status as its own unit: observed children in, NPUInference status and the Events it implies out.

Pure. Conditions (Ready, Progressing, Degraded) carry CamelCase reasons; a condition's
lastTransitionTime changes only when its status flips. Events are derived from condition
transitions against the stored status, so an operator restart never repeats them. The status
patch holds only what changed, so a steady resource costs no writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_operator.api.spec import NPUInferenceSpec, SpecError, plan_options
from npu_operator.children import routing, scaling
from npu_operator.kube import objects
from npu_operator.kube.names import endpoint, selector_string
from npu_operator.status.adapters import ADAPTER_FAILED, adapters_ready
from npu_operator.status.findings import GroupFindings, PodFindings
from npu_operator.status.graph import new_downgrades, new_rank_problems

JSON = dict[str, Any]

READY: Final = "Ready"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"
INVALID_SPEC: Final = "InvalidSpec"
GRAPH_MODE_DOWNGRADED: Final = "GraphModeDowngraded"
CHILD_REJECTED: Final = "ChildRejected"
CHILD_CONFLICT: Final = "ChildConflict"
LWS_NOT_INSTALLED: Final = "LeaderWorkerSetNotInstalled"
DS_NOT_INSTALLED: Final = "DisaggregatedSetNotInstalled"
# Multi-node replicas (LeaderWorkerSet groups).
GROUP_RESTARTING: Final = "GroupRestarting"  # LeaderWorkerSet is recreating a group
RANKS_NOT_SERVING: Final = "RanksNotServing"  # the groups count as ready, but a rank does not serve
RANK_FAILED: Final = "RankFailed"  # Event: a rank's runtime reports a failure
# A pod reported calibration figures that cannot be measurements (status.calibration): not kept.
CALIBRATION_REJECTED: Final = "CalibrationRejected"
IMPLAUSIBLE_REPORT: Final = "ImplausibleReport"
# The calibration record's name is taken by an object not ours: nothing rolls out (see reconcile).
CALIBRATION_RECORD_CONFLICT: Final = "CalibrationRecordConflict"


@dataclasses.dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the reconcile found in the cluster for one NPUInference."""

    # The workload's own object with its status (a Deployment, a LeaderWorkerSet, or a
    # DisaggregatedSet's view from its roles: the same replicas, updatedReplicas, readyReplicas and
    # observedGeneration), and its kind, for the messages.
    workload: JSON | None = None
    workload_kind: str = "Deployment"
    # Status fields of the topology's own (`status.disaggregation`: the roles' serving revision).
    topology_status: JSON | None = None
    # Children that exist under our name but belong to someone else: "Service default/x".
    conflicts: tuple[str, ...] = ()
    # Child writes the API server refused for good (403, 422, quota): "create Deployment ns/x: 403 ...".
    rejected: tuple[str, ...] = ()
    # Things the user asked for that the cluster cannot give, e.g. a PodMonitor without its CRD.
    notes: tuple[str, ...] = ()
    # What the pods and their runtimes say (see `findings`).
    findings: PodFindings = dataclasses.field(default_factory=PodFindings)
    graph: JSON = dataclasses.field(default_factory=dict)
    # (reason, message): the workload cannot be created in this cluster, e.g. its API is missing.
    blocked: tuple[str, str] | None = None
    # The download of a hub source (see `model`); None for a volume source.
    model: JSON | None = None
    # The longest startup seen among ready pods, kept across ticks (see `scaling.observed_startup_seconds`).
    startup_seconds: int | None = None
    # The replica's capacity (`scaling.capacity`) where spec.autoscaling or spec.routing reads it:
    # computed once per generation (`controller.desired.Desired`); None: computed here.
    capacity: scaling.Capacity | None = None
    # The groups of a multi-node replica (see `findings.group_findings`).
    groups: GroupFindings = dataclasses.field(default_factory=GroupFindings)
    # Why some pods' calibration figures were not kept (`calibration.rejected_message`); None: all plausible.
    calibration_rejected: str | None = None
    # spec.lora's adapters as the ready pods hold them (`status.adapters`), and why some are not served.
    adapters: tuple[JSON, ...] = ()
    adapter_failed: str | None = None


def compute_status(
    name: str,
    namespace: str,
    generation: int,
    spec: NPUInferenceSpec,
    observed: Observed,
    previous: Mapping[str, Any],
    now: str,
) -> JSON:
    """The whole new status of a valid resource."""
    total, updated, ready = replica_counts(observed.workload)
    conditions = [*assess(spec, observed), calibration_condition(observed.calibration_rejected)]
    if spec.lora is not None:
        conditions.append(adapter_condition(observed.adapter_failed))
    status: JSON = {
        "observedGeneration": generation,
        "replicas": total,
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "ready": f"{ready}/{spec.replicas}",
        "selector": selector_string(name, multi_node=spec.npu.nodes > 1),
        "endpoint": endpoint(name, namespace),
        "graph": observed.graph or {**previous.get("graph", {}), "requestedMode": spec.graph.mode},
        "conditions": merge_conditions(previous.get("conditions", ()), conditions, now=now, generation=generation),
    }
    if observed.model is not None:
        status["model"] = observed.model
    if spec.lora is not None:
        status["adapters"] = list(observed.adapters)
        status["adaptersReady"] = adapters_ready(observed.adapters)
    if observed.topology_status:
        status.update(observed.topology_status)
    if spec.autoscaling is not None or spec.routing is not None:
        # capacity is computed once per generation (Desired); scaling.capacity raises only for a spec read_spec refused
        cap = observed.capacity if observed.capacity is not None else scaling.capacity(spec, plan_options(spec))
        if spec.autoscaling is not None:
            timeout = spec.engine.startup_timeout_seconds
            status["autoscaling"] = scaling.autoscaling_status(spec.autoscaling, cap, observed.startup_seconds, timeout)
            if spec.disaggregation is not None:
                prefill = scaling.prefill_target(spec, scaling.prefill_capacity(spec))
                status["autoscaling"]["prefill"] = scaling.prefill_status(prefill)
        if spec.routing is not None:
            status["routing"] = routing.routing_status(name, routing.endpoint_concurrency(spec, cap.per_replica))
    status["phase"], status["reason"] = summarize(conditions, created=observed.workload is not None)
    return status


def calibration_condition(rejected: str | None) -> Condition:
    """CalibrationRejected: True while a pod reports figures that were not kept (a Warning Event when
    it turns on); the pods plan with their estimates meanwhile, nothing is degraded."""
    if rejected is None:
        return Condition(CALIBRATION_REJECTED, False, "AsExpected", "")
    return Condition(CALIBRATION_REJECTED, True, IMPLAUSIBLE_REPORT, rejected)


def adapter_condition(failed: str | None) -> Condition:
    """AdapterFailed: True while a LoRA adapter failed on a pod (a Warning Event when it turns on),
    naming each with the runtime's message; the base model and the other adapters keep serving."""
    if failed is None:
        return Condition(ADAPTER_FAILED, False, "AdaptersServing", "")
    return Condition(ADAPTER_FAILED, True, ADAPTER_FAILED, failed)


def replica_counts(workload: Mapping[str, Any] | None) -> tuple[int, int, int]:
    """The workload's (replicas, updatedReplicas, readyReplicas): zeros before it has a status."""
    status = (workload or {}).get("status", {})
    return int(status.get("replicas", 0)), int(status.get("updatedReplicas", 0)), int(status.get("readyReplicas", 0))


def invalid_status(generation: int, problems: Sequence[SpecError], previous: Mapping[str, Any], now: str) -> JSON:
    """The status of a resource whose spec cannot be served: nothing is built until it is fixed."""
    message = "; ".join(str(problem) for problem in problems)
    conditions = [
        Condition(READY, False, INVALID_SPEC, message),
        Condition(PROGRESSING, False, INVALID_SPEC, "fix the spec; nothing is rolled out until then"),
        Condition(DEGRADED, True, INVALID_SPEC, message),
    ]
    return {
        **{key: value for key, value in previous.items() if key != "conditions"},
        "observedGeneration": generation,
        "phase": "Failed",
        "reason": INVALID_SPEC,
        "conditions": merge_conditions(previous.get("conditions", ()), conditions, now=now, generation=generation),
    }


def stuck(reason: str, message: str) -> list[Condition]:
    """Nothing can roll out until something outside the spec changes: not Ready, not Progressing, Degraded."""
    return [
        Condition(READY, False, reason, message),
        Condition(PROGRESSING, False, reason, message),
        Condition(DEGRADED, True, reason, message),
    ]


def assess(spec: NPUInferenceSpec, observed: Observed) -> list[Condition]:
    """Ready, Progressing and Degraded for a valid spec, from the workload's own status (a
    Deployment's, or a LeaderWorkerSet's: the same replicas, updatedReplicas, readyReplicas and
    observedGeneration, counted in groups)."""
    if observed.conflicts:
        return stuck(CHILD_CONFLICT, "not owned by this NPUInference, left alone: " + ", ".join(observed.conflicts))
    if observed.rejected:
        return stuck(CHILD_REJECTED, "the API server refused: " + "; ".join(observed.rejected))
    if observed.blocked is not None:
        return stuck(*observed.blocked)
    workload = observed.workload
    if workload is None:
        creating = f"creating the {observed.workload_kind}"
        return [
            Condition(READY, False, "Creating", creating),
            Condition(PROGRESSING, True, "Creating", creating),
            Condition(DEGRADED, False, "AsExpected", ""),
        ]
    degraded = _degraded(spec, observed, workload)
    ready, rolling = _ready(spec, observed, workload)
    return [ready, _progressing(spec, observed, workload, rolling, degraded), degraded]


def _degraded(spec: NPUInferenceSpec, observed: Observed, workload: Mapping[str, Any]) -> Condition:
    """Degraded: the worst pod finding, then the workload's own failures, then a downgrade the spec refuses."""
    progress = objects.condition(workload, "Progressing")
    failure = objects.condition(workload, "ReplicaFailure")
    worst = observed.findings.worst
    effective = observed.graph.get("effectiveMode")
    if worst is not None:
        return Condition(DEGRADED, True, worst.reason, worst.message)
    if progress.get("status") == "False" and progress.get("reason") == "ProgressDeadlineExceeded":
        return Condition(DEGRADED, True, "ProgressDeadlineExceeded", progress.get("message", ""))
    if failure.get("status") == "True":
        return Condition(DEGRADED, True, "ReplicaFailure", failure.get("message", ""))
    if spec.graph.on_downgrade == "Degrade" and effective and effective != spec.graph.mode:
        message = f"the engines run {effective}, not the requested {spec.graph.mode} (spec.graph.onDowngrade: Degrade)"
        return Condition(DEGRADED, True, GRAPH_MODE_DOWNGRADED, message)
    return Condition(DEGRADED, False, "AsExpected", "; ".join(observed.notes))


def _ready(spec: NPUInferenceSpec, observed: Observed, workload: Mapping[str, Any]) -> tuple[Condition, bool]:
    """Ready, and whether a rollout is still under way (every replica updated, ready and current)."""
    desired = spec.replicas
    total, updated, ready = replica_counts(workload)
    observed_generation = int(workload.get("status", {}).get("observedGeneration", 0))
    current = observed_generation >= int(workload.get("metadata", {}).get("generation", 0))
    groups = observed.groups
    done = current and updated == desired and ready >= desired and total == desired
    if desired == 0:
        return Condition(READY, True, "ScaledToZero", "0 replicas requested"), total > 0
    if groups.restarting:
        # Ready means every rank of every group serves; the LeaderWorkerSet's counters lag behind.
        return Condition(READY, False, GROUP_RESTARTING, groups.restarting_message), True
    if done and groups.not_serving:
        return Condition(READY, False, RANKS_NOT_SERVING, groups.not_serving_message), True
    if done:
        notes = "; ".join(observed.notes)
        return Condition(
            READY, True, "Serving", f"{ready}/{desired} replicas serving" + (f"; {notes}" if notes else "")
        ), False
    return Condition(
        READY, False, "Starting" if ready == 0 else "PartiallyReady", f"{ready}/{desired} replicas ready"
    ), True


def _progressing(
    spec: NPUInferenceSpec, observed: Observed, workload: Mapping[str, Any], rolling: bool, degraded: Condition
) -> Condition:
    """Progressing while a rollout is under way and nothing is degraded (the rollout's figures in the message)."""
    if not rolling or degraded.status:
        return Condition(PROGRESSING, False, "RolloutComplete" if not rolling else degraded.reason, "")
    _, updated, ready = replica_counts(workload)
    groups = observed.groups
    phases = ", ".join(f"{count} {phase}" for phase, count in observed.findings.starting.items())
    rollout = f"{updated}/{spec.replicas} replicas updated, {ready} ready" + (f"; starting: {phases}" if phases else "")
    if groups.restarting:
        rollout = f"{groups.restarting_message}; {rollout}"
    return Condition(PROGRESSING, True, GROUP_RESTARTING if groups.restarting else "RollingOut", rollout)


def summarize(conditions: Sequence[Condition], *, created: bool) -> tuple[str, str]:
    """The phase and the one-word reason for `kubectl get` (empty when Ready)."""
    by_type = {c.type: c for c in conditions}
    degraded, ready = by_type[DEGRADED], by_type[READY]
    if degraded.status:
        return ("Failed" if degraded.reason == INVALID_SPEC else "Degraded"), degraded.reason
    if ready.status:
        return "Ready", ""
    return ("Progressing" if created else "Pending"), ready.reason


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], current: Sequence[Condition], *, now: str, generation: int
) -> list[JSON]:
    """Kubernetes-style conditions; lastTransitionTime moves only when the status flips."""
    before = {c.get("type"): c for c in previous}
    merged = []
    for condition in current:
        status = "True" if condition.status else "False"
        old = before.get(condition.type, {})
        merged.append(
            {
                "type": condition.type,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": old["lastTransitionTime"]
                if old.get("status") == status and "lastTransitionTime" in old
                else now,
                "observedGeneration": generation,
            }
        )
    return merged


def transition_events(previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]) -> list[Event]:
    """Events for what changed: a Warning when Degraded turns on (or changes reason), Normal when Ready."""
    before = {c.get("type"): c for c in previous}
    events = []
    for condition in current:
        old = before.get(condition["type"], {})
        changed = (old.get("status"), old.get("reason")) != (condition["status"], condition["reason"])
        if not changed or condition["status"] != "True":
            continue
        if condition["type"] in (CALIBRATION_REJECTED, ADAPTER_FAILED):
            events.append(Event("Warning", condition["reason"], condition["message"]))
        elif condition["type"] == DEGRADED and condition["reason"] != GRAPH_MODE_DOWNGRADED:
            # Downgrades have an Event each, when first seen (see graph_events).
            events.append(Event("Warning", condition["reason"], condition["message"]))
        elif condition["type"] == READY and old.get("status") != "True":
            events.append(Event("Normal", "Ready", condition["message"] or condition["reason"]))
    return events


def status_patch(previous: Mapping[str, Any], new: Mapping[str, Any]) -> JSON:
    """A merge patch of `status` with only the keys that changed (None removes a key).

    Recursive: a merge patch merges nested objects, so a key dropped inside one (`graph.modes`
    once the pods agree, `graph.unreachablePods` once they answer) needs its own None, or the
    stored status keeps it.
    """
    patch: JSON = {}
    for key, value in new.items():
        old = previous.get(key)
        if old == value:
            continue
        patch[key] = status_patch(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    patch.update({key: None for key in previous if key not in new})
    return patch


def graph_events(old_graph: Mapping[str, Any], new_graph: Mapping[str, Any], role: str = "") -> list[Event]:
    """A Warning Event per downgrade or rank failure that `new_graph` shows and `old_graph` did not;
    `role` ("role decode, ") starts the message of a disaggregated resource's role."""
    events: list[Event] = []
    ranked = "ranks" in new_graph  # a multi-node replica: the Events name the rank instead
    announced: set[str] = set()
    for rank in new_rank_problems(old_graph, new_graph):
        where = f"{role}group {rank['group']} node {rank['node']} (pod {rank['pod']})"
        if "failure" in rank:
            events.append(Event("Warning", RANK_FAILED, f"{where}: {rank['failure']}"))
        if "downgrade" in rank:
            reason = rank["downgrade"]
            announced.add(reason)
            known = next((d for d in new_graph.get("downgrades", []) if d["reason"] == reason), None)
            message = (
                f"{where}: {known['fromMode']} -> {known['toMode']} ({reason}, {known['stage']} stage): "
                f"{known['message']}"
                if known is not None
                else f"{where}: {rank.get('mode', 'an other mode')} ({reason})"
            )
            events.append(Event("Warning", GRAPH_MODE_DOWNGRADED, message))
    for downgrade in new_downgrades(old_graph, new_graph):
        if ranked and downgrade["reason"] in announced:
            continue
        modes = f"{downgrade['fromMode']} -> {downgrade['toMode']}"
        why = downgrade["message"].removeprefix(f"{modes}: ")
        pods = f"{downgrade['pods']} pod" + ("s" if downgrade["pods"] != 1 else "")
        message = f"{role}{modes} ({downgrade['reason']}, {downgrade['stage']} stage, {pods}): {why}"
        events.append(Event("Warning", GRAPH_MODE_DOWNGRADED, message))
    return events

"""Why pods do not serve: the Pod objects and their runtimes' reports folded into findings. Pure.

Two inputs: the Pod objects (scheduling, restarts, termination messages) and the runtimes'
`/status` reports, already checked and bounded by `reports` (failures, startup phases); and, given
what the Nodes offer, whether any node can run the pods at all (`placement`). Outputs:
`PodFindings` (why pods are not serving) and `GroupFindings` (the groups of a multi-node replica
that are being recreated or have a rank that does not serve), which `resource.assess` turns into
conditions. A message names at most MAX_PODS_NAMED pods, so the status stays small whatever the
pods report. What the engines did with graphs is `graph`'s.

A pod the scheduler refused is never silent: its PodScheduled condition (False, reason
Unschedulable) carries the scheduler's message, the same text kube-scheduler posts as the pod's
FailedScheduling Event (kubernetes/kubernetes pkg/scheduler/schedule_one.go,
handleSchedulingFailure: the Event and the condition get one message; "0/3 nodes are available: 3
Insufficient huawei.com/Ascend910." from the NodeResourcesFit filter,
pkg/scheduler/framework/plugins/noderesources/fit.go, "node(s) didn't match Pod's node
affinity/selector" from NodeAffinity), so the condition is read and no Event is watched:
InsufficientNPU when it names an NPU resource asked, Unschedulable otherwise, each with the ask.
With the Nodes known, NoNodeOffersNPUs comes first: no node has the resource, count and chip.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.fetch import download as fetch
from npu_runtime.fetch import hub as fetch_hub
from npu_runtime.serving import failures

from npu_operator.kube.names import CONTAINER_NAME, FETCH_CONTAINER_NAME
from npu_operator.kube.objects import condition, is_true
from npu_operator.kube.ownership import rank_of
from npu_operator.status.placement import Ask, Offer, first_unmet
from npu_operator.status.reports import RuntimeReport, one_line

JSON = dict[str, Any]

# The runtime's failure causes (termination message `<Reason>: <message>` and /status failure.reason)
# and the condition reason each one means for the resource.
FAILURE_CONDITIONS: Final = {
    failures.GRAPH_CAPTURE_OOM: "GraphCaptureFailed",
    failures.STREAM_RESOURCES: "GraphCaptureFailed",
    failures.MODEL_NOT_FOUND: "ModelLoadFailed",
    failures.MODEL_INVALID: "ModelLoadFailed",
    failures.MODEL_UNSUPPORTED: "ModelLoadFailed",
    failures.MODEL_DOES_NOT_FIT: "ModelLoadFailed",
    failures.DEVICE_OOM: "ModelLoadFailed",
    failures.INVALID_CONFIGURATION: "InvalidConfiguration",
    failures.PORT_IN_USE: "CrashLoop",
    failures.ENGINE_EXITED: "CrashLoop",
}
# The model download's causes (the fetch init container's termination message) are the reasons
# themselves: ModelAccessDenied, ModelNotFound, ModelCacheFull, ModelHashMismatch, ModelDownloadFailed.
# A model planned from its config.json before the weights come fails like the server would.
FETCH_CONDITIONS: Final = {
    **{reason: reason for reason in fetch_hub.REASONS},
    **{reason: FAILURE_CONDITIONS[reason] for reason in fetch.PLAN_REASONS},
}
# Scheduling: no listed node offers the NPUs asked (`placement`); the scheduler refused a pod for
# an NPU resource asked; it refused it for anything else (its message says what).
NO_NODE_OFFERS_NPUS: Final = "NoNodeOffersNPUs"
INSUFFICIENT_NPU: Final = "InsufficientNPU"
UNSCHEDULABLE: Final = "Unschedulable"
# When several pods fail differently, the most specific cause is reported first.
DEGRADED_PRIORITY: Final = (
    *fetch_hub.REASONS,
    "GraphCaptureFailed",
    "ModelLoadFailed",
    "InvalidConfiguration",
    NO_NODE_OFFERS_NPUS,
    INSUFFICIENT_NPU,
    UNSCHEDULABLE,
    "CrashLoop",
)

MAX_PODS_NAMED: Final = 5  # pods named in one finding's message; the rest are counted
MAX_GROUPS_LISTED: Final = 64  # entries of status.graph.restartingGroups


@dataclasses.dataclass(frozen=True)
class PodReport:
    """One pod's checked runtime /status (None when it could not be read), with the pod's identity."""

    pod: str
    report: RuntimeReport | None
    reachable: bool = True
    # The report was read before the pod's last transition (Ready, phase, a restart): not current.
    stale: bool = False
    # (group index, node index) of a LeaderWorkerSet pod; None for a Deployment's.
    rank: tuple[int, int] | None = None

    @property
    def current(self) -> RuntimeReport | None:
        """The report, when it tells the pod's present state (kept while unreachable, until it goes stale)."""
        return None if self.stale else self.report


@dataclasses.dataclass(frozen=True)
class Finding:
    """Why some pods do not serve: a condition reason and a message naming the pods."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class PodFindings:
    problems: tuple[Finding, ...] = ()
    # Startup phases of pods not ready yet, from their runtimes: {"loading": 1, "capturing": 1}.
    starting: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def worst(self) -> Finding | None:
        return min(self.problems, key=lambda f: DEGRADED_PRIORITY.index(f.reason), default=None)


@dataclasses.dataclass(frozen=True)
class GroupFindings:
    """How the groups of a multi-node replica stand: which are being recreated, which ranks do not serve."""

    restarting: Mapping[int, str] = dataclasses.field(default_factory=dict)  # group index -> why, in words
    not_serving: tuple[str, ...] = ()  # "group 0 node 1 (pod r1-0-1): not Ready"

    @property
    def restarting_message(self) -> str:
        shown = [f"group {group}: {why}" for group, why in sorted(self.restarting.items())[:MAX_PODS_NAMED]]
        more = len(self.restarting) - len(shown)
        return "; ".join(shown) + (f"; and {more} more groups" if more > 0 else "")

    @property
    def not_serving_message(self) -> str:
        return _pods_message(self.not_serving)


# --- pods -----------------------------------------------------------------------------------------


def group_findings(
    pods: Sequence[Mapping[str, Any]],
    reports: Sequence[PodReport],
    nodes: int,
    previous: Mapping[str, Any],
    replicas: int = 1,
) -> GroupFindings:
    """Which groups LeaderWorkerSet is recreating and which ranks of the others do not serve.

    With RecreateGroupOnPodRestart, LeaderWorkerSet answers a restarted container or a deleted pod
    in a group by deleting the group's leader pod (foreground), which takes the worker StatefulSet
    and its pods with it, and the leader StatefulSet makes the group anew (kubernetes-sigs/lws
    v0.10.0, pkg/controllers/pod_controller.go handleRestartPolicy). So a group is restarting
    while one of its pods restarted a container or is being deleted, and, once its new pods are
    there, until they all serve (remembered in the previous status's `restartingGroups`; a group
    of those, below `replicas`, with no pod at all is between its old pods and its new ones).
    """
    if nodes <= 1:
        return GroupFindings()
    groups: dict[int, list[tuple[int, Mapping[str, Any]]]] = {}
    for pod in pods:
        if (rank := rank_of(pod)) is not None:
            groups.setdefault(rank[0], []).append((rank[1], pod))
    failed = {r.pod for r in reports if r.current is not None and r.current.state == "failed"}
    before = {g for g in previous.get("restartingGroups") or [] if isinstance(g, int)}
    restarting: dict[int, str] = {}
    not_serving: list[str] = []
    for group, members in sorted(groups.items()):
        members.sort(key=lambda member: member[0])
        why = _group_restart(members)
        if why is not None:
            restarting[group] = why
            continue
        idle = [
            f"group {group} node {node} (pod {pod['metadata']['name']}): "
            + ("its runtime failed" if pod["metadata"]["name"] in failed else "not Ready")
            for node, pod in members
            if pod["metadata"]["name"] in failed or not is_true(pod, "Ready")
        ]
        if len(members) < nodes:
            idle.append(f"group {group}: {len(members)} of {nodes} pods")
        if idle and group in before:
            ready = sum(1 for _, pod in members if is_true(pod, "Ready"))
            restarting[group] = f"recreated, {ready}/{nodes} pods ready"
        else:
            not_serving += idle
    for group in sorted(before - set(groups)):
        if group < replicas:
            restarting[group] = "its pods are gone; LeaderWorkerSet makes them anew"
    return GroupFindings(restarting, tuple(not_serving))


def _group_restart(members: Sequence[tuple[int, Mapping[str, Any]]]) -> str | None:
    for node, pod in members:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            return f"pod {name} (node {node}) is being deleted; LeaderWorkerSet recreates the group"
        restarts = sum(int(c.get("restartCount") or 0) for c in pod.get("status", {}).get("containerStatuses", []))
        if restarts:
            cause = termination_cause(pod)
            because = f" ({cause[0]}: {cause[1]})" if cause is not None else ""
            return f"pod {name} (node {node}) restarted{because}; LeaderWorkerSet recreates the group"
    return None


def restarting_groups(findings: GroupFindings) -> list[int]:
    """`status.graph.restartingGroups`: what the next reconcile remembers (bounded)."""
    return sorted(findings.restarting)[:MAX_GROUPS_LISTED]


def runtime_failure(report: RuntimeReport | None) -> tuple[str, str] | None:
    """The cause in a runtime's /status, when it is one this operator knows: (Reason, message)."""
    failure = report.failure if report is not None else None
    if failure is not None and failure.reason in FAILURE_CONDITIONS:
        return failure.reason, failure.message
    return None


def termination_cause(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The runtime's one-line cause from the container's termination message: (Reason, message)."""
    return _cause(pod.get("status", {}).get("containerStatuses", []), CONTAINER_NAME, FAILURE_CONDITIONS)


def fetch_cause(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why the model download (init container) failed, from its termination message, unless it since finished."""
    return _cause(pod.get("status", {}).get("initContainerStatuses", []), FETCH_CONTAINER_NAME, FETCH_CONDITIONS)


def _cause(statuses: Sequence[Mapping[str, Any]], name: str, known: Mapping[str, str]) -> tuple[str, str] | None:
    for entry in statuses:
        if entry.get("name") != name or fetch_finished(entry):
            continue
        for state in (entry.get("state", {}), entry.get("lastState", {})):
            message = (state.get("terminated") or {}).get("message", "")
            if message:
                line = message.strip().splitlines()[0]
                reason, _, text = line.partition(": ")
                if reason in known:
                    return reason, one_line(text)
    return None


def fetch_finished(entry: Mapping[str, Any]) -> bool:
    """Whether this container status is the model download, finished well (earlier failures are history)."""
    terminated = entry.get("state", {}).get("terminated") or {}
    return entry.get("name") == FETCH_CONTAINER_NAME and terminated.get("exitCode", 1) == 0


def pod_findings(
    pods: Sequence[Mapping[str, Any]],
    reports: Sequence[PodReport],
    npu_resource: str | Sequence[Ask] | None,
    offer: Offer | None = None,
) -> PodFindings:
    """Why the pods do not serve. `npu_resource`: what each role's pods ask (`placement.asks`; a
    resource name alone for an ask of unknown count); `offer`: what the Nodes offer, when they are
    known (node discovery on and listed), to say so when no node can run a pod still unscheduled."""
    asks = (Ask(npu_resource, 0),) if isinstance(npu_resource, str) else tuple(npu_resource or ())
    by_pod = {r.pod: r.current for r in reports if r.current is not None}
    problems: dict[str, list[str]] = {}
    starting: Counter[str] = Counter()
    waiting = False  # a pod no node runs yet
    for pod in pods:
        name = pod["metadata"]["name"]
        report = by_pod.get(name)
        waiting = waiting or _unscheduled(pod)
        # While the model download fails, the server never starts: its cause comes first.
        if (cause := fetch_cause(pod)) is not None:
            problems.setdefault(FETCH_CONDITIONS[cause[0]], []).append(f"{name}: {cause[0]}: {cause[1]}")
            continue
        cause = runtime_failure(report) or termination_cause(pod)
        if cause is not None:
            problems.setdefault(FAILURE_CONDITIONS[cause[0]], []).append(f"{name}: {cause[0]}: {cause[1]}")
            continue
        if (verdict := unschedulable(pod, asks)) is not None:
            problems.setdefault(verdict[0], []).append(f"{name}: {verdict[1]}")
            continue
        if (why := _crash_looping(pod)) is not None:
            problems.setdefault("CrashLoop", []).append(f"{name}: {why}")
            continue
        starting_states = ("fetching", "starting", "loading", "capturing")
        if not is_true(pod, "Ready") and report is not None and report.state in starting_states:
            starting[report.state] += 1
        elif _unscheduled(pod) and pod.get("status", {}).get("phase") == "Pending":
            starting["unscheduled"] += 1  # no verdict of a scheduler yet
    found = [Finding(reason, _pods_message(messages)) for reason, messages in sorted(problems.items())]
    if waiting and (why := first_unmet(asks, offer)) is not None:
        found.insert(0, Finding(NO_NODE_OFFERS_NPUS, why))
    return PodFindings(problems=tuple(found), starting=dict(sorted(starting.items())))


def _pods_message(messages: Sequence[str]) -> str:
    shown = "; ".join(messages[:MAX_PODS_NAMED])
    return shown + (f"; and {len(messages) - MAX_PODS_NAMED} more pods" if len(messages) > MAX_PODS_NAMED else "")


def unschedulable(pod: Mapping[str, Any], asks: Sequence[Ask]) -> tuple[str, str] | None:
    """The scheduler's verdict on a pod it could not place (PodScheduled False, Unschedulable), with
    what the pod asks: (InsufficientNPU when it names an NPU resource asked, else Unschedulable, message)."""
    scheduled = condition(pod, "PodScheduled")
    if scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
        return None
    said = one_line(str(scheduled.get("message") or "")) or "(no message)"
    short = next((ask for ask in asks if ask.resource and f"Insufficient {ask.resource}" in said), None)
    if short is not None:
        return INSUFFICIENT_NPU, f"{short.text}; the scheduler: {said}"
    asked = "; ".join(ask.text for ask in asks if ask.resource)
    return UNSCHEDULABLE, (f"{asked}; " if asked else "") + f"the scheduler: {said}"


def _unscheduled(pod: Mapping[str, Any]) -> bool:
    """Not placed on a node yet (no PodScheduled True), and not on its way out."""
    phase = pod.get("status", {}).get("phase")
    return (
        phase in (None, "", "Pending")
        and not is_true(pod, "PodScheduled")
        and not pod["metadata"].get("deletionTimestamp")
    )


def _crash_looping(pod: Mapping[str, Any]) -> str | None:
    for status in pod.get("status", {}).get("containerStatuses", []):
        waiting = status.get("state", {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            return one_line(f"restarted {status.get('restartCount', 0)} times: {waiting.get('message', '')}")
    return None

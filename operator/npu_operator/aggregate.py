"""What the pods and their runtimes say, folded into one picture of an NPUInference. Pure.

Two inputs: the Pod objects (scheduling, restarts, termination messages) and the runtimes'
`/status` reports, already checked and bounded by `report_schema` (graph mode, captures,
downgrades, replay latency, failures). Two outputs: `status.graph` (what the engines really did)
and `PodFindings` (why pods are not serving), which `status.assess` turns into conditions.
Figures are rounded so that live traffic does not cause a status write per poll: Prometheus has
the exact numbers. The fold has hard bounds (distinct downgrades, replay rows, modes, pods named
in a message, ranks listed), so the status stays small whatever the pods report, and downgrades
no pod reports any more age out.

A multi-node replica (a LeaderWorkerSet group) adds a per-rank view: every pod is a rank (group
index, node index), `status.graph.ranks` lists the worst MAX_RANKS_LISTED of them with their mode,
downgrade, capture sizes and memory, `rankModes` says which ranks run which mode for all of them,
and the resource's effective mode is the worst rank's (`MODE_ORDER`). Only current reports count:
a report read before its pod's last transition is stale and shown as such, and pods that are
gone (a group recreated) drop out of the view.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from npu_runtime.fetch import download as fetch
from npu_runtime.serving import failures

from npu_operator.api import condition, is_true
from npu_operator.builders import CONTAINER_NAME, FETCH_CONTAINER_NAME
from npu_operator.ownership import rank_of
from npu_operator.report_schema import RuntimeReport, one_line

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
    **{reason: reason for reason in fetch.REASONS},
    **{reason: FAILURE_CONDITIONS[reason] for reason in fetch.PLAN_REASONS},
}
# When several pods fail differently, the most specific cause is reported first.
DEGRADED_PRIORITY: Final = (
    *fetch.REASONS,
    "GraphCaptureFailed",
    "ModelLoadFailed",
    "InvalidConfiguration",
    "InsufficientNPU",
    "CrashLoop",
)

# Bounds of status.graph and of the findings, whatever the pods report.
MAX_DOWNGRADES: Final = 16  # distinct (from, to, reason, stage) entries listed
MAX_REPLAY_ROWS: Final = 32
MAX_MODES: Final = 8
MAX_PODS_NAMED: Final = 5  # pods named in one finding's message; the rest are counted
# A downgrade that no current pod reports is dropped once it was first seen this long ago.
DOWNGRADE_RETENTION_SECONDS: Final = 3600.0
MAX_RANKS_LISTED: Final = 8  # entries of status.graph.ranks: the worst ranks first
# Distinct downgrades listed for a multi-node resource: its ranks' entries take the room of the rest
# (each rank names its downgrade's reason), so that status.graph keeps its bound.
MAX_DOWNGRADES_RANKED: Final = 8
MAX_RANKS_TEXT: Final = 256  # characters of one rankModes value ("0-62:* 63:0,2-3")
MAX_GROUPS_LISTED: Final = 64  # entries of status.graph.restartingGroups

# Graph modes from worst to best: how much of the decode step runs as a captured graph. NONE runs
# every step eagerly; PIECEWISE replays the pieces between attention layers; FULL_DECODE_ONLY
# replays the whole decode step (prefill eager); FULL also mixed batches; FULL_AND_PIECEWISE adds
# piecewise graphs for what FULL cannot capture. A mode this list does not know counts as worst:
# nothing can be promised about it. The resource's effective mode is its worst rank's.
MODE_ORDER: Final = ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL", "FULL_AND_PIECEWISE")


def mode_rank(mode: str | None) -> int:
    """The place of `mode` in MODE_ORDER (higher is better); -1 for an unknown or missing mode."""
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else -1


def worst_mode(modes: Iterable[str]) -> str:
    """The worst of `modes` (ties by name, so that two runs on the same reports agree)."""
    return min(modes, key=lambda mode: (mode_rank(mode), mode))


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
    pods: Sequence[Mapping[str, Any]], reports: Sequence[PodReport], npu_resource: str | None
) -> PodFindings:
    by_pod = {r.pod: r.current for r in reports if r.current is not None}
    problems: dict[str, list[str]] = {}
    starting: Counter[str] = Counter()
    for pod in pods:
        name = pod["metadata"]["name"]
        report = by_pod.get(name)
        # While the model download fails, the server never starts: its cause comes first.
        if (cause := fetch_cause(pod)) is not None:
            problems.setdefault(FETCH_CONDITIONS[cause[0]], []).append(f"{name}: {cause[0]}: {cause[1]}")
            continue
        cause = runtime_failure(report) or termination_cause(pod)
        if cause is not None:
            problems.setdefault(FAILURE_CONDITIONS[cause[0]], []).append(f"{name}: {cause[0]}: {cause[1]}")
            continue
        if (why := _unschedulable_for_npus(pod, npu_resource)) is not None:
            problems.setdefault("InsufficientNPU", []).append(f"{name}: {why}")
            continue
        if (why := _crash_looping(pod)) is not None:
            problems.setdefault("CrashLoop", []).append(f"{name}: {why}")
            continue
        starting_states = ("fetching", "starting", "loading", "capturing")
        if not is_true(pod, "Ready") and report is not None and report.state in starting_states:
            starting[report.state] += 1
    findings = tuple(Finding(reason, _pods_message(messages)) for reason, messages in sorted(problems.items()))
    return PodFindings(problems=findings, starting=dict(sorted(starting.items())))


def _pods_message(messages: Sequence[str]) -> str:
    shown = "; ".join(messages[:MAX_PODS_NAMED])
    return shown + (f"; and {len(messages) - MAX_PODS_NAMED} more pods" if len(messages) > MAX_PODS_NAMED else "")


def _unschedulable_for_npus(pod: Mapping[str, Any], npu_resource: str | None) -> str | None:
    scheduled = condition(pod, "PodScheduled")
    text = str(scheduled.get("message", ""))
    if scheduled.get("reason") == "Unschedulable" and npu_resource and f"Insufficient {npu_resource}" in text:
        return one_line(text)
    return None


def _crash_looping(pod: Mapping[str, Any]) -> str | None:
    for status in pod.get("status", {}).get("containerStatuses", []):
        waiting = status.get("state", {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            return one_line(f"restarted {status.get('restartCount', 0)} times: {waiting.get('message', '')}")
    return None


# --- status.graph -----------------------------------------------------------------------------------


def graph_status(
    requested_mode: str,
    reports: Sequence[PodReport],
    previous: Mapping[str, Any],
    *,
    now: str,
    same_generation: bool,
    nodes: int = 1,
) -> JSON:
    """`status.graph` from the pods' reports (`nodes`: the nodes of one replica).

    Sticky where reports are missing, so a pod restart does not make things disappear and come
    back: the effective mode and the downgrades of the previous status are kept while the spec's
    generation is unchanged. A downgrade no pod reports any more stays listed with `pods: 0`
    until DOWNGRADE_RETENTION_SECONDS after it was first seen. Stale reports are not folded in.
    Each pod counts once: reporting (its last read answered, about its current state),
    unreachable (its last read failed), or stale (neither, its report predates its last change).
    """
    readable = [r.current for r in reports if r.current is not None]
    ranked = any(r.rank is not None for r in reports)
    graph: JSON = {"requestedMode": requested_mode}
    modes = Counter(r.effective_mode for r in readable if r.effective_mode)
    if modes:
        graph["effectiveMode"] = worst_mode(modes) if ranked else _most_common(modes)
        if len(modes) > 1:
            top = sorted(modes.items(), key=lambda item: (-item[1], item[0]))[:MAX_MODES]
            graph["modes"] = dict(sorted(top))
    elif same_generation and isinstance(previous.get("effectiveMode"), str):
        graph["effectiveMode"] = previous["effectiveMode"]
    if sizes := _capture_sizes(readable):
        graph["captureSizes"] = sizes
    if memory := _capture_memory(readable):
        graph["captureMemory"] = memory
    if replay := _replay(readable):
        graph["replay"] = replay
    old = previous.get("downgrades") if same_generation else None
    limit = MAX_DOWNGRADES_RANKED if ranked else MAX_DOWNGRADES
    if downgrades := _downgrades(readable, old if isinstance(old, list) else [], now, limit):
        graph["downgrades"] = downgrades
    if (rate := _eager_fallback_rate(readable)) is not None:
        graph["eagerFallbackRate"] = rate
    graph["reportingPods"] = sum(1 for r in reports if r.reachable and r.current is not None)
    unreachable = sum(1 for r in reports if not r.reachable)
    if unreachable:
        graph["unreachablePods"] = unreachable
    if stale := sum(1 for r in reports if r.reachable and r.stale):
        graph["stalePods"] = stale
    if ranked:
        graph.update(rank_view(reports, nodes))
    return graph


# --- ranks of multi-node replicas -------------------------------------------------------------------


def rank_view(reports: Sequence[PodReport], nodes: int) -> JSON:
    """`ranks` (the worst MAX_RANKS_LISTED, each with what its runtime says), `rankModes` (every
    rank, per effective mode, as compact text) and `rankCount`, from the reports of ranked pods."""
    entries = [_rank_entry(r) for r in reports if r.rank is not None]
    entries.sort(key=_badness)
    by_mode: dict[str, list[tuple[int, int]]] = {}
    for entry in entries:
        if "mode" in entry:
            by_mode.setdefault(entry["mode"], []).append((entry["group"], entry["node"]))
    worst_modes = sorted(by_mode, key=lambda mode: (mode_rank(mode), mode))[:MAX_MODES]
    view: JSON = {"rankCount": len(entries), "ranks": entries[:MAX_RANKS_LISTED]}
    if by_mode:
        view["rankModes"] = {mode: compact_ranks(by_mode[mode], nodes) for mode in sorted(worst_modes)}
    return view


def _rank_entry(pod: PodReport) -> JSON:
    assert pod.rank is not None
    group, node = pod.rank
    entry: JSON = {"group": group, "node": node, "pod": pod.pod}
    report = pod.report
    if report is not None and report.data_parallel_ranks:
        entry["dataParallelRanks"] = _ranges(report.data_parallel_ranks, limit=32)
    if pod.stale:
        entry["reading"] = "Stale"  # what it said is from before its last transition: not shown
        return entry
    if not pod.reachable:
        entry["reading"] = "Unreachable"
    if report is None:
        return entry
    if report.effective_mode:
        entry["mode"] = report.effective_mode
    if report.state:
        entry["state"] = report.state
    if report.downgrades:
        worst = min(report.downgrades, key=lambda d: (mode_rank(d.to_mode), d.key))
        entry["downgrade"] = worst.reason  # from and to modes, message: in status.graph.downgrades
    if report.failure is not None:
        entry["failure"] = report.failure.reason
    sizes = {capture.size for capture in report.captures} or set(report.planned_sizes)
    if sizes:
        entry["captureSizes"] = {"count": len(sizes), "max": max(sizes)}
    if memory := sum(capture.memory_bytes or 0 for capture in report.captures):
        entry["captureMemoryBytes"] = _round_bytes(memory)
    return entry


def _badness(entry: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """Failed ranks first, then unread ones, then by mode (worst first), then by group and node."""
    return (
        0 if "failure" in entry else 1,
        0 if "reading" in entry else 1,
        mode_rank(entry.get("mode")),
        entry["group"],
        entry["node"],
    )


def compact_ranks(ranks: Iterable[tuple[int, int]], nodes: int) -> str:
    """Ranks as short text: groups whose every node is listed as `a-b:*`, others as `g:n,m-k`,
    space-separated, cut at MAX_RANKS_TEXT characters ("0-62:* 63:0,2-3")."""
    by_group: dict[int, set[int]] = {}
    for group, node in ranks:
        by_group.setdefault(group, set()).add(node)
    whole = set(range(max(nodes, 1)))
    parts: list[str] = []
    run: list[int] = []  # consecutive groups with every node
    for group in sorted(by_group):
        if by_group[group] >= whole and (not run or run[-1] == group - 1):
            run.append(group)
            continue
        if run:
            parts.append(f"{_ranges(run)}:*")
            run = []
        if by_group[group] >= whole:
            run = [group]
        else:
            parts.append(f"{group}:{_ranges(sorted(by_group[group]), separator=',')}")
    if run:
        parts.append(f"{_ranges(run)}:*")
    text = " ".join(parts)
    if len(text) <= MAX_RANKS_TEXT:
        return text
    return text[: text.rfind(" ", 0, MAX_RANKS_TEXT - 4)] + " …"


def _ranges(numbers: Iterable[int], *, separator: str = ",", limit: int = MAX_RANKS_TEXT) -> str:
    """Sorted integers as ranges: [0, 1, 2, 5] -> "0-2,5"; cut at `limit` characters."""
    items = sorted(set(numbers))
    spans: list[str] = []
    start = previous = None
    for number in [*items, None]:
        if number is not None and previous is not None and number == previous + 1:
            previous = number
            continue
        if start is not None:
            spans.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = number
    text = separator.join(spans)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def new_downgrades(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[JSON]:
    """Downgrades in `current` that `previous` did not list: announced by a Warning Event."""
    seen = {_downgrade_key(d) for d in previous.get("downgrades", []) if isinstance(d, Mapping)}
    return [d for d in current.get("downgrades", []) if _downgrade_key(d) not in seen]


def new_rank_problems(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[JSON]:
    """Listed ranks that downgraded or failed since `previous` (an Event each, naming group and node)."""
    before = {
        (entry.get("group"), entry.get("node")): entry
        for entry in previous.get("ranks") or []
        if isinstance(entry, Mapping)
    }
    found = []
    for entry in current.get("ranks") or []:
        old = before.get((entry["group"], entry["node"]), {})
        if ("downgrade" in entry and entry["downgrade"] != old.get("downgrade")) or (
            "failure" in entry and entry["failure"] != old.get("failure")
        ):
            found.append(entry)
    return found


def _most_common(counts: Counter[str]) -> str:
    # Ties go to the lowest name, so that two runs on the same reports agree.
    return min(counts.items(), key=lambda item: (-item[1], item[0]))[0]


def _capture_sizes(reports: Iterable[RuntimeReport]) -> list[int]:
    """The sizes the most pods captured (or planned to, before capture has been observed)."""
    lists: Counter[tuple[int, ...]] = Counter()
    for report in reports:
        captured = tuple(sorted({c.size for c in report.captures}))
        if captured or report.planned_sizes:
            lists[captured or report.planned_sizes] += 1
    if not lists:
        return []
    # Ties go to the longer list: a pod still capturing has captured fewer sizes so far.
    return list(min(lists.items(), key=lambda item: (-item[1], -len(item[0]), item[0]))[0])


def _capture_memory(reports: Iterable[RuntimeReport]) -> JSON:
    per_pod = [sum(c.memory_bytes or 0 for c in report.captures) for report in reports]
    per_pod = [total for total in per_pod if total > 0]
    if not per_pod:
        return {}
    return {"maxPodBytes": _round_bytes(max(per_pod)), "totalBytes": _round_bytes(sum(per_pod))}


def _replay(reports: Iterable[RuntimeReport]) -> list[JSON]:
    """Per (mode, size): the worst p50 and p99 over pods, in seconds, 2 significant digits."""
    worst: dict[tuple[str, int], tuple[float, float]] = {}
    for report in reports:
        for entry in report.replay:
            if not entry.count:
                continue
            key = (entry.mode, entry.size)
            old = worst.get(key, (0.0, 0.0))
            worst[key] = (max(old[0], entry.p50_seconds), max(old[1], entry.p99_seconds))
    rows = sorted(worst.items(), key=lambda item: (item[0][1], item[0][0]))[:MAX_REPLAY_ROWS]
    return [
        {"mode": mode, "size": size, "p50Seconds": _significant(p50), "p99Seconds": _significant(p99)}
        for (mode, size), (p50, p99) in rows
    ]


def _downgrades(reports: Iterable[RuntimeReport], previous: Sequence[Any], now: str, limit: int) -> list[JSON]:
    """Known entries first (their pod counts refreshed), then new ones, `limit` in all."""
    pods: Counter[tuple[str, str, str, str]] = Counter()
    messages: dict[tuple[str, str, str, str], str] = {}
    for report in reports:
        for downgrade in report.downgrades:
            pods[downgrade.key] += 1
            messages.setdefault(downgrade.key, downgrade.message)
    merged: dict[tuple[str, str, str, str], JSON] = {}
    for old in previous:
        if not isinstance(old, Mapping):
            continue
        key = _downgrade_key(old)
        count = pods.get(key, 0)
        if count == 0 and _age_seconds(old.get("firstSeen"), now) > DOWNGRADE_RETENTION_SECONDS:
            continue  # no pod reports it any more, and it has been shown long enough
        if key not in merged and len(merged) < limit:
            merged[key] = {**old, "message": one_line(old.get("message")), "pods": count}
    for key, count in sorted(pods.items()):
        if key not in merged and len(merged) < limit:
            from_mode, to_mode, reason, stage = key
            merged[key] = {
                "fromMode": from_mode,
                "toMode": to_mode,
                "reason": reason,
                "stage": stage,
                "message": messages[key],
                "pods": count,
                "firstSeen": now,
            }
    return [merged[key] for key in sorted(merged)]


def _age_seconds(then: Any, now: str) -> float:
    """Seconds from `then` to `now` (RFC 3339); an unreadable `then` counts as very old."""
    try:
        start = datetime.datetime.fromisoformat(str(then).replace("Z", "+00:00"))
        end = datetime.datetime.fromisoformat(now.replace("Z", "+00:00"))
        return (end - start).total_seconds()
    except (TypeError, ValueError):
        return math.inf


def _downgrade_key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(entry.get("fromMode", "")),
        str(entry.get("toMode", "")),
        str(entry.get("reason", "")),
        str(entry.get("stage", "")),
    )


def _eager_fallback_rate(reports: Iterable[RuntimeReport]) -> float | None:
    steps = sum(report.decode_steps for report in reports)
    fallbacks = sum(report.eager_fallbacks for report in reports)
    if steps <= 0:
        return None
    return round(min(fallbacks / steps, 1.0), 3)


def _significant(value: float, digits: int = 2) -> float:
    if value <= 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(value)))


def _round_bytes(value: int) -> int:
    """To the MiB: capture memory moves by a few KiB between reports of the same graphs."""
    return round(value / 2**20) * 2**20

"""`status.graph`: what the engines really did with graphs, folded from their runtimes' reports. Pure.

The runtimes' `/status` reports (`reports`: graph mode, captures, downgrades, replay latency),
folded into the resource's `status.graph`. Figures are rounded so that live traffic does not cause
a status write per poll: Prometheus has the exact numbers. The fold has hard bounds (distinct
downgrades, replay rows, modes, ranks listed), so the status stays small whatever the pods report,
and downgrades no pod reports any more age out.

A multi-node replica (a LeaderWorkerSet group) adds a per-rank view: every pod is a rank (group
index, node index), `status.graph.ranks` lists the worst MAX_RANKS_LISTED of them with their mode,
downgrade, capture sizes and memory, `rankModes` says which ranks run which mode for all of them,
and the resource's effective mode is the worst rank's (`npu_runtime.contract.graph_mode_rank`: one
mode type for the planner and the status; a mode it does not know counts as worst). Only current reports count:
a report read before its pod's last transition is stale and shown as such, and pods that are
gone (a group recreated) drop out of the view. A disaggregated resource's graph holds one such
fold per role under `roles` (`role_graphs`).
"""

from __future__ import annotations

import datetime
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from npu_runtime.contract import graph_mode_rank

from npu_operator.api.roles import ROLES
from npu_operator.status.findings import PodReport
from npu_operator.status.reports import RuntimeReport, one_line

JSON = dict[str, Any]

# Bounds of status.graph and of the findings, whatever the pods report.
MAX_DOWNGRADES: Final = 16  # distinct (from, to, reason, stage) entries listed


MAX_REPLAY_ROWS: Final = 32


MAX_MODES: Final = 8


# A downgrade that no current pod reports is dropped once it was first seen this long ago.
DOWNGRADE_RETENTION_SECONDS: Final = 3600.0


MAX_RANKS_LISTED: Final = 8  # entries of status.graph.ranks: the worst ranks first


# Distinct downgrades listed for a multi-node resource: its ranks' entries take the room of the rest
# (each rank names its downgrade's reason), so that status.graph keeps its bound.
MAX_DOWNGRADES_RANKED: Final = 8


MAX_RANKS_TEXT: Final = 256  # characters of one rankModes value ("0-62:* 63:0,2-3")


def worst_mode(modes: Iterable[str]) -> str:
    """The worst of `modes` (ties by name, so that two runs on the same reports agree)."""
    return min(modes, key=lambda mode: (graph_mode_rank(mode), mode))


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
    graph.update(_sizes_from(readable))  # issue 37: captureSizesFrom, expectedPadding
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


def rank_view(reports: Sequence[PodReport], nodes: int) -> JSON:
    """`ranks` (the worst MAX_RANKS_LISTED, each with what its runtime says), `rankModes` (every
    rank, per effective mode, as compact text) and `rankCount`, from the reports of ranked pods."""
    entries = [_rank_entry(r) for r in reports if r.rank is not None]
    entries.sort(key=_badness)
    by_mode: dict[str, list[tuple[int, int]]] = {}
    for entry in entries:
        if "mode" in entry:
            by_mode.setdefault(entry["mode"], []).append((entry["group"], entry["node"]))
    worst_modes = sorted(by_mode, key=lambda mode: (graph_mode_rank(mode), mode))[:MAX_MODES]
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
        worst = min(report.downgrades, key=lambda d: (graph_mode_rank(d.to_mode), d.key))
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
        graph_mode_rank(entry.get("mode")),
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


def _sizes_from(reports: Iterable[RuntimeReport]) -> JSON:
    """How the most pods chose their capture sizes (status/decode_batches.graph_fields); {} for none."""
    shown: Counter[str] = Counter(json.dumps(r.sizes_from, sort_keys=True) for r in reports if r.sizes_from)
    if not shown:
        return {}
    found: JSON = json.loads(min(shown.items(), key=lambda item: (-item[1], item[0]))[0])
    return found


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


def role_graphs(graph: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(role, its graph) of a disaggregated resource's `status.graph`; empty for any other."""
    roles = graph.get("roles")
    if not isinstance(roles, Mapping):
        return []
    return [(role, roles[role]) for role in ROLES if isinstance(roles.get(role), Mapping)]

"""`kubectl get` columns: the CRD's printer columns, and Kubernetes' own for a few kinds, as Tables.

The API server renders a CRD's `additionalPrinterColumns` into a Table when kubectl asks for one
(Accept: ...;as=Table;g=meta.k8s.io;v=v1); the emulator does the same with `table`, so the real
`kubectl get npuinf` shows our columns (and LeaderWorkerSet's, `CRD_COLUMNS`). `builtin_table` does
it for the kinds whose columns a user of the sandbox reads (Events, Namespaces, Deployments,
StatefulSets, Pods), with the API server's column names.
`text` prints a Table the way kubectl does.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def json_path(obj: Any, path: str) -> Any:
    """The simple JSONPath of printer columns: `.status.graph.effectiveMode`."""
    for part in path.lstrip(".").split("."):
        if not isinstance(obj, Mapping) or part not in obj:
            return None
        obj = obj[part]
    return obj


def age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """kubectl's human duration: 45s, 3m20s, 5h, 2d3h."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = int(((now or datetime.datetime.now(datetime.UTC)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s"
    hours = minutes // 60
    if hours < 3:
        return f"{minutes}m" if hours == 0 else f"{hours}h{minutes % 60}m"
    days = hours // 24
    return f"{hours}h" if days == 0 else (f"{days}d{hours % 24}h" if days < 8 else f"{days}d")


def table(
    printer_columns: Sequence[Mapping[str, Any]], objects: Sequence[Mapping[str, Any]], resource_version: str = "1"
) -> dict[str, Any]:
    """The Table an API server returns for `objects`, from a CRD version's printer columns."""
    definitions = [
        {"name": "Name", "type": "string", "format": "name", "description": "Name of the resource", "priority": 0}
    ] + [
        {
            "name": column["name"],
            "type": column["type"],
            "format": column.get("format", ""),
            "description": column.get("description", ""),
            "priority": column.get("priority", 0),
        }
        for column in printer_columns
    ]
    rows = []
    for obj in objects:
        cells: list[Any] = [obj.get("metadata", {}).get("name")]
        for column in printer_columns:
            value = json_path(obj, column["jsonPath"])
            if column["type"] == "date":
                value = age(value)
            cells.append(value)
        rows.append(_row(cells, obj))
    return _table(definitions, rows, resource_version)


def _row(cells: list[Any], obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}
    return {"cells": cells, "object": metadata}


def _table(definitions: list[dict[str, Any]], rows: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }


def _event_object(event: Mapping[str, Any]) -> str:
    involved = event.get("involvedObject", {})
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _event_source(event: Mapping[str, Any]) -> str:
    source = event.get("source", {})
    component = source.get("component") or event.get("reportingComponent") or ""
    return f"{component}, {source['host']}" if source.get("host") else component


def _pod_ready(pod: Mapping[str, Any]) -> str:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    total = len(pod.get("spec", {}).get("containers", []))
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _restarts(pod: Mapping[str, Any]) -> int:
    return sum(int(s.get("restartCount", 0)) for s in pod.get("status", {}).get("containerStatuses", []))


def _name(obj: Mapping[str, Any]) -> Any:
    return obj.get("metadata", {}).get("name")


def _age(obj: Mapping[str, Any]) -> str:
    return age(obj.get("metadata", {}).get("creationTimestamp"))


Column = tuple[str, int, Callable[[Mapping[str, Any]], Any]]  # name, priority, cell

# The API server's own columns (kubernetes/pkg/printers/internalversion), for the kinds shown here.
BUILTIN_COLUMNS: dict[str, tuple[Column, ...]] = {
    "Event": (
        ("Last Seen", 0, lambda e: age(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp"))),
        ("Type", 0, lambda e: e.get("type")),
        ("Reason", 0, lambda e: e.get("reason")),
        ("Object", 0, _event_object),
        ("Subobject", 1, lambda e: e.get("involvedObject", {}).get("fieldPath", "")),
        ("Source", 1, _event_source),
        ("Message", 0, lambda e: e.get("message")),
        ("First Seen", 1, lambda e: age(e.get("firstTimestamp") or e.get("eventTime"))),
        ("Count", 1, lambda e: e.get("series", {}).get("count") or e.get("count", 0)),
        ("Name", 1, _name),
    ),
    "Namespace": (
        ("Name", 0, _name),
        ("Status", 0, lambda ns: ns.get("status", {}).get("phase")),
        ("Age", 0, _age),
    ),
    "Deployment": (
        ("Name", 0, _name),
        ("Ready", 0, lambda d: f"{d.get('status', {}).get('readyReplicas', 0)}/{d.get('spec', {}).get('replicas', 1)}"),
        ("Up-to-date", 0, lambda d: d.get("status", {}).get("updatedReplicas", 0)),
        ("Available", 0, lambda d: d.get("status", {}).get("availableReplicas", 0)),
        ("Age", 0, _age),
    ),
    "StatefulSet": (
        ("Name", 0, _name),
        ("Ready", 0, lambda s: f"{s.get('status', {}).get('readyReplicas', 0)}/{s.get('spec', {}).get('replicas', 1)}"),
        ("Age", 0, _age),
    ),
    "Pod": (
        ("Name", 0, _name),
        ("Ready", 0, _pod_ready),
        (
            "Status",
            0,
            lambda p: (
                (p.get("metadata", {}).get("deletionTimestamp") and "Terminating")
                or p.get("status", {}).get("phase", "Pending")
            ),
        ),
        ("Restarts", 0, _restarts),
        ("Age", 0, _age),
        ("IP", 1, lambda p: p.get("status", {}).get("podIP", "<none>")),
        ("Node", 1, lambda p: p.get("spec", {}).get("nodeName", "<none>")),
    ),
}
BUILTIN_KINDS = frozenset(BUILTIN_COLUMNS)

# Printer columns of CRDs the sandbox serves besides NPUInference: LeaderWorkerSet's, as its CRD
# declares them (kubernetes-sigs/lws v0.10.0, api/leaderworkerset/v1/leaderworkerset_types.go, the
# +kubebuilder:printcolumn markers of type LeaderWorkerSet).
CRD_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "LeaderWorkerSet": [
        {
            "name": "Ready",
            "type": "integer",
            "jsonPath": ".status.readyReplicas",
            "description": "Number of ready replicas",
        },
        {
            "name": "Desired",
            "type": "integer",
            "jsonPath": ".spec.replicas",
            "description": "Number of desired replicas",
        },
        {
            "name": "Up-to-date",
            "type": "integer",
            "jsonPath": ".status.updatedReplicas",
            "description": "Number of up-to-date replicas",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
}


def builtin_table(
    kind: str | None, objects: Sequence[Mapping[str, Any]], resource_version: str = "1"
) -> dict[str, Any]:
    """The Table the API server prints for one of `BUILTIN_KINDS`."""
    columns = BUILTIN_COLUMNS[kind or ""]
    definitions = [
        {"name": name, "type": "string", "format": "name" if name == "Name" else "", "description": "", "priority": p}
        for name, p, _ in columns
    ]
    rows = [_row([cell(obj) for _, _, cell in columns], obj) for obj in objects]
    return _table(definitions, rows, resource_version)


def text(rendered: Mapping[str, Any], *, wide: bool = False) -> str:
    """A Table as kubectl prints it: upper-case headers, columns padded by three spaces."""
    shown = [i for i, c in enumerate(rendered["columnDefinitions"]) if wide or c.get("priority", 0) == 0]
    header = [str(rendered["columnDefinitions"][i]["name"]).upper() for i in shown]
    body = [["" if row["cells"][i] is None else str(row["cells"][i]) for i in shown] for row in rendered["rows"]]
    return columns([header, *body])


def columns(lines: Sequence[Sequence[str]]) -> str:
    """Lines of cells, each column as wide as its widest cell, three spaces apart (kubectl's layout)."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines
    )

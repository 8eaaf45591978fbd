"""Server-side Tables: a CRD's printer columns, and Kubernetes' own for a few kinds.

The API server renders a CRD's `additionalPrinterColumns` into a Table when kubectl asks for one
(Accept: ...;as=Table;g=meta.k8s.io;v=v1); the emulator does the same with `table`, so the real
`kubectl get npuinf` shows our columns (and LeaderWorkerSet's and its DisaggregatedSet kinds',
`CRD_COLUMNS`). `builtin_table` does it for the kinds whose columns a user of the sandbox reads
(Events, Namespaces, Deployments, StatefulSets, Pods), with the API server's column names.
`Tables` is the emulator's step that decides whether a request wants a Table and which columns it
gets. How kubectl prints a Table is the demo's (`npu_sandbox.demo.printer`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kmock._internal import rendering

from npu_sandbox.apiserver.custom_apis import CustomApis
from npu_sandbox.apiserver.store import Store


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
    # LeaderWorkerSet v0.10.0's DisaggregatedSetRoleScaler (api/disaggregatedset/v1/
    # disaggregatedsetrolescaler_types.go, its +kubebuilder:printcolumn markers); the DisaggregatedSet
    # declares none, so the API server prints its name and age.
    "DisaggregatedSetRoleScaler": [
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Current", "type": "integer", "jsonPath": ".status.replicas"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
    "DisaggregatedSet": [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
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


class Tables:
    """The emulator's step for `kubectl get`: whether a request asks for a Table, and the Table it gets."""

    def __init__(self, store: Store, custom: CustomApis) -> None:
        self.store = store
        self.custom = custom

    def wanted(self, request: rendering.Request) -> bool:
        """kubectl get asks for a server-side Table; a custom resource's columns are its CRD's printer columns."""
        if "as=Table" not in request.headers.get("Accept", "") or request.subresource is not None:
            return False
        kind = self.store.kind(request)
        return self.custom.version_of(request) is not None or kind in BUILTIN_KINDS or kind in CRD_COLUMNS

    def of(
        self, items: list[dict[str, Any]], request: rendering.Request, resource_version: str = "1"
    ) -> dict[str, Any]:
        version = self.custom.version_of(request)
        if version is None:
            kind = self.store.kind(request)
            if kind in CRD_COLUMNS:  # a third-party CRD the sandbox serves without its object
                return table(CRD_COLUMNS[kind], items, resource_version)
            return builtin_table(kind, items, resource_version)
        # Without printer columns, the API server prints a custom resource's name and age.
        age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        return table(version.get("additionalPrinterColumns") or [age], items, resource_version)

"""`kubectl get` for custom resources: the CRD's printer columns as a meta.k8s.io/v1 Table, and as text.

The API server renders a CRD's `additionalPrinterColumns` into a Table when kubectl asks for one
(Accept: ...;as=Table;g=meta.k8s.io;v=v1); the emulator does the same with `table`, so the real
`kubectl get npuinf` shows our columns. `text` prints a Table the way kubectl does.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
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


def table(printer_columns: Sequence[Mapping[str, Any]], objects: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The Table an API server returns for `objects`, from a CRD version's printer printer_columns."""
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
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj.get("metadata", {}),
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "1"},
        "columnDefinitions": definitions,
        "rows": rows,
    }


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

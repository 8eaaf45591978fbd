"""A Table as kubectl prints it: upper-case headers, columns padded by three spaces.

The Tables come from the API (`npu_sandbox.apiserver.tables` renders them server-side); the demo
prints them, and its own lists (Events, alerts), with kubectl's layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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

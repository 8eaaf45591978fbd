"""docs/design.md's metric table, read from the document itself: name -> (type, labels).

The names are a contract with the chart's dashboard and alerts and with users' own queries.
tests/runtime/serving/test_status_metrics.py holds the runtime's definitions to this table (types and
labels), tests/chart/test_metric_names.py the operator's definitions and the dashboard (names and
types), and tests/test_design_doc.py the operator's labels; so the document cannot drift from the
code without a test failing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

DESIGN_DOC: Final = Path(__file__).resolve().parents[1] / "docs" / "design.md"
METRICS_SECTION: Final = "## Contract 2: the metrics"
ROW: Final = re.compile(r"^\| `(?P<name>[a-z_:]+)` \| (?P<kind>\w+) \| (?P<labels>[^|]*) \| [^|]+ \|$")


def read_table(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The rows of the metric table in the metrics section of `text` (the design document)."""
    start = text.index(METRICS_SECTION)
    end = text.find("\n## ", start + len(METRICS_SECTION))
    table: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in text[start : end if end != -1 else None].splitlines():
        match = ROW.match(line.strip())
        if match:
            labels = tuple(label.strip() for label in match["labels"].split(",") if label.strip())
            table[match["name"]] = (match["kind"], labels)
    return table


DESIGN_TABLE: Final = read_table(DESIGN_DOC.read_text(encoding="utf-8"))
OPERATOR_PREFIX: Final = "npu_operator_"
RUNTIME_TABLE: Final = {name: row for name, row in DESIGN_TABLE.items() if not name.startswith(OPERATOR_PREFIX)}

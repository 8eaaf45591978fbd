"""Metric names on both sides of the contract: what the code defines and what the queries use.

Defined: every metric declared at module level in a metrics module, found generically, so that
a rename in the code is seen without touching this file:
- prometheus_client collectors (Counter, Gauge, Histogram, ...), by their `describe()`;
- declarations with a `name` and a `kind` (or `type`), such as the runtime's MetricSpec objects,
  also inside module-level tuples, lists and dicts.
Each is expanded into the series names Prometheus stores (counter: _total and _created;
histogram: _bucket, _sum, _count and _created; ...).

Used: the metric names in PromQL expressions, read with a real PromQL parser (`promql-parser`),
after Grafana's interval variables are replaced by durations.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from typing import Any

import promql_parser

KINDS = ("counter", "gauge", "histogram", "summary", "info", "stateset", "enum", "unknown")
# Grafana's built-in interval variables, which are not PromQL, as a duration PromQL accepts.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def series(name: str, kind: str) -> set[str]:
    """The names Prometheus stores for one metric family (the exposition's sample names)."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "info":
        return {f"{name.removesuffix('_info')}_info"}
    return {name}


def contract_name(name: str, kind: str) -> str:
    """The name docs/design.md's metric table uses: counters with _total, the rest as declared."""
    return f"{name.removesuffix('_total')}_total" if kind == "counter" else name


def declared(module: types.ModuleType) -> dict[str, str]:
    """{family name: kind} of every metric declared at module level."""
    from prometheus_client.metrics import MetricWrapperBase

    found: dict[str, str] = {}
    for value in _module_values(module):
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                found[family.name] = family.type
        else:
            name = getattr(value, "name", None)
            kind = getattr(value, "kind", None) or getattr(value, "type", None)
            if isinstance(name, str) and isinstance(kind, str) and kind in KINDS:
                found[name] = kind
    return found


def _module_values(module: types.ModuleType) -> Iterator[Any]:
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        yield value
        if isinstance(value, tuple | list | set | frozenset):
            yield from value
        elif isinstance(value, dict):
            yield from value.values()


def all_series(families: dict[str, str]) -> set[str]:
    return {name for family, kind in families.items() for name in series(family, kind)}


def parse(expr: str) -> Any:
    for variable, duration in GRAFANA_INTERVALS.items():
        expr = expr.replace(variable, duration)
    return promql_parser.parse(expr)


def used(expr: str) -> set[str]:
    """Metric names in a PromQL expression (vector selectors, and __name__ equality matchers)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__" and matcher.op == promql_parser.MatchOp.Equal:
                    names.add(matcher.value)

    promql_parser.walk(parse(expr), visit)
    return names


LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def variable_selector(query: str) -> str | None:
    """The PromQL selector inside a Grafana `label_values(selector, label)` variable query."""
    match = LABEL_VALUES.match(query)
    return match["selector"] if match else None

"""Label and field selectors, as lists and watches take them (`labelSelector=`, `fieldSelector=`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from npu_sandbox.apiserver.tables import json_path

_SELECTOR_TERM = re.compile(
    r"^\s*(?P<neg>!)?(?P<key>[A-Za-z0-9./_-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def matches_selector(labels: Mapping[str, str], selector: str) -> bool:
    """Kubernetes' label selector syntax: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    for term in _split_selector(selector):
        match = _SELECTOR_TERM.match(term)
        if not match:
            raise ValueError(f"unable to parse requirement: {term!r}")
        key = match["key"]
        if match["setop"]:
            values = {v.strip() for v in match["values"].split(",")}
            ok = (labels.get(key) in values) if match["setop"] == "in" else (labels.get(key) not in values)
        elif match["op"]:
            ok = (labels.get(key) == match["value"]) if match["op"] != "!=" else (labels.get(key) != match["value"])
        else:
            ok = (key not in labels) if match["neg"] else (key in labels)
        if not ok:
            return False
    return True


def matches_fields(obj: Mapping[str, Any], selector: str) -> bool:
    """Field selectors: `metadata.name=x`, `involvedObject.uid==y`, `status.phase!=Running` (a missing field is "")."""
    for term in selector.split(","):
        if not term.strip():
            continue
        match = re.match(r"^\s*([A-Za-z0-9._-]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not match:
            raise ValueError(f"invalid field selector: {term!r}")
        path, op, value = match.groups()
        actual = json_path(obj, path)
        text = "" if actual is None else str(actual)
        if (text == value) != (op != "!="):
            return False
    return True


def _split_selector(selector: str) -> Iterable[str]:
    depth, current = 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            yield current
            current = ""
        else:
            current += char
    if current.strip():
        yield current

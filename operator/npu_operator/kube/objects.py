"""Small helpers for any Kubernetes object: its conditions, and the API's timestamp format."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The condition of this type in `obj`'s status (any Kubernetes object), or an empty mapping."""
    found: Mapping[str, Any] = next(
        (c for c in obj.get("status", {}).get("conditions", []) if c.get("type") == kind), {}
    )
    return found


def is_true(obj: Mapping[str, Any], kind: str) -> bool:
    return condition(obj, kind).get("status") == "True"


def utc_now() -> str:
    """Now, as the API server writes a timestamp (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")

"""Small helpers for any Kubernetes object: its conditions, the API's timestamp format, and a
compact copy of a parsed object to keep for long (`shared_strings`)."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping
from typing import Any, Final

# Strings up to this long are interned by `shared_strings`: keys, label values, names, reasons,
# timestamps. Longer ones (messages, a calibration record) are most often unique.
SHARED_STRING_CHARS: Final = 80


def shared_strings(value: Any) -> Any:
    """A copy of a parsed JSON value whose dict keys and short strings are interned.

    `json.loads` shares equal keys only within one document, so every object parsed from a watch
    holds its own "metadata", "ownerReferences", label keys and values, condition types and
    reasons: kept for thousands of objects, the same few hundred strings thousands of times. The
    copy also holds exactly-sized dicts and lists, where the parsed ones may have room to spare.
    """
    if isinstance(value, dict):
        return {sys.intern(key) if isinstance(key, str) else key: shared_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shared_strings(item) for item in value]
    if isinstance(value, str) and len(value) <= SHARED_STRING_CHARS:
        return sys.intern(value)
    return value


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

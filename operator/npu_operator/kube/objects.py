"""Small helpers for any Kubernetes object: its conditions, the API's timestamp format, a compact
copy of a parsed object to keep for long (`shared_strings`) and one copy of equal documents kept
by many objects (`SharedDocuments`)."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import sys
from collections.abc import Hashable, Mapping
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


def document_digest(document: Any) -> bytes:
    """The SHA-256 of a JSON document's canonical text (sorted keys): equal documents, equal digests."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).digest()


@dataclasses.dataclass
class SharedDocuments:
    """One copy of each distinct document (a resource's spec) however many objects hold an equal one.

    Resources made from one template (a fleet of the same model) hold equal specs; each parsed from
    its own watch event is its own tree of dicts, kept for as long as the resource lives. `share`
    gives the copy all holders of an equal document use, found by the digest of its canonical
    JSON; that is computed only when the holder's version changes (a resource's generation,
    which the API server bumps on every change of its spec), so an event that changes nothing
    costs one dict lookup. A copy goes once no holder is left (`release`). The shared copies are
    read, never written: the reconcile parses a spec into a new typed object (`parse_spec`).
    """

    _copies: dict[bytes, tuple[Any, int]] = dataclasses.field(default_factory=dict)  # digest -> (copy, holders)
    _held: dict[Hashable, tuple[Any, bytes]] = dataclasses.field(default_factory=dict)  # holder -> (version, digest)

    def share(self, holder: Hashable, version: Any, document: Any) -> Any:
        """The shared copy of `document`, the holder's version `version` of it."""
        held = self._held.get(holder)
        if held is not None and held[0] == version:
            return self._copies[held[1]][0]
        digest = document_digest(document)
        copy, holders = self._copies.get(digest) or (shared_strings(document), 0)
        self._copies[digest] = (copy, holders + 1)
        self.release(holder)
        self._held[holder] = (version, digest)
        return copy

    def release(self, holder: Hashable) -> None:
        """`holder` holds no document any more (a deleted resource)."""
        held = self._held.pop(holder, None)
        if held is None:
            return
        copy, holders = self._copies[held[1]]
        if holders > 1:
            self._copies[held[1]] = (copy, holders - 1)
        else:
            del self._copies[held[1]]

    def __len__(self) -> int:
        return len(self._copies)


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

"""Field ownership for the emulator: server-side apply and `metadata.managedFields`, simplified.

What is faithful: every write records which manager set which fields (`managedFields`, FieldsV1
format, operation Apply or Update); an apply by manager M sets the fields of its object, removes
the fields M applied before and no longer applies (unless another manager also owns them),
leaves fields owned by other managers alone, and, unless forced, answers 409 when it would
change a field another manager owns; a non-apply write moves the fields it changes to its
manager (the User-Agent's product, or `fieldManager`), taking them from the others.

What is simplified: lists are atomic (one owner for the whole list, no merge keys such as
containers by name), so two managers cannot own different items of one list; the status
subresource is not tracked; a field's value is compared as JSON (no quantity normalization).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

APPLY_PATCH: Final = "application/apply-patch+yaml"
# Identity and server-managed metadata: never owned by a manager.
_SERVER_METADATA: Final = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "managedFields",
        "selfLink",
    }
)

Path = tuple[str, ...]
# (manager, operation) -> the leaf paths it owns
Owners = dict[tuple[str, str], set[Path]]


class ApplyConflict(Exception):
    """An apply would change fields another manager owns, and was not forced."""


def manager_of(request: Any) -> str:
    """The manager of a non-apply write: `fieldManager`, else the User-Agent's product (as kube-apiserver)."""
    named = request.params.get("fieldManager")
    if named:
        return str(named)
    agent = str(request.headers.get("User-Agent", "")).split("/", 1)[0].strip()
    return agent or "unknown"


def leaves(obj: Any, has_status: bool, prefix: Path = ()) -> dict[Path, Any]:
    """Every owned leaf of an object: maps are walked, lists and scalars (and empty maps) are leaves."""
    found: dict[Path, Any] = {}
    for key, value in obj.items():
        if not prefix and (key in ("apiVersion", "kind") or (key == "status" and has_status)):
            continue
        if prefix == ("metadata",) and key in _SERVER_METADATA:
            continue
        path = (*prefix, key)
        if isinstance(value, Mapping) and value:
            found.update(leaves(value, has_status, path))
        else:
            found[path] = value
    return found


def owners_of(obj: Mapping[str, Any]) -> Owners:
    """The ownership recorded in `metadata.managedFields` (status-subresource entries are skipped)."""
    owners: Owners = {}
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        if entry.get("subresource"):
            continue
        key = (str(entry.get("manager", "")), str(entry.get("operation", "Update")))
        owners.setdefault(key, set()).update(_paths(entry.get("fieldsV1") or {}))
    return owners


def managed_fields(owners: Owners, api_version: str) -> list[dict[str, Any]]:
    return [
        {
            "manager": manager,
            "operation": operation,
            "apiVersion": api_version,
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1(paths),
        }
        for (manager, operation), paths in sorted(owners.items())
        if paths
    ]


def updated(old: Mapping[str, Any], new: Mapping[str, Any], manager: str, has_status: bool) -> Owners:
    """Ownership after a non-apply write: the changed fields move to `manager`."""
    before, after = leaves(old, has_status), leaves(new, has_status)
    changed = {path for path, value in after.items() if before.get(path, _MISSING) != value}
    owners = owners_of(old)
    for key in owners:
        owners[key] = {path for path in owners[key] if path in after and path not in changed}
    if changed:
        owners.setdefault((manager, "Update"), set()).update(changed)
    return owners


def applied(
    old: Mapping[str, Any], config: Mapping[str, Any], manager: str, *, force: bool, has_status: bool
) -> tuple[dict[str, Any], Owners]:
    """The object after `manager` applies `config` to `old`, and the new ownership."""
    current, wanted = leaves(old, has_status), leaves(config, has_status)
    owners = owners_of(old)
    mine = owners.pop((manager, "Apply"), set())
    differing = {path for path, value in wanted.items() if path in current and current[path] != value}
    if not force:
        conflicts = sorted(
            f'conflict with "{who}": .{".".join(path)}'
            for (who, _), paths in owners.items()
            if who != manager
            for path in paths & differing
        )
        if conflicts:
            raise ApplyConflict(f"Apply failed with {len(conflicts)} conflict(s): " + "; ".join(conflicts))
    for key in owners:  # forced (or our own earlier updates): the fields that change are taken
        owners[key] -= differing if key[0] != manager else set(wanted)
    held_by_others = set().union(*owners.values()) if owners else set()
    new: dict[str, Any] = copy.deepcopy(dict(old))
    for path in sorted(mine - set(wanted) - held_by_others):
        _remove(new, path)
    for path, value in wanted.items():
        _set(new, path, copy.deepcopy(value))
    new["apiVersion"], new["kind"] = config["apiVersion"], config["kind"]
    owners[(manager, "Apply")] = set(wanted)
    return new, owners


_MISSING: Final = object()


def _paths(fields_v1: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    found: set[Path] = set()
    for key, sub in fields_v1.items():
        if not key.startswith("f:"):
            continue  # "." (the node itself) and list keys: lists are atomic here
        path = (*prefix, key[2:])
        nested = {k: v for k, v in sub.items() if k.startswith("f:")} if isinstance(sub, Mapping) else {}
        found |= _paths(nested, path) if nested else {path}
    return found


def _fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def _set(obj: dict[str, Any], path: Path, value: Any) -> None:
    node = obj
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def _remove(obj: dict[str, Any], path: Path) -> None:
    """Delete the field, then any map it leaves empty."""
    chain: list[dict[str, Any]] = [obj]
    for key in path[:-1]:
        child = chain[-1].get(key)
        if not isinstance(child, dict):
            return
        chain.append(child)
    chain[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if chain[depth]:
            break
        chain[depth - 1].pop(path[depth - 1], None)

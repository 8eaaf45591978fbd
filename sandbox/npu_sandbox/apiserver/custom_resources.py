"""CustomResourceDefinitions as the API server reads them: what a CRD serves, and whether it is valid.

A kube-apiserver serves a custom resource once its CRD is stored and Established: one API per served
version, with the version's schema (defaults, pruning, validation, CEL), subresources and printer
columns; a changed CRD changes them; a deleted CRD takes its API and every object of it away. The
emulator keeps the stored CRDs and asks this module what they mean. The checks here are the
structural ones of the API server's CRD validation
(staging/src/k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation/validation.go,
`ValidateCustomResourceDefinition`) that a chart can trip over; the rest (structural-schema rules,
CEL cost limits, conversion webhooks) is not emulated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npu_operator.kube.objects import utc_now

VERBS = frozenset({"list", "watch", "get", "create", "patch", "update", "delete"})


def errors(crd: Mapping[str, Any]) -> list[str]:
    """`path: message` for each reason the API server refuses this CRD (422)."""
    found: list[str] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural = spec.get("group", ""), names.get("plural", "")
    name = (crd.get("metadata") or {}).get("name", "")
    if not group or "." not in group:
        found.append(f'spec.group: Invalid value: "{group}": should be a domain with at least one dot')
    for field in ("plural", "kind"):
        if not names.get(field):
            found.append(f"spec.names.{field}: Required value")
    if plural and group and name != f"{plural}.{group}":
        found.append(f'metadata.name: Invalid value: "{name}": must be spec.names.plural+"."+spec.group')
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        found.append(f'spec.scope: Unsupported value: "{spec.get("scope")}": supported values: "Cluster", "Namespaced"')
    versions = spec.get("versions") or []
    if not versions:
        found.append("spec.versions: Invalid value: []: must have exactly one version marked as storage version")
    elif sum(bool(v.get("storage")) for v in versions) != 1:
        found.append("spec.versions: Invalid value: must have exactly one version marked as storage version")
    for index, version in enumerate(versions):
        if not (version.get("schema") or {}).get("openAPIV3Schema"):
            found.append(f"spec.versions[{index}].schema.openAPIV3Schema: Required value: schemas are required")
    return found


def served(crd: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """`group/version/plural` -> (kmock's resource info, the version's spec) for each served version."""
    spec = crd["spec"]
    names = spec["names"]
    result: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subresources = set(version.get("subresources") or {})
        info = {
            "kind": names["kind"],
            "singular": names.get("singular") or names["kind"].lower(),
            "namespaced": spec["scope"] == "Namespaced",
            "shortnames": set(names.get("shortNames") or ()),
            "categories": set(names.get("categories") or ()),
            "verbs": set(VERBS),
            "subresources": subresources,
        }
        result[f"{spec['group']}/{version['name']}/{names['plural']}"] = (info, dict(version))
    return result


def status(crd: Mapping[str, Any]) -> dict[str, Any]:
    """The status the API server's controllers give an accepted CRD: names accepted, Established."""
    spec = crd["spec"]
    now = utc_now()
    names = dict(spec["names"])
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", f"{names['kind']}List")
    conditions = [
        {
            "type": "NamesAccepted",
            "status": "True",
            "reason": "NoConflicts",
            "message": "no conflicts found",
            "lastTransitionTime": now,
        },
        {
            "type": "Established",
            "status": "True",
            "reason": "InitialNamesAccepted",
            "message": "the initial names have been accepted",
            "lastTransitionTime": now,
        },
    ]
    stored = [version["name"] for version in spec["versions"] if version.get("storage")]
    return {"acceptedNames": names, "conditions": conditions, "storedVersions": stored}

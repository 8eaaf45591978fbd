"""The children of an NPUInference, in one table, and the pure decision of what each one needs.

`KINDS` lists every kind of child the operator manages; everything else follows from it: the
handlers watch each kind through kopf (a change wakes the owner's worker), the reconcile applies
or deletes each one, RBAC must grant it. A new kind of child is one `ChildKind` entry here plus
its builder in `builders.build_children`. An `optional` kind belongs to an API that may not be
installed (a CRD): when it is not served the child is skipped and the resource says so.

Children are written by server-side apply (`client.KubeClient.apply`, field manager
`npu-operator`). `plan` decides without a request whether a child needs one: it does when it is
missing, when the manifest we would apply differs from the one we last applied (its digest is
kept in an annotation of a fixed, small size), or when another manager has taken one of our
fields (a hand edit: `managedFields` says so). A settled child therefore costs nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from npu_operator import crd
from npu_operator.client import FIELD_MANAGER, Resource

JSON = dict[str, Any]

DIGEST_ANNOTATION: Final = f"{crd.GROUP}/applied-digest"


@dataclasses.dataclass(frozen=True)
class ChildKind:
    resource: Resource
    # Served only where its API is installed; skipped, with a note in the status, where it is not.
    optional: bool = False

    @property
    def kind(self) -> str:
        return self.resource.kind


DEPLOYMENT: Final = ChildKind(Resource("apps", "v1", "deployments", "Deployment"))
SERVICE: Final = ChildKind(Resource("", "v1", "services", "Service"))
POD_DISRUPTION_BUDGET: Final = ChildKind(Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"))
POD_MONITOR: Final = ChildKind(Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"), optional=True)
# A multi-node replica (spec.npu.nodes > 1); its API is a CRD of kubernetes-sigs/lws.
LEADER_WORKER_SET: Final = ChildKind(
    Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"), optional=True
)
# Prefill/decode disaggregation (spec.disaggregation): the roles, each a LeaderWorkerSet; a CRD of
# kubernetes-sigs/lws v0.10. The Deployment is then the router, the Service its endpoint.
DISAGGREGATED_SET: Final = ChildKind(
    Resource("disaggregatedset.x-k8s.io", "v1", "disaggregatedsets", "DisaggregatedSet"), optional=True
)
# In apply order.
KINDS: Final = (DEPLOYMENT, LEADER_WORKER_SET, DISAGGREGATED_SET, SERVICE, POD_DISRUPTION_BUDGET, POD_MONITOR)
# The kinds that run the engines: one of them per resource, chosen by spec.npu.nodes and spec.disaggregation
# (the last one with a manifest is the workload: with a DisaggregatedSet, the Deployment is the router).
WORKLOADS: Final = (DEPLOYMENT, LEADER_WORKER_SET, DISAGGREGATED_SET)
# Services besides the resource's own: a disaggregated resource's role Services (`<name>-prefill`, ...).
EXTRA_SERVICE_SUFFIXES: Final = ("-prefill", "-decode")
BY_KIND: Final = {child.kind: child for child in KINDS}


def names(kind: ChildKind, name: str) -> tuple[str, ...]:
    """Every name a child of `kind` of the resource `name` can have (each one is applied or deleted)."""
    if kind is SERVICE:
        return (name, *(name + suffix for suffix in EXTRA_SERVICE_SUFFIXES))
    return (name,)


@dataclasses.dataclass(frozen=True)
class Step:
    """One write that brings a child to what is desired."""

    action: str  # create (an unforced apply) | apply | delete
    child: ChildKind
    name: str
    body: JSON | None = None


def stamped(desired: JSON) -> JSON:
    """The manifest to apply: `desired` with the digest of its content in an annotation."""
    text = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    metadata = dict(desired["metadata"])
    metadata["annotations"] = {**metadata.get("annotations", {}), DIGEST_ANNOTATION: digest}
    return {**desired, "metadata": metadata}


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences", []))


def plan(child: ChildKind, name: str, manifest: JSON | None, live: Mapping[str, Any] | None, uid: str) -> Step | None:
    """The write `child` needs (None: none). `manifest` is `stamped`; `live` is owned by `uid`."""
    if manifest is None:
        return Step("delete", child, name) if live is not None else None
    if live is None:
        return Step("create", child, name, manifest)
    if _digest(live) != _digest(manifest) or taken_fields(live, manifest):
        return Step("apply", child, name, manifest)
    return None


def taken_fields(live: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """Whether another manager now holds a field of `manifest` that our manager no longer holds.

    That is what a write by someone else to one of our fields leaves in `managedFields` (the API
    server moves the field to the writer). A field both hold has the same value in both: not taken.
    Below a list, any field the other holds and we do not counts (list merge keys are not read).
    """
    ours: Mapping[str, Any] | None = None
    theirs: list[Mapping[str, Any]] = []
    for entry in live.get("metadata", {}).get("managedFields") or []:
        if entry.get("subresource") or not isinstance(entry.get("fieldsV1"), Mapping):
            continue
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply":
            ours = entry["fieldsV1"]
        else:
            theirs.append(entry["fieldsV1"])
    body = {key: value for key, value in manifest.items() if key not in ("apiVersion", "kind")}
    return any(_taken(ours, fields, body) for fields in theirs)


def _taken(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any], desired: Any) -> bool:
    if isinstance(desired, Mapping) and desired:
        for key, sub in theirs.items():
            if key.startswith("f:") and key[2:] in desired and isinstance(sub, Mapping):
                below = ours.get(key) if ours is not None else None
                if _taken(below if isinstance(below, Mapping) else None, sub, desired[key[2:]]):
                    return True
        return False
    if ours is None:
        return True
    return not _leaves(theirs) <= _leaves(ours)


def _leaves(fields: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for key, sub in fields.items():
        if key == ".":
            continue
        path = (*prefix, key)
        found |= _leaves(sub, path) if isinstance(sub, Mapping) and sub else {path}
    return found


def _digest(obj: Mapping[str, Any]) -> str | None:
    value = obj.get("metadata", {}).get("annotations", {}).get(DIGEST_ANNOTATION)
    return str(value) if value is not None else None

"""A stand-in for LeaderWorkerSet v0.10's DisaggregatedSet controller, over the API.

It turns a `disaggregatedset.x-k8s.io/v1` DisaggregatedSet into one LeaderWorkerSet per role,
as kubernetes-sigs/lws v0.10.0 does (paths under that tag); `npu_sandbox.controllers.lws` then plays the
LeaderWorkerSet controller for each of them:

- the revision: a hash of the roles' names and leaderWorkerTemplates
  (pkg/utils/disaggregatedset/utils.go `ComputeRevision`: sha256 of their JSON, 8 hex
  characters; here of Python's JSON of the same fields, so the value differs, not what it covers);
- each role's LeaderWorkerSet named `<set>-<slice>-<revision>-<role>` (`GenerateName`, slice 0:
  one slice, the default), its labels the role template's `metadata.labels` merged with
  `GenerateLabels` (app, role, slice, set name, revision), its annotations the template's, the
  same labels on the worker (and leader) pod template, replicas from the role, and a controller
  owner reference to the DisaggregatedSet (pkg/controllers/disaggregatedset/lws_manager.go
  `Create`, disaggregatedset_controller.go `reconcileRoleSimple`);
- a replica change scales the role's LeaderWorkerSet (lws_manager.go `Scale`);
- a changed template makes a new revision: its LeaderWorkerSets are created, and the old
  revision's are deleted once every role of the new one is ready (a short cut of executor.go's
  rolling update, which scales old and new step by step; drained revisions are deleted,
  `cleanupDrainedLWS`);
- no status of its own: v0.10.0 declares `RoleStatus` and never writes it.

Not emulated: slices > 1, placement policies, External scaling (DisaggregatedSetRoleScaler), and
the per-revision headless Services (service_manager.go); the operator's role Services route.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers import lws
from npu_sandbox.controllers.workloads import JSON, Snapshot, controller_reference, delete

API_VERSION: Final = "disaggregatedset.x-k8s.io/v1"
KIND: Final = "DisaggregatedSet"
PLURAL: Final = "disaggregatedsets"
# api/disaggregatedset/v1/disaggregatedset_types.go, the label keys.
SET_NAME_LABEL: Final = "disaggregatedset.x-k8s.io/name"
ROLE_LABEL: Final = "disaggregatedset.x-k8s.io/role"
SLICE_LABEL: Final = "disaggregatedset.x-k8s.io/slice"
REVISION_LABEL: Final = "disaggregatedset.x-k8s.io/revision"
SLICE: Final = 0


def revision_of(ds: Mapping[str, Any]) -> str:
    """`ComputeRevision`: a hash of each role's name and leaderWorkerTemplate, 8 hex characters."""
    roles = [{"name": r["name"], "template": r["spec"]["leaderWorkerTemplate"]} for r in ds["spec"]["roles"]]
    return hashlib.sha256(json.dumps(roles, sort_keys=True).encode()).hexdigest()[:8]


def generated_labels(name: str, revision: str, role: str) -> dict[str, str]:
    """`GenerateLabels`."""
    return {
        "app": f"{name}-{SLICE}-{role}",
        ROLE_LABEL: role,
        SLICE_LABEL: str(SLICE),
        SET_NAME_LABEL: name,
        REVISION_LABEL: revision,
    }


def lws_name(ds: Mapping[str, Any], role: Mapping[str, Any], revision: str) -> str:
    """The name of the LeaderWorkerSet that runs `role` at `revision`."""
    return f"{ds['metadata']['name']}-{SLICE}-{revision}-{role['name']}"


def role_leader_worker_set(ds: Mapping[str, Any], role: Mapping[str, Any], revision: str) -> JSON:
    """lws_manager.go `Create` for one role."""
    name, namespace = ds["metadata"]["name"], ds["metadata"]["namespace"]
    labels = generated_labels(name, revision, role["name"])
    spec = copy.deepcopy(role["spec"])
    spec["replicas"] = role["spec"].get("replicas", 1)
    template = spec["leaderWorkerTemplate"]
    for key in ("workerTemplate", "leaderTemplate"):
        if key in template:
            metadata = template[key].setdefault("metadata", {})
            metadata["labels"] = {**metadata.get("labels", {}), **labels}
    metadata = role.get("metadata") or {}
    made: JSON = {
        "apiVersion": lws.API_VERSION,
        "kind": lws.KIND,
        "metadata": {
            "name": lws_name(ds, role, revision),
            "namespace": namespace,
            "labels": {**metadata.get("labels", {}), **labels},
            "ownerReferences": [controller_reference(ds)],
        },
        "spec": spec,
    }
    if metadata.get("annotations"):
        made["metadata"]["annotations"] = dict(metadata["annotations"])
    return made


async def reconcile(cluster: ApiClient, snapshot: Snapshot, ds: JSON) -> None:
    """One round of the DisaggregatedSet reconciler for `ds`."""
    if ds["metadata"].get("deletionTimestamp"):
        return
    namespace = ds["metadata"]["namespace"]
    revision = revision_of(ds)
    owned = snapshot.controlled_by(lws.PLURAL, ds)
    current = [o for o in owned if o["metadata"].get("labels", {}).get(REVISION_LABEL) == revision]
    for role in ds["spec"]["roles"]:
        name, replicas = lws_name(ds, role, revision), role["spec"].get("replicas", 1)
        existing = next((o for o in current if o["metadata"]["name"] == name), None)
        if existing is None:
            try:
                await cluster.create(role_leader_worker_set(ds, role, revision), lws.PLURAL)
            except ApiRejected as exc:
                if exc.status != 409:
                    raise
        elif existing["spec"].get("replicas", 1) != replicas:
            body = {"spec": {"replicas": replicas}}
            await cluster.patch(lws.API_VERSION, lws.PLURAL, namespace, existing["metadata"]["name"], body)
    old = [o for o in owned if o not in current]
    ready = len(current) == len(ds["spec"]["roles"]) and all(
        o.get("status", {}).get("readyReplicas", 0) >= o["spec"].get("replicas", 1) for o in current
    )
    if old and ready:
        for leader_worker_set in old:
            await delete(cluster, lws.API_VERSION, lws.PLURAL, leader_worker_set)

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
- no status of its own: v0.10.0 declares `RoleStatus` and never writes it;
- External scaling: for each role with `scaling.mode: External`, a DisaggregatedSetRoleScaler
  `<set>-<role>` (labels set name and role, a controller owner reference), seeded with the role's
  LeaderWorkerSets' replicas or 1 for a new role, and deleted when the role is no longer External
  (scaler_manager.go `Reconcile`, `create`; disaggregatedset_controller.go `seedForRole`); the role's
  replicas are the scaler's spec.replicas, the role template's are ignored (executor.go
  `getTargetReplicas`); its status is the role's LeaderWorkerSets' status.replicas summed, the
  leader-only selector and a Ready condition (`updateScalerStatus`, scaler_manager.go `WriteStatus`).
  What writes the scaler is an autoscaler through its scale subresource (KEDA's HPA; in the tests, the
  test itself).

Not emulated: slices > 1, placement policies, the no-shrink guard for an External role during a
rollout (executor.go), and the per-revision headless Services (service_manager.go); the operator's
role Services route.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from npu_operator.kube.objects import utc_now

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers import lws
from npu_sandbox.controllers.workloads import JSON, Snapshot, controller_reference, controller_uid, delete, patch_status

API_VERSION: Final = "disaggregatedset.x-k8s.io/v1"
KIND: Final = "DisaggregatedSet"
PLURAL: Final = "disaggregatedsets"
# api/disaggregatedset/v1/disaggregatedset_types.go, the label keys.
SET_NAME_LABEL: Final = "disaggregatedset.x-k8s.io/name"
ROLE_LABEL: Final = "disaggregatedset.x-k8s.io/role"
SLICE_LABEL: Final = "disaggregatedset.x-k8s.io/slice"
REVISION_LABEL: Final = "disaggregatedset.x-k8s.io/revision"
SLICE: Final = 0
# api/disaggregatedset/v1/disaggregatedsetrolescaler_types.go: the per-role scale target of an External role.
SCALER_KIND: Final = "DisaggregatedSetRoleScaler"
SCALER_PLURAL: Final = "disaggregatedsetrolescalers"
EXTERNAL: Final = "External"
WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"


def scaler_name(ds: Mapping[str, Any], role: str) -> str:
    """scaler_manager.go `ScalerName`."""
    return f"{ds['metadata']['name']}-{role}"


def external(role: Mapping[str, Any]) -> bool:
    return (role.get("scaling") or {}).get("mode") == EXTERNAL


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


def role_scaler(ds: Mapping[str, Any], role: str, seed: int) -> JSON:
    """scaler_manager.go `create`: the scaler of an External role, seeded with `seed` replicas."""
    return {
        "apiVersion": API_VERSION,
        "kind": SCALER_KIND,
        "metadata": {
            "name": scaler_name(ds, role),
            "namespace": ds["metadata"]["namespace"],
            "labels": {SET_NAME_LABEL: ds["metadata"]["name"], ROLE_LABEL: role},
            "ownerReferences": [controller_reference(ds)],
        },
        "spec": {"replicas": seed},
    }


async def reconcile_scalers(cluster: ApiClient, snapshot: Snapshot, ds: JSON) -> dict[str, JSON]:
    """scaler_manager.go `Reconcile`: a scaler per External role (created, or adopted only if this set
    controls it), the others of this set deleted; role -> scaler."""
    roles = {role["name"] for role in ds["spec"]["roles"] if external(role)}
    owned = [s for s in snapshot.of(SCALER_PLURAL) if s["metadata"].get("labels", {}).get(SET_NAME_LABEL)]
    scalers: dict[str, JSON] = {}
    for scaler in owned:
        if controller_uid(scaler) != ds["metadata"]["uid"]:
            continue
        role = scaler["metadata"]["labels"].get(ROLE_LABEL, "")
        if role in roles:
            scalers[role] = scaler
        else:
            await delete(cluster, API_VERSION, SCALER_PLURAL, scaler)
    leader_worker_sets = snapshot.controlled_by(lws.PLURAL, ds)
    for role in sorted(roles - set(scalers)):
        of_role = [o for o in leader_worker_sets if o["metadata"].get("labels", {}).get(ROLE_LABEL) == role]
        # seedForRole: the role's current replicas (a Static -> External flip), 1 for a role not yet made.
        seed = sum(o["spec"].get("replicas", 1) for o in of_role) if of_role else 1
        try:
            scalers[role] = await cluster.create(role_scaler(ds, role, seed), SCALER_PLURAL)
        except ApiRejected as exc:
            if exc.status != 409:  # taken by another owner: not adopted (ScalerConflict)
                raise
    return scalers


async def write_scaler_status(cluster: ApiClient, snapshot: Snapshot, ds: JSON, scalers: Mapping[str, JSON]) -> None:
    """`updateScalerStatus` and `WriteStatus`: observed replicas over every revision, the leaders' selector."""
    leader_worker_sets = snapshot.controlled_by(lws.PLURAL, ds)
    for role, scaler in scalers.items():
        observed = sum(
            o.get("status", {}).get("replicas", 0)
            for o in leader_worker_sets
            if o["metadata"].get("labels", {}).get(ROLE_LABEL) == role
        )
        generation = scaler["metadata"].get("generation", 1)
        previous = next((c for c in scaler.get("status", {}).get("conditions", ()) if c.get("type") == "Ready"), None)
        ready = {
            "type": "Ready",
            "status": "True",
            "observedGeneration": generation,
            "reason": "Bound",
            "message": "Scaler bound to a live DisaggregatedSet role",
            "lastTransitionTime": (previous or {}).get("lastTransitionTime") or utc_now(),
        }
        status = {
            "replicas": observed,
            "selector": f"{SET_NAME_LABEL}={ds['metadata']['name']},{ROLE_LABEL}={role},{WORKER_INDEX_LABEL}=0",
            "observedGeneration": generation,
            "conditions": [ready],
        }
        await patch_status(cluster, API_VERSION, SCALER_PLURAL, scaler, status)


def target_replicas(role: Mapping[str, Any], scalers: Mapping[str, JSON]) -> int:
    """executor.go `getTargetReplicas`: an External role's from its scaler, a Static one's from the role."""
    if external(role) and role["name"] in scalers:
        return int(scalers[role["name"]].get("spec", {}).get("replicas", 0))
    return int(role["spec"].get("replicas", 1))


async def reconcile(cluster: ApiClient, snapshot: Snapshot, ds: JSON) -> None:
    """One round of the DisaggregatedSet reconciler for `ds`."""
    if ds["metadata"].get("deletionTimestamp"):
        return
    namespace = ds["metadata"]["namespace"]
    scalers = await reconcile_scalers(cluster, snapshot, ds)
    revision = revision_of(ds)
    owned = snapshot.controlled_by(lws.PLURAL, ds)
    current = [o for o in owned if o["metadata"].get("labels", {}).get(REVISION_LABEL) == revision]
    for role in ds["spec"]["roles"]:
        name, replicas = lws_name(ds, role, revision), target_replicas(role, scalers)
        existing = next((o for o in current if o["metadata"]["name"] == name), None)
        if existing is None:
            made = role_leader_worker_set(ds, role, revision)
            made["spec"]["replicas"] = replicas
            try:
                await cluster.create(made, lws.PLURAL)
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
    await write_scaler_status(cluster, snapshot, ds, scalers)

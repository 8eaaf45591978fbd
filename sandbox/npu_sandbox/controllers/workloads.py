"""The workload controllers of kube-controller-manager, over the API: Deployment, ReplicaSet, StatefulSet.

Each reconciles what one read of the API (`Snapshot`) shows and writes its changes through the
API; the next round sees them, as with a real controller's informers. They make Pod objects;
the kubelet (`npu_sandbox.node.kubelet`) runs them. One loop drives them all:
`npu_sandbox.controllers.manager.ControllerManager`. What they do, after Kubernetes' own controllers
(kubernetes/kubernetes, pkg/controller/deployment, replicaset and statefulset):

- Deployment: one ReplicaSet per pod-template hash (label `pod-template-hash`); a changed
  template rolls out as `spec.strategy` says: RollingUpdate scales the new ReplicaSet up within
  maxSurge and the old ones down within maxUnavailable (rolling.go reconcileNewReplicaSet,
  reconcileOldReplicaSets, cleanupUnhealthyReplicas), Recreate scales the old ones to zero first;
  a replicas change scales the current ReplicaSet. Its status goes through
  `ApiClient.report_deployment`, the one stand-in for a Deployment's status.
- ReplicaSet: creates or deletes pods (`<replicaset>-<5 chars>`, not-ready ones first) until
  its replicas exist; keeps its status.
- StatefulSet: pods `<statefulset>-<ordinal>` from `spec.ordinals.start`, all at once (the
  Parallel pod management LeaderWorkerSet asks for), with `controller-revision-hash`, hostname and
  subdomain; a template change replaces, from the highest ordinal down, the pods at or above
  `updateStrategy.rollingUpdate.partition`, at most maxUnavailable at a time; pods below the
  partition are recreated at the current revision. Revisions are ControllerRevisions.

Pod admission (LeaderWorkerSet's mutating webhook) is a hook: `admission` functions change a pod
before it is created. Simplified: minReadySeconds and progressDeadlineSeconds are not counted (a
pod is available when Ready), no revision history is pruned, and a deleted pod is gone at once.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from npu_operator.kube.objects import utc_now

from npu_sandbox.cluster.client import ApiClient, ApiRejected

JSON = dict[str, Any]
Admission = Callable[[JSON], None]

POD_TEMPLATE_HASH: Final = "pod-template-hash"
REVISION_HASH: Final = "controller-revision-hash"
POD_NAME_LABEL: Final = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
# What rand.SafeEncodeString (k8s.io/apimachinery/pkg/util/rand) writes hashes with: no vowels, no 0/1/3.
_SAFE_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
# The plurals one round reads, and the API version of each.
WATCHED: Final = {
    "deployments": "apps/v1",
    "replicasets": "apps/v1",
    "statefulsets": "apps/v1",
    "controllerrevisions": "apps/v1",
    "services": "v1",
    "pods": "v1",
}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What one round of the controllers reads: every object of the watched kinds in a namespace."""

    namespace: str
    objects: Mapping[str, Sequence[JSON]]

    def of(self, plural: str) -> list[JSON]:
        return list(self.objects.get(plural, ()))

    def named(self, plural: str, name: str) -> JSON | None:
        return next((obj for obj in self.of(plural) if obj["metadata"]["name"] == name), None)

    def controlled_by(self, plural: str, owner: Mapping[str, Any]) -> list[JSON]:
        uid = owner["metadata"]["uid"]
        return [obj for obj in self.of(plural) if controller_uid(obj) == uid]


async def read_snapshot(cluster: ApiClient, namespace: str, extra: Mapping[str, str] | None = None) -> Snapshot:
    """One list per watched kind (and per `extra` plural -> API version; one the API lacks is empty)."""
    objects: dict[str, list[JSON]] = {}
    for plural, api_version in {**WATCHED, **(extra or {})}.items():
        try:
            objects[plural] = await cluster.list_objects(api_version, plural, namespace)
        except ApiRejected as exc:
            if exc.status != 404:
                raise
            objects[plural] = []
    return Snapshot(namespace, objects)


# --- shared facts -----------------------------------------------------------------------------


def controller_reference(owner: Mapping[str, Any]) -> JSON:
    """The owner reference a controller writes into what it makes (metav1.NewControllerRef)."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for reference in obj.get("metadata", {}).get("ownerReferences") or ():
        if reference.get("controller") is True:
            return str(reference.get("uid"))
    return None


def template_hash(value: Any) -> str:
    """A short, stable hash of a template, in the alphabet Kubernetes writes hashes with."""
    digest = int.from_bytes(hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()[:8], "big")
    chars = []
    for _ in range(10):
        digest, index = divmod(digest, len(_SAFE_ALPHABET))
        chars.append(_SAFE_ALPHABET[index])
    return "".join(chars)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running with the Ready condition True (podutil.IsPodReady, and LWS's PodRunningAndReady)."""
    status = pod.get("status", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", ()))
    return status.get("phase") == "Running" and ready


def scaled(value: Any, total: int, *, round_up: bool) -> int:
    """An int-or-percent against `total` (intstr.GetScaledValueFromIntOrPercent)."""
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        return int(text)
    share = int(text[:-1]) * total / 100
    return math.ceil(share) if round_up else math.floor(share)


def new_pod(name: str, namespace: str, template: Mapping[str, Any], owner: Mapping[str, Any]) -> JSON:
    metadata = copy.deepcopy(dict(template.get("metadata", {})))
    metadata.update(name=name, namespace=namespace, ownerReferences=[controller_reference(owner)])
    metadata.setdefault("labels", {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(template["spec"])}


async def create_pod(cluster: ApiClient, pod: JSON, admission: Sequence[Admission]) -> None:
    for admit in admission:
        admit(pod)
    with contextlib.suppress(ApiRejected):  # already there (made by an earlier round): nothing to do
        await cluster.create(pod, "pods")


async def delete(cluster: ApiClient, api_version: str, plural: str, obj: Mapping[str, Any]) -> None:
    with contextlib.suppress(ApiRejected):  # gone already
        await cluster.delete(api_version, plural, obj["metadata"]["namespace"], obj["metadata"]["name"])


async def patch_status(cluster: ApiClient, api_version: str, plural: str, obj: Mapping[str, Any], status: JSON) -> None:
    """Write the status when it differs from the stored one (controllers write only what changed)."""
    current = obj.get("status", {})
    if all(current.get(key) == value for key, value in status.items()):
        return
    meta = obj["metadata"]
    with contextlib.suppress(ApiRejected):
        await cluster.patch(
            api_version, plural, meta["namespace"], meta["name"], {"status": status}, subresource="status"
        )


# --- Deployment and ReplicaSet ------------------------------------------------------------------


def replica_set_for(deployment: Mapping[str, Any], replicas: int) -> JSON:
    """The ReplicaSet of the Deployment's current template (pkg/controller/deployment/sync.go getNewReplicaSet)."""
    template = copy.deepcopy(deployment["spec"]["template"])
    pod_hash = template_hash(template)
    labels = {**template.get("metadata", {}).get("labels", {}), POD_TEMPLATE_HASH: pod_hash}
    template.setdefault("metadata", {})["labels"] = labels
    selector = copy.deepcopy(deployment["spec"].get("selector", {}))
    selector.setdefault("matchLabels", {})[POD_TEMPLATE_HASH] = pod_hash
    meta = deployment["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{meta['name']}-{pod_hash}",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {"deployment.kubernetes.io/desired-replicas": str(deployment["spec"].get("replicas", 1))},
            "ownerReferences": [controller_reference(deployment)],
        },
        "spec": {"replicas": replicas, "selector": selector, "template": template},
    }


async def ensure_replica_set(cluster: ApiClient, deployment: Mapping[str, Any], replicas: int) -> JSON:
    wanted = replica_set_for(deployment, replicas)
    meta = wanted["metadata"]
    found = await cluster.get("apps/v1", "replicasets", meta["namespace"], meta["name"])
    if found is not None:
        return found
    return await cluster.create(wanted, "replicasets")


def _replicas(obj: Mapping[str, Any]) -> int:
    return int(obj.get("spec", {}).get("replicas", 1))


async def replica_set_owner(cluster: ApiClient, namespace: str, deployment: str) -> dict[str, Any]:
    """The owner reference of pods of the Deployment's current ReplicaSet (made when missing),
    for tests that create such pods themselves."""
    found = await cluster.get("apps/v1", "deployments", namespace, deployment)
    if found is None:
        raise LookupError(f"Deployment {namespace}/{deployment} does not exist")
    replica_set = await ensure_replica_set(cluster, found, int(found["spec"].get("replicas", 1)))
    return controller_reference(replica_set)


async def _scale(cluster: ApiClient, replica_set: Mapping[str, Any], replicas: int) -> None:
    meta = replica_set["metadata"]
    await cluster.patch("apps/v1", "replicasets", meta["namespace"], meta["name"], {"spec": {"replicas": replicas}})


async def reconcile_deployment(cluster: ApiClient, snapshot: Snapshot, deployment: JSON) -> None:
    """One round of the deployment controller for one Deployment (at most one scaling step)."""
    desired = _replicas(deployment)
    pod_hash = template_hash(deployment["spec"]["template"])
    owned = snapshot.controlled_by("replicasets", deployment)
    new = next((rs for rs in owned if rs["metadata"].get("labels", {}).get(POD_TEMPLATE_HASH) == pod_hash), None)
    old = sorted(
        (rs for rs in owned if rs is not new and _replicas(rs) > 0), key=lambda rs: rs["metadata"]["creationTimestamp"]
    )
    if new is None:
        new = await ensure_replica_set(cluster, deployment, 0 if old else desired)
    pods = {rs["metadata"]["uid"]: snapshot.controlled_by("pods", rs) for rs in [new, *old]}
    ready = {uid: sum(1 for pod in found if pod_ready(pod)) for uid, found in pods.items()}
    strategy = deployment["spec"].get("strategy", {})
    if not old:
        if _replicas(new) != desired:  # a scale, or the end of a rollout
            await _scale(cluster, new, desired)
    elif strategy.get("type") == "Recreate":
        for rs in old:
            await _scale(cluster, rs, 0)
        if not any(pods[rs["metadata"]["uid"]] for rs in old) and _replicas(new) != desired:
            await _scale(cluster, new, desired)
    else:
        await _roll(cluster, deployment, new, old, pods, ready)
    await _report_deployment(cluster, snapshot, deployment, new, owned)


async def _roll(
    cluster: ApiClient,
    deployment: JSON,
    new: JSON,
    old: list[JSON],
    pods: Mapping[str, list[JSON]],
    ready: Mapping[str, int],
) -> None:
    """RollingUpdate (pkg/controller/deployment/rolling.go): new up within maxSurge, old down within maxUnavailable."""
    desired = _replicas(deployment)
    rolling = deployment["spec"].get("strategy", {}).get("rollingUpdate", {})
    surge = scaled(rolling.get("maxSurge", "25%"), desired, round_up=True)
    unavailable = scaled(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1  # deploymentutil.ResolveFenceposts: both zero would block the rollout
    all_replicas = sum(_replicas(rs) for rs in [new, *old])
    # reconcileNewReplicaSet: up to desired, as long as all pods stay within desired + maxSurge.
    scale_up = min(desired - _replicas(new), desired + surge - all_replicas)
    if scale_up > 0:
        await _scale(cluster, new, _replicas(new) + scale_up)
        return
    # reconcileOldReplicaSets: what may go while desired - maxUnavailable stay available.
    min_available = desired - unavailable
    new_unavailable = _replicas(new) - ready[new["metadata"]["uid"]]
    budget = all_replicas - min_available - new_unavailable
    if budget <= 0:
        return
    for rs in old:  # cleanupUnhealthyReplicas: old pods that are not ready go first
        uid = rs["metadata"]["uid"]
        cut = min(budget, _replicas(rs) - ready[uid])
        if cut > 0:
            await _scale(cluster, rs, _replicas(rs) - cut)
            rs["spec"]["replicas"] = _replicas(rs) - cut
            budget -= cut
    available = sum(ready.values())
    budget = available - min_available
    for rs in old:  # scaleDownOldReplicaSetsForRollingUpdate
        cut = min(budget, _replicas(rs))
        if cut > 0:
            await _scale(cluster, rs, _replicas(rs) - cut)
            budget -= cut


async def _report_deployment(
    cluster: ApiClient, snapshot: Snapshot, deployment: JSON, new: JSON, owned: list[JSON]
) -> None:
    pods = [pod for rs in owned for pod in snapshot.controlled_by("pods", rs)]
    updated = [pod for pod in pods if pod["metadata"].get("labels", {}).get(POD_TEMPLATE_HASH) == _hash_of(new)]
    ready = sum(1 for pod in pods if pod_ready(pod))
    generation = int(deployment["metadata"]["generation"])
    status = deployment.get("status", {})
    now = (status.get("observedGeneration"), status.get("replicas"), status.get("updatedReplicas"))
    if now == (generation, len(pods), len(updated)) and status.get("readyReplicas", 0) == ready:
        return  # like the controller, write only what changed
    await cluster.report_deployment(
        snapshot.namespace, deployment["metadata"]["name"], generation, len(pods), ready, updated=len(updated)
    )


def _hash_of(replica_set: Mapping[str, Any]) -> str | None:
    labels: Mapping[str, str] = replica_set["metadata"].get("labels", {})
    return labels.get(POD_TEMPLATE_HASH)


def _delete_order(pod: Mapping[str, Any]) -> tuple[bool, str]:
    """Which pod a controller deletes first: not ready before ready, then the newest (controller.ActivePods)."""
    return (pod_ready(pod), "".join(chr(0x10FFFF - ord(c)) for c in pod["metadata"].get("creationTimestamp", "")))


async def reconcile_replica_set(
    cluster: ApiClient, snapshot: Snapshot, replica_set: JSON, admission: Sequence[Admission] = ()
) -> None:
    pods = snapshot.controlled_by("pods", replica_set)
    wanted = _replicas(replica_set)
    meta = replica_set["metadata"]
    for _ in range(wanted - len(pods)):
        name = f"{meta['name']}-{''.join(secrets.choice(_SAFE_ALPHABET) for _ in range(5))}"
        await create_pod(
            cluster, new_pod(name, meta["namespace"], replica_set["spec"]["template"], replica_set), admission
        )
    for pod in sorted(pods, key=_delete_order)[: max(0, len(pods) - wanted)]:
        await delete(cluster, "v1", "pods", pod)
    ready = sum(1 for pod in pods if pod_ready(pod))
    status = {
        "replicas": len(pods),
        "fullyLabeledReplicas": len(pods),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": int(meta.get("generation", 1)),
    }
    await patch_status(cluster, "apps/v1", "replicasets", replica_set, status)


# --- StatefulSet ------------------------------------------------------------------------------


async def _revision(cluster: ApiClient, snapshot: Snapshot, statefulset: JSON) -> str:
    """The StatefulSet's update revision: a ControllerRevision of its template (made when missing)."""
    meta = statefulset["metadata"]
    name = f"{meta['name']}-{template_hash(statefulset['spec']['template'])}"
    if snapshot.named("controllerrevisions", name) is None:
        revisions = snapshot.controlled_by("controllerrevisions", statefulset)
        revision = {
            "apiVersion": "apps/v1",
            "kind": "ControllerRevision",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": dict(statefulset["spec"].get("selector", {}).get("matchLabels", {})),
                "ownerReferences": [controller_reference(statefulset)],
            },
            "data": {"spec": {"template": statefulset["spec"]["template"]}},
            "revision": 1 + max((int(r.get("revision", 0)) for r in revisions), default=0),
        }
        with contextlib.suppress(ApiRejected):
            await cluster.create(revision, "controllerrevisions")
    return name


def stateful_pod(statefulset: JSON, ordinal: int, revision: str, template: Mapping[str, Any]) -> JSON:
    """Pod `<statefulset>-<ordinal>` (pkg/controller/statefulset/stateful_set_utils.go newVersionedStatefulSetPod)."""
    meta = statefulset["metadata"]
    name = f"{meta['name']}-{ordinal}"
    pod = new_pod(name, meta["namespace"], template, statefulset)
    pod["metadata"]["labels"].update({REVISION_HASH: revision, POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal)})
    pod["spec"]["hostname"] = name
    if statefulset["spec"].get("serviceName"):
        pod["spec"]["subdomain"] = statefulset["spec"]["serviceName"]
    return pod


async def reconcile_stateful_set(
    cluster: ApiClient, snapshot: Snapshot, statefulset: JSON, admission: Sequence[Admission] = ()
) -> None:
    spec = statefulset["spec"]
    update_revision = await _revision(cluster, snapshot, statefulset)
    current_revision = statefulset.get("status", {}).get("currentRevision") or update_revision
    start = int(spec.get("ordinals", {}).get("start", 0))
    ordinals = range(start, start + _replicas(statefulset))
    pods = {pod["metadata"]["name"]: pod for pod in snapshot.controlled_by("pods", statefulset)}
    rolling = spec.get("updateStrategy", {}).get("rollingUpdate", {})
    partition = int(rolling.get("partition", 0))
    name = statefulset["metadata"]["name"]
    for ordinal in ordinals:
        if f"{name}-{ordinal}" in pods:
            continue
        revision, template = update_revision, spec["template"]
        if ordinal < partition and current_revision != update_revision:  # below the partition: the current revision
            stored = snapshot.named("controllerrevisions", current_revision)
            if stored is not None:
                revision, template = current_revision, stored["data"]["spec"]["template"]
        await create_pod(cluster, stateful_pod(statefulset, ordinal, revision, template), admission)
    for pod in pods.values():  # scaled in
        if int(pod["metadata"]["labels"].get(POD_INDEX_LABEL, -1)) not in ordinals:
            await delete(cluster, "v1", "pods", pod)
    # RollingUpdate: outdated pods at or above the partition, highest ordinal first, within maxUnavailable.
    in_range = [pods.get(f"{name}-{ordinal}") for ordinal in ordinals]
    unavailable = sum(1 for pod in in_range if pod is None or not pod_ready(pod))
    budget = max(1, scaled(rolling.get("maxUnavailable", 1), _replicas(statefulset), round_up=False)) - unavailable
    for ordinal in reversed(ordinals):
        outdated = pods.get(f"{name}-{ordinal}")
        if budget <= 0 or ordinal < partition:
            break
        if outdated is not None and outdated["metadata"]["labels"].get(REVISION_HASH) != update_revision:
            await delete(cluster, "v1", "pods", outdated)
            budget -= 1 if pod_ready(outdated) else 0
    present = [pod for pod in in_range if pod is not None]
    ready = sum(1 for pod in present if pod_ready(pod))
    updated = sum(1 for pod in present if pod["metadata"]["labels"].get(REVISION_HASH) == update_revision)
    all_updated = updated == len(ordinals) and len(present) == len(ordinals)
    status = {
        "observedGeneration": int(statefulset["metadata"].get("generation", 1)),
        "replicas": len(present),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": len(present) if all_updated else len(present) - updated,
        "updatedReplicas": updated,
        "currentRevision": update_revision if all_updated else current_revision,
        "updateRevision": update_revision,
    }
    await patch_status(cluster, "apps/v1", "statefulsets", statefulset, status)


def event(involved: Mapping[str, Any], reason: str, message: str, *, component: str, warning: bool = False) -> JSON:
    """A core/v1 Event about `involved`, as a controller's recorder writes it."""
    meta = involved["metadata"]
    now = utc_now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }

"""Which pods are a resource's own: the owner chain from the pod up to the resource's workload. Pure.

Labels say nothing about who made a pod: anyone who may create pods in the namespace can copy
them. A pod counts only when its controller chain leads to the workload the operator created and
owns. The walk is generic over any chain of controller references through objects the caller
listed (the watched ReplicaSets, StatefulSets and pods):
- a Deployment's pod: Pod -> ReplicaSet -> Deployment;
- a LeaderWorkerSet's pods, as LeaderWorkerSet v0.10 builds them (kubernetes-sigs/lws v0.10.0):
  the leader StatefulSet, named after the LeaderWorkerSet and controlled by it
  (pkg/controllers/leaderworkerset_controller.go, SSAWithStatefulset ->
  setControllerReferenceWithStatefulSet), runs one leader pod per group; each leader pod controls
  its group's worker StatefulSet, named after the leader pod (pkg/controllers/pod_controller.go,
  constructWorkerStatefulSetApplyConfiguration), which runs the group's worker pods. So a leader
  is Pod -> StatefulSet -> LeaderWorkerSet and a worker Pod -> StatefulSet -> leader Pod ->
  StatefulSet -> LeaderWorkerSet: a worker of someone else's LeaderWorkerSet never reaches ours,
  whatever labels it carries.

An owner reference is not authenticated by the API server: whoever may create pods in the
namespace can write one naming our ReplicaSet. Such a pod is also counted by the ReplicaSet
controller as one of its replicas (and surplus replicas are deleted), so the forgery is visible
and short-lived; keeping pod creation in the namespace to trusted subjects is RBAC's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from npu_operator.kube.names import LWS_GROUP_INDEX_LABEL, LWS_WORKER_INDEX_LABEL

# Deepest chain followed: a LeaderWorkerSet worker pod is four controller links from its root.
MAX_DEPTH: Final = 4

# A pod's rank comes from the labels LeaderWorkerSet v0.10 puts on every pod of a group
# (api/leaderworkerset/v1/leaderworkerset_types.go: GroupIndexLabelKey, WorkerIndexLabelKey). Its
# pod webhook sets them (pkg/webhooks/pod_webhook.go, Default): group-index from the leader pod's
# StatefulSet ordinal (copied to the workers by their StatefulSet's template, pod_controller.go),
# worker-index 0 on the leader and the worker StatefulSet's ordinal (from 1) on each worker. They
# are read only from pods that passed the owner check.
# Highest group or node index read from a label: far above any LeaderWorkerSet this operator builds.
MAX_INDEX: Final = 1 << 16


def rank_of(pod: Mapping[str, Any]) -> tuple[int, int] | None:
    """(group index, node index) of a LeaderWorkerSet pod from its labels; None for any other pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    group, node = labels.get(LWS_GROUP_INDEX_LABEL), labels.get(LWS_WORKER_INDEX_LABEL)
    if not (isinstance(group, str) and isinstance(node, str) and group.isdigit() and node.isdigit()):
        return None
    if int(group) > MAX_INDEX or int(node) > MAX_INDEX:
        return None
    return int(group), int(node)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controller (the owner reference with `controller: true`)."""
    references = (obj.get("metadata") or {}).get("ownerReferences") or []
    for reference in references if isinstance(references, list) else []:
        if isinstance(reference, Mapping) and reference.get("controller") is True and reference.get("uid"):
            return str(reference["uid"])
    return None


def owned_pods(
    pods: Sequence[Mapping[str, Any]], intermediates: Iterable[Mapping[str, Any]], workload_uid: str
) -> list[Mapping[str, Any]]:
    """The pods whose controller chain, through `intermediates`, reaches the workload `workload_uid`."""
    return [pod for pod, chain in zip(pods, owner_chains(pods, intermediates), strict=True) if workload_uid in chain]


def owner_chains(pods: Sequence[Mapping[str, Any]], intermediates: Iterable[Mapping[str, Any]]) -> list[frozenset[str]]:
    """For each pod, the uids its controller chain reaches through `intermediates` (MAX_DEPTH links
    at most, up to the first owner not among them): a pod is a workload's when its uid is in there.
    One walk per pod, whatever the number of workloads asked about."""
    by_uid = {str(obj["metadata"]["uid"]): obj for obj in intermediates if (obj.get("metadata") or {}).get("uid")}
    return [_chain(pod, by_uid) for pod in pods]


def _chain(obj: Mapping[str, Any], by_uid: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    reached: list[str] = []
    for _ in range(MAX_DEPTH):
        owner = controller_uid(obj)
        if owner is None:
            break
        reached.append(owner)
        if owner not in by_uid:
            break
        obj = by_uid[owner]
    return frozenset(reached)

"""Which pods are a resource's own: the owner chain from the pod up to the resource's workload. Pure.

Labels say nothing about who made a pod: anyone who may create pods in the namespace can copy
them. A pod counts only when its controller chain leads to the workload the operator created and
owns: Pod -> ReplicaSet -> Deployment today. The walk is generic over any chain of controller
references through objects the caller listed, so a LeaderWorkerSet chain (worker Pod ->
StatefulSet -> leader Pod -> StatefulSet -> LeaderWorkerSet) needs only its objects listed
(the leader pods among them).

An owner reference is not authenticated by the API server: whoever may create pods in the
namespace can write one naming our ReplicaSet. Such a pod is also counted by the ReplicaSet
controller as one of its replicas (and surplus replicas are deleted), so the forgery is visible
and short-lived; keeping pod creation in the namespace to trusted subjects is RBAC's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

# Deepest chain followed: a LeaderWorkerSet worker pod is four controller links from its root.
MAX_DEPTH: Final = 4


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
    by_uid = {str(obj["metadata"]["uid"]): obj for obj in intermediates if (obj.get("metadata") or {}).get("uid")}
    return [pod for pod in pods if _leads_to(pod, by_uid, workload_uid)]


def _leads_to(obj: Mapping[str, Any], by_uid: Mapping[str, Mapping[str, Any]], root: str) -> bool:
    for _ in range(MAX_DEPTH):
        owner = controller_uid(obj)
        if owner is None:
            return False
        if owner == root:
            return True
        if owner not in by_uid:
            return False
        obj = by_uid[owner]
    return False

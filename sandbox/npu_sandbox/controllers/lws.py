"""A stand-in for the LeaderWorkerSet controller (kubernetes-sigs/lws v0.10.0), over the API.

It turns a `leaderworkerset.x-k8s.io/v1` LeaderWorkerSet into what LeaderWorkerSet v0.10 creates,
and keeps its status; the StatefulSet controller (`npu_sandbox.controllers.workloads`) makes the pods and
the kubelet (`npu_sandbox.node.kubelet`) runs them. Every behaviour below names the LWS source it
follows (repository kubernetes-sigs/lws, tag v0.10.0; paths under it):

- the leader StatefulSet, named after the LeaderWorkerSet, one leader pod per group, with the
  labels, annotations, selector, Parallel pod management, partition and maxUnavailable of
  pkg/controllers/leaderworkerset_controller.go `constructLeaderStatefulSetApplyConfiguration`,
  replicas and partition from `rollingUpdateParameters` (a template change rolls out group by
  group, from the highest index down, within maxUnavailable and maxSurge);
- per leader pod, the worker StatefulSet named after it, owned by the leader pod, ordinals from 1
  (pkg/controllers/pod_controller.go `constructWorkerStatefulSetApplyConfiguration`), made as soon
  as the leader pod exists (startupPolicy LeaderCreated) or once it is ready (LeaderReady),
  from the template of the leader's revision (`Reconcile`);
- the headless Services of networkConfig.subdomainPolicy, each created only if no Service of its
  name exists yet, whoever made it (pkg/utils/controller/controller_utils.go
  `CreateHeadlessServiceIfNotExists`: clusterIP None, publishNotReadyAddresses, the set's name
  label): under Shared one named after the LeaderWorkerSet, selecting all its pods
  (leaderworkerset_controller.go `reconcileHeadlessServices`), which the leader and worker
  StatefulSets name as their serviceName; under UniquePerReplica one per group, named after the
  group's leader pod, selecting the group's pods and owned by the leader pod (pod_controller.go
  `Reconcile`), the leader pod template annotated with the policy
  (`constructLeaderStatefulSetApplyConfiguration`) and the worker StatefulSet's serviceName the
  leader pod's name (`constructWorkerStatefulSetApplyConfiguration`);
- the pod webhook's labels, subdomain and environment (pkg/webhooks/pod_webhook.go `Default`,
  pkg/utils/pod/pod_utils.go `AddLWSVariables`): group-index and group-key on leaders,
  worker-index on workers, a UniquePerReplica leader's subdomain set to its own name,
  LWS_LEADER_ADDRESS (`<lws>-<group>.<the pod's subdomain>.<namespace>`), LWS_GROUP_SIZE,
  LWS_WORKER_INDEX first in every container's env (v0.10 injects no other LWS_* variable);
- revisions as ControllerRevisions labelled with the template-revision-hash
  (pkg/utils/revision/revision_utils.go `NewRevision`; the hash here is of the same fields,
  leaderWorkerTemplate and networkConfig, with another function);
- restartPolicy RecreateGroupOnPodRestart: a pod of a group whose container restarted gets the
  group's leader pod deleted, and with it (owner references) the worker StatefulSet and its pods
  (pod_controller.go `handleRestartPolicy`, pkg/utils/pod/pod_utils.go `ContainerRestarted`);
- the status: replicas, readyReplicas, updatedReplicas, observedGeneration, hpaPodSelector and
  the Available / Progressing / UpdateInProgress conditions (leaderworkerset_controller.go
  `updateStatus`, `updateConditions`, `makeCondition`, `setCondition`);
- the defaults its CRD and webhook give (config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml,
  pkg/webhooks/leaderworkerset_webhook.go `Default`): the emulator stores a LeaderWorkerSet as
  written, so the stand-in reads it with them.

LWS_LEADER_ADDRESS resolves in a pod exactly when the cluster DNS would answer it: through a
headless Service named after the pod's subdomain that selects the leader (the kubelet's DNS,
`npu_sandbox.node.dns`). So a Shared LeaderWorkerSet whose name another Service (the operator's
ClusterIP Service, say) already holds gets no headless Service, and its workers cannot resolve
their leader, here as on a cluster. Not emulated: subGroupPolicy, exclusive topology,
volumeClaimTemplates, scheduler providers, and a deleted (not restarted) pod triggering a group
restart (the emulator deletes pods at once, with no deletionTimestamp for the controller to see).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers.workloads import (
    JSON,
    Snapshot,
    controller_reference,
    delete,
    event,
    pod_ready,
    scaled,
    template_hash,
)

API_VERSION: Final = "leaderworkerset.x-k8s.io/v1"
KIND: Final = "LeaderWorkerSet"
PLURAL: Final = "leaderworkersets"
COMPONENT: Final = "lws"  # leaderworkerset_controller.go: fieldManager "lws"

# api/leaderworkerset/v1/leaderworkerset_types.go, the label and annotation keys.
NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"  # SetNameLabelKey
GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"  # GroupIndexLabelKey
WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"  # WorkerIndexLabelKey
GROUP_KEY_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-key"  # GroupUniqueHashLabelKey
REVISION_LABEL: Final = "leaderworkerset.sigs.k8s.io/template-revision-hash"  # RevisionKey
SIZE_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/size"  # SizeAnnotationKey
REPLICAS_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/replicas"  # ReplicasAnnotationKey
LEADER_NAME_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/leader-name"  # LeaderPodNameAnnotationKey
SUBDOMAIN_POLICY_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/subdomainPolicy"  # SubdomainPolicyAnnotationKey
SHARED: Final = "Shared"  # SubdomainShared
UNIQUE_PER_REPLICA: Final = "UniquePerReplica"  # SubdomainUniquePerReplica
LEADER_ADDRESS_ENV: Final = "LWS_LEADER_ADDRESS"
GROUP_SIZE_ENV: Final = "LWS_GROUP_SIZE"
WORKER_INDEX_ENV: Final = "LWS_WORKER_INDEX"
RECREATE_GROUP: Final = "RecreateGroupOnPodRestart"
# pkg/utils/statefulset/statefulset_utils.go statefulPodRegex
_STATEFUL_POD: Final = re.compile(r"(.*)-([0-9]+)$")


def defaulted(lws: Mapping[str, Any]) -> JSON:
    """The LeaderWorkerSet with its CRD's and webhook's defaults (replicas 1, size 1, RollingUpdate
    with maxUnavailable 1, maxSurge 0, partition 0, LeaderCreated, RecreateGroupOnPodRestart, Shared)."""
    obj = copy.deepcopy(dict(lws))
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("startupPolicy", "LeaderCreated")
    template = spec.setdefault("leaderWorkerTemplate", {})
    template.setdefault("size", 1)
    if template.get("restartPolicy", "") in ("", None):
        template["restartPolicy"] = RECREATE_GROUP
    if template["restartPolicy"] == "Default":  # deprecated name of None (leaderworkerset_webhook.go Default)
        template["restartPolicy"] = "None"
    strategy = spec.setdefault("rolloutStrategy", {})
    strategy.setdefault("type", "RollingUpdate")
    rolling = strategy.setdefault("rollingUpdateConfiguration", {})
    rolling.setdefault("maxUnavailable", 1)
    rolling.setdefault("maxSurge", 0)
    rolling.setdefault("partition", 0)
    network = spec.get("networkConfig") or {}
    network.setdefault("subdomainPolicy", SHARED)
    spec["networkConfig"] = network
    return obj


def unique_per_replica(lws: Mapping[str, Any]) -> bool:
    """networkConfig.subdomainPolicy is UniquePerReplica (missing: Shared)."""
    return bool(defaulted(lws)["spec"]["networkConfig"]["subdomainPolicy"] == UNIQUE_PER_REPLICA)


def revision_key(lws: Mapping[str, Any]) -> str:
    """The template-revision-hash: a hash of leaderWorkerTemplate and networkConfig (revision_utils.go getPatch)."""
    spec = defaulted(lws)["spec"]
    return template_hash({"leaderWorkerTemplate": spec["leaderWorkerTemplate"], "networkConfig": spec["networkConfig"]})


def revision(lws: Mapping[str, Any], number: int) -> JSON:
    """The ControllerRevision that keeps this template (revision_utils.go NewRevision: `<lws>-<hash>-<n>`)."""
    spec = defaulted(lws)["spec"]
    key = revision_key(lws)
    meta = lws["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": f"{meta['name'][:220]}-{key}-{number}",
            "namespace": meta["namespace"],
            "labels": {NAME_LABEL: meta["name"], REVISION_LABEL: key},
            "ownerReferences": [controller_reference(lws)],
        },
        "data": {
            "spec": {"leaderWorkerTemplate": spec["leaderWorkerTemplate"], "networkConfig": spec["networkConfig"]}
        },
        "revision": number,
    }


def _max_surge_and_unavailable(spec: Mapping[str, Any]) -> tuple[int, int]:
    replicas = int(spec["replicas"])
    rolling = spec["rolloutStrategy"]["rollingUpdateConfiguration"]
    surge = min(
        scaled(rolling["maxSurge"], replicas, round_up=True), replicas
    )  # "No need to burst more than the replicas"
    unavailable = scaled(rolling["maxUnavailable"], replicas, round_up=False)
    return surge, unavailable


def leader_statefulset(lws: Mapping[str, Any], partition: int, replicas: int, key: str) -> JSON:
    """leaderworkerset_controller.go constructLeaderStatefulSetApplyConfiguration (and its owner reference)."""
    obj = defaulted(lws)
    spec, meta = obj["spec"], obj["metadata"]
    lwt = spec["leaderWorkerTemplate"]
    template = copy.deepcopy(lwt.get("leaderTemplate") or lwt["workerTemplate"])
    template_meta = template.setdefault("metadata", {})
    template_meta["labels"] = {
        **template_meta.get("labels", {}),
        WORKER_INDEX_LABEL: "0",
        NAME_LABEL: meta["name"],
        REVISION_LABEL: key,
    }
    template_meta["annotations"] = {**template_meta.get("annotations", {}), SIZE_ANNOTATION: str(lwt["size"])}
    if unique_per_replica(obj):  # the pod webhook then makes the leader's subdomain its own name
        template_meta["annotations"][SUBDOMAIN_POLICY_ANNOTATION] = UNIQUE_PER_REPLICA
    surge, unavailable = _max_surge_and_unavailable(spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {**meta.get("labels", {}), NAME_LABEL: meta["name"], REVISION_LABEL: key},
            "annotations": {**meta.get("annotations", {}), REPLICAS_ANNOTATION: str(spec["replicas"])},
            "ownerReferences": [controller_reference(lws)],
        },
        "spec": {
            "serviceName": meta["name"],
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "template": template,
            "updateStrategy": {
                "type": spec["rolloutStrategy"]["type"],
                # "make sure that stsMaxUnavailable is at least 1"
                "rollingUpdate": {"maxUnavailable": max(1, unavailable + surge), "partition": partition},
            },
            "selector": {"matchLabels": {NAME_LABEL: meta["name"], WORKER_INDEX_LABEL: "0"}},
        },
    }


def worker_statefulset(
    leader_pod: Mapping[str, Any], lws: Mapping[str, Any], worker_template: Mapping[str, Any]
) -> JSON:
    """pod_controller.go constructWorkerStatefulSetApplyConfiguration: the group's workers, owned by its leader pod."""
    obj = defaulted(lws)
    meta, lwt = obj["metadata"], obj["spec"]["leaderWorkerTemplate"]
    leader_labels = leader_pod["metadata"]["labels"]
    selector = {
        GROUP_INDEX_LABEL: leader_labels[GROUP_INDEX_LABEL],
        NAME_LABEL: meta["name"],
        GROUP_KEY_LABEL: leader_labels[GROUP_KEY_LABEL],
    }
    labels = {**selector, REVISION_LABEL: leader_labels.get(REVISION_LABEL, "")}
    template = copy.deepcopy(dict(worker_template))
    template_meta = template.setdefault("metadata", {})
    template_meta["labels"] = {**template_meta.get("labels", {}), **labels}
    template_meta["annotations"] = {
        **template_meta.get("annotations", {}),
        SIZE_ANNOTATION: str(lwt["size"]),
        LEADER_NAME_ANNOTATION: leader_pod["metadata"]["name"],
    }
    statefulset: JSON = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": leader_pod["metadata"]["name"],
            "namespace": meta["namespace"],
            "labels": {**meta.get("labels", {}), **labels},
            "ownerReferences": [controller_reference(leader_pod)],
        },
        "spec": {
            # The group's own headless Service under UniquePerReplica, the set's under Shared.
            "serviceName": leader_pod["metadata"]["name"] if unique_per_replica(obj) else meta["name"],
            "replicas": int(lwt["size"]) - 1,
            "podManagementPolicy": "Parallel",
            "template": template,
            "ordinals": {"start": 1},
            "selector": {"matchLabels": selector},
        },
    }
    if meta.get("annotations"):
        statefulset["metadata"]["annotations"] = dict(meta["annotations"])
    return statefulset


def headless_service(
    lws: Mapping[str, Any],
    name: str | None = None,
    selector: Mapping[str, str] | None = None,
    owner: Mapping[str, Any] | None = None,
) -> JSON:
    """controller_utils.go CreateHeadlessServiceIfNotExists's Service: by default Shared's (named after
    the set, selecting all its pods, owned by it); UniquePerReplica passes the leader pod's name, the
    group's selector and the leader pod as the owner (`group_service`)."""
    meta = lws["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name or meta["name"],
            "namespace": meta["namespace"],
            "labels": {NAME_LABEL: meta["name"]},
            "ownerReferences": [controller_reference(owner or lws)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": dict(selector or {NAME_LABEL: meta["name"]}),
            "publishNotReadyAddresses": True,
        },
    }


def group_service(lws: Mapping[str, Any], leader_pod: Mapping[str, Any]) -> JSON:
    """pod_controller.go Reconcile, UniquePerReplica: the group's headless Service, named after its leader
    pod, selecting the set's pods of the leader's group, owned by the leader pod."""
    name = lws["metadata"]["name"]
    group = leader_pod["metadata"]["labels"][GROUP_INDEX_LABEL]
    return headless_service(
        lws, leader_pod["metadata"]["name"], {NAME_LABEL: name, GROUP_INDEX_LABEL: group}, leader_pod
    )


async def create_headless_service_if_not_exists(cluster: ApiClient, snapshot: Snapshot, service: JSON) -> None:
    """controller_utils.go CreateHeadlessServiceIfNotExists: created only when no Service has its name, whatever
    that Service is (another's ClusterIP Service keeps the name, and no pod of the set gets a DNS record
    through it). A create that loses a race to the same name is the same case."""
    if snapshot.named("services", service["metadata"]["name"]) is not None:
        return
    with contextlib.suppress(ApiRejected):
        await cluster.create(service, "services")


def parent_and_ordinal(name: str) -> tuple[str, int]:
    """statefulset_utils.go GetParentNameAndOrdinal."""
    match = _STATEFUL_POD.fullmatch(name)
    return (match[1], int(match[2])) if match else ("", -1)


def group_key(namespace: str, leader_name: str) -> str:
    """pod_webhook.go genGroupUniqueKey: sha1 of `<namespace>/<leader pod name>`."""
    return hashlib.sha1(f"{namespace}/{leader_name}".encode(), usedforsecurity=False).hexdigest()


def admit_pod(pod: JSON) -> None:
    """LWS's mutating pod webhook (pod_webhook.go Default, pod_utils.go AddLWSVariables); other pods pass."""
    meta = pod["metadata"]
    labels = meta.setdefault("labels", {})
    if NAME_LABEL not in labels:
        return
    _, ordinal = parent_and_ordinal(meta["name"])
    if labels.get(WORKER_INDEX_LABEL) == "0":
        labels.setdefault(GROUP_INDEX_LABEL, str(ordinal))
        if meta.get("annotations", {}).get(SUBDOMAIN_POLICY_ANNOTATION) == UNIQUE_PER_REPLICA:
            pod["spec"]["subdomain"] = meta["name"]
        labels.setdefault(GROUP_KEY_LABEL, group_key(meta["namespace"], meta["name"]))
    else:
        labels[WORKER_INDEX_LABEL] = str(ordinal)
    spec = pod["spec"]
    address = f"{labels[NAME_LABEL]}-{labels[GROUP_INDEX_LABEL]}.{spec.get('subdomain', '')}.{meta['namespace']}"
    injected = [
        {"name": LEADER_ADDRESS_ENV, "value": address},
        {"name": GROUP_SIZE_ENV, "value": meta.get("annotations", {})[SIZE_ANNOTATION]},
        {"name": WORKER_INDEX_ENV, "value": labels[WORKER_INDEX_LABEL]},
    ]
    names = {var["name"] for var in injected}
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:  # addEnvVarsIfNotExists
        container["env"] = injected + [var for var in container.get("env", []) if var["name"] not in names]


def container_restarted(pod: Mapping[str, Any]) -> bool:
    """pod_utils.go ContainerRestarted: Running or Pending with a restarted (init) container."""
    status = pod.get("status", {})
    if status.get("phase") not in ("Running", "Pending"):
        return False
    statuses = [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
    return any(int(s.get("restartCount", 0)) > 0 for s in statuses)


def statefulset_ready(statefulset: Mapping[str, Any]) -> bool:
    """statefulset_utils.go StatefulsetReady."""
    status = statefulset.get("status", {})
    return int(statefulset["spec"].get("replicas", 1)) == int(status.get("availableReplicas", 0)) and status.get(
        "currentRevision"
    ) == status.get("updateRevision")


# --- rolling update (leaderworkerset_controller.go) ---------------------------------------------


def _states(lws: JSON, snapshot: Snapshot, replicas: int, key: str) -> list[tuple[bool, bool]]:
    """getReplicaStates: (ready, updated) per group index below `replicas`."""
    name = lws["metadata"]["name"]
    leaders = {pod["metadata"]["name"]: pod for pod in _leader_pods(snapshot, name)}
    no_workers = int(lws["spec"]["leaderWorkerTemplate"]["size"]) == 1
    states = []
    for index in range(replicas):
        pod = leaders.get(f"{name}-{index}")
        workers = snapshot.named("statefulsets", f"{name}-{index}")
        if pod is None or (not no_workers and workers is None):
            states.append((False, False))
            continue
        ready = pod_ready(pod) and (no_workers or statefulset_ready(workers or {}))
        updated = _revision_of(pod) == key and (no_workers or _revision_of(workers or {}) == key)
        states.append((ready, updated))
    return states


def _revision_of(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("labels", {}).get(REVISION_LABEL, ""))


def rolling_update_partition(states: Sequence[tuple[bool, bool]], replicas: int, step: int, current: int) -> int:
    """rollingUpdatePartition."""
    continuous = 0
    for ready, updated in reversed(states):  # calculateContinuousReadyReplicas
        if not (ready and updated):
            break
        continuous += 1
    step_partition = max(0, replicas - continuous - step)
    partition = step_partition + sum(1 for ready, _ in states[:step_partition] if not ready)
    index = min(partition, replicas - 1)
    while index >= step_partition:
        ready, updated = states[index]
        if not ready or updated:
            partition = index
        else:
            break
        index -= 1
    return min(partition, current)


def rolling_update_replicas(replicas: int, surge: int, unavailable: int, unready: int) -> int:
    """calculateRollingUpdateReplicas: keep surge groups while more desired groups are unready than
    maxUnavailable allows, reclaim them gradually after."""
    return replicas + max(0, unready - unavailable) if unready <= surge else replicas + surge


def rolling_update_parameters(
    lws: JSON, snapshot: Snapshot, leader: JSON | None, key: str, updated: bool
) -> tuple[int, int]:
    """rollingUpdateParameters: the leader StatefulSet's partition and replicas."""
    spec = lws["spec"]
    replicas = int(spec["replicas"])
    lws_partition = int(spec["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"])
    if leader is None:  # Case 1: not created yet
        return max(0, lws_partition), replicas
    sts_replicas = int(leader["spec"]["replicas"])
    surge, unavailable = _max_surge_and_unavailable(spec)
    burst = replicas + surge

    def want(unready: int) -> int:
        return rolling_update_replicas(replicas, surge, unavailable, unready)

    if updated:  # Case 2: a new rolling update; scaling first
        partition = min(replicas, sts_replicas)
        return max(partition, lws_partition), (replicas if sts_replicas < replicas else want(replicas))
    partition = int(leader["spec"]["updateStrategy"]["rollingUpdate"]["partition"])
    if partition == 0 and sts_replicas == replicas:  # Case 3: no rolling update
        return max(0, lws_partition), replicas
    if sts_replicas < replicas:
        return max(partition, lws_partition), replicas
    states = _states(lws, snapshot, sts_replicas, key)
    unready = sum(1 for index in range(replicas) if index >= len(states) or not all(states[index]))
    original = int(leader["metadata"].get("annotations", {}).get(REPLICAS_ANNOTATION, replicas))
    if original != replicas:  # Case 4: replicas changed during the rolling update
        return max(min(partition, burst), lws_partition), want(unready)
    step = unavailable + surge - (burst - sts_replicas)  # Case 5
    partition = rolling_update_partition(states, sts_replicas, step, partition)
    return max(partition, lws_partition), want(unready)


# --- status (leaderworkerset_controller.go updateStatus, updateConditions) -------------------------


def _leader_pods(snapshot: Snapshot, name: str) -> list[JSON]:
    return [
        pod
        for pod in snapshot.of("pods")
        if pod["metadata"].get("labels", {}).get(NAME_LABEL) == name
        and pod["metadata"]["labels"].get(WORKER_INDEX_LABEL) == "0"
    ]


def _condition(kind: str, generation: int, now: str) -> JSON:
    """makeCondition."""
    reason, message = {
        "Available": ("AllGroupsReady", "All replicas are ready"),
        "UpdateInProgress": ("GroupsUpdating", "Rolling Upgrade is in progress"),
        "Progressing": ("GroupsProgressing", "Replicas are progressing"),
    }[kind]
    return {
        "type": kind,
        "status": "True",
        "lastTransitionTime": now,
        "observedGeneration": generation,
        "reason": reason,
        "message": message,
    }


def set_conditions(existing: Sequence[Mapping[str, Any]], new: Sequence[JSON], generation: int, now: str) -> list[JSON]:
    """setConditions / setCondition: true conditions added; Available excludes Progressing and UpdateInProgress."""
    conditions = [dict(c) for c in existing]
    exclusive = {frozenset({"Available", "Progressing"}), frozenset({"Available", "UpdateInProgress"})}
    for condition in new:
        found = False
        for index, current in enumerate(conditions):
            if current["type"] == condition["type"]:
                found = True
                if current["status"] != condition["status"] or current.get("observedGeneration") != generation:
                    conditions[index] = dict(condition)
            elif frozenset({current["type"], condition["type"]}) in exclusive and current["status"] == "True":
                conditions[index] = {
                    **current,
                    "status": "False",
                    "lastTransitionTime": now,
                    "observedGeneration": generation,
                }
        if not found:
            conditions.append(dict(condition))
    return [{**c, "observedGeneration": generation} for c in conditions]


def status_of(lws: JSON, snapshot: Snapshot, leader: Mapping[str, Any] | None, key: str, now: str) -> JSON:
    spec, meta = lws["spec"], lws["metadata"]
    replicas, generation = int(spec["replicas"]), int(meta.get("generation", 1))
    partition = int(spec["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"])
    no_workers = int(spec["leaderWorkerTemplate"]["size"]) == 1
    ready_count = updated_count = ready_non_burst = updated_non_burst = current_non_burst = updated_and_ready = 0
    for pod in _leader_pods(snapshot, meta["name"]):
        index = int(pod["metadata"]["labels"].get(GROUP_INDEX_LABEL, -1))
        workers = None if no_workers else snapshot.named("statefulsets", pod["metadata"]["name"])
        if not no_workers and workers is None:
            continue
        in_scope = partition <= index < replicas
        current_non_burst += in_scope
        ready = pod_ready(pod) and (no_workers or statefulset_ready(workers or {}))
        updated = _revision_of(pod) == key and (no_workers or _revision_of(workers or {}) == key)
        ready_count += ready
        updated_count += updated
        updated_non_burst += updated and in_scope
        if index < replicas:
            ready_non_burst += ready
            updated_and_ready += ready and updated and index >= partition
    if updated_non_burst < current_non_burst:
        new = [_condition("UpdateInProgress", generation, now), _condition("Progressing", generation, now)]
    elif ready_non_burst == replicas and updated_and_ready == current_non_burst:
        new = [_condition("Available", generation, now)]
    else:
        new = [_condition("Progressing", generation, now)]
    current = lws.get("status", {})
    return {
        "replicas": int((leader or {}).get("status", {}).get("replicas", 0)),
        "readyReplicas": ready_count,
        "updatedReplicas": updated_count,
        "observedGeneration": generation,
        "hpaPodSelector": f"{NAME_LABEL}={meta['name']},{WORKER_INDEX_LABEL}=0",
        "conditions": set_conditions(current.get("conditions", []), new, generation, now),
    }


def _conditions_changed(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> bool:
    def key(conditions: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((c["type"], c["status"], c.get("observedGeneration")) for c in conditions)

    return key(old) != key(new)


# --- the reconcile round ------------------------------------------------------------------------


async def reconcile(cluster: ApiClient, snapshot: Snapshot, written: JSON, now: str) -> None:
    """One round of LWS's two reconcilers (LeaderWorkerSet and Pod) for one LeaderWorkerSet."""
    lws = defaulted(written)
    meta, spec = lws["metadata"], lws["spec"]
    if meta.get("deletionTimestamp"):
        return
    name, namespace = meta["name"], meta["namespace"]
    key = revision_key(lws)
    revisions = [
        r for r in snapshot.of("controllerrevisions") if r["metadata"].get("labels", {}).get(NAME_LABEL) == name
    ]
    if not any(r["metadata"]["labels"].get(REVISION_LABEL) == key for r in revisions):
        with contextlib.suppress(ApiRejected):
            await cluster.create(
                revision(lws, 1 + max((int(r["revision"]) for r in revisions), default=0)), "controllerrevisions"
            )
    leader = snapshot.named("statefulsets", name)
    updated = leader is not None and _revision_of(leader) != key
    partition, replicas = rolling_update_parameters(lws, snapshot, leader, key, updated)
    wanted = leader_statefulset(lws, partition, replicas, key)
    if leader is None:
        await cluster.create(wanted, "statefulsets")
        await _record(cluster, written, "GroupsProgressing", f"Created leader statefulset {name}")
    elif any(leader.get(k) != wanted.get(k) for k in ("spec",)) or any(
        leader["metadata"].get(k) != wanted["metadata"][k] for k in ("labels", "annotations")
    ):
        await cluster.patch(
            "apps/v1",
            "statefulsets",
            namespace,
            name,
            {"metadata": {k: wanted["metadata"][k] for k in ("labels", "annotations")}, "spec": wanted["spec"]},
        )
    if not unique_per_replica(lws):  # reconcileHeadlessServices: Shared's one Service
        await create_headless_service_if_not_exists(cluster, snapshot, headless_service(lws))
    await _reconcile_pods(cluster, snapshot, lws, written, revisions)
    status = status_of(lws, snapshot, leader, key, now)
    current = written.get("status", {})
    if {k: v for k, v in status.items() if k != "conditions"} != {
        k: current.get(k) for k in status if k != "conditions"
    } or _conditions_changed(current.get("conditions", []), status["conditions"]):
        with contextlib.suppress(ApiRejected):
            await cluster.patch(API_VERSION, PLURAL, namespace, name, {"status": status}, subresource="status")
        new_types = {c["type"] for c in status["conditions"] if c["status"] == "True"}
        old_types = {c["type"] for c in current.get("conditions", []) if c["status"] == "True"}
        if new_types != old_types:
            first = next(c for c in status["conditions"] if c["status"] == "True")
            message = (
                f"{first['message']}, with {status['readyReplicas']} groups ready of total {spec['replicas']} groups"
            )
            await _record(cluster, written, first["reason"], message)


async def _reconcile_pods(
    cluster: ApiClient, snapshot: Snapshot, lws: JSON, written: JSON, revisions: Sequence[JSON]
) -> None:
    """pod_controller.go Reconcile for the pods of this LeaderWorkerSet: the restart policy, then worker sets."""
    name = lws["metadata"]["name"]
    spec = lws["spec"]
    pods = [pod for pod in snapshot.of("pods") if pod["metadata"].get("labels", {}).get(NAME_LABEL) == name]
    leaders = {pod["metadata"]["name"]: pod for pod in pods if pod["metadata"]["labels"].get(WORKER_INDEX_LABEL) == "0"}
    recreated: set[str] = set()
    if spec["leaderWorkerTemplate"]["restartPolicy"] in (RECREATE_GROUP, "RecreateGroupAfterStart"):
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            if not container_restarted(pod):
                continue
            leader_name = (
                pod["metadata"]["name"] if pod in leaders.values() else parent_and_ordinal(pod["metadata"]["name"])[0]
            )
            leader = leaders.get(leader_name)
            if leader is None or leader_name in recreated or _revision_of(leader) != _revision_of(pod):
                continue
            if spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupAfterStart" and _pending(
                pods, leader, spec
            ):
                continue
            await delete(cluster, "v1", "pods", leader)  # its worker StatefulSet and pods follow (owner references)
            recreated.add(leader_name)
            group = leader["metadata"]["labels"].get(GROUP_INDEX_LABEL)
            failed = pod["metadata"]["name"]
            message = f"Worker pod {failed} failed, deleted leader pod {leader_name} to recreate group {group}"
            await _record(cluster, written, "RecreateGroup", message)
    if unique_per_replica(lws):  # each leader's group Service, before (and whatever) its workers
        for leader_name, leader in leaders.items():
            if leader_name not in recreated:
                await create_headless_service_if_not_exists(cluster, snapshot, group_service(lws, leader))
    if int(spec["leaderWorkerTemplate"]["size"]) == 1:
        return
    by_key = {r["metadata"]["labels"].get(REVISION_LABEL): r for r in revisions}
    for leader_name, leader in leaders.items():
        if leader_name in recreated or snapshot.named("statefulsets", leader_name) is not None:
            continue
        if spec["startupPolicy"] == "LeaderReady" and not pod_ready(leader):
            continue  # "defer the creation of the worker statefulset because leader pod is not ready"
        stored = by_key.get(_revision_of(leader))
        if stored is None:
            continue  # "Revision has not been created yet": the next round
        worker_template = stored["data"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        with contextlib.suppress(ApiRejected):
            await cluster.create(worker_statefulset(leader, lws, worker_template), "statefulsets")
            await _record(
                cluster, written, "GroupsProgressing", f"Created worker statefulset for leader pod {leader_name}"
            )


def _pending(pods: Sequence[Mapping[str, Any]], leader: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """pendingPodsInGroup."""
    group = leader["metadata"]["labels"].get(GROUP_INDEX_LABEL)
    members = [p for p in pods if p["metadata"]["labels"].get(GROUP_INDEX_LABEL) == group]
    size = int(spec["leaderWorkerTemplate"]["size"])
    return len(members) != size or any(p.get("status", {}).get("phase") == "Pending" for p in members)


async def _record(cluster: ApiClient, lws: Mapping[str, Any], reason: str, message: str) -> None:
    with contextlib.suppress(ApiRejected):
        await cluster.create(event(lws, reason, message, component="lws-controller"), "events")

"""Where a pod may run: the part of kube-scheduler the sandbox plays, over the Node objects in the API.

The sandbox has one machine; its Node objects say what a cluster's nodes would offer (an Ascend
node with huawei.com/Ascend910 and its chip label, a CCE node with huawei.com/ascend-1980, a CPU
node: `PROFILE_NODES`, created by `register_nodes`). Before the kubelet starts a pod, `refusal`
runs two of kube-scheduler's filters on every Node, in kube-scheduler's order, and the first that
fails a node is that node's reason:
- NodeAffinity, the pod's nodeSelector (kubernetes/kubernetes pkg/scheduler/framework/plugins/
  nodeaffinity/node_affinity.go, Filter: ErrReasonPod "node(s) didn't match Pod's node
  affinity/selector");
- NodeResourcesFit, the extended resources the pod's containers request against the node's
  allocatable (pkg/scheduler/framework/plugins/noderesources/fit.go, fitsRequest: "Insufficient
  <resource>" for each one short). Only extended resources (a name with a domain): this machine
  honours no cpu or memory, and the pods already on a node are not counted.
When no node passes, the message is kube-scheduler's FitError (pkg/scheduler/framework/types.go,
FitError.Error: "0/N nodes are available: " then the "count reason" histogram, sorted, joined
with ", " and ended with "."), with default preemption's PostFilter message after it
(pkg/scheduler/framework/plugins/defaultpreemption: "preemption: 0/N nodes are available: N
Preemption is not helpful for scheduling."). The kubelet then does what kube-scheduler's
handleSchedulingFailure does (pkg/scheduler/schedule_one.go): the pod's PodScheduled condition
False, reason Unschedulable, with that message (`unschedulable_status`), and a Warning Event
FailedScheduling on the pod (`failed_scheduling_event`); the pod stays Pending. Without any Node
object (most tests), every pod runs, as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_operator.kube.objects import utc_now

from npu_sandbox.cluster.client import ApiClient, ApiRejected

JSON = dict[str, Any]
SCHEDULER_NAME: Final = "default-scheduler"
NODE_AFFINITY: Final = "node(s) didn't match Pod's node affinity/selector"
CHIP_LABEL: Final = "node.kubernetes.io/npu.chip.name"


def node(name: str, allocatable: Mapping[str, int], labels: Mapping[str, str] | None = None) -> JSON:
    """A Node object as a kubelet registers it: its labels, and capacity = allocatable (cpu and memory
    of a modest node, plus `allocatable`'s extended resources)."""
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", **{k: str(v) for k, v in allocatable.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"capacity": dict(resources), "allocatable": resources},
    }


# A node per cluster profile (api.clusters.PROFILES): the Ascend device plugin's resource and chip
# label, with the accelerator type MindCluster's Volcano plugin reads (ascend-docker-runtime,
# device-plugin, volcano), CCE's resource and label, and a CPU node.
PROFILE_NODES: Final[Mapping[str, JSON]] = {
    "ascend-docker-runtime": node(
        "ascend-910b3",
        {"huawei.com/Ascend910": 8},
        {CHIP_LABEL: "910B3", "accelerator": "huawei-Ascend910", "accelerator-type": "module-910b-8"},
    ),
    "cce": node("cce-snt9b", {"huawei.com/ascend-1980": 8}, {"accelerator/huawei-npu": "ascend-snt9b"}),
    "cpu": node("cpu-0", {}),
}


async def register_nodes(cluster: ApiClient, nodes: Sequence[Mapping[str, Any]]) -> None:
    """Create the Node objects (their status through the status subresource, as a kubelet posts it)."""
    for obj in nodes:
        await cluster.create({**obj, "status": {}}, "nodes")
        await cluster.patch(
            "v1", "nodes", None, obj["metadata"]["name"], {"status": obj["status"]}, subresource="status"
        )


def _extended_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The extended resources the pod's containers request (limits stand for requests, as the API
    server defaults them), summed."""
    wanted: dict[str, int] = {}
    for container in pod.get("spec", {}).get("containers", []):
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, quantity in asked.items():
            if "/" in name and str(quantity).strip().isdigit():
                wanted[name] = wanted.get(name, 0) + int(str(quantity).strip())
    return wanted


def _reasons(pod: Mapping[str, Any], obj: Mapping[str, Any]) -> list[str]:
    """Why `obj` cannot run `pod` (empty: it can): the first filter that fails it."""
    labels = obj.get("metadata", {}).get("labels") or {}
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return [NODE_AFFINITY]
    allocatable = obj.get("status", {}).get("allocatable") or {}
    short = []
    for name, count in sorted(_extended_requests(pod).items()):
        offered = str(allocatable.get(name, "0")).strip()
        if not offered.isdigit() or int(offered) < count:
            short.append(f"Insufficient {name}")
    return short


def refusal(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """kube-scheduler's message when no node can run `pod`; None when one can, or when there are no nodes."""
    if not nodes:
        return None
    histogram: dict[str, int] = {}
    for obj in nodes:
        reasons = _reasons(pod, obj)
        if not reasons:
            return None
        for reason in reasons:
            histogram[reason] = histogram.get(reason, 0) + 1
    total = len(nodes)
    counted = ", ".join(sorted(f"{count} {reason}" for reason, count in histogram.items()))
    preemption = f"preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling."
    return f"0/{total} nodes are available: {counted}. {preemption}"


def unschedulable_status(message: str, now: str) -> JSON:
    """The pod status patch of handleSchedulingFailure: Pending, PodScheduled False/Unschedulable."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": now,
    }
    return {"status": {"phase": "Pending", "conditions": [condition]}}


def failed_scheduling_event(pod: Mapping[str, Any], message: str, now: str) -> JSON:
    """The Warning Event FailedScheduling on the pod, as kube-scheduler records it (core/v1 view)."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": "Warning",
        "reason": "FailedScheduling",
        "message": message,
        "action": "Scheduling",
        "source": {"component": SCHEDULER_NAME},
        "reportingComponent": SCHEDULER_NAME,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def list_nodes(cluster: ApiClient) -> list[JSON]:
    """The Node objects (none where the API serves no Nodes)."""
    try:
        return await cluster.list_objects("v1", "nodes")
    except ApiRejected as exc:
        if exc.status != 404:
            raise
        return []


async def refuse(cluster: ApiClient, pod: Mapping[str, Any], message: str) -> None:
    """Say that no node can run `pod`: its status, then the Event (once per message: the caller remembers)."""
    now = utc_now()
    meta = pod["metadata"]
    await cluster.patch(
        "v1", "pods", meta["namespace"], meta["name"], unschedulable_status(message, now), subresource="status"
    )
    await cluster.create(failed_scheduling_event(pod, message, now), "events")

"""The sandbox's scheduling: a pod runs only where a Node could run it, or stays Pending as kube-scheduler leaves it.

Pure: kube-scheduler's message for each way a pod does not fit (an NPU resource no node offers, too
many of it, a chip label no node has). Over the API: the kubelet refuses such a pod (PodScheduled
False/Unschedulable with that message, a Warning Event FailedScheduling on the pod, no process), and
runs every pod where there is no Node object at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu_sandbox.cluster import LocalCluster
from npu_sandbox.node.kubelet import Kubelet
from npu_sandbox.node.scheduler import CHIP_LABEL, PROFILE_NODES, node, refusal, register_nodes

NS = "default"
PREEMPTION = "preemption: 0/{n} nodes are available: {n} Preemption is not helpful for scheduling."


def pod(resources: dict[str, int], selector: dict[str, str] | None = None, name: str = "p") -> dict[str, Any]:
    limits = {k: str(v) for k, v in resources.items()}
    container = {
        "name": "engine",
        "image": "x",
        "command": ["true"],
        "resources": {"limits": limits, "requests": limits},
    }
    spec: dict[str, Any] = {"containers": [container]}
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


NODES = list(PROFILE_NODES.values())  # an Ascend node (910B3), a CCE node, a CPU node


def test_a_resource_no_node_offers() -> None:
    assert refusal(pod({"huawei.com/Ascend310P": 1}), NODES) == (
        f"0/3 nodes are available: 3 Insufficient huawei.com/Ascend310P. {PREEMPTION.format(n=3)}"
    )


def test_each_profile_node_runs_its_own_resource_only() -> None:
    assert refusal(pod({"huawei.com/Ascend910": 8}), NODES) is None
    assert refusal(pod({"huawei.com/ascend-1980": 8}), NODES) is None
    cce_only = [PROFILE_NODES["cce"], PROFILE_NODES["cpu"]]
    assert refusal(pod({"huawei.com/Ascend910": 8}), cce_only) == (
        f"0/2 nodes are available: 2 Insufficient huawei.com/Ascend910. {PREEMPTION.format(n=2)}"
    )
    assert refusal(pod({"cpu": 500}), NODES) is None  # this machine honours no cpu or memory


def test_more_than_a_node_allocates() -> None:
    assert refusal(pod({"huawei.com/Ascend910": 16}), NODES) == (
        f"0/3 nodes are available: 3 Insufficient huawei.com/Ascend910. {PREEMPTION.format(n=3)}"
    )


def test_a_chip_label_no_node_has_fails_the_node_affinity_filter_first() -> None:
    message = refusal(pod({"huawei.com/Ascend910": 8}, {CHIP_LABEL: "910B4"}), NODES)
    assert message == (
        f"0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. {PREEMPTION.format(n=3)}"
    )
    mixed = [*NODES, node("ascend-910b4", {"huawei.com/Ascend910": 4}, {CHIP_LABEL: "910B4"})]
    assert refusal(pod({"huawei.com/Ascend910": 8}, {CHIP_LABEL: "910B4"}), mixed) == (
        "0/4 nodes are available: 1 Insufficient huawei.com/Ascend910, "
        f"3 node(s) didn't match Pod's node affinity/selector. {PREEMPTION.format(n=4)}"
    )


def test_without_nodes_every_pod_runs() -> None:
    assert refusal(pod({"huawei.com/Ascend910": 8}), []) is None


async def test_the_kubelet_leaves_a_pod_no_node_can_run_pending_as_kube_scheduler_does(tmp_path: Path) -> None:
    async with LocalCluster() as cluster:
        await register_nodes(cluster, [PROFILE_NODES["cce"]])
        created = await cluster.create(pod({"huawei.com/Ascend910": 8}), "pods")
        kubelet = Kubelet(cluster, NS, workdir=tmp_path / "pods", interval=0.1)
        await kubelet.start()
        try:

            async def refused() -> Any:
                found = await cluster.get("v1", "pods", NS, "p")
                conditions = (found or {}).get("status", {}).get("conditions", [])
                return next((c for c in conditions if c["type"] == "PodScheduled"), None)

            scheduled = await cluster.wait_for(refused, within=10, what="the pod's PodScheduled condition")
            message = f"0/1 nodes are available: 1 Insufficient huawei.com/Ascend910. {PREEMPTION.format(n=1)}"
            assert {k: scheduled[k] for k in ("status", "reason", "message")} == {
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
            await kubelet.sync()  # tried again each round, said once
            events = [
                e
                for e in await cluster.list_objects("v1", "events", NS)
                if e["involvedObject"]["uid"] == created["metadata"]["uid"]
            ]
            assert [(e["type"], e["reason"], e["message"], e["source"]["component"]) for e in events] == [
                ("Warning", "FailedScheduling", message, "default-scheduler")
            ]
            assert kubelet.pods == []
            found = await cluster.get("v1", "pods", NS, "p")
            assert found is not None and found["status"]["phase"] == "Pending"
        finally:
            await kubelet.stop()

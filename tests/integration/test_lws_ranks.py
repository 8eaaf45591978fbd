"""Every rank of a LeaderWorkerSet read, owner-checked, per rank in status: the real operator over HTTP.

The test plays the LeaderWorkerSet controller as LeaderWorkerSet v0.10 behaves (kubernetes-sigs/lws
v0.10.0): the leader StatefulSet named after the LeaderWorkerSet and controlled by it, a leader pod
per group with the `leaderworkerset.sigs.k8s.io/*` labels and the size annotation its webhook and
controller set (pkg/webhooks/pod_webhook.go Default, pkg/controllers/leaderworkerset_controller.go
constructLeaderStatefulSetApplyConfiguration), and a worker StatefulSet per group named after and
controlled by the leader pod (pkg/controllers/pod_controller.go
constructWorkerStatefulSetApplyConfiguration, ordinals from 1). Group recreation is
RecreateGroupOnPodRestart as pod_controller.go handleRestartPolicy does it: a restarted worker
makes the controller delete the group's leader pod, which takes the worker StatefulSet and its pods
with it (the emulator's garbage collector), and the group is made anew. The runtimes are
`FakeRuntimes` answering `/status`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from npu_operator.api import crd
from npu_operator.kube.objects import condition
from npu_sandbox.cluster import LocalCluster

from tests.integration.test_faults import CONFIG, HOSTILE, FakeRuntimes, report
from tests.operator.status.test_ranks import HCCL

NS = "default"
NAME = "tiny-llama"
LWS_API = "leaderworkerset.x-k8s.io/v1"


def two_node_manifest() -> dict[str, Any]:
    from tests.examples import example

    document = example("sandbox-cpu.yaml")
    document["metadata"] = {"name": NAME, "namespace": NS}
    document["spec"]["npu"] = {"count": 0, "nodes": 2}
    document["spec"]["parallelism"] = {"data": 2}
    return document


def reference(obj: dict[str, Any]) -> dict[str, Any]:
    """A controller owner reference, as controller-runtime's SetControllerReference writes it."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class LeaderWorkerSetController:
    """The test's stand-in for LeaderWorkerSet v0.10's controller: objects, labels, owners, status."""

    def __init__(self, cluster: LocalCluster, runtimes: FakeRuntimes) -> None:
        self.cluster = cluster
        self.runtimes = runtimes

    async def lws(self, name: str = NAME) -> dict[str, Any] | None:
        return await self.cluster.get(LWS_API, "leaderworkersets", NS, name)

    async def leader_stateful_set(self, lws: dict[str, Any]) -> dict[str, Any]:
        name = lws["metadata"]["name"]
        found = await self.cluster.get("apps/v1", "statefulsets", NS, name)
        if found is not None:
            return found
        labels = {**lws["metadata"].get("labels", {}), "leaderworkerset.sigs.k8s.io/name": name}
        sts = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": NS, "labels": labels, "ownerReferences": [reference(lws)]},
            "spec": {"replicas": lws["spec"]["replicas"], "serviceName": name},
        }
        return await self.cluster.create(sts, "statefulsets")

    async def make_group(self, lws: dict[str, Any], group: int, answers: list[Any]) -> list[int]:
        """The leader pod of `group`, its worker StatefulSet and workers; pod n's runtime answers answers[n]."""
        name = lws["metadata"]["name"]
        template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        size = lws["spec"]["leaderWorkerTemplate"]["size"]
        ports = await self.runtimes.start(size)
        for port, answer in zip(ports, answers, strict=True):
            self.runtimes.answers[port] = answer
        leader_sts = await self.leader_stateful_set(lws)
        group_labels = {
            "leaderworkerset.sigs.k8s.io/name": name,
            "leaderworkerset.sigs.k8s.io/group-index": str(group),
            "leaderworkerset.sigs.k8s.io/group-key": f"key-{name}-{group}",
        }
        leader = await self.pod(
            f"{name}-{group}",
            template,
            {**group_labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"},
            leader_sts,
            ports[0],
            size,
        )
        worker_sts = await self.cluster.create(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {
                    "name": leader["metadata"]["name"],
                    "namespace": NS,
                    "labels": {**lws["metadata"].get("labels", {}), **group_labels},
                    "ownerReferences": [reference(leader)],
                },
                "spec": {"replicas": size - 1, "ordinals": {"start": 1}, "serviceName": name},
            },
            "statefulsets",
        )
        for index in range(1, size):
            labels = {**group_labels, "leaderworkerset.sigs.k8s.io/worker-index": str(index)}
            await self.pod(f"{leader['metadata']['name']}-{index}", template, labels, worker_sts, ports[index], size)
        return ports

    async def pod(
        self, name: str, template: dict[str, Any], labels: dict[str, str], owner: dict[str, Any], port: int, size: int
    ) -> dict[str, Any]:
        spec = json.loads(json.dumps(template["spec"]))
        spec["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port}]
        meta = {
            "name": name,
            "namespace": NS,
            "labels": {**template["metadata"]["labels"], **labels},
            "annotations": {"leaderworkerset.sigs.k8s.io/size": str(size)},
            "ownerReferences": [reference(owner)],
        }
        created = await self.cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, "pods")
        await self.set_pod(name, ready=True)
        return created

    async def set_pod(self, name: str, *, ready: bool, restarts: int = 0, last_message: str = "") -> None:
        container: dict[str, Any] = {"name": "runtime", "ready": ready, "restartCount": restarts}
        if last_message:
            container["lastState"] = {"terminated": {"exitCode": 1, "message": last_message}}
        status = {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [container],
        }
        await self.cluster.patch("v1", "pods", NS, name, {"status": status}, subresource="status")

    async def report(self, ready: int, name: str = NAME) -> None:
        lws = await self.lws(name)
        assert lws is not None
        status = {"observedGeneration": lws["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1}
        await self.cluster.patch(
            LWS_API, "leaderworkersets", NS, name, {"status": {**status, "readyReplicas": ready}}, subresource="status"
        )

    async def recreate_group(self, group: int, answers: list[Any]) -> None:
        """RecreateGroupOnPodRestart: delete the leader pod (its worker StatefulSet and pods go with it)."""
        await self.report(ready=0)
        await self.cluster.delete("v1", "pods", NS, f"{NAME}-{group}")
        lws = await self.lws()
        assert lws is not None
        await self.make_group(lws, group, answers)
        await self.report(ready=1)


Controlled = tuple[LocalCluster, LeaderWorkerSetController, FakeRuntimes]


@contextlib.asynccontextmanager
async def controlled_cluster(*, disaggregated_sets: bool = False) -> AsyncIterator[Controlled]:
    """The operator over the emulator serving LeaderWorkerSets (and DisaggregatedSets when asked), the
    LWS controller played by the test."""
    runtimes = FakeRuntimes()
    async with LocalCluster(leader_worker_sets=True, disaggregated_sets=disaggregated_sets) as cluster:
        await cluster.start_operator(CONFIG)
        try:
            yield cluster, LeaderWorkerSetController(cluster, runtimes), runtimes
        finally:
            await cluster.stop_operator()
            await runtimes.close()


@pytest.fixture
async def lws_cluster() -> AsyncIterator[Controlled]:
    async with controlled_cluster() as controlled:
        yield controlled


async def status_when(
    cluster: LocalCluster, check: Any, what: str, within: float = 30, *, name: str = NAME
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, name)
        return obj if obj is not None and check(obj) else None

    found: dict[str, Any] = await cluster.wait_for(probe, within=within, what=what)
    return found


async def events(cluster: LocalCluster, reason: str) -> list[str]:
    return [
        e["message"]
        for e in await cluster.list_objects("v1", "events", NS)
        if e.get("involvedObject", {}).get("name") == NAME and e.get("reason") == reason
    ]


def ranks(obj: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r["group"], r["node"]): r for r in obj["status"].get("graph", {}).get("ranks", [])}


def node_report(node: int, mode: str = "FULL_DECODE_ONLY", **extra: Any) -> Any:
    return report(mode, node={"rank": node, "nodes": 2, "data_parallel_ranks": [node]}, **extra)


async def test_every_rank_is_read_shown_and_recovers_with_its_group(
    lws_cluster: tuple[LocalCluster, LeaderWorkerSetController, FakeRuntimes],
) -> None:
    cluster, controller, runtimes = lws_cluster
    await cluster.apply_npu_inference(two_node_manifest())
    lws = await cluster.wait_for(controller.lws, what="the LeaderWorkerSet")
    # Someone else's LeaderWorkerSet, its objects all carrying our labels, its worker a hostile runtime.
    foreign = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "other", "namespace": NS, "labels": lws["metadata"]["labels"]},
        "spec": lws["spec"],
    }
    foreign = await cluster.create(foreign, "leaderworkersets")
    foreign_ports = await controller.make_group(foreign, 0, [HOSTILE, HOSTILE])

    first = await controller.make_group(lws, 0, [node_report(0), node_report(1, "NONE", downgrades=[HCCL])])
    await controller.report(ready=1)
    obj = await status_when(
        cluster, lambda o: condition(o, "Ready").get("status") == "True" and len(ranks(o)) == 2, "Ready with both ranks"
    )
    graph = obj["status"]["graph"]
    assert graph["effectiveMode"] == "NONE"  # the worst rank's
    assert graph["rankModes"] == {"FULL_DECODE_ONLY": "0:0", "NONE": "0:1"}
    assert ranks(obj)[(0, 1)]["downgrade"] == "HcclBufferShortfall"
    assert ranks(obj)[(0, 1)]["dataParallelRanks"] == "1" and ranks(obj)[(0, 0)]["pod"] == f"{NAME}-0"
    assert graph["reportingPods"] == 2 and "unreachablePods" not in graph
    assert all(runtimes.hits.get(port, 0) == 0 for port in foreign_ports)  # never read
    assert condition(obj, "Degraded")["status"] == "False"
    # kopf posts Events from its own queue after the status write: wait for it.
    downgraded = await cluster.wait_for(lambda: events(cluster, "GraphModeDowngraded"), what="the downgrade Event")
    assert downgraded == [
        f"group 0 node 1 (pod {NAME}-0-1): FULL_DECODE_ONLY -> NONE (HcclBufferShortfall, engine stage): "
        "HCCL_BUFFSIZE too small for the graphs on this node"
    ]

    # The worker's engine dies: its container restarts, LeaderWorkerSet will recreate the group.
    await controller.set_pod(f"{NAME}-0-1", ready=False, restarts=1, last_message="EngineExited: killed (signal 9)")
    obj = await status_when(
        cluster, lambda o: condition(o, "Progressing").get("reason") == "GroupRestarting", "GroupRestarting"
    )
    assert condition(obj, "Ready")["status"] == "False" and condition(obj, "Ready")["reason"] == "GroupRestarting"
    assert (
        f"group 0: pod {NAME}-0-1 (node 1) restarted (EngineExited: killed (signal 9))"
        in condition(obj, "Progressing")["message"]
    )
    assert condition(obj, "Degraded")["status"] == "False"  # a group being recreated is not failing

    await controller.recreate_group(0, [node_report(0), node_report(1)])
    obj = await status_when(cluster, lambda o: condition(o, "Ready").get("status") == "True", "Ready again")
    graph = obj["status"]["graph"]
    assert graph["effectiveMode"] == "FULL_DECODE_ONLY" and graph["rankModes"] == {"FULL_DECODE_ONLY": "0:*"}
    assert "downgrade" not in ranks(obj)[(0, 1)]  # the old pod's downgrade is not current
    assert [d["pods"] for d in graph["downgrades"]] == [0]  # history, no pod reports it now
    assert "restartingGroups" not in graph and graph["reportingPods"] == 2
    assert all(runtimes.hits.get(port, 0) == 0 for port in foreign_ports)
    assert first  # the old group's runtimes are gone with their pods

    # Deleting the resource takes the LeaderWorkerSet, and with it every StatefulSet and pod of ours.
    await cluster.delete(crd.API_VERSION, crd.PLURAL, NS, NAME)

    async def all_gone() -> bool:
        pods = [p["metadata"]["name"] for p in await cluster.list_objects("v1", "pods", NS)]
        sets = [s["metadata"]["name"] for s in await cluster.list_objects("apps/v1", "statefulsets", NS)]
        return await controller.lws() is None and pods == ["other-0", "other-0-1"] and sets == ["other", "other-0"]

    await cluster.wait_for(all_gone, what="the LeaderWorkerSet, its StatefulSets and pods to go")

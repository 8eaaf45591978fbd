"""The sandbox's kubelet and controllers over the API, with a stand-in process instead of vLLM.

The workloads are the operator's own (its pure builders); every container runs
`tests.sandbox.node.stub_pod`, which answers the readiness probe at once, shows the args the
kubelet gave it and resolves names as its pod does. What is checked is Kubernetes' behaviour:
scale out and in, a rollout in the order the Deployment's strategy says (maxSurge 0,
maxUnavailable 1: one old pod down, then a new one up), everything gone with the workload, each
pod on its own address with its declared ports, names resolving only as the cluster DNS would
answer them, and a LeaderWorkerSet group made and recreated as LeaderWorkerSet v0.10 does (see
test_lws.py for the objects themselves), its leader address resolving under UniquePerReplica and
not under Shared when the operator's Service holds the set's name.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import parse_spec
from npu_operator.children import engine_pod, workloads
from npu_operator.kube import names
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.controllers import lws
from npu_sandbox.controllers.workloads import POD_TEMPLATE_HASH, pod_ready
from npu_sandbox.node.kubelet import Kubelet, LocalKubelet
from npu_sandbox.node.pod import LocalPod
from npu_sandbox.node.runners import DEFAULT_RUNNERS, ServeRunner

from tests.examples import example
from tests.runtime.serve_helpers import alive

NS = "default"
NAME = "tiny-llama"
CONFIG = OperatorConfig()


class StubRunner:
    """`npu-runtime serve` as the stub process, with the args the kubelet's ServeRunner would give it."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return ServeRunner().accepts(container)

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        served = ServeRunner().command(pod, container, args)
        stub = [
            sys.executable,
            "-m",
            "tests.sandbox.node.stub_pod",
            "--host",
            pod.ip,
            "--port",
            str(pod.ports["metrics"]),
        ]
        return [*stub, "--", *served]


def spec(**changes: Any) -> Any:
    manifest = example("sandbox-cpu.yaml")
    manifest["spec"].update(changes)
    return parse_spec(manifest["spec"])


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, LocalKubelet]]:
    async with LocalCluster(leader_worker_sets=True) as cluster:
        kubelet = LocalKubelet(cluster, NS, workdir=tmp_path / "pods", runners=[StubRunner(), *DEFAULT_RUNNERS])
        kubelet.interval = 0.1
        await kubelet.start()
        try:
            yield cluster, kubelet
        finally:
            await kubelet.stop()
            assert all(pod.process is None or pod.process.returncode is not None for pod in kubelet.stopped)


async def pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    return await cluster.list_objects("v1", "pods", NS)


async def ready_pods(cluster: LocalCluster, count: int, kubelet: LocalKubelet) -> list[dict[str, Any]]:
    async def ready() -> list[dict[str, Any]] | None:
        found = await pods(cluster)
        running = {pod.uid for pod in kubelet.pods}
        ok = [p for p in found if pod_ready(p) and p["metadata"]["uid"] in running]
        return ok if len(ok) == count and len(found) == count and len(kubelet.pods) == count else None

    result: list[dict[str, Any]] = await cluster.wait_for(ready, within=60, what=f"{count} ready pods")
    return result


async def deployment_status(cluster: LocalCluster) -> dict[str, Any]:
    found = await cluster.get("apps/v1", "deployments", NS, NAME)
    assert found is not None
    status: dict[str, Any] = found.get("status", {})
    return status


async def test_a_deployment_scales_out_and_in_through_the_scale_subresource(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    cluster, kubelet = node
    await cluster.create(workloads.build_deployment(NAME, NS, spec(), CONFIG), "deployments")
    (first,) = await ready_pods(cluster, 1, kubelet)
    # The Pod object says where the pod is: its own address, its ports as declared; the process answers there.
    ports = {p["name"]: p["containerPort"] for p in first["spec"]["containers"][0]["ports"]}
    assert ports["metrics"] == kubelet.pods[0].ports["metrics"] == names.METRICS_PORT
    assert first["status"]["podIP"] == kubelet.pods[0].ip != "127.0.0.1"
    assert first["status"]["podIPs"] == [{"ip": kubelet.pods[0].ip}]

    await cluster.patch("apps/v1", "deployments", NS, NAME, {"spec": {"replicas": 3}}, subresource="scale")
    scaled = await ready_pods(cluster, 3, kubelet)
    # Three pods on the same ports, each on its address (one cluster's range, 127.N.0.0/16).
    addresses = {p["status"]["podIP"] for p in scaled}
    assert len(addresses) == 3 and len({a.rsplit(".", 2)[0] for a in addresses}) == 1
    for address in addresses:
        assert (await status_of(address))["state"] == "serving"

    async def reported(replicas: int) -> Any:
        status = await deployment_status(cluster)
        wanted = {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas}
        return all(status.get(k) == v for k, v in wanted.items())

    await cluster.wait_for(lambda: reported(3), within=10, what="status 3/3")
    processes = [pod.process for pod in kubelet.pods]

    await cluster.patch("apps/v1", "deployments", NS, NAME, {"spec": {"replicas": 1}}, subresource="scale")
    (kept,) = await ready_pods(cluster, 1, kubelet)
    await cluster.wait_for(lambda: reported(1), within=10, what="status 1/1")
    assert kept["metadata"]["uid"] == first["metadata"]["uid"]  # the newest pods go first
    gone = [p for p in processes if p is not None and p.pid != kubelet.pods[0].process.pid]  # type: ignore[union-attr]
    await cluster.wait_for(lambda: asyncio.sleep(0, all(not alive(p.pid) for p in gone)), within=10)


async def test_a_changed_template_rolls_out_one_old_pod_down_then_one_new_up(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    cluster, kubelet = node
    deployment = workloads.build_deployment(NAME, NS, spec(replicas=2), CONFIG)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    await cluster.create(deployment, "deployments")
    old = await ready_pods(cluster, 2, kubelet)
    old_hash = old[0]["metadata"]["labels"][POD_TEMPLATE_HASH]
    old_pids = [pod.process.pid for pod in kubelet.pods if pod.process is not None]

    changed = workloads.build_deployment(NAME, NS, spec(replicas=2, engine={"maxNumSeqs": 4}), CONFIG)
    await cluster.patch("apps/v1", "deployments", NS, NAME, {"spec": {"template": changed["spec"]["template"]}})
    seen: list[tuple[int, int, int]] = []  # (old pods, new pods, ready pods)

    async def rolled_out() -> bool:
        found = await pods(cluster)
        hashes = [p["metadata"]["labels"][POD_TEMPLATE_HASH] for p in found]
        counts = (hashes.count(old_hash), len(hashes) - hashes.count(old_hash), sum(map(pod_ready, found)))
        if not seen or seen[-1] != counts:
            seen.append(counts)
        return counts == (0, 2, 2)

    await cluster.wait_for(rolled_out, within=30, interval=0.02, what="the rollout")
    # Never more than 2 pods (maxSurge 0) nor fewer than 1 ready once started (maxUnavailable 1).
    assert all(old_count + new_count <= 2 for old_count, new_count, _ in seen), seen
    assert all(ready >= 1 for _, _, ready in seen), seen
    # An old pod went before the first new one came.
    first_new = next(index for index, (_, new_count, _) in enumerate(seen) if new_count)
    assert seen[first_new][0] <= 1, seen
    replica_sets = await cluster.list_objects("apps/v1", "replicasets", NS)
    assert sorted(rs["spec"]["replicas"] for rs in replica_sets) == [0, 2]

    async def reported() -> bool:
        status = await deployment_status(cluster)
        return (status.get("updatedReplicas"), status.get("readyReplicas"), status.get("replicas")) == (2, 2, 2)

    await cluster.wait_for(reported, within=10, what="the Deployment's status: 2 updated, 2 ready")
    await cluster.wait_for(lambda: asyncio.sleep(0, not any(alive(pid) for pid in old_pids)), within=10)


async def test_a_running_pods_names_follow_the_services_as_they_come_and_go(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    """The kubelet rewrites a pod's hosts file in place: the bind mount in the running pod shows it."""
    cluster, kubelet = node
    await cluster.create(workloads.build_deployment(NAME, NS, spec(), CONFIG), "deployments")
    await ready_pods(cluster, 1, kubelet)
    (pod,) = kubelet.pods
    assert await resolved_in(pod, "later") == {"error": "Name or service not known"}
    later = workloads.build_service(NAME, NS)  # the operator's Service, under another name
    later["metadata"]["name"] = "later"
    await cluster.create(later, "services")

    async def resolves(wanted: dict[str, Any]) -> bool:
        return await resolved_in(pod, "later.default.svc.cluster.local") == wanted

    await cluster.wait_for(lambda: resolves({"addresses": [pod.ip]}), within=10, what="the new Service's name")
    await cluster.delete("v1", "services", NS, "later")
    gone = {"error": "Name or service not known"}
    await cluster.wait_for(lambda: resolves(gone), within=10, what="the name gone with the Service")


async def test_deleting_the_workload_deletes_its_pods_and_stops_their_processes(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    cluster, kubelet = node
    await cluster.create(workloads.build_deployment(NAME, NS, spec(replicas=2), CONFIG), "deployments")
    await ready_pods(cluster, 2, kubelet)
    pids = [pod.process.pid for pod in kubelet.pods if pod.process is not None]
    await cluster.delete("apps/v1", "deployments", NS, NAME)

    async def gone() -> bool:
        left = await pods(cluster) + await cluster.list_objects("apps/v1", "replicasets", NS)
        return not left and not kubelet.pods and not any(alive(pid) for pid in pids)

    await cluster.wait_for(gone, within=60, what="no pods, no ReplicaSets, no processes")


def two_node_set(policy: str | None = None) -> dict[str, Any]:
    """The operator's LeaderWorkerSet for a two-node replica (UniquePerReplica); `policy` overrides it."""
    built = workloads.build_leader_worker_set(
        NAME, NS, spec(npu={"count": 0, "nodes": 2}, parallelism={"data": 2}), CONFIG
    )
    if policy is not None:
        built["spec"]["networkConfig"] = {"subdomainPolicy": policy}
    return built


async def status_of(address: str, path: str = "/status") -> dict[str, Any]:
    """A stub pod's answer at `path` on its metrics port."""

    def get() -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{address}:{names.METRICS_PORT}{path}", timeout=5) as answer:
            found: dict[str, Any] = json.load(answer)
            return found

    return await asyncio.to_thread(get)


async def resolved_in(pod: LocalPod, name: str) -> dict[str, Any]:
    """What `name` resolves to inside `pod` (its own /etc/hosts, in its mount namespace)."""
    return await status_of(pod.ip, f"/resolve?name={name}")


def stub_args(kubelet: LocalKubelet, name: str) -> list[str]:
    (pod,) = [p for p in kubelet.pods if p.name == name]
    assert pod.process is not None
    argv = Path(f"/proc/{pod.process.pid}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index("--") + 1 :]  # what the stub stands in for: `npu-runtime serve ...`


async def test_a_leader_worker_set_group_finds_its_leader_through_its_own_headless_service(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    """UniquePerReplica, as the operator writes it: the group's headless Service `<name>-0` (LWS's
    pod controller), and the leader address resolves in both pods to the leader's own address."""
    cluster, kubelet = node
    await cluster.create(workloads.build_service(NAME, NS, leaders_only=True), "services")  # the operator's
    await cluster.create(two_node_set(), lws.PLURAL)
    await ready_pods(cluster, 2, kubelet)
    leader, worker = kubelet.pods
    assert (leader.name, worker.name) == (f"{NAME}-0", f"{NAME}-0-1")
    leader_args, worker_args = stub_args(kubelet, leader.name), stub_args(kubelet, worker.name)

    def flag(args: list[str], name: str) -> str:
        return args[args.index(name) + 1]

    # LWS_LEADER_ADDRESS (the leader's DNS name) and LWS_WORKER_INDEX were expanded; nothing rewrote the
    # name or the ports: each pod listens on its own address, the worker reaches its leader by name.
    address = f"{NAME}-0.{NAME}-0.{NS}"
    assert [flag(a, "--node-rank") for a in (leader_args, worker_args)] == ["0", "1"]
    assert {flag(a, "--data-parallel-address") for a in (leader_args, worker_args)} == {address}
    assert [flag(a, "--host") for a in (leader_args, worker_args)] == [leader.ip, worker.ip]
    assert flag(worker_args, "--port") == flag(leader_args, "--port") == str(names.HTTP_PORT)
    assert flag(worker_args, "--metrics-port") == flag(leader_args, "--metrics-port") == str(names.METRICS_PORT)
    service = await cluster.get("v1", "services", NS, f"{NAME}-0")
    assert service is not None and service["spec"]["clusterIP"] == "None"
    for pod in (leader, worker):
        assert await resolved_in(pod, address) == {"addresses": [leader.ip]}
        assert await resolved_in(pod, NAME) == {"addresses": [leader.ip]}  # the operator's Service: leaders
        assert await resolved_in(pod, f"{NAME}-0-1.{NAME}-0") == {"addresses": [worker.ip]}
        assert "error" in await resolved_in(pod, "example.com")  # nothing but the cluster's names
    assert (await status_of(worker.ip))["hostname"] == worker.name  # its own UTS namespace

    async def available() -> Any:
        found = await cluster.get(lws.API_VERSION, lws.PLURAL, NS, NAME)
        status = (found or {}).get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return status if conditions.get("Available") == "True" else None

    status = await cluster.wait_for(available, within=10, what="the LeaderWorkerSet Available")
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (1, 1, 1)


async def test_under_shared_the_operators_service_keeps_the_name_and_the_leader_address_resolves_nowhere(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    """The operator's old LeaderWorkerSet (Shared) beside its ClusterIP Service `<name>`: LWS creates its
    headless Service only if the name is free (CreateHeadlessServiceIfNotExists), so it creates none,
    and `$(LWS_LEADER_ADDRESS)` resolves in no pod of the group, as on a cluster."""
    cluster, kubelet = node
    await cluster.create(workloads.build_service(NAME, NS, leaders_only=True), "services")
    await cluster.create(two_node_set("Shared"), lws.PLURAL)
    await ready_pods(cluster, 2, kubelet)
    leader, worker = kubelet.pods
    (service,) = await cluster.list_objects("v1", "services", NS)
    assert service["spec"]["type"] == "ClusterIP" and "clusterIP" not in service["spec"]  # still the operator's
    address = f"{NAME}-0.{NAME}.{NS}"
    worker_args = stub_args(kubelet, worker.name)
    assert worker_args[worker_args.index("--data-parallel-address") + 1] == address
    for pod in (leader, worker):
        assert await resolved_in(pod, address) == {"error": "Name or service not known"}
    assert await resolved_in(worker, f"{NAME}.{NS}.svc") == {"addresses": [leader.ip]}  # the Service itself does


async def test_a_restarted_worker_recreates_its_whole_group(node: tuple[LocalCluster, LocalKubelet]) -> None:
    """RecreateGroupOnPodRestart: the worker's container exits, the group's leader is deleted, all come back."""
    cluster, kubelet = node
    await cluster.create(two_node_set(), lws.PLURAL)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await ready_pods(cluster, 2, kubelet)}
    worker = next(p for p in kubelet.pods if p.name.endswith("-0-1"))
    assert worker.process is not None
    os.killpg(worker.process.pid, signal.SIGKILL)

    async def recreated() -> dict[str, str] | None:
        found = await ready_pods(cluster, 2, kubelet)
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in found}
        return after if set(after) == set(before) and not set(after.values()) & set(before.values()) else None

    await cluster.wait_for(recreated, within=30, what="a new leader and worker")
    events = [e for e in await cluster.list_objects("v1", "events", NS) if e["reason"] == "RecreateGroup"]
    assert [e["message"] for e in events] == [
        f"Worker pod {NAME}-0-1 failed, deleted leader pod {NAME}-0 to recreate group 0"
    ]
    assert events[0]["involvedObject"]["kind"] == "LeaderWorkerSet"


async def test_a_container_that_cannot_start_says_so_and_the_kubelet_goes_on(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    cluster, kubelet = node
    broken = workloads.build_deployment("broken", NS, spec(), CONFIG)
    broken["spec"]["template"]["spec"]["containers"][0]["args"] = ["no-such-command-here", "--flag"]
    await cluster.create(broken, "deployments")

    async def refused() -> Any:
        found = [p for p in await pods(cluster) if p["metadata"]["name"].startswith("broken-")]
        states = [s["state"] for p in found for s in p.get("status", {}).get("containerStatuses", [])]
        return next((s["waiting"] for s in states if s.get("waiting", {}).get("reason") == "RunContainerError"), None)

    waiting = await cluster.wait_for(refused, within=10, what="RunContainerError")
    assert "no-such-command-here" in waiting["message"]
    await cluster.create(workloads.build_deployment(NAME, NS, spec(), CONFIG), "deployments")

    async def served() -> bool:
        return any(p.name.startswith(f"{NAME}-") and p.ready.is_set() for p in kubelet.pods)

    await cluster.wait_for(served, within=30, what="the next Deployment's pod, served")


async def test_a_config_map_volume_is_projected_when_the_pod_starts_and_an_optional_missing_one_is_empty(
    node: tuple[LocalCluster, LocalKubelet],
) -> None:
    """The calibration record's volume (optional): no ConfigMap yet, an empty directory; once the
    operator wrote it, the next pod that starts finds its keys as files where --calibration points."""
    cluster, kubelet = node
    await cluster.create(workloads.build_deployment(NAME, NS, spec(), CONFIG), "deployments")
    await ready_pods(cluster, 1, kubelet)
    (first,) = kubelet.pods
    assert list(first.volume_paths()[engine_pod.CALIBRATION_VOLUME].iterdir()) == []
    record = '{"schema": 1}'
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{NAME}-calibration", "namespace": NS},
        "data": {"record.json": record},
    }
    await cluster.create(config_map, "configmaps")
    await cluster.patch("apps/v1", "deployments", NS, NAME, {"spec": {"replicas": 2}}, subresource="scale")
    await ready_pods(cluster, 2, kubelet)
    (second,) = [pod for pod in kubelet.pods if pod.uid != first.uid]
    directory = second.volume_paths()[engine_pod.CALIBRATION_VOLUME]
    assert (directory / "record.json").read_text(encoding="utf-8") == record
    args = second.command(second.container, {}, second.volume_paths())
    assert args[args.index("--calibration") + 1] == str(directory / "record.json")


async def test_starting_twice_at_once_runs_one_loop(tmp_path: Path) -> None:
    """`follow` and `start_pods` both start the kubelet: one reconcile loop, or every pod would run twice."""
    async with LocalCluster() as cluster:
        kubelet = Kubelet(cluster, NS, workdir=tmp_path / "pods")
        await asyncio.gather(kubelet.start(), kubelet.start())
        try:
            assert [task.get_name() for task in asyncio.all_tasks()].count("kubelet") == 1
        finally:
            await kubelet.stop()

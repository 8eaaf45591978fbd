"""A kubelet for this machine: it runs the Pod objects of a namespace as local processes.

Each round (`Kubelet.sync`) reads the namespace over HTTP and makes the local processes match the
Pod objects: a pod without a process is started (its init containers one after another, then its
container), a process whose pod is gone is stopped (SIGTERM, the pod's grace period, SIGKILL). The
Pod objects come from the workload controllers (`npu_sandbox.controllers`), whose loop is the
`ControllerManager`'s, not this one; `LocalKubelet` is this kubelet with its namespace's manager
started and stopped beside it, the sandbox's node. So scale out and in, rollouts, group restarts and
deletions all happen through the API, as in a cluster; anything that writes the API (the operator,
kubectl, a test, an autoscaler through the scale subresource) drives it.

Each pod (`npu_sandbox.node.pod`) reports back as a kubelet does (`npu_sandbox.node.status`): its
IP, phase, Ready condition (from its readiness probe: an HTTP GET on the pod's address), init
container statuses, and on exit the container's termination message, with restartCount 1 and
CrashLoopBackOff (a real kubelet restarts the container with back-off; here it stays down and says
why, which is also what LeaderWorkerSet's RecreateGroupOnPodRestart reacts to).

How a container runs here is pluggable: the first of the kubelet's `runners` that accepts the
container turns it into a command line (`npu_sandbox.node.runners`: `ServeRunner` for `npu-runtime
serve`, `FetchRunner` for `npu-runtime fetch`, `RouteRunner` for `npu-runtime route`,
`ProcessRunner` for anything else; tests add their own). Before a runner sees them, the args get
Kubernetes' `$(VAR)` expansion from the container's env (`npu_sandbox.node.container`), volume
paths are rewritten to where the volumes lie on this machine (`npu_sandbox.node.volumes`: hostPath
as is, a claim under volumes/, an emptyDir per pod, a configMap's keys as files per pod, projected
when the pod starts).

Where a cluster has Node objects, a pod runs only where one of them could run it
(`npu_sandbox.node.scheduler`: kube-scheduler's NodeAffinity and NodeResourcesFit filters on the
extended resources, such as huawei.com/Ascend910, and the nodeSelector, such as the chip label);
a pod no node can run stays Pending with PodScheduled False/Unschedulable and kube-scheduler's
message, and a FailedScheduling Event, as kube-scheduler leaves it. Without Node objects every pod
runs here.

The network, as a cluster's (`npu_sandbox.node.network`, `npu_sandbox.node.dns`): each pod has its
own address, 127.N.x.y on this machine's loopback (status.podIP says so), and its processes bind it
(the runners give `npu-runtime serve`, `route` and `fetch` the pod's address as their host) on the
ports its containers declare, so two pods listen on 8000 side by side. Names resolve only as the
cluster DNS would answer them: each pod's processes run in a mount namespace of their own
(`npu_sandbox.node.isolation`) where /etc/hosts is the pod's, holding its own name and the
cluster's records (Services, and a headless Service's pods by hostname.subdomain), rewritten in
place each round that they change; any other name fails to resolve. Nothing rewrites a name in
the args or env: a pod's `$(LWS_LEADER_ADDRESS)` resolves here exactly when it would on a cluster.
What differs: one network namespace for all (a pod can reach any other's address and this
machine's 127.0.0.1, where the API runs; there is no NetworkPolicy and no kube-proxy: a ClusterIP
Service's name resolves to its ready pods' addresses, see `dns`), and a process that can only
listen on all addresses (the operator's `npu-operator run`) gets its declared ports mapped to free
ones (`LocalPod.map_port`; the Pod object's containerPorts then say where they are).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import aiohttp

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers import disaggregated, lws, workloads
from npu_sandbox.controllers.manager import KINDS, ControllerManager
from npu_sandbox.controllers.workloads import JSON, Snapshot
from npu_sandbox.node import isolation, scheduler
from npu_sandbox.node.container import NotYet
from npu_sandbox.node.network import PodNetwork
from npu_sandbox.node.pod import LocalPod, Runner
from npu_sandbox.node.runners import DEFAULT_RUNNERS

logger = logging.getLogger(__name__)

# This machine's pods share its cores, as containers do on a node without a CPU manager policy.
# vLLM's CPU build binds each engine's worker to the cores it does not keep for its engine core
# process (vllm/utils/ompmultiprocessing.py `_get_autobind_cpu_ids`, VLLM_CPU_OMP_THREADS_BIND=auto):
# core 0 of two, for every engine at once. A third engine then started in 4 minutes beside two
# serving ones (66 s unbound); the pod's own env may still ask for a binding.
SHARED_CORES_ENV: Final = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class Kubelet:
    """Runs the pods of a namespace on this machine: one loop that matches processes to Pod objects.

    `workload` (optional) names the Deployment, LeaderWorkerSet or DisaggregatedSet whose pods
    `start_pods` waits for; the loop itself runs every pod in the namespace. `network`: the pods'
    addresses and DNS, the cluster's by default (`PodNetwork.of`), which every kubelet of the same
    cluster shares.
    """

    def __init__(
        self,
        cluster: ApiClient,
        namespace: str,
        workload: str | None = None,
        *,
        workdir: Path,
        environ: dict[str, str] | None = None,
        runners: Sequence[Runner] = DEFAULT_RUNNERS,
        interval: float = 0.5,
        network: PodNetwork | None = None,
    ) -> None:
        self.cluster = cluster
        self.network = network if network is not None else PodNetwork.of(cluster)
        self.namespace = namespace
        self.workload = workload
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.environ = {**SHARED_CORES_ENV, **(environ or {})}
        self.runners = list(runners)
        self.interval = interval
        self.running: dict[str, LocalPod] = {}  # by pod uid
        self.stopped: list[LocalPod] = []
        self.snapshot = Snapshot(namespace, {})
        self._stops: set[asyncio.Task[int | None]] = set()
        self.nodes: list[JSON] = []  # the Node objects, as of the last round (none: every pod runs here)
        self._refused: dict[str, str] = {}  # pod uid -> the scheduler's message it was refused with
        self._loop: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    @property
    def pods(self) -> list[LocalPod]:
        """The pods running here (or exited and not yet deleted), oldest first."""
        return list(self.running.values())

    async def sync(self) -> None:
        """One round: read the namespace (the pods, and the Services and workloads they belong to), then
        match the processes to the Pod objects, then bring each pod's hosts file up to date."""
        self.snapshot = await workloads.read_snapshot(self.cluster, self.namespace, KINDS)
        self.nodes = await scheduler.list_nodes(self.cluster)
        self.network.publish(self.namespace, self.snapshot.of("services"), self.snapshot.of("pods"))
        await self._sync_pods(self.snapshot.of("pods"))
        cluster_dns = self.network.dns()
        for pod in self.pods:
            pod.write_names(cluster_dns)
        self._synced.set()

    async def _sync_pods(self, pods: list[JSON]) -> None:
        live = {pod["metadata"]["uid"]: pod for pod in pods if not pod["metadata"].get("deletionTimestamp")}
        self._refused = {uid: message for uid, message in self._refused.items() if uid in live}
        for uid in [uid for uid in self.running if uid not in live]:
            local = self.running.pop(uid)
            self.stopped.append(local)
            task = asyncio.create_task(local.stop(), name=f"kubelet stop {local.name}")
            self._stops.add(task)
            task.add_done_callback(self._stops.discard)
        # Leaders before workers, then oldest first: a worker starts once its leader runs.
        order = sorted(
            live.values(),
            key=lambda p: (
                p["metadata"].get("labels", {}).get(lws.WORKER_INDEX_LABEL, ""),
                p["metadata"].get("creationTimestamp", ""),
            ),
        )
        for pod in order:
            uid = pod["metadata"]["uid"]
            if uid in self.running or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if (refused := scheduler.refusal(pod, self.nodes)) is not None:
                await self._refuse(pod, refused)
                continue
            local = LocalPod(self, pod)
            try:
                await local.start()
            except NotYet as exc:
                logger.info("pod %s waits: %s", local.name, exc)
                continue
            except ApiRejected:
                continue  # deleted meanwhile
            except Exception as exc:
                logger.warning("pod %s cannot start: %s", local.name, exc)
                await local.fail_to_start(f"{type(exc).__name__}: {exc}")
            self.running[uid] = local

    async def _refuse(self, pod: JSON, message: str) -> None:
        """No node can run `pod`: say so as kube-scheduler does, once per message (it is tried each round)."""
        uid = pod["metadata"]["uid"]
        if self._refused.get(uid) == message:
            return
        try:
            await scheduler.refuse(self.cluster, pod, message)
        except ApiRejected:
            return  # deleted meanwhile
        self._refused[uid] = message
        logger.info("pod %s is unschedulable: %s", pod["metadata"]["name"], message)

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
            except (aiohttp.ClientError, ApiRejected) as exc:  # the API went away or refused: the next round
                logger.warning("kubelet round failed: %s", exc)
            except Exception:  # a kubelet outlives its bugs: logged, then the next round
                logger.exception("kubelet round failed")
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        """Start the reconcile loop (once); return after its first round. IsolationUnavailable, naming
        what is missing, when this machine cannot give pods their own name files."""
        await asyncio.to_thread(isolation.check)  # once per process (cached), before any loop: no await below
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="kubelet")
        await self._synced.wait()

    async def start_pods(self, within: float = 60.0) -> list[LocalPod]:
        """Start the loop and wait until `workload` has as many pods running here as it asks for."""
        if self.workload is None:
            raise ValueError("start_pods needs the kubelet's workload")
        await self.start()
        workload = self.workload

        async def started() -> list[LocalPod] | None:
            deployment = self.snapshot.named("deployments", workload)
            group = self.snapshot.named(lws.PLURAL, workload)
            roles = self.snapshot.named(disaggregated.PLURAL, workload)
            if roles is not None:  # the roles' engines; the Deployment is its router, which waits for them
                specs = [lws.defaulted({"spec": role["spec"]})["spec"] for role in roles["spec"]["roles"]]
                wanted = sum(int(spec["replicas"]) * int(spec["leaderWorkerTemplate"]["size"]) for spec in specs)
                found = [p for p in self.pods if p.labels.get(disaggregated.SET_NAME_LABEL) == workload]
            elif deployment is not None:
                wanted = int(deployment["spec"].get("replicas", 1))
                found = [p for p in self.pods if self.owner_chain(p).get("deployments") == workload]
            elif group is not None:
                spec = lws.defaulted(group)["spec"]
                wanted = int(spec["replicas"]) * int(spec["leaderWorkerTemplate"]["size"])
                found = [p for p in self.pods if p.labels.get(lws.NAME_LABEL) == workload]
            else:
                return None
            return found if len(found) >= wanted else None

        pods: list[LocalPod] = await self.cluster.wait_for(
            started, within=within, interval=0.2, what=f"pods of {workload}"
        )
        return pods

    def owner_chain(self, pod: LocalPod) -> dict[str, str]:
        """Plural -> name of the workload objects above the pod, through controller references."""
        by_uid = {
            obj["metadata"]["uid"]: (plural, obj)
            for plural in ("replicasets", "deployments", "statefulsets")
            for obj in self.snapshot.of(plural)
        }
        chain: dict[str, str] = {}
        uid = pod.controller_uid
        while uid in by_uid:
            plural, obj = by_uid[uid]
            chain[plural] = obj["metadata"]["name"]
            uid = workloads.controller_uid(obj)
        return chain

    async def follow(self, until: asyncio.Event) -> None:
        """Keep the loop running until `until` is set."""
        await self.start()
        await until.wait()

    async def stop(self) -> list[int | None]:
        """Stop the loop, then every pod's processes (the Pod objects stay: the API may be gone)."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        pods = self.pods
        self.stopped.extend(pods)
        self.running.clear()
        codes = [await pod.stop() for pod in pods]
        if self._stops:
            await asyncio.gather(*self._stops, return_exceptions=True)
        return codes


class LocalKubelet(Kubelet):
    """The sandbox's node: a `Kubelet`, with its namespace's `ControllerManager` started and stopped beside it.

    In a cluster the controllers run in kube-controller-manager, apart from every node; here one
    object starts both loops (as k3s runs both in one process), so that whoever runs a kubelet gets
    the Deployments, StatefulSets and LeaderWorkerSets of its namespace turned into pods. Each loop
    reads the API on its own; the manager's rounds follow the kubelet's `interval` as set at `start`.
    """

    def __init__(
        self,
        cluster: ApiClient,
        namespace: str,
        workload: str | None = None,
        *,
        workdir: Path,
        environ: dict[str, str] | None = None,
        runners: Sequence[Runner] = DEFAULT_RUNNERS,
        interval: float = 0.5,
        network: PodNetwork | None = None,
    ) -> None:
        super().__init__(
            cluster,
            namespace,
            workload,
            workdir=workdir,
            environ=environ,
            runners=runners,
            interval=interval,
            network=network,
        )
        self.controllers = ControllerManager(cluster, namespace, interval=interval)

    async def start(self) -> None:
        """Start the controllers' loop, then the kubelet's (once each); return after the first round of both."""
        self.controllers.interval = self.interval
        await self.controllers.start()
        await super().start()

    async def stop(self) -> list[int | None]:
        """Stop the controllers' loop, then the kubelet's and every pod's processes."""
        await self.controllers.stop()
        return await super().stop()

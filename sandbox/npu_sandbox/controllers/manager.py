"""kube-controller-manager for one namespace: the sandbox's workload controllers, driven by one loop.

Each round (`ControllerManager.sync`) reads the namespace over HTTP once (`workloads.read_snapshot`,
with the LeaderWorkerSet and DisaggregatedSet kinds, `KINDS`) and lets every controller act on what
it shows, in this order: Deployments, ReplicaSets and StatefulSets (`npu_sandbox.controllers.workloads`,
with LeaderWorkerSet's pod webhook as their pod admission), DisaggregatedSets
(`npu_sandbox.controllers.disaggregated`), LeaderWorkerSets (`npu_sandbox.controllers.lws`). What they
write, the next round reads, as with a real controller's informers. They make and delete Pod objects;
a kubelet (`npu_sandbox.node.kubelet`) runs them, in a loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import aiohttp
from npu_operator.kube.objects import utc_now

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers import disaggregated, lws, workloads
from npu_sandbox.controllers.workloads import Snapshot

# The custom kinds one round reads besides `workloads.WATCHED`: plural -> API version.
KINDS: Final = {
    lws.PLURAL: lws.API_VERSION,
    disaggregated.PLURAL: disaggregated.API_VERSION,
    disaggregated.SCALER_PLURAL: disaggregated.API_VERSION,
}
# What every pod passes through before it is created (LeaderWorkerSet's mutating pod webhook).
POD_ADMISSION: Final = (lws.admit_pod,)
logger = logging.getLogger(__name__)


class ControllerManager:
    """Runs every workload controller over one namespace: `sync` for one round, `start` for the loop."""

    def __init__(self, cluster: ApiClient, namespace: str, *, interval: float = 0.5) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.interval = interval
        self.snapshot = Snapshot(namespace, {})  # what the last round read
        self._loop: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    async def sync(self) -> Snapshot:
        """One round: read the namespace, then let each controller act on what it read."""
        snapshot = await workloads.read_snapshot(self.cluster, self.namespace, KINDS)
        self.snapshot = snapshot
        now = utc_now()
        for deployment in snapshot.of("deployments"):
            await workloads.reconcile_deployment(self.cluster, snapshot, deployment)
        for replica_set in snapshot.of("replicasets"):
            await workloads.reconcile_replica_set(self.cluster, snapshot, replica_set, POD_ADMISSION)
        for statefulset in snapshot.of("statefulsets"):
            await workloads.reconcile_stateful_set(self.cluster, snapshot, statefulset, POD_ADMISSION)
        for disaggregated_set in snapshot.of(disaggregated.PLURAL):
            await disaggregated.reconcile(self.cluster, snapshot, disaggregated_set)
        for leader_worker_set in snapshot.of(lws.PLURAL):
            await lws.reconcile(self.cluster, snapshot, leader_worker_set, now)
        self._synced.set()
        return snapshot

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
            except (aiohttp.ClientError, ApiRejected) as exc:  # the API went away or refused: the next round
                logger.warning("controller round failed: %s", exc)
            except Exception:  # a controller manager outlives its bugs: logged, then the next round
                logger.exception("controller round failed")
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        """Start the loop (once); return after its first round."""
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name=f"controller-manager {self.namespace}")
        await self._synced.wait()

    async def stop(self) -> None:
        """Stop the loop; what the controllers wrote stays in the API."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

"""The workload controllers, over the API: what kube-controller-manager and the LWS controllers do here.

`workloads`: Deployment, ReplicaSet, StatefulSet (and the snapshot every round reads); `lws`:
LeaderWorkerSet; `disaggregated`: DisaggregatedSet; `manager`: the one loop that runs them all
(`ControllerManager`). They talk to the API only through `npu_sandbox.cluster.client.ApiClient`.

The names below are re-exported for the operator's tests, which call them as `controllers.<name>`
(`from npu_sandbox import controllers`); new code imports them from `workloads`.
"""

from npu_sandbox.controllers.workloads import pod_ready, read_snapshot, reconcile_deployment, reconcile_replica_set

__all__ = ["pod_ready", "read_snapshot", "reconcile_deployment", "reconcile_replica_set"]

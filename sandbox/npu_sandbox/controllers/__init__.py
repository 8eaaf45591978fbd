"""The workload controllers, over the API: what kube-controller-manager and the LWS controllers do here.

`workloads`: Deployment, ReplicaSet, StatefulSet (and the snapshot every round reads); `lws`:
LeaderWorkerSet; `disaggregated`: DisaggregatedSet; `manager`: the one loop that runs them all
(`ControllerManager`). They talk to the API only through `npu_sandbox.cluster.client.ApiClient`.
"""

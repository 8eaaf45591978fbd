"""Several nodes per replica: a LeaderWorkerSet with one group of spec.npu.nodes pods per replica.

The leader of each group (worker index 0) serves the API and its data-parallel ranks, the workers
their ranks headless (`children.workloads.build_leader_worker_set`). The resource's Service and its
routing select the leaders only; every pod is a rank in `status.graph.ranks`. LeaderWorkerSet is a
CRD (kubernetes-sigs/lws): without it the resource is Degraded/LeaderWorkerSetNotInstalled.
"""

from __future__ import annotations

from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.children import kinds, workloads
from npu_operator.children.kinds import ChildKind
from npu_operator.status.resource import LWS_NOT_INSTALLED
from npu_operator.topologies.base import JSON
from npu_operator.topologies.single_node import SingleNode


class MultiNode(SingleNode):
    """A LeaderWorkerSet (a group of pods per replica), its leaders' Service, a PDB and a PodMonitor."""

    workload: ChildKind = kinds.LEADER_WORKER_SET
    multi_node = True

    def build_workload(self, name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
        return workloads.build_leader_worker_set(name, namespace, spec, config)

    def missing_api(self, spec: NPUInferenceSpec, why: str) -> tuple[str, str]:
        return (
            LWS_NOT_INSTALLED,
            f"spec.npu.nodes is {spec.npu.nodes}: a multi-node replica is a LeaderWorkerSet, but {why}; "
            "install LeaderWorkerSet (kubernetes-sigs/lws)",
        )

"""One node per replica: a Deployment of engine pods behind the resource's Service.

Also the base of `multi_node`, which differs only in its workload (a LeaderWorkerSet group per
replica) and in which pods serve the API (the groups' leaders).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.children import kinds, workloads
from npu_operator.children.kinds import Capabilities, ChildKind
from npu_operator.kube.names import serving_pod_labels
from npu_operator.status import findings, graph
from npu_operator.status.findings import GroupFindings, PodReport
from npu_operator.topologies.base import JSON, Found, LiveView, Seen, own_pods


class SingleNode:
    """A Deployment (one pod per replica), its Service, a PodDisruptionBudget and a PodMonitor."""

    workload: ChildKind = kinds.DEPLOYMENT
    holds_all_without_api = False
    multi_node = False

    def build(
        self,
        name: str,
        namespace: str,
        spec: NPUInferenceSpec,
        config: OperatorConfig,
        capabilities: Capabilities,
        seen: Seen,
    ) -> list[JSON]:
        children = [
            self.build_workload(name, namespace, spec, config),
            workloads.build_service(name, namespace, leaders_only=self.multi_node),
        ]
        if spec.replicas > 1:
            children.append(workloads.build_pod_disruption_budget(name, namespace))
        if spec.pod_monitor.enabled and capabilities.pod_monitor:
            children.append(workloads.build_pod_monitor(name, namespace, spec))
        return children

    def build_workload(self, name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
        return workloads.build_deployment(name, namespace, spec, config)

    def serving_pods(self, name: str, spec: NPUInferenceSpec) -> dict[str, str]:
        return serving_pod_labels(name, multi_node=self.multi_node)

    def missing_api(self, spec: NPUInferenceSpec, why: str) -> tuple[str, str]:
        raise AssertionError(f"the Deployment API is always served ({why})")

    def find(self, view: LiveView, namespace: str, name: str, workload: Mapping[str, Any] | None, seen: Seen) -> Found:
        return Found(workload, own_pods(view, namespace, name, workload))

    def calibrating(self, reports: Sequence[PodReport], found: Found) -> list[PodReport]:
        return list(reports)

    def graph(
        self,
        spec: NPUInferenceSpec,
        reports: Sequence[PodReport],
        found: Found,
        previous: Mapping[str, Any],
        *,
        now: str,
        same_generation: bool,
    ) -> JSON:
        return graph.graph_status(
            spec.graph.mode, reports, previous, now=now, same_generation=same_generation, nodes=spec.npu.nodes
        )

    def groups(
        self,
        spec: NPUInferenceSpec,
        pods: Sequence[Mapping[str, Any]],
        reports: Sequence[PodReport],
        previous_graph: Mapping[str, Any],
    ) -> GroupFindings:
        return findings.group_findings(pods, reports, spec.npu.nodes, previous_graph, spec.replicas)

"""The workloads and their companions for one-node and multi-node replicas: the Deployment, the
LeaderWorkerSet, the Service, the PodDisruptionBudget, the PodMonitor, the shared cache's claim. Pure.

Each runs or serves the engine pods of `pod.pod_template`; which of them a resource gets is its
topology's choice (`npu_operator.topologies`). Owner references are added where the children are
applied, because they need the owner's uid.
"""

from __future__ import annotations

from typing import Any, Final

from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.children.engine_pod import pod_template
from npu_operator.kube.names import (
    HTTP_PORT,
    LWS_API_VERSION,
    LWS_KIND,
    LWS_SUBDOMAIN_POLICY,
    METRICS_PORT,
    NAME_LABEL,
    api_server_pods_only,
    labels,
    rank_relabelings,
    selector_labels,
    serving_pod_labels,
    sorted_mapping,
)

JSON = dict[str, Any]

# Volcano's queue for a pod group (volcano-sh/apis pkg/apis/scheduling/v1beta1/labels.go QueueNameAnnotationKey).
VOLCANO_QUEUE_ANNOTATION: Final = "scheduling.volcano.sh/queue-name"


def build_deployment(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": sorted_mapping(selector_labels(name))},
            # NPUs are scarce and whole: a surge pod would wait for NPUs that the old pod holds.
            # Replace one pod at a time instead.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            # A rollout may legitimately take a whole startup (weights plus graph capture).
            "progressDeadlineSeconds": spec.engine.startup_timeout_seconds + 600,
            "revisionHistoryLimit": 5,
            "template": pod_template(name, spec, config),
        },
    }


def build_leader_worker_set(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    """A LeaderWorkerSet with one group of spec.npu.nodes pods per replica.

    Every pod runs the same `npu-runtime serve` (see `runtime_args`): the leader (worker index 0)
    starts vLLM's API server and its local data-parallel ranks, the workers their ranks headless.
    The workers are created with the leader (startupPolicy LeaderCreated: the leader only becomes
    ready once they have joined), and a group is recreated whole when one pod restarts, since the
    engine's data-parallel group cannot take a member back.

    Each group gets its own headless Service (subdomainPolicy UniquePerReplica): LeaderWorkerSet
    v0.10.0 then names it after the group's leader pod, `<name>-<group>`, selecting the group's
    pods (pkg/controllers/pod_controller.go, Reconcile -> CreateHeadlessServiceIfNotExists with
    pod.Name), sets the leader's subdomain to it (pkg/webhooks/pod_webhook.go, Default) and the
    workers' StatefulSet serviceName (constructWorkerStatefulSetApplyConfiguration), so that
    `$(LWS_LEADER_ADDRESS)`, `<name>-<group>.<name>-<group>.<namespace>`
    (pkg/utils/pod/pod_utils.go, AddLWSVariables), resolves. With the default policy, Shared, it
    would create one headless Service named `<name>` only if no Service of that name exists
    (pkg/utils/controller/controller_utils.go, CreateHeadlessServiceIfNotExists), and the
    resource's own ClusterIP Service `<name>` (the endpoint clients use) takes that name: no DNS
    record for any pod, and the workers never reach their leader.
    """
    metadata: JSON = {"name": name, "namespace": namespace, "labels": labels(name)}
    if queue := spec.template.annotations.get(VOLCANO_QUEUE_ANNOTATION):
        # Gang scheduling through Volcano (LeaderWorkerSet >= v0.7 with gangSchedulingManagement
        # schedulerProvider volcano) makes one PodGroup per group, of minMember size, in the queue
        # that this annotation of the LeaderWorkerSet names (pkg/schedulerprovider/volcano_provider.go,
        # CreatePodGroupIfNotExists); Volcano reads the same annotation off a Deployment's pods.
        metadata["annotations"] = {VOLCANO_QUEUE_ANNOTATION: queue}
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": metadata,
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            "networkConfig": {"subdomainPolicy": LWS_SUBDOMAIN_POLICY},
            "rolloutStrategy": {
                "type": "RollingUpdate",
                # As for the Deployment: no surge group, whose NPUs the old group holds.
                "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "leaderWorkerTemplate": {
                "size": spec.npu.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": pod_template(name, spec, config),
            },
        },
    }


def build_service(name: str, namespace: str, *, leaders_only: bool = False) -> JSON:
    """The endpoint. For a LeaderWorkerSet only the leaders serve the API: the selector adds
    LeaderWorkerSet's worker-index label 0."""
    selector = serving_pod_labels(name, multi_node=leaders_only)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "type": "ClusterIP",
            "selector": sorted_mapping(selector),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_pod_disruption_budget(name: str, namespace: str) -> JSON:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": sorted_mapping(selector_labels(name))}},
    }


# The runtime exports a few hundred series (a replay histogram per captured size) and vLLM about as
# many: ten times that is the most one pod may add per scrape.
POD_MONITOR_LIMITS: Final = {
    "sampleLimit": 20000,
    "labelLimit": 32,
    "labelNameLengthLimit": 128,
    "labelValueLengthLimit": 1024,
}


def build_pod_monitor(name: str, namespace: str, spec: NPUInferenceSpec) -> JSON:
    interval = spec.pod_monitor.interval
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": sorted_mapping({**spec.pod_monitor.labels, **labels(name)}),
        },
        "spec": {
            "selector": {"matchLabels": sorted_mapping(selector_labels(name))},
            # Every series gets the resource's name as `inference_npu_dev_name` (prometheus-operator
            # makes the label name valid): what the chart's dashboard and alerts group by.
            "podTargetLabels": [NAME_LABEL],
            # A pod is untrusted: these bound what one scrape may add to Prometheus (a scrape past a
            # limit fails as a whole; prometheus-operator v0.93.0, PodMonitorSpec).
            **POD_MONITOR_LIMITS,
            "podMetricsEndpoints": [
                # npu_graph_* and npu_device_* from the runtime; vllm:* from the engine itself.
                {"port": "metrics", "path": "/metrics", "interval": interval, "relabelings": rank_relabelings()},
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": interval,
                    "relabelings": [*api_server_pods_only(), *rank_relabelings()],
                },
            ],
        },
    }


def build_cache_claim(namespace: str, spec: NPUInferenceSpec) -> JSON | None:
    """The shared cache's PersistentVolumeClaim, when the spec asks the operator to create it.

    Not owned by the resource: other resources share the cache, and deleting one must not delete
    the downloads of all.
    """
    cache = spec.model.cache
    if cache is None or cache.create is None:
        return None
    claim_spec: JSON = {
        "accessModes": [cache.create.access_mode],
        "resources": {"requests": {"storage": cache.create.size}},
    }
    if cache.create.storage_class_name:
        claim_spec["storageClassName"] = cache.create.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": cache.claim_name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "npu-operator", "app.kubernetes.io/part-of": "npu-inference"},
        },
        "spec": claim_spec,
    }

"""The topologies a resource can have, and the one dispatcher that builds a resource's children.

`of(spec)` picks the topology (`base.Topology`): disaggregated with `spec.disaggregation`, multi-node
with `spec.npu.nodes > 1`, single-node otherwise. `build_children` is every child the resource
should have: its topology's, plus what autoscaling and routing add in front of the serving pods.
"""

from __future__ import annotations

from typing import Final

from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec, plan_options
from npu_operator.children import lora, routing, scaling
from npu_operator.children.kinds import Capabilities
from npu_operator.kube.names import HTTP_PORT, labels
from npu_operator.topologies.base import JSON, NOTHING_SEEN, Seen, Topology
from npu_operator.topologies.disaggregated import Disaggregated
from npu_operator.topologies.multi_node import MultiNode
from npu_operator.topologies.single_node import SingleNode

SINGLE_NODE: Final[Topology] = SingleNode()
MULTI_NODE: Final[Topology] = MultiNode()
DISAGGREGATED: Final[Topology] = Disaggregated()


def of(spec: NPUInferenceSpec) -> Topology:
    """The topology that runs `spec`'s engines."""
    if spec.disaggregation is not None:
        return DISAGGREGATED
    return MULTI_NODE if spec.npu.nodes > 1 else SINGLE_NODE


def build_children(
    name: str,
    namespace: str,
    spec: NPUInferenceSpec,
    config: OperatorConfig,
    capabilities: Capabilities = Capabilities.NONE,
    seen: Seen = NOTHING_SEEN,
) -> list[JSON]:
    """Every child the resource should have, in apply order.

    The topology's workload and companions (a workload whose API is not installed is built all the
    same: the caller reports the missing API), then the ScaledObject of spec.autoscaling and the
    endpoint picker, InferencePool and HTTPRoute of spec.routing where `capabilities` has their APIs:
    the picker's PodMonitor with the resource's own (spec.metrics.podMonitor, which spec.autoscaling
    requires: the picker's held requests are what wakes a resource scaled to zero,
    `scaling.picker_queue_query`), its DestinationRule where Istio's API is served. A P/D resource
    gets a ScaledObject per role (decode on the resource, prefill on its role scaler) and a pool of
    its routers.
    `seen` is what the resource's status remembers of the cluster (the startup seen so far, the
    roles' serving revision; `base.Seen.of`).
    """
    topology = of(spec)
    children = topology.build(name, namespace, spec, config, capabilities, seen)
    if spec.lora is not None:  # applied before the workload, whose pods mount it (children.KINDS' order)
        children.append(lora.build_adapter_list(name, namespace, spec))
    if spec.autoscaling is None and spec.routing is None:
        return children
    cap = scaling.capacity(spec, plan_options(spec))
    disaggregated = spec.disaggregation is not None
    if spec.autoscaling is not None and capabilities.scaled_object:
        startup = seen.startup_seconds or spec.engine.startup_timeout_seconds
        prometheus = config.prometheus_address
        # With P/D, this one scales the decode role (the resource's replicas) on the decode engines' load.
        role = "decode" if disaggregated else None
        children.append(
            scaling.build_scaled_object(
                name, namespace, spec.autoscaling, cap, labels(name), prometheus, startup, role=role
            )
        )
        if disaggregated:
            prefill = scaling.prefill_capacity(spec)
            children.append(
                scaling.build_prefill_scaled_object(name, namespace, spec, prefill, labels(name), prometheus, startup)
            )
    if spec.routing is not None:
        # With P/D the pool's endpoints are the routers (`topology.serving_pods`; see `routing`).
        pool = routing.Pool(
            name=name,
            namespace=namespace,
            labels=labels(name),
            pods=topology.serving_pods(name, spec),
            max_concurrency=routing.endpoint_concurrency(spec, cap.per_replica),
            failure_mode=spec.routing.failure_mode,
            data_parallel=1 if disaggregated else cap.data_parallel,
            behind_router=disaggregated,
            lora=spec.lora is not None,
            kv_events=spec.kv_events,
            model=spec.model.name,
            # The resource's Service: its engines tokenize for the picker (`routing.precise_prefix_plugins`).
            tokenizer_url=f"http://{name}.{namespace}.svc:{HTTP_PORT}",
        )
        if capabilities.inference_pool:
            children += routing.build_picker(pool, config.picker_image)
            monitor = spec.pod_monitor
            if capabilities.pod_monitor and monitor.enabled:
                children.append(routing.build_picker_pod_monitor(pool, monitor.interval, monitor.labels))
        # Istio's API alone decides (the kind `needs` itself, as the controller applies it): where
        # InferencePools are not served, Istio ignores a rule for a Service that does not exist.
        if capabilities.destination_rule:
            children.append(routing.build_destination_rule(pool))
        if capabilities.inference_pool:
            children.append(routing.build_inference_pool(pool))
            if spec.routing.gateway is not None and capabilities.http_route:
                children.append(routing.build_http_route(pool, spec.routing.gateway, _route_timeouts(spec)))
    return children


def _route_timeouts(spec: NPUInferenceSpec) -> dict[str, str]:
    """The route's timeouts: one completion, and with scale to zero the wait for KEDA to notice a held
    request (its polling interval) and for a replica to start (the spec's startup timeout)."""
    assert spec.routing is not None
    autoscaling = spec.autoscaling
    cold_start = (
        autoscaling.polling_interval_seconds + spec.engine.startup_timeout_seconds
        if autoscaling is not None and autoscaling.min_replicas == 0
        else 0
    )
    return routing.route_timeouts(spec.routing.request_timeout_seconds, cold_start)

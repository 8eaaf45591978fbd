"""LeaderWorkerSet v0.10.0's own rules for the objects it makes from ours, as data and small functions.

Read from kubernetes-sigs/lws at v0.10.0 (each rule cites its function); used by the tests to check
what a real LeaderWorkerSet controller would do with the manifests we render, not what our
sandbox's stand-in does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # api/leaderworkerset/v1/leaderworkerset_types.go, SetNameLabelKey
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"  # GroupIndexLabelKey
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # WorkerIndexLabelKey


def subdomain_policy(lws: Mapping[str, Any]) -> str:
    """pkg/webhooks/leaderworkerset_webhook.go, Default: a missing networkConfig or policy is Shared."""
    return str(((lws["spec"].get("networkConfig") or {}).get("subdomainPolicy")) or "Shared")


def headless_services(lws: Mapping[str, Any], taken: set[str]) -> list[dict[str, Any]]:
    """The headless Services the controller creates for `lws`, given the Service names already `taken`.

    Shared: one Service named after the set, selecting all its pods, created only if no Service of
    that name exists (pkg/controllers/leaderworkerset_controller.go, reconcileHeadlessServices ->
    pkg/utils/controller/controller_utils.go, CreateHeadlessServiceIfNotExists). UniquePerReplica:
    one per group, named after the group's leader pod `<set>-<group>`, selecting the set's pods of
    that group (pkg/controllers/pod_controller.go, Reconcile). Both: clusterIP None,
    publishNotReadyAddresses true.
    """
    name = lws["metadata"]["name"]
    if subdomain_policy(lws) == "Shared":
        wanted = [(name, {SET_NAME_LABEL: name})]
    else:
        wanted = [
            (f"{name}-{group}", {SET_NAME_LABEL: name, GROUP_INDEX_LABEL: str(group)})
            for group in range(int(lws["spec"]["replicas"]))
        ]
    return [
        {"name": service, "selector": selector, "clusterIP": "None", "publishNotReadyAddresses": True}
        for service, selector in wanted
        if service not in taken
    ]


def leader_address(lws: Mapping[str, Any], group: int, namespace: str) -> tuple[str, str]:
    """($(LWS_LEADER_ADDRESS), the subdomain it resolves through) for a group's pods.

    pkg/utils/pod/pod_utils.go, AddLWSVariables: `<set>-<group>.<subdomain>.<namespace>`. The
    subdomain is the leader pod's name under UniquePerReplica (pkg/webhooks/pod_webhook.go, Default;
    the workers' StatefulSet serviceName likewise, pod_controller.go) and the set's name under Shared
    (leaderworkerset_controller.go, the leader StatefulSet's serviceName).
    """
    name = lws["metadata"]["name"]
    subdomain = name if subdomain_policy(lws) == "Shared" else f"{name}-{group}"
    return f"{name}-{group}.{subdomain}.{namespace}", subdomain

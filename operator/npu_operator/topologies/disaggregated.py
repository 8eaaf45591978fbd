"""Prefill/decode disaggregation: a DisaggregatedSet of two roles, each a LeaderWorkerSet, behind a router.

What is built is `children.disaggregated`'s. Found in the cluster: the DisaggregatedSet's role
LeaderWorkerSets (kubernetes-sigs/lws v0.10.0 names them `<set>-<slice>-<revision>-<role>` and owns
them with `controller: true`) and, through their owner chains, each role's pods. The status: one
`status.graph` fold per role (`roles.<role>`), the resource's replicas the decode role's, and only
the decode role's reports calibrate the record (the record is the spec's layout, the decode role's).
DisaggregatedSet is a CRD of LeaderWorkerSet v0.10: without it nothing of the resource is applied
(no router without its engines): Degraded/DisaggregatedSetNotInstalled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from npu_operator.api.config import OperatorConfig
from npu_operator.api.roles import ROLES, role_spec
from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.children import disaggregated, kinds
from npu_operator.children.kinds import Capabilities, ChildKind
from npu_operator.kube import ownership
from npu_operator.kube.names import (
    DS_REVISION_LABEL,
    DS_ROLE_LABEL,
    ROLE_LABEL,
    ROUTER,
    selector_labels,
    sorted_mapping,
)
from npu_operator.status.findings import GroupFindings, PodReport
from npu_operator.status.graph import graph_status, role_graphs
from npu_operator.status.resource import DS_NOT_INSTALLED
from npu_operator.topologies.base import JSON, Found, LiveView, Seen, pod_name


class Disaggregated:
    """The router (Deployment), the roles (DisaggregatedSet) and the Services of a P/D resource."""

    workload: ChildKind = kinds.DISAGGREGATED_SET
    holds_all_without_api = True

    def build(
        self,
        name: str,
        namespace: str,
        spec: NPUInferenceSpec,
        config: OperatorConfig,
        capabilities: Capabilities,
        seen: Seen,
    ) -> list[JSON]:
        return disaggregated.build_children(
            name, namespace, spec, config, capabilities.pod_monitor, seen.serving_revision
        )

    def serving_pods(self, name: str, spec: NPUInferenceSpec) -> dict[str, str]:
        return sorted_mapping({**selector_labels(name), ROLE_LABEL: ROUTER})

    def missing_api(self, spec: NPUInferenceSpec, why: str) -> tuple[str, str]:
        return (
            DS_NOT_INSTALLED,
            f"spec.disaggregation asks for prefill and decode roles, which are a DisaggregatedSet, but "
            f"{why}; install LeaderWorkerSet v0.10 or later (kubernetes-sigs/lws)",
        )

    def find(self, view: LiveView, namespace: str, name: str, workload: Mapping[str, Any] | None, seen: Seen) -> Found:
        """The DisaggregatedSet's counts, each role's pods through its role LeaderWorkerSets, and the
        revision the role Services are to select (`serving_revision`)."""
        uid = ((workload or {}).get("metadata") or {}).get("uid")
        if workload is None or not uid:
            return Found(workload)
        roles = role_workloads(view.children_of(kinds.LEADER_WORKER_SET, namespace, name), str(uid))
        router = view.child(kinds.DEPLOYMENT, namespace, name)
        by_role = role_pods(view.pods(namespace, name), view.owner_links(namespace, name), roles)
        serving = serving_revision(roles, seen.serving_revision)
        return Found(
            workload_view(workload, roles, router),
            [pod for found in by_role.values() for pod in found],
            {role: frozenset(pod_name(pod) for pod in found) for role, found in by_role.items()},
            {"disaggregation": {"servingRevision": serving}} if serving else None,
        )

    def calibrating(self, reports: Sequence[PodReport], found: Found) -> list[PodReport]:
        decode = found.roles.get("decode", frozenset())
        return [report for report in reports if report.pod in decode]

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
        by_role = {role: [r for r in reports if r.pod in pods] for role, pods in found.roles.items()}
        return roles_graph_status(spec, by_role, previous, now=now, same_generation=same_generation)

    def groups(
        self,
        spec: NPUInferenceSpec,
        pods: Sequence[Mapping[str, Any]],
        reports: Sequence[PodReport],
        previous_graph: Mapping[str, Any],
    ) -> GroupFindings:
        return GroupFindings()


def role_workloads(leader_worker_sets: Iterable[Mapping[str, Any]], ds_uid: str) -> dict[str, list[Mapping[str, Any]]]:
    """The LeaderWorkerSets the DisaggregatedSet `ds_uid` controls, by role (several while a rollout
    runs two revisions). The controller names each `<set>-<slice>-<revision>-<role>` and labels it
    with its role (pkg/utils/disaggregatedset/utils.go, GenerateName, GenerateLabels: RoleLabelKey),
    owned by the DisaggregatedSet with `controller: true` (lws_manager.go, Create); only the owner
    reference makes one ours, a label can be copied."""
    found: dict[str, list[Mapping[str, Any]]] = {role: [] for role in ROLES}
    for lws in leader_worker_sets:
        if ownership.controller_uid(lws) != ds_uid:
            continue
        role = ((lws.get("metadata") or {}).get("labels") or {}).get(DS_ROLE_LABEL)
        if role in found:
            found[role].append(lws)
    return found


def serving_revision(roles: Mapping[str, Sequence[Mapping[str, Any]]], previous: str | None) -> str | None:
    """The revision whose engines the role Services select: the newest one with a ready replica on every
    role, else the one selected so far (None before any: the Services select every revision).

    LeaderWorkerSet v0.10.0's DisaggregatedSet controller pairs the roles the same way: it points its
    per-revision Services at a revision only once it is ready on all roles, and keeps the existing
    ones until then (pkg/controllers/disaggregatedset/service_manager.go, ReconcileServices,
    revisionReadyOnAllRoles). Without it, a rollout's role Services mix old- and new-revision pods,
    and the router pairs an old prefill engine with a new decode engine.
    """
    ready: dict[str, set[str]] = {}
    newest: dict[str, tuple[str, str]] = {}
    for role, sets in roles.items():
        for lws in sets:
            revision = ((lws.get("metadata") or {}).get("labels") or {}).get(DS_REVISION_LABEL)
            if not isinstance(revision, str) or not revision:
                continue
            if _ready(lws) > 0:
                ready.setdefault(revision, set()).add(role)
            newest[revision] = max(newest.get(revision, ("", "")), _created(lws))
    candidates = [revision for revision, on in ready.items() if on >= set(ROLES)]
    return max(candidates, key=lambda revision: (newest[revision], revision), default=previous)


def workload_view(
    ds: Mapping[str, Any], roles: Mapping[str, Sequence[Mapping[str, Any]]], router: Mapping[str, Any] | None
) -> JSON:
    """A DisaggregatedSet seen as the resource's workload, from its roles' LeaderWorkerSets.

    LeaderWorkerSet v0.10.0's DisaggregatedSet controller writes no status of its own (its
    `RoleStatus` type is declared, nothing sets it), so the counts are the role LeaderWorkerSets'
    (replicas, readyReplicas, updatedReplicas), summed over revisions. The resource's replicas are the
    decode role's; none is ready while the prefill role or the router (the Deployment `router`, the
    resource's endpoint) has no ready replica: no request could be served. The newest LeaderWorkerSet
    of a role is its current revision (the controller makes the new revision's before it scales the
    old one down, executor.go).
    """
    counts = {role: _role_counts(roles.get(role, ())) for role in ROLES}
    decode, prefill = counts["decode"], counts["prefill"]
    created = all(roles.get(role) for role in ROLES)
    status = {
        "replicas": decode["replicas"],
        "updatedReplicas": decode["updatedReplicas"],
        "readyReplicas": decode["readyReplicas"] if prefill["readyReplicas"] > 0 and _ready(router) > 0 else 0,
        "observedGeneration": int((ds.get("metadata") or {}).get("generation", 0)) if created else 0,
    }
    return {"metadata": dict(ds.get("metadata") or {}), "status": status}


def _ready(workload: Mapping[str, Any] | None) -> int:
    value = ((workload or {}).get("status") or {}).get("readyReplicas", 0)
    return value if isinstance(value, int) else 0


def _role_counts(leader_worker_sets: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    def count(lws: Mapping[str, Any], key: str) -> int:
        value = (lws.get("status") or {}).get(key, 0)
        return value if isinstance(value, int) else 0

    newest = max(leader_worker_sets, key=_created, default=None)
    return {
        "replicas": sum(count(lws, "replicas") for lws in leader_worker_sets),
        "readyReplicas": sum(count(lws, "readyReplicas") for lws in leader_worker_sets),
        "updatedReplicas": count(newest, "updatedReplicas") if newest is not None else 0,
    }


def _created(lws: Mapping[str, Any]) -> tuple[str, str]:
    meta = lws.get("metadata") or {}
    return str(meta.get("creationTimestamp", "")), str(meta.get("name", ""))


def role_pods(
    pods: Sequence[Mapping[str, Any]],
    links: Sequence[Mapping[str, Any]],
    roles: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, list[Mapping[str, Any]]]:
    """Each role's pods: those whose owner chain (`kube.ownership`, a LeaderWorkerSet's, through `links`)
    leads to one of the role's LeaderWorkerSets."""
    chains = ownership.owner_chains(pods, [*links, *pods])  # one walk per pod for every role's LWS
    found: dict[str, list[Mapping[str, Any]]] = {}
    for role in ROLES:
        found[role] = [
            pod
            for lws in roles.get(role, ())
            if (uid := (lws.get("metadata") or {}).get("uid"))
            for pod, chain in zip(pods, chains, strict=True)
            if str(uid) in chain
        ]
    return found


def roles_graph_status(
    spec: NPUInferenceSpec,
    reports: Mapping[str, Sequence[PodReport]],
    previous: Mapping[str, Any],
    *,
    now: str,
    same_generation: bool,
) -> JSON:
    """`status.graph` of a disaggregated resource: `roles.<role>` is what `graph.graph_status`
    makes of that role's pods (its ranks, modes, capture sizes and memory, downgrades; each bounded
    as for one workload, so the whole is at most twice that); the top level is the decode role's
    mode, the one the resource's graph settings ask for."""
    before = dict(role_graphs(previous))
    roles: JSON = {}
    for role in ROLES:
        rspec = role_spec(spec, role)
        old = before.get(role, {})
        roles[role] = graph_status(
            rspec.graph.mode,
            reports.get(role, ()),
            old,
            now=now,
            same_generation=same_generation,
            nodes=rspec.npu.nodes,
        )
    graph: JSON = {"requestedMode": spec.graph.mode}
    if "effectiveMode" in roles["decode"]:
        graph["effectiveMode"] = roles["decode"]["effectiveMode"]
    graph["roles"] = roles
    return graph

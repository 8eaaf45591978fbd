"""Reconcile one NPUInference: plan what to change in its children, apply it, report the status.

The plan (`plan_child`) is pure and idempotent: a child that already matches what was last
applied and still holds every desired field needs nothing, so a settled resource costs no
writes. Like `kubectl apply`, the last applied manifest is kept in an annotation, so fields the
spec no longer sets are removed (merge patch with null) and hand edits are put back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import kopf

from npu_operator import aggregate, builders, crd, kube, ownership, status
from npu_operator.api import NPUInferenceSpec, SpecError, parse_spec, validate_spec
from npu_operator.config import OperatorConfig
from npu_operator.model_status import model_status
from npu_operator.report_schema import one_line
from npu_operator.runtime_reports import ReportCollector

JSON = dict[str, Any]

LAST_APPLIED: Final = f"{crd.GROUP}/last-applied"
MANAGED: Final = (
    kube.DEPLOYMENTS,
    kube.LEADER_WORKER_SETS,
    kube.SERVICES,
    kube.POD_DISRUPTION_BUDGETS,
    kube.POD_MONITORS,
)
# The workload that runs the pods: a Deployment (one node per replica) or a LeaderWorkerSet.
WORKLOADS: Final = (kube.DEPLOYMENTS, kube.LEADER_WORKER_SETS)
LWS_NOT_INSTALLED: Final = "LeaderWorkerSetNotInstalled"


@dataclasses.dataclass(frozen=True)
class Change:
    action: str  # create | patch | delete
    resource: kube.Resource
    name: str
    body: JSON | None = None


@dataclasses.dataclass(frozen=True)
class Result:
    """What a reconcile decided: the status patch, the events to post, the changes it made."""

    status_patch: JSON
    events: tuple[status.Event, ...]
    changes: tuple[Change, ...]
    problems: tuple[SpecError, ...] = ()


def read_spec(body: Mapping[str, Any]) -> tuple[NPUInferenceSpec | None, list[SpecError]]:
    """The typed spec and everything wrong with it (schema-level gaps included)."""
    try:
        spec = parse_spec(body.get("spec", {}))
    except SpecError as exc:
        return None, [exc]
    return spec, validate_spec(spec)


async def reconcile(
    body: Mapping[str, Any],
    client: kube.KubeClient,
    config: OperatorConfig,
    now: str,
    collector: ReportCollector | None = None,
) -> Result:
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = int(meta.get("generation", 1))
    previous = body.get("status") or {}
    spec, problems = read_spec(body)
    if spec is None or problems:
        new = status.invalid_status(generation, problems, previous, now)
        return _result(previous, new, (), tuple(problems))

    # Asked whether or not the spec wants a PodMonitor: one it no longer wants must be deleted.
    # PodMonitors are optional: whatever stops us from managing them never blocks the rest.
    notes: list[str] = []
    try:
        pod_monitors_served = await client.serves(kube.POD_MONITORS)
    except kube.ApiError as exc:
        pod_monitors_served = False
        if spec.pod_monitor.enabled:
            notes.append(f"PodMonitor not managed: {_api_message(exc)}")
    capabilities = builders.Capabilities(pod_monitor=spec.pod_monitor.enabled and pod_monitors_served)
    desired = adopted_children(body, spec, config, capabilities)
    desired_by_kind = {child["kind"]: child for child in desired}
    served = {kube.POD_MONITORS: pod_monitors_served}
    # Asked on every reconcile (discovery is cached): a LeaderWorkerSet left from an earlier
    # multi-node spec is deleted too. Without the API, one-node resources work as before.
    served[kube.LEADER_WORKER_SETS] = await client.serves(kube.LEADER_WORKER_SETS)
    blocked: tuple[str, str] | None = None
    if spec.npu.nodes > 1 and not served[kube.LEADER_WORKER_SETS]:
        blocked = (
            LWS_NOT_INSTALLED,
            f"spec.npu.nodes is {spec.npu.nodes}: a multi-node replica is a LeaderWorkerSet, but the "
            "leaderworkerset.x-k8s.io/v1 API is not installed; install LeaderWorkerSet (kubernetes-sigs/lws)",
        )

    changes: list[Change] = []
    conflicts: list[str] = []
    rejected: list[str] = []
    live_deployment: JSON | None = None
    for resource in MANAGED:
        if not served.get(resource, True):
            continue
        try:
            live = await client.get(resource, namespace, name)
        except kube.ApiError as exc:
            if resource is not kube.POD_MONITORS or exc.transient:
                raise
            notes.append(f"PodMonitor not managed: {_api_message(exc)}")
            continue
        if live is not None and not _owned_by(live, uid):
            conflicts.append(f"{resource.kind} {namespace}/{name}")
            continue
        change = plan_child(resource, name, desired_by_kind.get(resource.kind), live)
        if change is not None:
            changes.append(change)
        if resource in WORKLOADS and resource.kind in desired_by_kind:
            live_deployment = live
    if (claim := builders.build_cache_claim(namespace, spec)) is not None:
        changes += await ensure_cache_claim(client, namespace, claim)
    applied_changes: list[Change] = []
    for change in changes:
        try:
            applied = await _execute(change, client, namespace)
        except kube.ApiError as exc:
            if exc.transient:
                raise  # retried with backoff by the worker
            # A quota, an admission policy, an invalid field: retrying the same write cannot help
            # until something changes, so it becomes status (Degraded/ChildRejected) instead.
            where = f"{change.action} {change.resource.kind} {namespace}/{change.name}"
            if change.resource is kube.POD_MONITORS:
                notes.append(f"PodMonitor not managed: {where}: {_api_message(exc)}")
            else:
                rejected.append(f"{where}: {_api_message(exc)}")
            continue
        applied_changes.append(change)
        if change.resource in WORKLOADS and change.action != "delete":
            live_deployment = applied

    if spec.pod_monitor.enabled and not capabilities.pod_monitor and not notes:
        notes.append("PodMonitor not created: the monitoring.coreos.com/v1 API is not installed")
    pods = await _own_pods(client, namespace, name, live_deployment)
    reports = await collector.collect(uid, pods) if collector is not None else []
    graph = aggregate.graph_status(
        spec.graph.mode,
        reports,
        previous.get("graph", {}),
        now=now,
        same_generation=previous.get("observedGeneration") == generation,
    )
    observed = status.Observed(
        deployment=live_deployment,
        conflicts=tuple(conflicts),
        rejected=tuple(rejected),
        notes=tuple(notes),
        findings=aggregate.pod_findings(pods, reports, spec.npu.resource_name or config.npu_resource_name),
        graph=graph,
        blocked=blocked,
        model=model_status(spec.model.hub, pods, reports, previous.get("model", {})),
    )
    new = status.compute_status(name, namespace, generation, spec, observed, previous, now)
    return _result(previous, new, tuple(applied_changes))


async def _own_pods(
    client: kube.KubeClient, namespace: str, name: str, deployment: Mapping[str, Any] | None
) -> list[Mapping[str, Any]]:
    """The pods of our Deployment's ReplicaSets: the labels select, the owner chain decides."""
    uid = ((deployment or {}).get("metadata") or {}).get("uid")
    if not uid:
        return []
    selector = builders.selector_string(name)
    pods = await client.list(kube.PODS, namespace, selector)
    if not pods:
        return []
    replica_sets = await client.list(kube.REPLICA_SETS, namespace, selector)
    return ownership.owned_pods(pods, replica_sets, str(uid))


async def ensure_cache_claim(client: kube.KubeClient, namespace: str, claim: JSON) -> list[Change]:
    """Create the shared model cache's claim when it is missing; never change or delete one that exists
    (other resources share it, and a bound claim's spec is immutable)."""
    name = claim["metadata"]["name"]
    if await client.get(kube.PERSISTENT_VOLUME_CLAIMS, namespace, name) is not None:
        return []
    return [Change("create", kube.PERSISTENT_VOLUME_CLAIMS, name, claim)]


def adopted_children(
    body: Mapping[str, Any],
    spec: NPUInferenceSpec,
    config: OperatorConfig,
    capabilities: builders.Capabilities,
) -> list[JSON]:
    """The desired children, owned by `body` (owner references, namespace, the owner's labels)."""
    meta = body["metadata"]
    namespace = meta.get("namespace", "default")
    owner = {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {**meta, "namespace": namespace},
    }
    children = builders.build_children(meta["name"], namespace, spec, config, capabilities)
    for child in children:
        kopf.adopt(child, owner=owner)  # type: ignore[arg-type]
    return children


def _result(
    previous: Mapping[str, Any], new: JSON, changes: tuple[Change, ...], problems: tuple[SpecError, ...] = ()
) -> Result:
    events = status.transition_events(previous.get("conditions", ()), new.get("conditions", ()))
    for downgrade in aggregate.new_downgrades(previous.get("graph", {}), new.get("graph", {})):
        modes = f"{downgrade['fromMode']} -> {downgrade['toMode']}"
        why = downgrade["message"].removeprefix(f"{modes}: ")
        pods = f"{downgrade['pods']} pod" + ("s" if downgrade["pods"] != 1 else "")
        message = f"{modes} ({downgrade['reason']}, {downgrade['stage']} stage, {pods}): {why}"
        events.append(status.Event("Warning", status.GRAPH_MODE_DOWNGRADED, message))
    return Result(status.status_patch(previous, new), tuple(events), changes, problems)


def plan_child(resource: kube.Resource, name: str, desired: JSON | None, live: JSON | None) -> Change | None:
    """The one change that brings `live` to `desired` (None: already there)."""
    if desired is None:
        return Change("delete", resource, name) if live is not None else None
    manifest = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    annotated = _with_annotation(desired, LAST_APPLIED, manifest)
    if live is None:
        return Change("create", resource, name, annotated)
    last_text = live.get("metadata", {}).get("annotations", {}).get(LAST_APPLIED)
    last = json.loads(last_text) if last_text else {}
    if last == desired and contains(live, desired):
        return None
    return Change("patch", resource, name, merge_patch(last, annotated))


async def _execute(change: Change, client: kube.KubeClient, namespace: str) -> JSON | None:
    if change.action == "create":
        assert change.body is not None
        return await client.create(change.resource, namespace, change.body)
    if change.action == "patch":
        assert change.body is not None
        return await client.patch(change.resource, namespace, change.name, change.body)
    await client.delete(change.resource, namespace, change.name)
    return None


def merge_patch(last: Mapping[str, Any], desired: Mapping[str, Any]) -> JSON:
    """A merge patch that turns `last` into `desired`: `desired` plus a null for every key it dropped."""
    patch: JSON = dict(desired)
    for key, old in last.items():
        if key not in desired:
            patch[key] = None
        elif isinstance(old, Mapping) and isinstance(desired[key], Mapping):
            patch[key] = merge_patch(old, desired[key])
    return patch


def contains(live: Any, desired: Any, key: str = "") -> bool:
    """Whether `live` holds every field of `desired` (fields the API server added are ignored).

    Quantities compare by value, since the API server rewrites them (8000m is stored as 8).
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(k in live and contains(live[k], v, k) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(contains(a, b, key) for a, b in zip(live, desired, strict=True))
        )
    if live == desired:
        return True
    return _quantity(live) is not None and _quantity(live) == _quantity(desired)


_SUFFIXES: Final[dict[str, int | Decimal]] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


def _quantity(value: Any) -> Decimal | None:
    """The value of a Kubernetes quantity (int, '8', '8000m', '64Gi'), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(value)
    if not isinstance(value, str) or not value:
        return None
    number, factor = value, Decimal(1)
    for suffix, multiple in _SUFFIXES.items():
        if value.endswith(suffix):
            number, factor = value[: -len(suffix)], Decimal(multiple)
            break
    try:
        return Decimal(number) * factor
    except InvalidOperation:
        return None


def _api_message(exc: kube.ApiError) -> str:
    """The API server's answer in one bounded line: status, reason and its message."""
    return one_line(f"{exc.status} {exc.reason}: {exc.message}")


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences", []))


def _with_annotation(obj: JSON, key: str, value: str) -> JSON:
    metadata = dict(obj["metadata"])
    metadata["annotations"] = {**metadata.get("annotations", {}), key: value}
    return {**obj, "metadata": metadata}

"""Reconcile one NPUInference: bring its children to what its spec asks, report the status.

What depends only on the resource's generation (the parsed spec, its problems, the manifests
of the children) is computed once per generation (`DesiredCache`), not once per tick. The live
children and pods come from a `LiveView` (the watch caches of `watches`), so a settled resource
costs no request; `children.plan` decides which child needs a server-side apply or a delete.
A child the watch has not seen is created by an unforced apply, so that an object of someone
else under its name answers 409 (and is reported, left alone) instead of being taken over.

Every failure ends in a retry or in status, never in silence: a transient API error goes back to
the worker's backoff; a write the API server refuses for good (403, 422, a quota) is
Degraded/ChildRejected with its message; an optional child (PodMonitor) that cannot be managed
is a note and never blocks the others; a multi-node spec without the LeaderWorkerSet API is
Degraded/LeaderWorkerSetNotInstalled. Pods are taken from the watch by label, then kept only
when their owner chain leads to our workload (`ownership`): labels can be copied.

The calibration record (`children.CALIBRATION_RECORD`) is the one child written from the pods'
reports, not from the spec: `store_calibration` folds them into it (the rules live in
`calibration`) after the reports are read; a record the API server refuses is a note, never a
reason to stop serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import kopf

from npu_operator import (
    aggregate,
    builders,
    calibration,
    children,
    disaggregation,
    ownership,
    revisions,
    scaling,
    status,
)
from npu_operator.api import NPUInferenceSpec, SpecError, parse_spec, validate_spec
from npu_operator.children import ChildKind, Step
from npu_operator.client import PERSISTENT_VOLUME_CLAIMS, ApiError, KubeClient
from npu_operator.config import OperatorConfig
from npu_operator.model_status import model_status
from npu_operator.policy import policy_problems
from npu_operator.report_schema import one_line
from npu_operator.runtime_reports import ReportCollector

JSON = dict[str, Any]


class LiveView(Protocol):
    """Where the reconcile reads the cluster (`watches.WatchedView`: kopf's watch caches)."""

    def child(self, kind: ChildKind, namespace: str, owner: str) -> Mapping[str, Any] | None:
        """The live child of `kind` of the resource named `owner`, as last seen by the watch (only
        objects labelled as ours are seen)."""

    def pods(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]: ...

    def has_pods(self, namespace: str, name: str) -> bool:
        """Whether `pods` would find any (without copying them)."""

    def owner_links(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        """The ReplicaSets and StatefulSets with the resource's labels: the links of a pod's owner chain."""

    def children_of(self, kind: ChildKind, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        """Every object of `kind` with the resource's labels, whatever its name (a DisaggregatedSet's
        role LeaderWorkerSets, which its controller names)."""


@dataclasses.dataclass(frozen=True)
class Result:
    """What a reconcile decided: the status patch, the events to post, the writes it made."""

    status_patch: JSON
    events: tuple[status.Event, ...]
    changes: tuple[Step, ...]
    problems: tuple[SpecError, ...] = ()


@dataclasses.dataclass(frozen=True)
class Desired:
    """Everything that follows from one generation of the spec (and the optional APIs served)."""

    spec: NPUInferenceSpec | None
    problems: tuple[SpecError, ...]
    manifests: Mapping[str, JSON]  # kind -> the stamped manifest to apply (`children.CompactManifests`)
    notes: tuple[str, ...]  # optional children asked for whose API is not installed or usable
    # (reason, message): the workload itself cannot be made here (no LeaderWorkerSet API).
    blocked: tuple[str, str] | None = None
    cache_claim: JSON | None = None  # the shared model cache's claim, to create when missing
    rollout: revisions.Rollout | None = None  # a hub branch or tag: the rollout it is resolved for
    capacity: scaling.Capacity | None = None  # where spec.autoscaling or spec.routing reads it (`status`)


def read_spec(body: Mapping[str, Any], config: OperatorConfig) -> tuple[NPUInferenceSpec | None, list[SpecError]]:
    """The typed spec and everything wrong with it (schema-level gaps and the pod-template policy included)."""
    try:
        spec = parse_spec(body.get("spec", {}))
    except SpecError as exc:
        return None, [exc]
    return spec, validate_spec(spec) + scaling.spec_problems(spec, builders.plan_options(spec)) + policy_problems(
        spec, config
    )


def desired_state(
    body: Mapping[str, Any], config: OperatorConfig, served: frozenset[str], refused: Mapping[str, str] | None = None
) -> Desired:
    """The children `body` should have, given the optional kinds the API server serves (and,
    in `refused`, why the API of an optional kind could not even be asked)."""
    spec, problems = read_spec(body, config)
    if spec is None or problems:
        return Desired(spec, tuple(problems), {}, ())
    refused = refused or {}
    manifests: dict[str, JSON] = {}
    notes: list[str] = []
    blocked: tuple[str, str] | None = None
    owner = body["metadata"]["name"]
    startup = scaling.seen_startup_seconds(body.get("status") or {})
    # Built as if every optional API were served, so that what cannot be created is named.
    built = adopted_children(body, spec, config, builders.Capabilities.everything(), startup)
    rollout = revisions.rollout(body, spec, built)
    if rollout is not None:  # a branch or tag: its pods fetch the commit pinned for this rollout, once known
        fetching = revisions.for_rollout(spec, rollout)
        built = adopted_children(body, fetching, config, builders.Capabilities.everything(), startup)
        revisions.label(built, rollout.key)
    for child in built:
        kind = children.kind_of(child, owner)
        if kind.needs is not None and kind.needs not in served:
            continue  # useless without the API it needs, whose own note says it is missing
        if kind.optional and kind.kind not in served:
            why = refused.get(kind.kind) or f"the {kind.resource.api_version} API is not installed"
            if kind is children.LEADER_WORKER_SET:
                blocked = (
                    status.LWS_NOT_INSTALLED,
                    f"spec.npu.nodes is {spec.npu.nodes}: a multi-node replica is a LeaderWorkerSet, but {why}; "
                    "install LeaderWorkerSet (kubernetes-sigs/lws)",
                )
            elif kind is children.DISAGGREGATED_SET:
                blocked = (
                    status.DS_NOT_INSTALLED,
                    f"spec.disaggregation asks for prefill and decode roles, which are a DisaggregatedSet, but "
                    f"{why}; install LeaderWorkerSet v0.10 or later (kubernetes-sigs/lws)",
                )
            else:
                notes.append(f"{kind.kind} not managed: {why}")
            continue
        manifests[kind.key] = children.stamped(child)
    if blocked is not None and spec.disaggregation is not None:
        manifests = {}  # nothing else changes: no router without its engines
    claim = builders.build_cache_claim(body["metadata"].get("namespace", "default"), spec)
    # scaling.capacity raises only for a spec that read_spec has refused already
    capacity = (
        scaling.capacity(spec, builders.plan_options(spec))
        if spec.autoscaling is not None or spec.routing is not None
        else None
    )
    return Desired(spec, (), children.CompactManifests(manifests), tuple(notes), blocked, claim, rollout, capacity)


@dataclasses.dataclass
class DesiredCache:
    """One resource's `Desired`, recomputed only when its generation, labels or the served APIs change."""

    key: tuple[Any, ...] | None = None
    value: Desired | None = None
    cache_claim_checked: bool = False  # once per generation: a settled resource costs no request
    # The calibration record last made into its ConfigMap, by the owner it was adopted by
    # (`store_calibration`): the ConfigMap is made again only when one of them changes.
    calibration: tuple[tuple[Any, ...], JSON, children.CompactManifests] | None = None

    def get(
        self, body: Mapping[str, Any], config: OperatorConfig, served: frozenset[str], refused: Mapping[str, str]
    ) -> Desired:
        meta = body["metadata"]
        labels = tuple(sorted((meta.get("labels") or {}).items()))
        startup = scaling.seen_startup_seconds(body.get("status") or {})
        key: tuple[Any, ...] = (meta.get("uid"), meta.get("generation"), labels, served, tuple(sorted(refused.items())))
        key += (startup, *revisions.cache_key(body))  # and the annotation and commit of the rollout
        if self.value is None or key != self.key:
            self.key, self.value = key, desired_state(body, config, served, refused)
            self.cache_claim_checked = False
        return self.value


_OPTIONAL: tuple[ChildKind, ...] = tuple(kind for kind in children.KINDS if kind.optional)


async def served_kinds(client: KubeClient) -> tuple[frozenset[str], dict[str, str]]:
    """The optional kinds whose API the server offers (asked at most once per discovery interval),
    and why for those it would not even say (a 403 on discovery): never a reason to block the rest."""
    served: list[str] = []
    refused: dict[str, str] = {}
    known: dict[ChildKind, bool | BaseException | None] = {kind: client.served_now(kind.resource) for kind in _OPTIONAL}
    unknown = [kind for kind, answer in known.items() if answer is None]
    # Asked together: a resource's first reconcile waits for one round trip, not one per API.
    # Those known (nearly every tick) cost no task.
    if unknown:
        asked = await asyncio.gather(*(client.serves(kind.resource) for kind in unknown), return_exceptions=True)
        known.update(zip(unknown, asked, strict=True))
    for kind, answer in known.items():
        if isinstance(answer, ApiError) and not answer.transient:
            refused[kind.kind] = f"the {kind.resource.api_version} API cannot be used: {_api_message(answer)}"
        elif isinstance(answer, BaseException):
            raise answer
        elif answer:
            served.append(kind.kind)
    return frozenset(served), refused


async def reconcile(
    body: Mapping[str, Any],
    client: KubeClient,
    view: LiveView,
    config: OperatorConfig,
    now: str,
    collector: ReportCollector | None = None,
    cache: DesiredCache | None = None,
) -> Result:
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = int(meta.get("generation", 1))
    previous = body.get("status") or {}
    served, refused = await served_kinds(client)
    cache = cache or DesiredCache()
    desired = cache.get(body, config, served, refused)
    if desired.spec is None or desired.problems:
        new = status.invalid_status(generation, desired.problems, previous, now)
        return _result(previous, new, (), desired.problems)
    spec = desired.spec

    steps: list[Step] = []
    conflicts: list[str] = []
    rejected: list[str] = []
    notes = list(desired.notes)
    live_workload: Mapping[str, Any] | None = None
    # The engines' workload; a disaggregated resource's Deployment is its router.
    workloads = (children.DISAGGREGATED_SET,) if spec.disaggregation is not None else children.WORKLOADS
    router: Mapping[str, Any] | None = None  # a disaggregated resource's Deployment, as the watch saw it
    # Without the DisaggregatedSet API nothing of a disaggregated resource changes.
    kinds = () if desired.blocked is not None and spec.disaggregation is not None else children.KINDS
    for kind in kinds:
        if (kind.optional and kind.kind not in served) or kind.from_reports:
            continue
        child_name = kind.child_name(name)
        live = view.child(kind, namespace, name)
        if kind is children.DEPLOYMENT:
            router = live
        if live is not None and not children.owned_by(live, uid):
            conflicts.append(f"{kind.kind} {namespace}/{child_name}")
            continue
        step = children.plan_kept(kind, child_name, desired.manifests, live, uid)
        if step is not None:
            steps.append(step)
        if kind in workloads and kind.key in desired.manifests:
            live_workload = live
    applied_steps: list[Step] = []
    for step in steps:
        try:
            applied = await _execute(step, client, namespace, uid)
        except ForeignChild:
            conflicts.append(f"{step.child.kind} {namespace}/{step.name}")
            continue
        except ApiError as exc:
            if exc.transient:
                raise  # retried with backoff by the worker
            # A quota, an admission policy, an invalid field: retrying the same write cannot help
            # until something changes, so it becomes status (Degraded/ChildRejected) instead.
            where = f"{step.action} {step.child.kind} {namespace}/{step.name}: {_api_message(exc)}"
            if step.child.optional:
                notes.append(f"{step.child.kind} not managed: {where}")
            else:
                rejected.append(where)
            continue
        applied_steps.append(step)
        if step.child in workloads and step.action != "delete":
            live_workload = applied
    if desired.cache_claim is not None and not cache.cache_claim_checked:
        try:
            await ensure_cache_claim(client, namespace, desired.cache_claim)
            cache.cache_claim_checked = True
        except ApiError as exc:
            if exc.transient:
                raise
            rejected.append(
                f"create PersistentVolumeClaim {namespace}/{desired.cache_claim['metadata']['name']}: "
                f"{_api_message(exc)}"
            )

    by_role: dict[str, list[Mapping[str, Any]]] = {}
    if spec.disaggregation is not None:  # its pods: DisaggregatedSet -> role LeaderWorkerSets -> ...
        live_workload, by_role = role_view(view, namespace, name, live_workload, router)
    pods = (
        own_pods(view, namespace, name, live_workload)
        if spec.disaggregation is None
        else [pod for found in by_role.values() for pod in found]
    )
    names = {role: {pod_name(pod) for pod in found} for role, found in by_role.items()}  # each role's pods
    reports = await collector.collect(uid, pods) if collector is not None else []
    # The record is the decode role's (the spec's layout): a prefill pod's section never matches it.
    decode_pods = names.get("decode", set())
    calibrating = reports if spec.disaggregation is None else [r for r in reports if r.pod in decode_pods]
    calibrated, stored, why_not = await store_calibration(body, client, view, spec, calibrating, cache)
    if stored is not None:
        applied_steps.append(stored)
    if why_not is not None:
        notes.append(why_not)
    same_generation = previous.get("observedGeneration") == generation
    if spec.disaggregation is not None:
        role_reports = {role: [r for r in reports if r.pod in names[role]] for role in names}
        graph = disaggregation.graph_status(
            spec, role_reports, previous.get("graph", {}), now=now, same_generation=same_generation
        )
    else:
        graph = aggregate.graph_status(
            spec.graph.mode,
            reports,
            previous.get("graph", {}),
            now=now,
            same_generation=same_generation,
            nodes=spec.npu.nodes,
        )
    if calibrated is not None:
        graph["calibration"] = calibrated
    groups = (
        aggregate.group_findings(pods, reports, spec.npu.nodes, previous.get("graph", {}), spec.replicas)
        if spec.disaggregation is None
        else aggregate.GroupFindings()
    )
    if restarting := aggregate.restarting_groups(groups):
        graph["restartingGroups"] = restarting
        # A group being recreated is not failing: why it restarts is in the GroupRestarting message.
        pods = [pod for pod in pods if (ownership.rank_of(pod) or (-1, 0))[0] not in groups.restarting]
    model = model_status(spec.model.hub, pods, reports, previous.get("model", {}))
    repository = spec.model.hub.repository if spec.model.hub is not None else ""
    previous_resolved = previous.get("model", {}).get("resolved")
    resolution = revisions.resolve(desired.rollout, repository, pods, reports, previous_resolved, now)
    if model is not None and resolution.resolved is not None:
        model["resolved"] = resolution.resolved
    startup: int | None = None  # read only by the autoscaling status
    if spec.autoscaling is not None:
        seen = (scaling.observed_startup_seconds(pods), scaling.seen_startup_seconds(previous))
        startup = max((seconds for seconds in seen if seconds), default=None)
    observed = status.Observed(
        deployment=dict(live_workload) if live_workload is not None else None,
        conflicts=tuple(conflicts),
        rejected=tuple(rejected),
        notes=tuple(notes),
        findings=aggregate.pod_findings(pods, reports, spec.npu.resource_name or config.npu_resource_name),
        graph=graph,
        blocked=desired.blocked or resolution.problem,
        model=model,
        startup_seconds=startup,
        capacity=desired.capacity,
        groups=groups,
    )
    new = status.compute_status(name, namespace, generation, spec, observed, previous, now)
    return _result(previous, new, tuple(applied_steps))


def role_view(
    view: LiveView, namespace: str, name: str, ds: Mapping[str, Any] | None, router: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, dict[str, list[Mapping[str, Any]]]]:
    """A DisaggregatedSet's counts and each role's pods, through its role LeaderWorkerSets (`disaggregation`);
    `router` is the live Deployment that the reconcile read."""
    uid = ((ds or {}).get("metadata") or {}).get("uid")
    if ds is None or not uid:
        return ds, {}
    roles = disaggregation.role_workloads(view.children_of(children.LEADER_WORKER_SET, namespace, name), str(uid))
    pods = view.pods(namespace, name)
    counts = disaggregation.workload_view(ds, roles, router)
    return counts, disaggregation.role_pods(pods, view.owner_links(namespace, name), roles)


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def own_pods(view: LiveView, namespace: str, name: str, workload: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The pods of our workload: the labels select (the watch), the owner chain decides."""
    uid = ((workload or {}).get("metadata") or {}).get("uid")
    if not uid:
        return []
    pods = view.pods(namespace, name)
    if not pods:
        return []
    # A LeaderWorkerSet's leader pods are links too: they control their groups' worker StatefulSets.
    return ownership.owned_pods(pods, [*view.owner_links(namespace, name), *pods], str(uid))


async def ensure_cache_claim(client: KubeClient, namespace: str, claim: JSON) -> None:
    """Create the shared model cache's claim when it is missing; never change or delete one that exists
    (other resources share it, and a bound claim's spec is immutable). Unforced: one made meanwhile
    by someone else answers 409 and is left alone (retried, then found)."""
    if await client.get(PERSISTENT_VOLUME_CLAIMS, namespace, claim["metadata"]["name"]) is None:
        await client.apply(PERSISTENT_VOLUME_CLAIMS, namespace, claim, force=False)


async def store_calibration(
    body: Mapping[str, Any],
    client: KubeClient,
    view: LiveView,
    spec: NPUInferenceSpec,
    reports: Sequence[aggregate.PodReport],
    cache: DesiredCache | None = None,
) -> tuple[JSON | None, Step | None, str | None]:
    """Fold the current calibration sections of the resource's own pods into its stored record
    (`calibration.fold_record`: the trust rules) and apply the record's ConfigMap when it changed.

    Returns `status.graph.calibration`, the write made (None: none was needed) and, when the
    record could not be written, a note saying why: the pods serve on with their estimates.
    """
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    kind = children.CALIBRATION_RECORD
    child_name = kind.child_name(name)
    live = view.child(kind, namespace, name)
    not_ours = f"calibration not kept: {kind.kind} {namespace}/{child_name} is not ours, left alone"
    if live is not None and not children.owned_by(live, uid):
        return None, None, not_ours
    sections = [r.current.calibration for r in reports if r.current is not None and r.current.calibration is not None]
    layout = calibration.spec_layout(
        spec.parallelism.tensor, spec.parallelism.pipeline, spec.parallelism.data, spec.npu.nodes
    )
    record = calibration.fold_record(calibration.stored_record(live), sections, layout)
    shown = calibration.graph_section(sections, record, name)
    if record is None:
        return shown, None, None
    # What `adopt` reads of the owner: the ConfigMap is the same while these and the record are.
    owner = (body["apiVersion"], body["kind"], name, namespace, uid, tuple(sorted((meta.get("labels") or {}).items())))
    made = cache.calibration if cache is not None else None
    if made is None or made[0] != owner or made[1] != record:
        configmap = calibration.configmap(name, namespace, builders.labels(name), record)
        made = owner, record, children.CompactManifests({kind.key: children.stamped(adopt(body, configmap))})
        if cache is not None:
            cache.calibration = made
    step = children.plan_kept(kind, child_name, made[2], live, uid)  # a settled record is not even parsed
    if step is None:
        return shown, None, None
    try:
        await _execute(step, client, namespace, uid)
    except ForeignChild:
        return shown, None, not_ours
    except ApiError as exc:
        if exc.transient:
            raise
        return (
            shown,
            None,
            f"calibration not kept: {step.action} {kind.kind} {namespace}/{child_name}: {_api_message(exc)}",
        )
    return shown, step, None


def adopt(body: Mapping[str, Any], child: JSON) -> JSON:
    """`child`, owned by `body` (owner reference, namespace, the owner's labels): garbage-collected with it."""
    meta = body["metadata"]
    owner = {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {**meta, "namespace": meta.get("namespace", "default")},
    }
    kopf.adopt(child, owner=owner)  # type: ignore[arg-type]
    return child


def adopted_children(
    body: Mapping[str, Any],
    spec: NPUInferenceSpec,
    config: OperatorConfig,
    capabilities: builders.Capabilities,
    startup_seconds: int | None = None,
) -> list[JSON]:
    """The desired children, owned by `body` (owner references, namespace, the owner's labels)."""
    meta = body["metadata"]
    built = builders.build_children(
        meta["name"], meta.get("namespace", "default"), spec, config, capabilities, startup_seconds
    )
    return [adopt(body, child) for child in built]


def _result(
    previous: Mapping[str, Any], new: JSON, changes: tuple[Step, ...], problems: tuple[SpecError, ...] = ()
) -> Result:
    events = status.transition_events(previous.get("conditions", ()), new.get("conditions", ()))
    resolved = (previous.get("model") or {}).get("resolved"), (new.get("model") or {}).get("resolved")
    events += [status.Event("Normal", *event) for event in revisions.resolution_events(*resolved)]
    old_graph, new_graph = previous.get("graph", {}), new.get("graph", {})
    old_roles = dict(disaggregation.role_graphs(old_graph))
    for role, graph in disaggregation.role_graphs(new_graph):  # a disaggregated resource: each role's own
        events += graph_events(old_roles.get(role, {}), graph, f"role {role}, ")
    if "roles" not in new_graph:
        events += graph_events(old_graph, new_graph)
    return Result(status.status_patch(previous, new), tuple(events), changes, problems)


def graph_events(old_graph: Mapping[str, Any], new_graph: Mapping[str, Any], role: str = "") -> list[status.Event]:
    """A Warning Event per downgrade or rank failure that `new_graph` shows and `old_graph` did not;
    `role` ("role decode, ") starts the message of a disaggregated resource's role."""
    events: list[status.Event] = []
    ranked = "ranks" in new_graph  # a multi-node replica: the Events name the rank instead
    announced: set[str] = set()
    for rank in aggregate.new_rank_problems(old_graph, new_graph):
        where = f"{role}group {rank['group']} node {rank['node']} (pod {rank['pod']})"
        if "failure" in rank:
            events.append(status.Event("Warning", status.RANK_FAILED, f"{where}: {rank['failure']}"))
        if "downgrade" in rank:
            reason = rank["downgrade"]
            announced.add(reason)
            known = next((d for d in new_graph.get("downgrades", []) if d["reason"] == reason), None)
            message = (
                f"{where}: {known['fromMode']} -> {known['toMode']} ({reason}, {known['stage']} stage): "
                f"{known['message']}"
                if known is not None
                else f"{where}: {rank.get('mode', 'an other mode')} ({reason})"
            )
            events.append(status.Event("Warning", status.GRAPH_MODE_DOWNGRADED, message))
    for downgrade in aggregate.new_downgrades(old_graph, new_graph):
        if ranked and downgrade["reason"] in announced:
            continue
        modes = f"{downgrade['fromMode']} -> {downgrade['toMode']}"
        why = downgrade["message"].removeprefix(f"{modes}: ")
        pods = f"{downgrade['pods']} pod" + ("s" if downgrade["pods"] != 1 else "")
        message = f"{role}{modes} ({downgrade['reason']}, {downgrade['stage']} stage, {pods}): {why}"
        events.append(status.Event("Warning", status.GRAPH_MODE_DOWNGRADED, message))
    return events


def _api_message(exc: ApiError) -> str:
    """The API server's answer in one bounded line: status, reason and its message."""
    return one_line(f"{exc.status} {exc.reason}: {exc.message}")


class ForeignChild(Exception):
    """A child we would create exists already and belongs to someone else: it is left alone."""


async def _execute(step: Step, client: KubeClient, namespace: str, uid: str) -> JSON | None:
    resource = step.child.resource
    if step.action == "delete":
        await client.delete(resource, namespace, step.name)
        return None
    assert step.body is not None
    if step.action == "apply":
        return await client.apply(resource, namespace, step.body)
    # create: the watch has not seen it. Unforced, so that an object of someone else under this
    # name answers 409 instead of being taken over; only then is it worth a GET.
    try:
        return await client.apply(resource, namespace, step.body, force=False)
    except ApiError as exc:
        if exc.status != 409:
            raise
    existing = await client.get(resource, namespace, step.name)
    if existing is not None and not children.owned_by(existing, uid):
        raise ForeignChild(step.name)
    return await client.apply(resource, namespace, step.body)

"""Reconcile one NPUInference: one pipeline for every topology, desired -> apply -> observe -> status.

- desired: what the resource's generation asks for (`desired.DesiredCache`, once per generation);
- apply: each child brought to its manifest by server-side apply, or deleted (`children.kinds.plan_kept`
  decides without a request; `apply.execute` writes);
- observe: the resource's topology (`topologies.of`) finds its workload and engine pods in the watch
  caches (`LiveView`), their runtimes' reports are read (`status.collector`), the calibration record
  is folded from them (`store_calibration`);
- status: `status.resource.compute_status`, the patch of what changed, and the Events it implies.

Every failure ends in a retry or in status, never in silence: a transient API error goes back to
the worker's backoff; a write the API server refuses for good (403, 422, a quota) is
Degraded/ChildRejected with its message; an optional child (PodMonitor) that cannot be managed
is a note and never blocks the others; a workload whose API is not installed is its topology's
condition (Degraded/LeaderWorkerSetNotInstalled, DisaggregatedSetNotInstalled). Pods are taken
from the watch by label, then kept only when their owner chain leads to our workload
(`kube.ownership`): labels can be copied.

The calibration record (`children.kinds.CALIBRATION_RECORD`) is the one child written from the
pods' reports, not from the spec: `ensure_calibration_record` creates it empty before any other
child (the pods mount it by name: a foreign object of that name holds everything), and
`store_calibration` folds the reports into it (the rules live in `status.calibration`) after they
are read; a record the API server refuses is a note, never a reason to stop serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from npu_operator import topologies
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec, SpecError
from npu_operator.children import kinds as children
from npu_operator.children import scaling
from npu_operator.children.kinds import Step
from npu_operator.controller import apply
from npu_operator.controller.desired import Desired, DesiredCache, adopt
from npu_operator.kube.client import ApiError, KubeClient
from npu_operator.kube.names import labels
from npu_operator.kube.ownership import rank_of
from npu_operator.status import calibration, decode_batches, findings, placement, resource, revisions
from npu_operator.status.adapters import adapters_status
from npu_operator.status.collector import ReportCollector
from npu_operator.status.findings import PodReport
from npu_operator.status.graph import role_graphs
from npu_operator.status.model import model_status
from npu_operator.topologies.base import Found, LiveView, Seen, Topology, pod_name

JSON = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Result:
    """What a reconcile decided: the status patch, the events to post, the writes it made."""

    status_patch: JSON
    events: tuple[resource.Event, ...]
    changes: tuple[Step, ...]
    problems: tuple[SpecError, ...] = ()


@dataclasses.dataclass
class Written:
    """What applying the children did: the writes made, what stood in the way, the live workload."""

    steps: list[Step] = dataclasses.field(default_factory=list)
    conflicts: list[str] = dataclasses.field(default_factory=list)  # "Service default/x": someone else's
    rejected: list[str] = dataclasses.field(default_factory=list)  # writes the API server refused for good
    notes: list[str] = dataclasses.field(default_factory=list)  # optional children that cannot be managed
    workload: Mapping[str, Any] | None = None  # as the watch saw it, or as our apply returned it
    # (reason, message): nothing was applied, e.g. the calibration record's name is someone else's.
    held: tuple[str, str] | None = None


async def reconcile(
    body: Mapping[str, Any],
    client: KubeClient,
    view: LiveView,
    config: OperatorConfig,
    now: str,
    collector: ReportCollector | None = None,
    cache: DesiredCache | None = None,
    offer: placement.Offer | None = None,
) -> Result:
    """One reconcile of the resource `body`; `offer`: what the Nodes offer of NPUs, when known."""
    meta = body["metadata"]
    generation = int(meta.get("generation", 1))
    previous = body.get("status") or {}
    served, refused = await apply.served_kinds(client)
    cache = cache or DesiredCache()
    desired = cache.get(body, config, served, refused)
    if desired.spec is None or desired.problems:
        new = resource.invalid_status(generation, desired.problems, previous, now)
        return _result(previous, new, (), desired.problems)
    topology = topologies.of(desired.spec)
    written = await apply_children(body, client, view, desired, served, topology, cache)
    seen = Seen.of(body.get("status") or {})
    found = topology.find(view, meta["namespace"], meta["name"], written.workload, seen)
    observed = await observe(
        body, client, view, config, desired, topology, found, written, now, collector, cache, offer
    )
    new = resource.compute_status(meta["name"], meta["namespace"], generation, desired.spec, observed, previous, now)
    return _result(previous, new, tuple(written.steps))


async def apply_children(
    body: Mapping[str, Any],
    client: KubeClient,
    view: LiveView,
    desired: Desired,
    served: frozenset[str],
    topology: Topology,
    cache: DesiredCache,
) -> Written:
    """Bring every child to its manifest (create, apply or delete), and the shared cache's claim into being."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    written = Written(notes=list(desired.notes))
    steps: list[Step] = []
    # Without its workload's API, a topology that holds everything changes nothing.
    held = desired.blocked is not None and topology.holds_all_without_api
    if not held:
        # The pods mount the record by name: it is ours before any pod exists, or nothing rolls out.
        record_step, written.held = await ensure_calibration_record(body, client, view)
        if record_step is not None:
            written.steps.append(record_step)
        held = written.held is not None
    for kind in () if held else children.KINDS:
        if (kind.optional and kind.kind not in served) or kind.from_reports:
            continue
        child_name = kind.child_name(name)
        live = view.child(kind, namespace, name)
        if live is not None and not children.owned_by(live, uid):
            written.conflicts.append(f"{kind.kind} {namespace}/{child_name}")
            continue
        step = children.plan_kept(kind, child_name, desired.manifests, live, uid)
        if step is not None:
            steps.append(step)
        if kind is topology.workload and kind.key in desired.manifests:
            written.workload = live
    for step in steps:
        try:
            applied = await apply.execute(step, client, namespace, uid)
        except apply.ForeignChild:
            written.conflicts.append(f"{step.child.kind} {namespace}/{step.name}")
            continue
        except ApiError as exc:
            if exc.transient:
                raise  # retried with backoff by the worker
            # A quota, an admission policy, an invalid field: retrying the same write cannot help
            # until something changes, so it becomes status (Degraded/ChildRejected) instead.
            where = f"{step.action} {step.child.kind} {namespace}/{step.name}: {apply.api_message(exc)}"
            if step.child.optional:
                written.notes.append(f"{step.child.kind} not managed: {where}")
            else:
                written.rejected.append(where)
            continue
        written.steps.append(step)
        if step.child is topology.workload and step.action != "delete":
            written.workload = applied
    if desired.cache_claim is not None and not cache.cache_claim_checked:
        try:
            await apply.ensure_cache_claim(client, namespace, desired.cache_claim)
            cache.cache_claim_checked = True
        except ApiError as exc:
            if exc.transient:
                raise
            claim = desired.cache_claim["metadata"]["name"]
            written.rejected.append(f"create PersistentVolumeClaim {namespace}/{claim}: {apply.api_message(exc)}")
    return written


async def observe(
    body: Mapping[str, Any],
    client: KubeClient,
    view: LiveView,
    config: OperatorConfig,
    desired: Desired,
    topology: Topology,
    found: Found,
    written: Written,
    now: str,
    collector: ReportCollector | None,
    cache: DesiredCache,
    offer: placement.Offer | None = None,
) -> resource.Observed:
    """What the cluster and the pods' runtimes say of the resource, for its status."""
    assert desired.spec is not None
    spec = desired.spec
    meta = body["metadata"]
    previous = body.get("status") or {}
    previous_graph = previous.get("graph", {})
    reports = await collector.collect(meta["uid"], found.pods) if collector is not None else []
    calibrating = topology.calibrating(reports, found)
    calibrated, stored, why_not = await store_calibration(body, client, view, spec, calibrating, cache, found.pods)
    if stored is not None:
        written.steps.append(stored)
    if why_not is not None:
        written.notes.append(why_not)
    rejected = calibration.rejected_message((calibrated or {}).get("implausible") or {})
    same_generation = previous.get("observedGeneration") == int(meta.get("generation", 1))
    graph = topology.graph(spec, reports, found, previous_graph, now=now, same_generation=same_generation)
    if calibrated is not None:
        graph["calibration"] = calibrated
    pods = list(found.pods)
    groups = topology.groups(spec, pods, reports, previous_graph)
    if restarting := findings.restarting_groups(groups):
        graph["restartingGroups"] = restarting
        # A group being recreated is not failing: why it restarts is in the GroupRestarting message.
        pods = [pod for pod in pods if (rank_of(pod) or (-1, 0))[0] not in groups.restarting]
    model = model_status(spec.model.hub, pods, reports, previous.get("model", {}))
    repository = spec.model.hub.repository if spec.model.hub is not None else ""
    previous_resolved = previous.get("model", {}).get("resolved")
    resolution = revisions.resolve(desired.rollout, repository, pods, reports, previous_resolved, now)
    if model is not None and resolution.resolved is not None:
        model["resolved"] = resolution.resolved
    adapters, adapter_failed = adapters_status(spec, pods, reports)
    startup: int | None = None  # read only by the autoscaling status
    if spec.autoscaling is not None:
        startup = scaling.startup_in_force(pods, previous)
    return resource.Observed(
        workload=dict(found.workload) if found.workload is not None else None,
        workload_kind=topology.workload.kind,
        topology_status=found.status,
        conflicts=tuple(written.conflicts),
        rejected=tuple(written.rejected),
        notes=tuple(written.notes),
        findings=findings.pod_findings(pods, reports, placement.asks(spec, config), offer),
        graph=graph,
        blocked=desired.blocked or written.held or resolution.problem,
        model=model,
        startup_seconds=startup,
        capacity=desired.capacity,
        groups=groups,
        calibration_rejected=rejected,
        adapters=tuple(adapters),
        adapter_failed=adapter_failed,
    )


async def ensure_calibration_record(
    body: Mapping[str, Any], client: KubeClient, view: LiveView
) -> tuple[Step | None, tuple[str, str] | None]:
    """The resource's calibration record ConfigMap, created empty (owned, labelled) before anything
    else: the pods mount it by name, so a ConfigMap of that name that is not ours (someone who may
    create ConfigMaps in the namespace made it first) would be applied by every pod's plan.
    Returns the create made, if any, and (reason, message) when nothing may be rolled out."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    kind = children.CALIBRATION_RECORD
    child_name = kind.child_name(name)
    foreign = (
        resource.CALIBRATION_RECORD_CONFLICT,
        f"ConfigMap {namespace}/{child_name} is not owned by this NPUInference: its pods would mount it as "
        "their calibration record, so nothing is rolled out until it is deleted or renamed",
    )
    live = view.child(kind, namespace, name)
    if live is not None:
        return None, None if children.owned_by(live, uid) else foreign
    # A POST, not the unforced apply of other children: an apply merges into an unlabelled object of
    # that name (the watch never sees one) wherever no field conflicts, adding our owner reference.
    empty = children.stamped(adopt(body, calibration.configmap(name, namespace, labels(name), None)))
    try:
        await client.create(kind.resource, namespace, empty)
    except ApiError as exc:
        if exc.status == 409:
            existing = await client.get(kind.resource, namespace, child_name)
            return None, None if existing is not None and children.owned_by(existing, uid) else foreign
        if exc.transient:
            raise
        where = f"create {kind.kind} {namespace}/{child_name}: {apply.api_message(exc)}"
        return None, (
            resource.CHILD_REJECTED,
            f"the calibration record comes first, and the API server refused: {where}",
        )
    return Step("create", kind, child_name, empty), None


async def store_calibration(
    body: Mapping[str, Any],
    client: KubeClient,
    view: LiveView,
    spec: NPUInferenceSpec,
    reports: Sequence[PodReport],
    cache: DesiredCache | None = None,
    pods: Sequence[Mapping[str, Any]] = (),
) -> tuple[JSON | None, Step | None, str | None]:
    """Fold the current calibration sections of the resource's own pods (`pods`: who each one is)
    into its stored record (`calibration.fold_record`: the trust rules) and apply the record's
    ConfigMap when it changed.

    Returns `status.graph.calibration` (with the figures it did not keep: `implausible`), the write
    made (None: none was needed) and, when the record could not be written, a note saying why: the
    pods serve on with their estimates.
    """
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    kind = children.CALIBRATION_RECORD
    child_name = kind.child_name(name)
    live = view.child(kind, namespace, name)
    not_ours = f"calibration not kept: {kind.kind} {namespace}/{child_name} is not ours, left alone"
    if live is not None and not children.owned_by(live, uid):
        return None, None, not_ours
    who = {pod_name(pod): reporter(pod) for pod in pods}
    sections = [
        (who.get(r.pod) or calibration.Reporter(r.pod, r.pod), r.current.calibration)
        for r in reports
        if r.current is not None and r.current.calibration is not None
    ]
    rejected = {
        reporter.pod: sorted(found) for reporter, section in sections if (found := calibration.implausible(section))
    }
    stored = calibration.stored_record(live)
    record = calibration.fold_record(stored, sections, calibration_layouts(spec), calibration_role(spec))
    # issue 37: the decode batches the pods ran, for the next plan's capture sizes (none from a pod
    # whose report was implausible)
    batches = [
        (by.uid, s.key, s.decode_batches)
        for by, s in sections
        if s.decode_batches is not None and by.pod not in rejected
    ]
    record = decode_batches.fold(stored, record, batches, decode_batches.spec_limits(spec))
    shown = calibration.graph_section([section for _, section in sections], record, name, rejected)
    if extra := decode_batches.record_fields(record):
        shown = {**(shown or {}), **extra}
    if record is None:
        return shown, None, None
    # What `adopt` reads of the owner: the ConfigMap is the same while these and the record are.
    owner = (body["apiVersion"], body["kind"], name, namespace, uid, tuple(sorted((meta.get("labels") or {}).items())))
    made = cache.calibration if cache is not None else None
    if made is None or made[0] != owner or made[1] != record:
        configmap = calibration.configmap(name, namespace, labels(name), record)
        made = owner, record, children.CompactManifests({kind.key: children.stamped(adopt(body, configmap))})
        if cache is not None:
            cache.calibration = made
    step = children.plan_kept(kind, child_name, made[2], live, uid)  # a settled record is not even parsed
    if step is None:
        return shown, None, None
    try:
        await apply.execute(step, client, namespace, uid)
    except apply.ForeignChild:
        return shown, None, not_ours
    except ApiError as exc:
        if exc.transient:
            raise
        return (
            shown,
            None,
            f"calibration not kept: {step.action} {kind.kind} {namespace}/{child_name}: {apply.api_message(exc)}",
        )
    return shown, step, None


def reporter(pod: Mapping[str, Any]) -> calibration.Reporter:
    """Who a pod is to the calibration record: its name, uid and its containers' restarts, from the
    pod object the watch holds (a run of a pod is its uid and restart count)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    restarts = sum(
        int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [] if isinstance(c, Mapping)
    )
    name = pod_name(pod)
    return calibration.Reporter(name, str(meta.get("uid") or name), restarts)


def calibration_layouts(spec: NPUInferenceSpec) -> frozenset[str]:
    """The layout keys the resource's calibrating pods (the decode role's, for P/D) may report."""
    eplb = (spec.engine.additional_config or {}).get("eplb_config")
    redundant = eplb.get("num_redundant_experts") if isinstance(eplb, Mapping) else None
    parallelism = spec.parallelism
    return calibration.expected_layouts(
        parallelism.tensor,
        parallelism.pipeline,
        parallelism.data,
        spec.npu.nodes,
        expert=parallelism.expert,
        redundant=redundant if isinstance(redundant, int) and not isinstance(redundant, bool) else 0,
    )


def calibration_role(spec: NPUInferenceSpec) -> str | None:
    """The role in the record's key: decode for a P/D resource (its record is the decode role's;
    prefill pods mount none), none for the others."""
    return "decode" if spec.disaggregation is not None else None


def _result(
    previous: Mapping[str, Any], new: JSON, changes: tuple[Step, ...], problems: tuple[SpecError, ...] = ()
) -> Result:
    events = resource.transition_events(previous.get("conditions", ()), new.get("conditions", ()))
    resolved = (previous.get("model") or {}).get("resolved"), (new.get("model") or {}).get("resolved")
    events += [resource.Event("Normal", *event) for event in revisions.resolution_events(*resolved)]
    old_graph, new_graph = previous.get("graph", {}), new.get("graph", {})
    old_roles = dict(role_graphs(old_graph))
    for role, graph in role_graphs(new_graph):  # a disaggregated resource: each role's own
        events += resource.graph_events(old_roles.get(role, {}), graph, f"role {role}, ")
    if "roles" not in new_graph:
        events += resource.graph_events(old_graph, new_graph)
    return Result(resource.status_patch(previous, new), tuple(events), changes, problems)

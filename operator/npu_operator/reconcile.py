"""Reconcile one NPUInference: bring its children to what its spec asks, report the status.

What depends only on the resource's generation (the parsed spec, its problems, the manifests
of the children) is computed once per generation (`DesiredCache`), not once per tick. The live
children and pods come from a `LiveView` (the watch caches of `watches`), so a settled resource
costs no request; `children.plan` decides which child needs a server-side apply or a delete.
A child the watch has not seen is created by an unforced apply, so that an object of someone
else under its name answers 409 (and is reported, left alone) instead of being taken over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import kopf

from npu_operator import aggregate, builders, children, status
from npu_operator.api import NPUInferenceSpec, SpecError, parse_spec, validate_spec
from npu_operator.children import ChildKind, Step
from npu_operator.client import ApiError, KubeClient
from npu_operator.config import OperatorConfig
from npu_operator.runtime_reports import ReportCollector

JSON = dict[str, Any]


class LiveView(Protocol):
    """Where the reconcile reads the cluster (`watches.WatchedView`: kopf's watch caches)."""

    def child(self, kind: ChildKind, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The live child, as last seen by the watch (only objects labelled as ours are seen)."""

    def pods(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]: ...


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
    manifests: Mapping[str, JSON]  # kind -> the stamped manifest to apply
    notes: tuple[str, ...]  # children asked for whose API is not installed


def read_spec(body: Mapping[str, Any]) -> tuple[NPUInferenceSpec | None, list[SpecError]]:
    """The typed spec and everything wrong with it (schema-level gaps included)."""
    try:
        spec = parse_spec(body.get("spec", {}))
    except SpecError as exc:
        return None, [exc]
    return spec, validate_spec(spec)


def desired_state(body: Mapping[str, Any], config: OperatorConfig, served: frozenset[str]) -> Desired:
    """The children `body` should have, given the optional kinds the API server serves."""
    spec, problems = read_spec(body)
    if spec is None or problems:
        return Desired(spec, tuple(problems), {}, ())
    manifests: dict[str, JSON] = {}
    notes: list[str] = []
    # Built as if every optional API were served, so that what cannot be created is named.
    for child in adopted_children(body, spec, config, builders.Capabilities(pod_monitor=True)):
        kind = children.BY_KIND[child["kind"]]
        if kind.optional and kind.kind not in served:
            notes.append(f"{kind.kind} not created: the {kind.resource.api_version} API is not installed")
            continue
        manifests[kind.kind] = children.stamped(child)
    return Desired(spec, (), manifests, tuple(notes))


@dataclasses.dataclass
class DesiredCache:
    """One resource's `Desired`, recomputed only when its generation, labels or the served APIs change."""

    key: tuple[Any, ...] | None = None
    value: Desired | None = None

    def get(self, body: Mapping[str, Any], config: OperatorConfig, served: frozenset[str]) -> Desired:
        meta = body["metadata"]
        key = (meta.get("uid"), meta.get("generation"), tuple(sorted((meta.get("labels") or {}).items())), served)
        if self.value is None or key != self.key:
            self.key, self.value = key, desired_state(body, config, served)
        return self.value


async def served_kinds(client: KubeClient) -> frozenset[str]:
    """The optional kinds whose API the server offers (asked at most once per discovery interval)."""
    return frozenset([kind.kind for kind in children.KINDS if kind.optional and await client.serves(kind.resource)])


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
    served = await served_kinds(client)
    desired = (cache or DesiredCache()).get(body, config, served)
    if desired.spec is None or desired.problems:
        new = status.invalid_status(generation, desired.problems, previous, now)
        return _result(previous, new, (), desired.problems)
    spec = desired.spec

    steps: list[Step] = []
    conflicts: list[str] = []
    live_deployment: Mapping[str, Any] | None = None
    for kind in children.KINDS:
        if kind.optional and kind.kind not in served:
            continue
        manifest = desired.manifests.get(kind.kind)
        live = view.child(kind, namespace, name)
        if live is not None and not children.owned_by(live, uid):
            conflicts.append(f"{kind.kind} {namespace}/{name}")
            continue
        step = children.plan(kind, name, manifest, live, uid)
        if step is not None:
            steps.append(step)
        if kind is children.DEPLOYMENT:
            live_deployment = live
    for step in steps:
        try:
            applied = await _execute(step, client, namespace, uid)
        except ForeignChild:
            conflicts.append(f"{step.child.kind} {namespace}/{step.name}")
            continue
        if step.child is children.DEPLOYMENT:
            live_deployment = applied

    pods = view.pods(namespace, name) if live_deployment else []
    reports = await collector.collect(uid, pods) if collector is not None else []
    graph = aggregate.graph_status(
        spec.graph.mode,
        reports,
        previous.get("graph", {}),
        now=now,
        same_generation=previous.get("observedGeneration") == generation,
    )
    observed = status.Observed(
        deployment=dict(live_deployment) if live_deployment is not None else None,
        conflicts=tuple(conflicts),
        notes=desired.notes,
        findings=aggregate.pod_findings(pods, reports, spec.npu.resource_name or config.npu_resource_name),
        graph=graph,
    )
    new = status.compute_status(name, namespace, generation, spec, observed, previous, now)
    return _result(previous, new, tuple(steps))


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
    built = builders.build_children(meta["name"], namespace, spec, config, capabilities)
    for child in built:
        kopf.adopt(child, owner=owner)  # type: ignore[arg-type]
    return built


def _result(
    previous: Mapping[str, Any], new: JSON, changes: tuple[Step, ...], problems: tuple[SpecError, ...] = ()
) -> Result:
    events = status.transition_events(previous.get("conditions", ()), new.get("conditions", ()))
    for downgrade in aggregate.new_downgrades(previous.get("graph", {}), new.get("graph", {})):
        modes = f"{downgrade['fromMode']} -> {downgrade['toMode']}"
        why = downgrade["message"].removeprefix(f"{modes}: ")
        pods = f"{downgrade['pods']} pod" + ("s" if downgrade["pods"] != 1 else "")
        message = f"{modes} ({downgrade['reason']}, {downgrade['stage']} stage, {pods}): {why}"
        events.append(status.Event("Warning", status.GRAPH_MODE_DOWNGRADED, message))
    return Result(status.status_patch(previous, new), tuple(events), changes, problems)


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

"""What one generation of a resource asks for: its typed spec, its problems, its children's manifests.

Everything here depends only on the resource (its generation, labels, the rollout annotation) and
on the optional APIs the server offers, so it is computed once per generation (`DesiredCache`), not
once per tick. The children are those of the resource's topology (`topologies.build_children`),
owned by the resource (`adopt`) and stamped with their digest (`children.kinds.stamped`); an
optional child whose API is not served is a note, a workload whose API is not served blocks the
resource with its topology's reason.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from typing import Any

import kopf

from npu_operator import topologies
from npu_operator.api.config import OperatorConfig
from npu_operator.api.policy import policy_problems
from npu_operator.api.spec import NPUInferenceSpec, SpecError, parse_spec, plan_options
from npu_operator.api.validation import validate_spec
from npu_operator.children import kinds as children
from npu_operator.children import scaling
from npu_operator.children.kinds import Capabilities
from npu_operator.children.workloads import build_cache_claim
from npu_operator.kube.objects import document_digest
from npu_operator.status import revisions
from npu_operator.topologies.base import NOTHING_SEEN, Seen

JSON = dict[str, Any]


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
    capacity: scaling.Capacity | None = None  # where spec.autoscaling or spec.routing reads it (`status.resource`)


# The typed specs in use, by the digest of the spec they were read from: resources with equal
# specs share one (it is frozen), and one goes once no `Desired` holds it.
_TYPED_SPECS: weakref.WeakValueDictionary[bytes, NPUInferenceSpec] = weakref.WeakValueDictionary()


def typed_spec(raw: Mapping[str, Any]) -> NPUInferenceSpec:
    """`parse_spec(raw)`, the same object for equal specs. Raises SpecError as it does."""
    digest = document_digest(raw)
    spec = _TYPED_SPECS.get(digest)
    if spec is None:
        _TYPED_SPECS[digest] = spec = parse_spec(raw)
    return spec


def read_spec(body: Mapping[str, Any], config: OperatorConfig) -> tuple[NPUInferenceSpec | None, list[SpecError]]:
    """The typed spec and everything wrong with it (schema-level gaps, a name too long for what is
    derived from it, and the pod-template policy included)."""
    try:
        spec = typed_spec(body.get("spec", {}))
    except SpecError as exc:
        return None, [exc]
    meta = body.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    problems = validate_spec(spec, name if isinstance(name, str) else None)
    namespace = namespace if isinstance(namespace, str) else None
    return spec, problems + scaling.spec_problems(spec, plan_options(spec)) + policy_problems(spec, config, namespace)


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
    seen = Seen.of(body.get("status") or {})
    # Built as if every optional API were served, so that what cannot be created is named.
    built = adopted_children(body, spec, config, Capabilities.everything(), seen)
    rollout = revisions.rollout(body, spec, built)
    if rollout is not None:  # a branch or tag: its pods fetch the commit pinned for this rollout, once known
        fetching = revisions.for_rollout(spec, rollout)
        built = adopted_children(body, fetching, config, Capabilities.everything(), seen)
        revisions.label(built, rollout.key)
    topology = topologies.of(spec)
    for child in built:
        kind = children.kind_of(child, owner)
        if kind.needs is not None and kind.needs not in served:
            continue  # useless without the API it needs, whose own note says it is missing
        if kind.optional and kind.kind not in served:
            why = refused.get(kind.kind) or f"the {kind.resource.api_version} API is not installed"
            if kind is topology.workload:
                blocked = topology.missing_api(spec, why)
            elif not any(note.startswith(f"{kind.kind} not managed:") for note in notes):  # one note per API
                notes.append(f"{kind.kind} not managed: {why}" + _consequence(kind, spec))
            continue
        manifests[kind.key] = children.stamped(child)
    if blocked is not None and topology.holds_all_without_api:
        manifests = {}  # nothing else changes: e.g. no P/D router without its engines
    claim = build_cache_claim(body["metadata"].get("namespace", "default"), spec)
    # scaling.capacity raises only for a spec that read_spec has refused already
    capacity = (
        scaling.capacity(spec, plan_options(spec)) if spec.autoscaling is not None or spec.routing is not None else None
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
        seen = Seen.of(body.get("status") or {})
        key: tuple[Any, ...] = (meta.get("uid"), meta.get("generation"), labels, served, tuple(sorted(refused.items())))
        key += (seen, *revisions.cache_key(body))  # and the annotation and commit of the rollout
        if self.value is None or key != self.key:
            self.key, self.value = key, desired_state(body, config, served, refused)
            self.cache_claim_checked = False
        return self.value


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
    capabilities: Capabilities,
    seen: Seen = NOTHING_SEEN,
) -> list[JSON]:
    """The desired children, owned by `body` (owner references, namespace, the owner's labels)."""
    meta = body["metadata"]
    built = topologies.build_children(meta["name"], meta.get("namespace", "default"), spec, config, capabilities, seen)
    return [adopt(body, child) for child in built]


def _consequence(kind: children.ChildKind, spec: NPUInferenceSpec) -> str:
    """What else stops working when an optional child cannot be managed (empty: nothing)."""
    if kind is children.POD_MONITOR and spec.autoscaling is not None:
        return "; spec.autoscaling reads only the series this PodMonitor labels: the ScaledObject sees no load"
    return ""

"""What a topology is: the small interface single-node, multi-node and disaggregated replicas implement.

A topology decides three things for a resource, and nothing else differs between them:
- what to build: its workload and the companions that serve it (`build`), and what to say when the
  workload's API is not installed (`missing_api`);
- how to find its engine pods and ranks in the cluster (`find`), through the watch caches
  (`LiveView`) and the owner chains (`kube.ownership`): labels can be copied, owner references
  decide;
- how to compute its part of the status: `status.graph` (`graph`), the groups of multi-node
  replicas (`groups`), and which reports may calibrate the resource's record (`calibrating`).

`controller.reconcile` runs one pipeline for every topology (desired -> apply -> observe ->
status); a new topology is one module here plus its entry in `of`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.children import scaling
from npu_operator.children.kinds import Capabilities, ChildKind
from npu_operator.kube import ownership
from npu_operator.status.findings import GroupFindings, PodReport

JSON = dict[str, Any]


class LiveView(Protocol):
    """Where the reconcile reads the cluster (`controller.watches.WatchedView`: kopf's watch caches)."""

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
class Seen:
    """What the resource's status remembers of the cluster that its children depend on (so that the
    children stay a function of the resource: spec, labels and status)."""

    # The longest startup seen (status.autoscaling.startupSeconds): the ScaledObject's scale-up period.
    startup_seconds: int | None = None
    # The roles' revision that the role Services select (status.disaggregation.servingRevision).
    serving_revision: str | None = None

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> Seen:
        revision = (status.get("disaggregation") or {}).get("servingRevision")
        return cls(
            startup_seconds=scaling.seen_startup_seconds(status),
            serving_revision=revision if isinstance(revision, str) and revision else None,
        )


# A resource whose status remembers nothing yet (and `npu-operator render`, which has no status).
NOTHING_SEEN: Final = Seen()


@dataclasses.dataclass(frozen=True)
class Found:
    """What a topology found of its resource in the cluster."""

    # The workload as the status reads it (replicas, updatedReplicas, readyReplicas, observedGeneration).
    workload: Mapping[str, Any] | None
    # The engine pods whose owner chain leads to the workload.
    pods: Sequence[Mapping[str, Any]] = ()
    # Pod names by role, for a resource with roles (empty for the others).
    roles: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    # Status fields of the topology's own (status.disaggregation), None: none.
    status: JSON | None = None


class Topology(Protocol):
    """One way of running a resource's engines (see the module's docstring)."""

    # The child kind that runs the engines (its live object is what `find` starts from).
    workload: ChildKind
    # Without the workload's API nothing of the resource is applied (not even the rest of its children).
    holds_all_without_api: bool

    def build(
        self,
        name: str,
        namespace: str,
        spec: NPUInferenceSpec,
        config: OperatorConfig,
        capabilities: Capabilities,
        seen: Seen,
    ) -> list[JSON]:
        """The workload and the children that serve it, in apply order (autoscaling and routing apart)."""

    def serving_pods(self, name: str, spec: NPUInferenceSpec) -> dict[str, str]:
        """The labels of the pods that serve the API, one per replica (what routing selects)."""

    def missing_api(self, spec: NPUInferenceSpec, why: str) -> tuple[str, str]:
        """(condition reason, message) when the workload's API is not served: `why` says why."""

    def find(self, view: LiveView, namespace: str, name: str, workload: Mapping[str, Any] | None, seen: Seen) -> Found:
        """The workload's view and its pods, from the live workload that the reconcile read or applied."""

    def calibrating(self, reports: Sequence[PodReport], found: Found) -> list[PodReport]:
        """The reports whose calibration sections may be folded into the resource's record."""

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
        """`status.graph` (without its calibration section)."""

    def groups(
        self,
        spec: NPUInferenceSpec,
        pods: Sequence[Mapping[str, Any]],
        reports: Sequence[PodReport],
        previous_graph: Mapping[str, Any],
    ) -> GroupFindings:
        """The groups being recreated or with a rank that does not serve."""


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

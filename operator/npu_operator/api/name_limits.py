"""The longest resource name that every object made from it can bear, upstream controllers' own included.

The CRD takes any DNS-1035 label of up to 63 characters as metadata.name, and the operator's own
children stay within 63 (`children.kinds.ChildKind.child_name` shortens a suffixed name with a
digest). But the controllers that our children are handed to make longer names of their own from
it, and a name past 63 characters where Kubernetes asks for a label (a Service name, a pod's
hostname, a label value) is refused: by an admission webhook (KEDA), or later, silently for the
user, when a controller cannot create its pods. Each such name is `metadata.name` plus a fixed
part and index digits, so it is written here as the characters it adds (`Derived.added`), per
topology and spec; the resource's limit is 63 minus the most any of them adds, and a longer name
is refused up front (`name_problems`, called from `validation.validate_spec`) with the object that
would break. docs/operator.md "Names" has the table; tests/operator/upstream_names.py derives the
same names from the rendered children, independently, and checks them.

Upstream, as read (each function cited where its name is derived below):
- KEDA v2.20.2, apis/keda/v1alpha1/scaledobject_webhook.go: verifyName refuses a ScaledObject whose
  HPA name, getHpaName's `keda-hpa-<scaledobject>`, exceeds maxK8sLabelValueLength (63).
- LeaderWorkerSet v0.10.0 (kubernetes-sigs/lws): pkg/webhooks/leaderworkerset_webhook.go
  generalValidate (the name is a DNS-1035 label); pkg/controllers/leaderworkerset_controller.go
  constructLeaderStatefulSetApplyConfiguration (the leader StatefulSet is named after the
  LeaderWorkerSet); pkg/controllers/pod_controller.go Reconcile and
  constructWorkerStatefulSetApplyConfiguration (one worker StatefulSet per group, named after its
  leader pod, and with subdomainPolicy UniquePerReplica one headless Service per group, also named
  after the leader pod: CreateHeadlessServiceIfNotExists(..., pod.Name, ...)).
- DisaggregatedSet, same release: pkg/utils/disaggregatedset/utils.go GenerateName
  (`<set>-<slice>-<revision>-<role>` LeaderWorkerSets), ComputeRevision (revisionLength 8 hex
  characters), GenerateLabels (label `app: <set>-<slice>-<role>`), GetSlices (1 unless set: slice
  0); pkg/controllers/disaggregatedset/service_manager.go buildService (`<lws>-prv` Services).
- The StatefulSet controller (kubernetes/kubernetes, read at master; not pinned to a tag here):
  pkg/controller/statefulset/stateful_set_utils.go getPodName (`<set>-<ordinal>`), initIdentity
  (the pod's hostname is its name: a DNS-1123 label), newVersionedStatefulSetPod/setPodRevision
  (label controller-revision-hash = the ControllerRevision's name); pkg/controller/history/
  controller_history.go ControllerRevisionName (`<set>-<hash>`) and HashControllerRevision
  (rand.SafeEncodeString of a uint32 in decimal: at most 10 characters).
- Kubernetes' own limits (k8s.io/apimachinery pkg/util/validation): IsDNS1123Label,
  IsDNS1035Label and IsValidLabelValue, 63 characters each.

The routing objects add nothing: gateway-api-inference-extension v1.6.0 and llm-d-router v0.9.0 make
no Kubernetes object named after the InferencePool, and the picker's own objects (`<name>-epp`) are
ours. A Deployment's names are not limited beyond 63: its ReplicaSets (`<deployment>-<hash>`) are DNS
subdomains (253), its pods are named by generateName, which truncates, and their hostnames are
truncated by the kubelet. Our own children with a suffix (`-epp`, `-prefill`, `-calibration`...)
are shortened by `child_name`, deterministically, so a long name keeps the same children.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from npu_operator.api.roles import ROLES, role_spec
from npu_operator.api.spec import NPUInferenceSpec, SpecError

MAX_LABEL: Final = 63  # DNS-1123 and DNS-1035 labels, label values (apimachinery pkg/util/validation)

# KEDA v2.20.2 scaledobject_webhook.go getHpaName, without spec.advanced.horizontalPodAutoscalerConfig.name.
KEDA_HPA_PREFIX: Final = "keda-hpa-"
# kubernetes pkg/controller/history HashControllerRevision: a uint32 in decimal, safe-encoded: <= 10 characters.
REVISION_HASH_MAX: Final = 10
# lws v0.10.0 pkg/utils/disaggregatedset/utils.go ComputeRevision: revisionLength.
DS_REVISION_LENGTH: Final = 8
# GetSlices: 1 unless spec.slices is set (the operator never sets it), so every LeaderWorkerSet is slice 0.
DS_SLICE: Final = "0"
DS_SERVICE_SUFFIX: Final = "-prv"  # service_manager.go buildService

LABEL_VALUE: Final = "a label value"
DNS_1035: Final = "a DNS-1035 label"
DNS_1123: Final = "a DNS-1123 label"
HOSTNAME: Final = "a pod hostname (a DNS-1123 label)"


@dataclasses.dataclass(frozen=True)
class Derived:
    """One name made from metadata.name, at its longest for the spec, and what breaks past 63."""

    what: str  # the object, or the label, that bears it
    pattern: str  # how it is made from <name>
    added: int  # the characters it adds to metadata.name, at most
    kind: str  # what Kubernetes requires of it (DNS_1035, DNS_1123, HOSTNAME, LABEL_VALUE: 63 characters each)
    breaks: str  # what fails when it is longer
    source: str  # the upstream function(s) that make or check it
    parts: str = ""  # what the placeholders in `pattern` are at most, for this spec
    otherwise: str = ""  # a change of the spec that lifts this limit, where there is one

    @property
    def limit(self) -> int:
        """The longest metadata.name this name can be made from."""
        return MAX_LABEL - self.added


def derived_names(spec: NPUInferenceSpec) -> list[Derived]:
    """Every name made from metadata.name whose length depends on it, for this spec's topology."""
    found = [
        Derived(
            "The resource's workload and Service",
            "<name>",
            0,
            DNS_1035,
            "the API server refuses the resource",
            "the CRD's rule on metadata.name",
        )
    ]
    if spec.autoscaling is not None:
        found.append(
            Derived(
                "KEDA's HorizontalPodAutoscaler",
                KEDA_HPA_PREFIX + "<name>",
                len(KEDA_HPA_PREFIX),
                DNS_1123,
                "KEDA's admission webhook refuses the ScaledObject",
                "KEDA v2.20.2 scaledobject_webhook.go verifyName, getHpaName",
                otherwise="remove spec.autoscaling",
            )
        )
        if spec.disaggregation is not None:  # the prefill role's ScaledObject, <name>-prefill
            found.append(
                Derived(
                    "KEDA's HorizontalPodAutoscaler of the prefill role",
                    KEDA_HPA_PREFIX + "<name>-prefill",
                    len(KEDA_HPA_PREFIX) + len("-prefill"),
                    DNS_1123,
                    "KEDA's admission webhook refuses the ScaledObject",
                    "KEDA v2.20.2 scaledobject_webhook.go verifyName, getHpaName",
                    otherwise="remove spec.autoscaling",
                )
            )
    if spec.disaggregation is not None:
        for role in ROLES:
            found += _disaggregated_role(role, role_spec(spec, role), _role_groups(spec, role))
    elif spec.npu.nodes > 1:
        # KEDA scales the groups up to maxReplicas: the indices reach maxReplicas - 1.
        groups = max(spec.replicas, spec.autoscaling.max_replicas if spec.autoscaling else 0)
        found += _leader_worker_set("<name>", 0, "LeaderWorkerSet", groups, spec.npu.nodes)
    return found


def binding(spec: NPUInferenceSpec) -> Derived:
    """The derived name that adds the most: it sets the resource's limit (the first one, on a tie)."""
    return max(derived_names(spec), key=lambda derived: derived.added)


def name_limit(spec: NPUInferenceSpec) -> int:
    """The longest metadata.name that every object derived from it can bear."""
    return binding(spec).limit


def name_problems(name: str, spec: NPUInferenceSpec) -> list[SpecError]:
    """metadata.name, refused when a name derived from it would break (none: it fits)."""
    derived = binding(spec)
    if len(name) <= derived.limit:
        return []
    parts = f" ({derived.parts})" if derived.parts else ""
    why = (
        f"{name!r} is {len(name)} characters; with this spec at most {derived.limit} fit. {derived.what}, "
        f"{derived.pattern}{parts}, would be {len(name) + derived.added} characters, more than the {MAX_LABEL} "
        f"of {derived.kind}: {derived.breaks} ({derived.source}). Choose a name of at most {derived.limit} characters"
    )
    if derived.otherwise:  # a name cannot change: for a resource that exists, the other way out
        why += f", or {derived.otherwise}"
    return [SpecError("metadata.name", why)]


def _digits(count: int) -> int:
    """The digits of the largest index among `count` (0-based: a count of 10 ends at 9)."""
    return len(str(max(count - 1, 0)))


def _leader_worker_set(pattern: str, added: int, owner: str, groups: int, nodes: int) -> list[Derived]:
    """What a LeaderWorkerSet named `pattern` (`added` characters beyond <name>) makes, and the
    StatefulSet controller under it, with `groups` replicas of `nodes` pods each."""
    group, worker, revision = _digits(groups), _digits(nodes), REVISION_HASH_MAX
    indices = f"<group> up to {max(groups - 1, 0)}"
    hashed = f"<hash> up to {revision} characters"
    no_pods = "the StatefulSet controller cannot create these pods"
    labelled = "StatefulSet controller ControllerRevisionName, HashControllerRevision, setPodRevision"
    found = [
        Derived(
            f"The {owner}'s leader pods' controller-revision-hash label",
            f"{pattern}-<hash>",
            added + 1 + revision,
            LABEL_VALUE,
            no_pods,
            f"{labelled}; the leader StatefulSet is named after the LeaderWorkerSet, leaderworkerset_controller.go "
            "constructLeaderStatefulSetApplyConfiguration",
            hashed,
        ),
        Derived(
            f"The {owner}'s leader pods",
            f"{pattern}-<group>",
            added + 1 + group,
            HOSTNAME,
            no_pods,
            "StatefulSet controller getPodName, initIdentity",
            indices,
        ),
        Derived(
            f"The {owner}'s headless Service per group (subdomainPolicy UniquePerReplica)",
            f"{pattern}-<group>",
            added + 1 + group,
            DNS_1035,
            "LeaderWorkerSet cannot create the Service",
            "LeaderWorkerSet pod_controller.go Reconcile, CreateHeadlessServiceIfNotExists with the leader pod's name",
            indices,
        ),
    ]
    if nodes > 1:  # a group of one pod has no worker StatefulSet (pod_controller.go Reconcile: Size == 1)
        found += [
            Derived(
                f"The {owner}'s worker pods' controller-revision-hash label",
                f"{pattern}-<group>-<hash>",
                added + 1 + group + 1 + revision,
                LABEL_VALUE,
                no_pods,
                f"{labelled}; each worker StatefulSet is named after its leader pod, pod_controller.go "
                "constructWorkerStatefulSetApplyConfiguration",
                f"{indices}, {hashed}",
            ),
            Derived(
                f"The {owner}'s worker pods",
                f"{pattern}-<group>-<worker>",
                added + 1 + group + 1 + worker,
                HOSTNAME,
                no_pods,
                "StatefulSet controller getPodName, initIdentity",
                f"{indices}, <worker> up to {nodes - 1}",
            ),
        ]
    return found


def _role_groups(spec: NPUInferenceSpec, role: str) -> int:
    """The most groups a role's LeaderWorkerSet reaches: its replicas, or what KEDA may scale it to
    (decode: autoscaling.maxReplicas; prefill: its own maxReplicas, else autoscaling's)."""
    assert spec.disaggregation is not None
    prefill = spec.disaggregation.prefill
    replicas = prefill.replicas if role == "prefill" else spec.replicas
    if spec.autoscaling is None:
        return replicas
    most = (
        (prefill.max_replicas or spec.autoscaling.max_replicas) if role == "prefill" else spec.autoscaling.max_replicas
    )
    return max(replicas, most)


def _disaggregated_role(role: str, spec: NPUInferenceSpec, groups: int) -> list[Derived]:
    """What the DisaggregatedSet makes for one role: its LeaderWorkerSets, their `-prv` Services,
    the `app` label, and all that a LeaderWorkerSet makes."""
    lws = f"<name>-{DS_SLICE}-<revision>-{role}"
    added = 1 + len(DS_SLICE) + 1 + DS_REVISION_LENGTH + 1 + len(role)
    revision = f"<revision> {DS_REVISION_LENGTH} characters"
    owner = f"{role} LeaderWorkerSet"
    return [
        Derived(
            f"The {owner}",
            lws,
            added,
            DNS_1035,
            "LeaderWorkerSet's webhook refuses it",
            "DisaggregatedSet utils.go GenerateName, ComputeRevision; LeaderWorkerSet webhook generalValidate",
            revision,
        ),
        Derived(
            f"The {role} role's headless Service",
            lws + DS_SERVICE_SUFFIX,
            added + len(DS_SERVICE_SUFFIX),
            DNS_1035,
            "the DisaggregatedSet controller cannot create it",
            "DisaggregatedSet service_manager.go buildService",
            revision,
        ),
        Derived(
            f"The {owner}'s app label",
            f"<name>-{DS_SLICE}-{role}",
            1 + len(DS_SLICE) + 1 + len(role),
            LABEL_VALUE,
            "the DisaggregatedSet controller cannot create the LeaderWorkerSet",
            "DisaggregatedSet utils.go GenerateLabels",
        ),
        *(
            dataclasses.replace(derived, parts=f"{revision}, {derived.parts}")
            for derived in _leader_worker_set(lws, added, owner, groups, spec.npu.nodes)
        ),
    ]

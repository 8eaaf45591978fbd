"""Every name that Kubernetes and the upstream controllers will make from rendered children, and the
rule each must pass. A test helper that reads manifests, not specs: it checks
`npu_operator.api.name_limits` from the other side, so a limit there that is too loose (a name
here breaks) or too tight (nothing here breaks one character past it) shows.

Each derivation follows the upstream function cited beside it (read, never copied):
- KEDA v2.20.2, apis/keda/v1alpha1/scaledobject_webhook.go: getHpaName (`keda-hpa-<scaledobject>`
  unless spec.advanced.horizontalPodAutoscalerConfig.name is set) and verifyName (the ScaledObject's
  name and that HPA name at most maxK8sLabelValueLength, 63).
- LeaderWorkerSet v0.10.0: pkg/webhooks/leaderworkerset_webhook.go generalValidate (the name a
  DNS-1035 label); pkg/controllers/leaderworkerset_controller.go reconcileHeadlessServices (one
  Service named after the LeaderWorkerSet, subdomainPolicy Shared) and
  constructLeaderStatefulSetApplyConfiguration (the leader StatefulSet has the LeaderWorkerSet's
  name); pkg/controllers/pod_controller.go Reconcile (with UniquePerReplica, one Service per group
  named after the leader pod; no worker StatefulSet for a group of one pod) and
  constructWorkerStatefulSetApplyConfiguration (the worker StatefulSet named after the leader pod).
- DisaggregatedSet, same release: pkg/utils/disaggregatedset/utils.go GenerateName, GenerateLabels,
  ComputeRevision (8 hex characters), GetSlices (one slice, 0, unless spec.slices is set);
  pkg/controllers/disaggregatedset/service_manager.go buildService (`<lws>-prv`).
- The StatefulSet controller (kubernetes/kubernetes pkg/controller/statefulset/stateful_set_utils.go):
  getPodName (`<set>-<ordinal>`), initIdentity (hostname = pod name), setPodRevision (label
  controller-revision-hash = the revision's name) and the label statefulset.kubernetes.io/pod-name;
  pkg/controller/history/controller_history.go ControllerRevisionName (`<set>-<hash>`),
  HashControllerRevision (rand.SafeEncodeString of a uint32: at most 10 characters).
- The Deployment controller (pkg/controller/deployment/sync.go getNewReplicaSet): ReplicaSets
  `<deployment>-<pod-template-hash>`, the hash (controller.ComputeHash) again at most 10 characters.
- The rules, k8s.io/apimachinery pkg/util/validation: IsDNS1123Label, IsDNS1035Label,
  IsValidLabelValue (63 characters), IsDNS1123Subdomain (253).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

JSON = dict[str, Any]

# The longest hash SafeEncodeString makes of a uint32 ("4294967295" is 10 digits), in its alphabet.
LONGEST_HASH = "7c9bd5f6d4"
DS_REVISION = "ef53f2d7"  # 8 hex characters, as ComputeRevision (this one from lws's service_manager_test.go)

RULES = {
    "DNS-1035 label": (re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"), 63),
    "DNS-1123 label": (re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), 63),
    "label value": (re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"), 63),
    "DNS-1123 subdomain": (
        re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"),
        253,
    ),
}


@dataclasses.dataclass(frozen=True)
class Name:
    value: str
    rule: str  # a key of RULES
    what: str  # which object bears it, and who makes it

    def problem(self) -> str | None:
        pattern, longest = RULES[self.rule]
        if len(self.value) > longest:
            return f"{self.what}: {self.value!r} is {len(self.value)} characters, more than {longest} ({self.rule})"
        if not pattern.match(self.value):
            return f"{self.what}: {self.value!r} is not a {self.rule}"
        return None


def problems(children: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every name made from `children` (one resource's rendered children) that Kubernetes would refuse."""
    return [why for name in derived_names(children) if (why := name.problem()) is not None]


def derived_names(children: Iterable[Mapping[str, Any]]) -> list[Name]:
    """The children's own names and labels, and every name the upstream controllers make from them."""
    children = list(children)
    # KEDA scales the resource (and so its LeaderWorkerSet's groups) up to maxReplicaCount.
    scaled = max((c["spec"]["maxReplicaCount"] for c in children if c["kind"] == "ScaledObject"), default=0)
    found: list[Name] = []
    for child in children:
        found += _own(child)
        kind, name = child["kind"], child["metadata"]["name"]
        if kind == "ScaledObject":
            found += keda_names(child)
        elif kind == "Deployment":
            found.append(Name(f"{name}-{LONGEST_HASH}", "DNS-1123 subdomain", f"ReplicaSet of Deployment {name}"))
        elif kind == "LeaderWorkerSet":
            spec = child["spec"]
            found += lws_names(name, max(spec.get("replicas", 1), scaled), _size(spec), _policy(spec))
        elif kind == "DisaggregatedSet":
            for role in child["spec"]["roles"]:
                found += ds_role_names(name, role["name"], role["spec"], role_scaled(children, name, role))
    return found


def role_scaled(children: list[Mapping[str, Any]], ds: str, role: Mapping[str, Any]) -> int:
    """What KEDA may scale one role of DisaggregatedSet `ds` to: an External role through its
    DisaggregatedSetRoleScaler `<ds>-<role>` (lws v0.10.0 scaler_manager.go ScalerName), the decode role
    through the resource's own scale subresource (its replicas are the decode role's); 0 for none."""
    external = (role.get("scaling") or {}).get("mode") == "External"
    targets = [c["spec"] for c in children if c["kind"] == "ScaledObject"]
    for target in targets:
        ref = target["scaleTargetRef"]
        if external and ref.get("kind") == "DisaggregatedSetRoleScaler" and ref["name"] == f"{ds}-{role['name']}":
            return int(target["maxReplicaCount"])
        if not external and role["name"] == "decode" and ref.get("kind") == "NPUInference":
            return int(target["maxReplicaCount"])
    return 0


def keda_names(scaled_object: Mapping[str, Any]) -> list[Name]:
    """verifyName: the ScaledObject's name is a label value, and so is the length of getHpaName's name."""
    name = scaled_object["metadata"]["name"]
    hpa = hpa_name(scaled_object)
    return [
        Name(name, "label value", f"ScaledObject {name} (KEDA verifyName: the scaledobject.keda.sh/name label)"),
        Name(hpa, "DNS-1123 label", f"HPA of ScaledObject {name} (KEDA getHpaName, verifyName)"),
    ]


def hpa_name(scaled_object: Mapping[str, Any]) -> str:
    """KEDA's getHpaName."""
    config = (scaled_object["spec"].get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}
    return config.get("name") or f"keda-hpa-{scaled_object['metadata']['name']}"


def lws_names(lws: str, replicas: int, size: int, policy: str = "Shared") -> list[Name]:
    """What LeaderWorkerSet `lws` and the StatefulSet controller make: the last group's names are the
    longest, so the first and the last group are enough."""
    found = [Name(lws, "DNS-1035 label", f"LeaderWorkerSet {lws} (webhook generalValidate)")]
    if policy != "UniquePerReplica":
        found.append(Name(lws, "DNS-1035 label", f"headless Service of {lws} (reconcileHeadlessServices)"))
    found += statefulset_names(lws, [0, replicas - 1] if replicas > 0 else [], f"leader StatefulSet {lws}")
    for group in sorted({0, replicas - 1}) if replicas > 0 else []:
        leader = f"{lws}-{group}"
        if policy == "UniquePerReplica":
            found.append(Name(leader, "DNS-1035 label", f"headless Service of group {group} (pod_controller.go)"))
        if size > 1:
            found += statefulset_names(leader, [1, size - 1], f"worker StatefulSet {leader} (named after its leader)")
    return found


def statefulset_names(statefulset: str, ordinals: Iterable[int], what: str) -> list[Name]:
    """A StatefulSet's pods (getPodName, initIdentity, the pod-name label) and their revision label."""
    found = [
        Name(statefulset, "DNS-1123 subdomain", what),
        Name(f"{statefulset}-{LONGEST_HASH}", "label value", f"controller-revision-hash of {what}'s pods"),
    ]
    for ordinal in sorted(set(ordinals)):
        pod = f"{statefulset}-{ordinal}"
        found += [
            Name(pod, "DNS-1123 label", f"hostname of pod {ordinal} of {what}"),
            Name(pod, "label value", f"statefulset.kubernetes.io/pod-name of pod {ordinal} of {what}"),
        ]
    return found


def ds_lws_name(ds: str, role: str, slice_index: int = 0, revision: str = DS_REVISION) -> str:
    """DisaggregatedSet utils.go GenerateName."""
    return f"{ds}-{slice_index}-{revision}-{role}"


def ds_service_name(ds: str, role: str, slice_index: int = 0, revision: str = DS_REVISION) -> str:
    """service_manager.go buildService: the role's LeaderWorkerSet's name plus -prv."""
    return ds_lws_name(ds, role, slice_index, revision) + "-prv"


def ds_role_names(ds: str, role: str, spec: Mapping[str, Any], scaled: int = 0) -> list[Name]:
    """One role of DisaggregatedSet `ds` (scaled up to `scaled` groups): its LeaderWorkerSet, the -prv
    Service, the app label."""
    lws = ds_lws_name(ds, role)
    return [
        Name(ds_service_name(ds, role), "DNS-1035 label", f"Service of the {role} role (buildService)"),
        Name(f"{ds}-0-{role}", "label value", f"app label of the {role} LeaderWorkerSet (GenerateLabels)"),
        *lws_names(lws, max(spec.get("replicas", 1), scaled), _size(spec), _policy(spec)),
    ]


def _own(child: Mapping[str, Any]) -> Iterator[Name]:
    """The child's own name (a Service or LeaderWorkerSet name is a DNS-1035 label; every name our
    children get is a DNS-1123 label, `ChildKind.child_name`) and its labels, its pods' included."""
    meta = child["metadata"]
    strict = child["kind"] in ("Service", "LeaderWorkerSet")
    yield Name(meta["name"], "DNS-1035 label" if strict else "DNS-1123 label", f"{child['kind']} {meta['name']}")
    for labels in _label_sets(child):
        for key, value in labels.items():
            yield Name(str(value), "label value", f"label {key} of {child['kind']} {meta['name']}")


def _label_sets(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in ("labels", "matchLabels") and isinstance(value, Mapping):
                yield value
            else:
                yield from _label_sets(value)
    elif isinstance(node, list):
        for item in node:
            yield from _label_sets(item)


def _size(spec: Mapping[str, Any]) -> int:
    return int(spec.get("leaderWorkerTemplate", {}).get("size", 1))


def _policy(spec: Mapping[str, Any]) -> str:
    return str((spec.get("networkConfig") or {}).get("subdomainPolicy", "Shared"))

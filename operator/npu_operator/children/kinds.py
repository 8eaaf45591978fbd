"""The children of an NPUInference, in one table, and the pure decision of what each one needs.

`KINDS` lists every kind of child the operator manages; everything else follows from it: the
handlers watch each kind through kopf (a change wakes the owner's worker), the reconcile applies
or deletes each one, RBAC must grant it. A new kind of child is one `ChildKind` entry here plus
its builder, called by the topology that makes it (`npu_operator.topologies`). An `optional` kind
belongs to an API that may not be installed (a CRD): when it is not served the child is skipped
and the resource says so.

Children are written by server-side apply (`client.KubeClient.apply`, field manager
`npu-operator`). `plan` decides without a request whether a child needs one: it does when it is
missing, when the manifest we would apply differs from the one we last applied (its digest is
kept in an annotation of a fixed, small size), or when another manager has taken one of our
fields (a hand edit: `managedFields` says so). A settled child therefore costs nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Final

from npu_operator.api import crd
from npu_operator.kube.client import FIELD_MANAGER, Resource
from npu_operator.kube.names import DISAGGREGATED_SETS, LEADER_WORKER_SETS

JSON = dict[str, Any]

DIGEST_ANNOTATION: Final = f"{crd.GROUP}/applied-digest"


@dataclasses.dataclass(frozen=True)
class ChildKind:
    resource: Resource
    # Served only where its API is installed; skipped, with a note in the status, where it is not.
    optional: bool = False
    # The child is named after the resource plus this suffix (two children of one kind differ by it).
    suffix: str = ""
    # The optional kind this child is only useful with: skipped, without a note of its own, where
    # that kind's API is not served (the endpoint picker's objects without the InferencePool API).
    needs: str | None = None
    # Written from the pods' runtime reports by the status loop (`controller.reconcile.store_calibration`),
    # not built from the spec: the spec-driven apply/delete pass leaves it alone (it is created
    # empty before it, `ensure_calibration_record`), and it lives as long as its owner
    # (garbage-collected with it).
    from_reports: bool = False

    @property
    def kind(self) -> str:
        return self.resource.kind

    @property
    def key(self) -> str:
        """Unique among KINDS: the kind, plus the suffix where there is one."""
        return self.kind + self.suffix

    def child_name(self, owner: str) -> str:
        """The child's name: the owner's name plus the suffix, shortened (with a digest of the whole)
        to stay a DNS-1035 label of at most 63 characters, as a Service name must be."""
        if len(owner) + len(self.suffix) <= MAX_NAME:
            return owner + self.suffix
        digest = hashlib.sha256(owner.encode()).hexdigest()[:8]
        keep = MAX_NAME - len(self.suffix) - len(digest) - 1
        return f"{owner[:keep].rstrip('-')}-{digest}{self.suffix}"


MAX_NAME: Final = 63


DEPLOYMENT: Final = ChildKind(Resource("apps", "v1", "deployments", "Deployment"))
SERVICE: Final = ChildKind(Resource("", "v1", "services", "Service"))
POD_DISRUPTION_BUDGET: Final = ChildKind(Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"))
POD_MONITOR: Final = ChildKind(Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"), optional=True)
# A multi-node replica (spec.npu.nodes > 1); its API is a CRD of kubernetes-sigs/lws.
LEADER_WORKER_SET: Final = ChildKind(LEADER_WORKER_SETS, optional=True)
# spec.autoscaling: KEDA's ScaledObject on the resource's scale subresource (see `scaling`).
SCALED_OBJECT: Final = ChildKind(Resource("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject"), optional=True)
# With spec.disaggregation, the prefill role's own ScaledObject, on its DisaggregatedSetRoleScaler.
PREFILL_SCALED_OBJECT: Final = ChildKind(SCALED_OBJECT.resource, optional=True, suffix="-prefill")
# spec.routing: the Gateway API Inference Extension's pool, its endpoint picker (llm-d's router,
# one per resource, named <resource>-epp) and, with routing.gateway, an HTTPRoute (see `routing`).
INFERENCE_POOL: Final = ChildKind(
    Resource("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool"), optional=True
)
PICKER_SUFFIX: Final = "-epp"
# Prefill/decode disaggregation (spec.disaggregation): the roles, each a LeaderWorkerSet; a CRD of
# kubernetes-sigs/lws v0.10. The Deployment is then the router, the Service its endpoint, and one
# Service per role (<resource>-prefill, <resource>-decode) selects that role's leaders for the router.
DISAGGREGATED_SET: Final = ChildKind(DISAGGREGATED_SETS, optional=True)
PREFILL_SERVICE: Final = ChildKind(SERVICE.resource, suffix="-prefill", needs=DISAGGREGATED_SET.kind)
DECODE_SERVICE: Final = ChildKind(SERVICE.resource, suffix="-decode", needs=DISAGGREGATED_SET.kind)


def _picker(resource: Resource) -> ChildKind:
    return ChildKind(resource, suffix=PICKER_SUFFIX, needs=INFERENCE_POOL.kind)


PICKER_SERVICE_ACCOUNT: Final = _picker(Resource("", "v1", "serviceaccounts", "ServiceAccount"))
PICKER_ROLE: Final = _picker(Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"))
PICKER_ROLE_BINDING: Final = _picker(Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"))
PICKER_CONFIG: Final = _picker(Resource("", "v1", "configmaps", "ConfigMap"))
PICKER_DEPLOYMENT: Final = _picker(DEPLOYMENT.resource)
PICKER_SERVICE: Final = _picker(SERVICE.resource)
# What scrapes the picker's own /metrics (flow control's held requests wake a resource scaled to zero):
# optional like the serving pods' PodMonitor, and only useful with the picker, so it also needs InferencePool.
PICKER_POD_MONITOR: Final = ChildKind(
    POD_MONITOR.resource, optional=True, suffix=PICKER_SUFFIX, needs=INFERENCE_POOL.kind
)
# Istio's DestinationRule (networking.istio.io/v1) that makes Istio's proxies, the Istio gateway among
# them, speak TLS to the picker's gRPC port (its certificate is self-signed). It `needs` its own kind:
# where Istio's API is not served it is skipped without a note (a cluster without Istio needs none),
# and where the InferencePool API is not served either, Istio ignores a rule for a host it does not know.
DESTINATION_RULES: Final = Resource("networking.istio.io", "v1", "destinationrules", "DestinationRule")
PICKER_DESTINATION_RULE: Final = ChildKind(
    DESTINATION_RULES, optional=True, suffix=PICKER_SUFFIX, needs=DESTINATION_RULES.kind
)
HTTP_ROUTE: Final = ChildKind(
    Resource("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute"), optional=True, needs="InferencePool"
)
# What the resource's pods measured, handed to its later pods (see `status.calibration`).
CALIBRATION_RECORD: Final = ChildKind(
    Resource("", "v1", "configmaps", "ConfigMap"), suffix="-calibration", from_reports=True
)
# spec.lora: the adapter list the engine pods re-read (`children.lora`); before the workload, whose
# pods mount it.
LORA_ADAPTERS: Final = ChildKind(Resource("", "v1", "configmaps", "ConfigMap"), suffix="-lora")
# In apply order.
KINDS: Final = (
    LORA_ADAPTERS,
    DEPLOYMENT,
    LEADER_WORKER_SET,
    DISAGGREGATED_SET,
    SERVICE,
    PREFILL_SERVICE,
    DECODE_SERVICE,
    POD_DISRUPTION_BUDGET,
    POD_MONITOR,
    SCALED_OBJECT,
    PREFILL_SCALED_OBJECT,
    PICKER_SERVICE_ACCOUNT,
    PICKER_ROLE,
    PICKER_ROLE_BINDING,
    PICKER_CONFIG,
    PICKER_DEPLOYMENT,
    PICKER_SERVICE,
    PICKER_POD_MONITOR,
    PICKER_DESTINATION_RULE,
    INFERENCE_POOL,
    HTTP_ROUTE,
    CALIBRATION_RECORD,
)
# The kinds that run the engines: one of them per resource, chosen by spec.npu.nodes and spec.disaggregation
# (the last one with a manifest is the workload: with a DisaggregatedSet, the Deployment is the router).
WORKLOADS: Final = (DEPLOYMENT, LEADER_WORKER_SET, DISAGGREGATED_SET)
BY_KEY: Final = {child.key: child for child in KINDS}
# The distinct APIs of KINDS (two kinds of child may share one, e.g. the two Deployments).
RESOURCES: Final = tuple(dict.fromkeys(child.resource for child in KINDS))


def kind_of(manifest: Mapping[str, Any], owner: str) -> ChildKind:
    """The entry of KINDS that `manifest`, a child of the resource named `owner`, belongs to."""
    for child in KINDS:
        if child.kind == manifest["kind"] and child.child_name(owner) == manifest["metadata"]["name"]:
            return child
    raise KeyError(f"{manifest['kind']} {manifest['metadata']['name']} is no child kind of {owner}")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What the cluster offers, found out by the caller (builders never ask the API)."""

    pod_monitor: bool = False
    scaled_object: bool = False  # keda.sh/v1alpha1
    inference_pool: bool = False  # inference.networking.k8s.io/v1
    http_route: bool = False  # gateway.networking.k8s.io/v1
    destination_rule: bool = False  # networking.istio.io/v1

    NONE: ClassVar[Capabilities]

    @classmethod
    def everything(cls) -> Capabilities:
        return cls(pod_monitor=True, scaled_object=True, inference_pool=True, http_route=True, destination_rule=True)


Capabilities.NONE = Capabilities()


@dataclasses.dataclass(frozen=True)
class Step:
    """One write that brings a child to what is desired."""

    action: str  # create (an unforced apply) | apply | delete
    child: ChildKind
    name: str
    body: JSON | None = None


def stamped(desired: JSON) -> JSON:
    """The manifest to apply: `desired` with the digest of its content in an annotation."""
    text = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    metadata = dict(desired["metadata"])
    metadata["annotations"] = {**metadata.get("annotations", {}), DIGEST_ANNOTATION: digest}
    return {**desired, "metadata": metadata}


class CompactManifests(Mapping[str, JSON]):
    """Stamped manifests by kind key, kept as compressed compact JSON and parsed when one is read.

    A resource keeps its manifests for as long as its generation lasts: for the example's
    Deployment and Service, the parsed objects take 12 KB, their JSON text 4 KB, compressed 1.3 KB.
    A read (about 20 us) gets a fresh copy; a settled child's is not read at all (`plan_kept`).
    """

    def __init__(self, manifests: Mapping[str, JSON]) -> None:
        self._texts = {
            key: zlib.compress(json.dumps(value, separators=(",", ":")).encode()) for key, value in manifests.items()
        }
        # Beside each text, its digest annotation: `plan_kept` compares it without parsing the text.
        self._digests = {key: _digest(value) for key, value in manifests.items()}

    def __getitem__(self, key: str) -> JSON:
        return _parsed(self._texts[key])

    def get(self, key: str, default: Any = None) -> Any:
        """`Mapping.get` without the KeyError that it raises and catches for an absent key."""
        text = self._texts.get(key)
        return default if text is None else _parsed(text)

    def __contains__(self, key: object) -> bool:
        return key in self._texts

    def digest(self, key: str) -> str | None:
        """The digest annotation of the manifest under `key` (None: no manifest, or one without)."""
        return self._digests.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)


def _parsed(text: bytes) -> JSON:
    manifest: JSON = json.loads(zlib.decompress(text))
    return manifest


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences", []))


def plan(child: ChildKind, name: str, manifest: JSON | None, live: Mapping[str, Any] | None, uid: str) -> Step | None:
    """The write `child` needs (None: none). `manifest` is `stamped`; `live` is owned by `uid`."""
    if manifest is None:
        return Step("delete", child, name) if live is not None else None
    if live is None:
        return Step("create", child, name, manifest)
    if _digest(live) != _digest(manifest) or taken_fields(live, manifest):
        return Step("apply", child, name, manifest)
    return None


def plan_kept(
    child: ChildKind, name: str, manifests: Mapping[str, JSON], live: Mapping[str, Any] | None, uid: str
) -> Step | None:
    """`plan` for the manifest of `child` in `manifests` (none: a delete), deciding as `plan` does
    but without reading that manifest when the live child is settled: same digest, and no
    `managedFields` (the watch keeps none while our apply is the only writer, see
    `managed_fields_to_keep`), so that no field can be taken. A settled child, each tick, then
    costs no decompress and no parse of its manifest."""
    if live is not None and isinstance(manifests, CompactManifests):
        digest = manifests.digest(child.key)
        if digest is not None and digest == _digest(live) and not live.get("metadata", {}).get("managedFields"):
            return None  # what `plan` decides: the digests agree and `taken_fields` has no other manager
    return plan(child, name, manifests.get(child.key), live, uid)


def taken_fields(live: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """Whether another manager now holds a field of `manifest` that our manager no longer holds.

    That is what a write by someone else to one of our fields leaves in `managedFields` (the API
    server moves the field to the writer). A field both hold has the same value in both: not taken.
    Below a list, any field the other holds and we do not counts (list merge keys are not read).
    """
    ours: Mapping[str, Any] | None = None
    theirs: list[Mapping[str, Any]] = []
    for entry in live.get("metadata", {}).get("managedFields") or []:
        if entry.get("subresource") or not isinstance(entry.get("fieldsV1"), Mapping):
            continue
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply":
            ours = entry["fieldsV1"]
        else:
            theirs.append(entry["fieldsV1"])
    body = {key: value for key, value in manifest.items() if key not in ("apiVersion", "kind")}
    return any(_taken(ours, fields, body) for fields in theirs)


def managed_fields_to_keep(entries: Any) -> list[Any] | None:
    """What `taken_fields` needs of a live child's `managedFields` (None: nothing).

    Only writes by another manager can take a field; while our own apply is the only writer of
    the main resource (status writes are subresource entries, never read), `taken_fields` is
    False with or without the entries, so a watch cache keeps none: our apply's entry mirrors the
    whole manifest (a pod template) and was most of what a settled child cost in memory.
    """
    kept = [e for e in entries or () if isinstance(e, Mapping) and not e.get("subresource")]
    if all(e.get("manager") == FIELD_MANAGER and e.get("operation") == "Apply" for e in kept):
        return None
    return kept


def _taken(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any], desired: Any) -> bool:
    if isinstance(desired, Mapping) and desired:
        for key, sub in theirs.items():
            if key.startswith("f:") and key[2:] in desired and isinstance(sub, Mapping):
                below = ours.get(key) if ours is not None else None
                if _taken(below if isinstance(below, Mapping) else None, sub, desired[key[2:]]):
                    return True
        return False
    if ours is None:
        return True
    return not _leaves(theirs) <= _leaves(ours)


def _leaves(fields: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for key, sub in fields.items():
        if key == ".":
            continue
        path = (*prefix, key)
        found |= _leaves(sub, path) if isinstance(sub, Mapping) and sub else {path}
    return found


def _digest(obj: Mapping[str, Any]) -> str | None:
    value = obj.get("metadata", {}).get("annotations", {}).get(DIGEST_ANNOTATION)
    return str(value) if value is not None else None

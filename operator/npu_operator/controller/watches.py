"""Children and pods watched by our own informers: caches keyed by the owner, and a wake-up on each change.

One informer (`kube.informer`) per kind in `children.KINDS` (objects labelled as ours), on pods (objects
with our name label) and on the links of pods' owner chains, in each watched namespace (or cluster-wide).
Each keeps an `OwnedObjects` cache keyed by (namespace, owner name) holding the part of each object the
reconcile reads (`essentials`): the worker reads its children and pods there (`WatchedView`), with no
request to the API server (someone else's object under a child's name is not labelled as ours, so it
is not seen: `reconcile` creates children with an unforced apply, which such an object answers with
409). A change of what is kept wakes the owner (`worker.Workers.wake`) after the cache holds it, so its
next tick reads the new object; an event that changes nothing kept (a pod's heartbeat of a
condition time) wakes nothing. The workers stay the only writers of the status.
ReplicaSets and StatefulSets with our name label are kept too (no wake-up): a pod is ours only when its
owner chain through them leads to our workload (`kube.ownership`), since labels can be copied. A
LeaderWorkerSet's StatefulSets carry our labels because LeaderWorkerSet copies its own labels onto the
leader and worker StatefulSets (kubernetes-sigs/lws v0.10.0, pkg/controllers/leaderworkerset_controller.go
constructLeaderStatefulSetApplyConfiguration and pod_controller.go
constructWorkerStatefulSetApplyConfiguration: mergeMetadata(lws.Labels, ...)).
The workers start once every required kind has been listed (`Informers.ready`); a kind whose API is not
installed or that RBAC refuses is empty (its informer asks again every minute), so an optional API
never holds the required children back.
With the setting `node_discovery`, one more informer lists and watches every Node (cluster-wide,
read-only, no selector) into `NodeOffers`: of each Node only what `status.placement.node_npus`
keeps (its NPU resources' allocatable counts and chip labels), projected page by page while listing,
folded into the few distinct node shapes the reconcile reads (`NodeOffers.offer`). It wakes nobody
(a resource whose pods wait for a node ticks every interval anyway: `worker.quiet_inputs`) and
holds nobody back: until the first list, or where RBAC refuses Nodes (logged once), the offer is
unknown and the pods' scheduling verdicts speak alone (`status.findings`).

Why not kopf's own watching, as before: kopf runs every object of every watched kind through its
per-object machinery (a memory per object, an event queue and its task per object, the invocation of
each handler), which was most of the operator's CPU and a third of its memory per resource, for
caches that need none of it. The label selectors go to the API server (`server_selectors`): only our
objects are listed and streamed, in pages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from npu_operator.children import kinds as children
from npu_operator.children.kinds import ChildKind
from npu_operator.kube import names as builders
from npu_operator.kube.client import NODES, PODS, REPLICA_SETS, STATEFUL_SETS, ApiError, KubeClient, Resource
from npu_operator.kube.informer import Watched, inform
from npu_operator.kube.objects import shared_strings
from npu_operator.status import calibration, placement

logger = logging.getLogger(__name__)

OwnerKey = tuple[str, str]  # (namespace, NPUInference name)
OURS: Final = f"{builders.NAME_LABEL},app.kubernetes.io/managed-by=npu-operator"
POD_LABELS: Final = builders.NAME_LABEL
# The links of pods' owner chains.
LINKS: Final = (REPLICA_SETS, STATEFUL_SETS)


def server_selectors() -> dict[Resource, str]:
    """The `labelSelector` of every kind watched besides the NPUInference."""
    return dict.fromkeys(children.RESOURCES, OURS) | dict.fromkeys((PODS, *LINKS), POD_LABELS)


class OwnedObjects:
    """One kind's objects (an informer's `Sink`), as kept projections, by owner: (namespace, NPUInference
    name) -> {name: projection}. A change of a projection calls `wake` with its owner, once it is kept."""

    def __init__(
        self, project: Callable[[Mapping[str, Any]], dict[str, Any]], wake: Callable[[OwnerKey], None] | None = None
    ) -> None:
        self._project = project
        self._wake = wake or (lambda _: None)
        self.by_owner: dict[OwnerKey, dict[str, dict[str, Any]]] = {}
        self._owner_of: dict[tuple[str, str], OwnerKey] = {}  # (namespace, name) -> owner: a relabelled object moves

    def get(self, key: OwnerKey) -> Iterable[Mapping[str, Any]]:
        return self.by_owner.get(key, {}).values()

    def put(self, obj: Mapping[str, Any]) -> None:
        if (key := self._keep(obj)) is not None:
            self._wake(key)

    def remove(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if (key := self._drop(meta.get("namespace") or "", meta.get("name") or "")) is not None:
            self._wake(key)

    def replace(self, namespace: str | None, objects: Sequence[Mapping[str, Any]]) -> None:
        before = {key: found for key, found in self.by_owner.items() if namespace is None or key[0] == namespace}
        for key in before:
            del self.by_owner[key]
        self._owner_of = {at: key for at, key in self._owner_of.items() if key not in before}
        for obj in objects:
            self._keep(obj)
        now = {key for key in self.by_owner if namespace is None or key[0] == namespace}
        for key in before.keys() | now:
            if before.get(key) != self.by_owner.get(key):
                self._wake(key)

    def _keep(self, obj: Mapping[str, Any]) -> OwnerKey | None:
        """Keep `obj`'s projection; the owner whose objects changed, or None when nothing did."""
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        owner = (meta.get("labels") or {}).get(builders.NAME_LABEL)
        if owner is None:  # no longer labelled as ours
            return self._drop(namespace, name)
        projected = self._project(obj)
        # The cache's keys are the projection's own (shared) strings, not this event's copies.
        kept = projected.get("metadata") or {}
        namespace, name = kept.get("namespace") or namespace, kept.get("name") or name
        key: OwnerKey = (namespace, owner)
        moved = self._owner_of.get((namespace, name))
        if moved is not None and moved != key:
            self._drop(namespace, name)
            self._wake(moved)
        found = self.by_owner.setdefault(key, {})
        if found.get(name) == projected:
            return None
        found[name] = projected
        self._owner_of[(namespace, name)] = key
        return key

    def _drop(self, namespace: str, name: str) -> OwnerKey | None:
        key = self._owner_of.pop((namespace, name), None)
        if key is None:
            return None
        found = self.by_owner.get(key, {})
        found.pop(name, None)
        if not found:
            self.by_owner.pop(key, None)
        return key


class NodeOffers:
    """What the Nodes offer of NPUs (an informer's `Sink`): each Node's `placement.NodeNPUs` by name,
    and their `placement.Offer`, folded again only when a node's shape changed. `offer` is None
    until the first list, and while Nodes may not be listed (403: logged once per process)."""

    def __init__(self) -> None:
        self._nodes: dict[str, placement.NodeNPUs] = {}
        self._offer: placement.Offer | None = None
        self._known = False
        self._refused_logged = False

    @property
    def offer(self) -> placement.Offer | None:
        if not self._known:
            return None
        if self._offer is None:
            self._offer = placement.Offer.of(self._nodes.values())
        return self._offer

    def replace(self, namespace: str | None, objects: Sequence[Mapping[str, Any]]) -> None:
        self._nodes = {name: placement.node_npus(obj) for obj in objects if (name := _node_name(obj))}
        self._offer, self._known = None, True

    def put(self, obj: Mapping[str, Any]) -> None:
        if (name := _node_name(obj)) and self._nodes.get(name) != (shape := placement.node_npus(obj)):
            self._nodes[name] = shape
            self._offer = None

    def remove(self, obj: Mapping[str, Any]) -> None:
        if self._nodes.pop(_node_name(obj), None) is not None:
            self._offer = None

    def absent(self, exc: ApiError) -> None:
        """The Nodes may not be listed (or are not served): unknown, and said once (asked again every minute)."""
        self._known = False
        if not self._refused_logged:
            self._refused_logged = True
            logger.warning(
                f"cannot list Nodes ({exc}): conditions say what the scheduler says of the pods, not which NPUs "
                "the nodes offer (the chart grants Nodes with npu.nodeDiscovery; turn it off to stop asking)"
            )


def _node_name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def node_essentials(node: Mapping[str, Any]) -> dict[str, Any]:
    """What `NodeOffers` keeps of a listed Node, as a Node (its name, NPU allocatable, chip labels)."""
    npus = placement.node_npus(node)
    return {
        "metadata": {"name": _node_name(node), "labels": dict(npus.labels)},
        "status": {"allocatable": {name: str(count) for name, count in npus.resources}},
    }


class Informers:
    """The caches of every watched kind and the informers that fill them (in the memo)."""

    def __init__(self, wake: Callable[[OwnerKey], None]) -> None:
        self.children: dict[Resource, OwnedObjects] = {
            resource: OwnedObjects(essentials, wake) for resource in children.RESOURCES
        }
        self.pods = OwnedObjects(pod_essentials, wake)
        # One cache per kind: a fresh list of one kind replaces only that kind's objects.
        self.links = {resource: OwnedObjects(link_essentials) for resource in LINKS}
        self.nodes = NodeOffers()
        self._synced: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []

    def sinks(self) -> dict[Resource, OwnedObjects]:
        return self.children | {PODS: self.pods} | self.links

    def start(self, client: KubeClient, namespaces: Sequence[str], *, nodes: bool = False) -> None:
        """An informer per kind and namespace (one per kind, cluster-wide, when `namespaces` is empty);
        with `nodes` (the setting node_discovery), one on every Node, which holds no worker back."""
        required = {kind.resource for kind in children.KINDS if not kind.optional} | {PODS, *LINKS}
        sinks = self.sinks()
        for resource, selector in server_selectors().items():
            for namespace in namespaces or (None,):
                synced = asyncio.Event()
                if resource in required:  # an optional API never holds the workers back
                    self._synced.append(synced)
                watched = Watched(resource, namespace, selector)
                self._tasks.append(asyncio.create_task(inform(client, watched, sinks[resource], synced)))
        if nodes:
            watched = Watched(NODES, None, "")
            offers = self.nodes
            informer = inform(client, watched, offers, asyncio.Event(), absent=offers.absent, keep=node_essentials)
            self._tasks.append(asyncio.create_task(informer))

    async def ready(self) -> None:
        """Until every required kind has been listed once."""
        for synced in self._synced:
            await synced.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


class WatchedView:
    """The live children and pods of the resources, from the informers' caches (see `topologies.base.LiveView`)."""

    def __init__(self, informers: Informers) -> None:
        self._children = informers.children
        self._pods = informers.pods
        self._links = informers.links

    def child(self, kind: ChildKind, namespace: str, owner: str) -> Mapping[str, Any] | None:
        # Kept under the owner's name label; a child with a suffix (`-epp`, `-calibration`) is
        # found there by its own name.
        found = self._children[kind.resource].by_owner.get((namespace, owner), {}).get(kind.child_name(owner))
        return dict(found) if found is not None else None

    def pods(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return [dict(pod) for pod in self._pods.get((namespace, name))]

    def has_pods(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._pods.by_owner

    def owner_links(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return [dict(obj) for links in self._links.values() for obj in links.get((namespace, name))]

    def children_of(self, kind: ChildKind, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return [dict(obj) for obj in self._children[kind.resource].get((namespace, name))]


# What the reconcile reads of a child and of a pod; the rest (a child's spec, most of all the pod
# template) is not kept, so 1,000 resources fit in little memory. Of a ConfigMap's data only a
# calibration record of at most 64 KiB is kept (`calibration.stored_record` reads it).
_CHILD_METADATA: Final = ("name", "namespace", "uid", "generation", "labels", "ownerReferences")
_POD_METADATA: Final = ("name", "namespace", "uid", "labels", "deletionTimestamp", "ownerReferences")
_LINK_METADATA: Final = ("name", "namespace", "uid", "ownerReferences")


def essentials(body: Mapping[str, Any], *, pod: bool = False) -> dict[str, Any]:
    """The part of a watched object that the reconcile reads (metadata it needs, status; a pod's containers)."""
    meta = body.get("metadata", {})
    kept: dict[str, Any] = {key: meta[key] for key in (_POD_METADATA if pod else _CHILD_METADATA) if key in meta}
    if not pod and (digest := (meta.get("annotations") or {}).get(children.DIGEST_ANNOTATION)) is not None:
        kept["annotations"] = {children.DIGEST_ANNOTATION: digest}
    if not pod and (managed := children.managed_fields_to_keep(meta.get("managedFields"))) is not None:
        kept["managedFields"] = managed
    result: dict[str, Any] = {"metadata": kept, "status": body.get("status") or {}}
    record = None if pod else (body.get("data") or {}).get(calibration.RECORD_FILE)
    if isinstance(record, str) and len(record) <= calibration.MAX_RECORD_BYTES:
        result["data"] = {calibration.RECORD_FILE: record}  # the status loop merges into it
    if pod:
        containers = body.get("spec", {}).get("containers", [])
        result["spec"] = {"containers": [{"name": c.get("name"), "ports": c.get("ports", [])} for c in containers]}
    # A compact copy: kept for as long as the object lives, the same keys and labels in each.
    compact: dict[str, Any] = shared_strings(result)
    return compact


def pod_essentials(body: Mapping[str, Any]) -> dict[str, Any]:
    return essentials(body, pod=True)


def link_essentials(body: Mapping[str, Any]) -> dict[str, Any]:
    """A link of a pod's owner chain (a ReplicaSet, a StatefulSet): only who it is and who owns it."""
    meta = body.get("metadata", {})
    kept: dict[str, Any] = shared_strings({"metadata": {key: meta[key] for key in _LINK_METADATA if key in meta}})
    return kept

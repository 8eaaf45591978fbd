"""Children and pods watched through kopf: caches keyed by the owner, and a wake-up on each change.

kopf keeps one watch per kind in `children.KINDS` (objects labelled as ours) and one on pods
(objects with our name label). For each kind there is:
- a kopf index keyed by (namespace, owner name), holding the latest objects: the worker reads its
  children and pods there (`WatchedView`), with no request to the API server (someone else's
  object under a child's name is not labelled as ours, so it is not seen: `reconcile` creates
  children with an unforced apply, which such an object answers with 409);
- a wake-up of the owner's worker (`Wakeups.wake`) on each change: from the indexer itself for
  an object that changed (kopf stores what the indexer returns before anything else runs, so the
  woken worker reads the new object), and from an event handler for one that is deleted (kopf
  drops it from the index without calling the indexer). One handler per event, not two: kopf's
  handler machinery, not our code, is most of what an event costs. The worker stays the only
  writer of the status.
Children of an optional kind (PodMonitor, LeaderWorkerSet) are kept by their event handler in
`SeenChildren` instead of a kopf index: kopf holds every worker back until each index has been
filled by its first listing, and an optional API the operator may not list (a 403 from RBAC)
must never hold the required children back. Until its first event such a child is unknown, which
costs at most one unforced apply (an object of ours answers it as a no-op).
ReplicaSets and StatefulSets with our name label are indexed too (no wake-up): a pod is ours
only when its owner chain through them leads to our workload (`kube.ownership`), since labels can be
copied. A LeaderWorkerSet's StatefulSets carry our labels because LeaderWorkerSet copies its own
labels onto the leader and worker StatefulSets (kubernetes-sigs/lws v0.10.0,
pkg/controllers/leaderworkerset_controller.go constructLeaderStatefulSetApplyConfiguration and
pod_controller.go constructWorkerStatefulSetApplyConfiguration: mergeMetadata(lws.Labels, ...)).
kopf starts the workers only once every index has been filled by its first listing. A kind whose
API is not installed is not watched (kopf skips it) and its index stays empty.

The label filters are sent to the API server (`select_on_server`), which then lists and streams
only our objects: kopf applies a handler's `labels=` on its own side, after it has read and parsed
every object of the kind in the cluster (kopf 1.45, kopf/_core/intents/registries.py
`_matches_labels` on each event), so without it another tenant's ConfigMaps would fill the operator's memory.
kopf sends `settings.watching.label_selectors` with both its list and its watch
(kopf/_cogs/clients/fetching.py fetch_objs and watching.py watch_objs: `labelSelector=`) and lists
in chunks of `settings.watching.chunk_size` (`limit=` and `continue=`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Final

import kopf

from npu_operator.children import kinds as children
from npu_operator.children.kinds import ChildKind
from npu_operator.kube import names as builders
from npu_operator.kube.client import PODS, REPLICA_SETS, STATEFUL_SETS, Resource
from npu_operator.kube.objects import SharedDocuments, shared_strings
from npu_operator.status import calibration

OwnerKey = tuple[str, str]  # (namespace, NPUInference name)
OURS: Final[Mapping[str, Any]] = {builders.NAME_LABEL: kopf.PRESENT, "app.kubernetes.io/managed-by": "npu-operator"}
POD_LABELS: Final = {builders.NAME_LABEL: kopf.PRESENT}
POD_INDEX: Final = "npu_pods"
# The links of pods' owner chains, one index per kind.
LINK_INDEXES: Final = {REPLICA_SETS: "npu_replicasets", STATEFUL_SETS: "npu_statefulsets"}


# Chunks of the first listing of each kind, as client-go's pager lists (k8s.io/client-go/tools/pager,
# defaultPageSize = 500): a cluster with many of our objects is never read in one answer.
LIST_CHUNK: Final = 500


def label_selector(labels: Mapping[str, Any]) -> str:
    """A kopf `labels=` filter as the API server's `labelSelector`: `key` for kopf.PRESENT, `key=value` else."""
    return ",".join(key if value is kopf.PRESENT else f"{key}={value}" for key, value in sorted(labels.items()))


def server_selectors() -> dict[tuple[str, str, str], str]:
    """The `labelSelector` of every kind watched besides the NPUInference: (group, version, plural) -> selector."""
    selected = dict.fromkeys(children.RESOURCES, OURS)
    selected |= {PODS: POD_LABELS} | dict.fromkeys(LINK_INDEXES, POD_LABELS)
    return {(r.group, r.version, r.plural): label_selector(labels) for r, labels in selected.items()}


def select_on_server(settings: kopf.OperatorSettings) -> None:
    """Make the API server filter every child, pod and owner-chain watch and list, and list in chunks."""
    for (group, version, plural), selector in server_selectors().items():
        # (group, version, name): kopf's selector shortcut, the core group as "" (kopf.Selector is private).
        settings.watching.label_selectors[group, version, plural] = selector
    settings.watching.chunk_size = LIST_CHUNK


def index_name(kind: ChildKind) -> str:
    """The kopf index (and handler id) of one kind of child; kopf passes it to handlers by this name."""
    return f"npu_children_{kind.resource.plural}"


def owner_key(namespace: str | None, labels: Mapping[str, str]) -> OwnerKey:
    return (namespace or "", labels[builders.NAME_LABEL])


@dataclasses.dataclass
class SeenChildren:
    """The children of optional kinds, as their latest watch events showed them (in the memo)."""

    objects: dict[tuple[str, OwnerKey], dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def see(self, kind: ChildKind, key: OwnerKey, body: Mapping[str, Any], *, deleted: bool) -> None:
        name = str(body.get("metadata", {}).get("name", ""))
        found = self.objects.setdefault((kind.kind, key), {})
        if deleted:
            found.pop(name, None)
        else:
            found[name] = essentials(body)
        if not found:
            del self.objects[(kind.kind, key)]

    def get(self, kind: ChildKind, key: OwnerKey) -> Sequence[Mapping[str, Any]]:
        return list(self.objects.get((kind.kind, key), {}).values())


@dataclasses.dataclass
class Wakeups:
    """Per-resource wake-up signals, shared by the handlers and the workers (in the memo).

    Set only from the event loop (every handler that wakes is async), so `asyncio.Event` is safe.
    """

    events: dict[OwnerKey, asyncio.Event] = dataclasses.field(default_factory=dict)
    seen: dict[OwnerKey, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    deleted: set[str] = dataclasses.field(default_factory=set)  # uids whose DELETED event came

    def for_owner(self, key: OwnerKey) -> asyncio.Event:
        """A new worker's wake-up (a resource re-created under the same name gets its own)."""
        self.events[key] = event = asyncio.Event()
        return event

    def wake(self, key: OwnerKey) -> None:
        event = self.events.get(key)
        if event is not None:  # no worker (yet): its first tick reads the latest state anyway
            event.set()

    def wake_all(self) -> None:
        """Every worker: what all of them read has changed (an optional API is served or no longer is)."""
        for event in self.events.values():
            event.set()

    def saw_resource(self, key: OwnerKey, metadata: Mapping[str, Any], *, deleted: bool = False) -> None:
        """Wake the resource's worker when what it reads of the resource besides the status (its
        generation, labels and annotations: `read_by_worker`) differs from what was seen before,
        and when the resource is deleted (the worker then exits: kopf keeps no finalizer to stop it)."""
        if deleted:
            self.seen.pop(key, None)
            if key in self.events:  # a worker to tell (its exit forgets the uid again)
                self.deleted.add(str(metadata.get("uid", "")))
                self.wake(key)
            return
        read = read_by_worker(metadata)
        if self.seen.setdefault(key, read) != read:
            self.seen[key] = read
            self.wake(key)

    def forget(self, key: OwnerKey, uid: str, event: asyncio.Event) -> None:
        """The worker of `uid` has exited: its wake-up goes, unless a newer worker's took its place."""
        self.deleted.discard(uid)
        if self.events.get(key) is event:
            del self.events[key]
            self.seen.pop(key, None)


def drop_unread(body: MutableMapping[str, Any], *, worker_running: bool) -> None:
    """Drop from kopf's own copy of a resource (the body it keeps for the resource's daemon) what no
    one reads of it: its managedFields (neither kopf nor the worker reads them), and once the
    resource's worker runs, its status (the worker reads it once, when it starts, and from then on
    keeps the status as it last wrote it: `known_status`). Both grow with the status we write;
    kept, they were a second copy of it per resource. Called from the resource's raw event handler,
    which kopf runs before it starts a daemon (kopf 1.45, kopf/_core/reactor/processing.py,
    process_resource_event: the daemon's body is a view of this event's object). The metadata and
    spec that stay are not copied with shared strings: 4 KB less per resource at 1,000 resources,
    for 8% more CPU (a new copy for every event)."""
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    if worker_running:
        body.pop("status", None)


def share_spec(body: MutableMapping[str, Any], specs: SharedDocuments, *, deleted: bool) -> None:
    """Make kopf's copy of a resource hold the one shared copy of its spec (`SharedDocuments`): a
    fleet of resources with equal specs keeps one. Keyed by the resource's uid (a resource
    re-created under the same name starts again at generation 1) and its generation."""
    uid = (body.get("metadata") or {}).get("uid")
    if deleted:
        specs.release(uid)
    elif "spec" in body:
        body["spec"] = specs.share(uid, body["metadata"].get("generation"), body["spec"])


def read_by_worker(metadata: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a worker reads of its resource's metadata: the generation (the spec), the labels (the
    children's), the annotations (a rollout's). Our status writes and kopf's finalizer change none."""
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    return (metadata.get("generation"), tuple(sorted(labels.items())), tuple(sorted(annotations.items())))


class WatchedView:
    """The live children and pods of the resources, from kopf's indexes (see `topologies.base.LiveView`)."""

    def __init__(self, indexes: Mapping[str, Any], seen: SeenChildren) -> None:
        self._children: dict[ChildKind, kopf.Index[OwnerKey, Any]] = {
            kind: indexes[index_name(kind)] for kind in children.KINDS if not kind.optional
        }
        self._seen = seen
        self._pods: kopf.Index[OwnerKey, Any] = indexes[POD_INDEX]
        self._links: list[kopf.Index[OwnerKey, Any]] = [indexes[index] for index in LINK_INDEXES.values()]

    def child(self, kind: ChildKind, namespace: str, owner: str) -> Mapping[str, Any] | None:
        # Indexed under the owner's name label; a child with a suffix (`-epp`, `-calibration`) is
        # found there by its own name.
        name = kind.child_name(owner)
        for obj in self._indexed(kind, namespace, owner):
            if obj.get("metadata", {}).get("name") == name:
                return dict(obj)
        return None

    def pods(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return [dict(pod) for pod in self._pods.get((namespace, name), ())]

    def has_pods(self, namespace: str, name: str) -> bool:
        return bool(self._pods.get((namespace, name), ()))

    def owner_links(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return [dict(obj) for index in self._links for obj in index.get((namespace, name), ())]

    def children_of(self, kind: ChildKind, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return [dict(obj) for obj in self._indexed(kind, namespace, name)]

    def _indexed(self, kind: ChildKind, namespace: str, owner: str) -> Iterable[Mapping[str, Any]]:
        """The owner's children of one kind: from kopf's index, or for an optional kind from `SeenChildren`."""
        index = self._children.get(kind)
        return index.get((namespace, owner), ()) if index is not None else self._seen.get(kind, (namespace, owner))


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


# The indexers are async although they never wait: kopf runs a sync handler in a thread of its
# executor (kopf/_core/actions/invocation.py, invoke), a thread hop and a copied context for every
# child and pod event (three to five per resource as it settles). Never waiting is also what lets
# them wake the owner: kopf stores their answer in the index (kopf/_core/engines/indexing.py,
# index_resource: `indexers.replace` right after the handlers ran) before the event loop can run
# the woken worker.
async def _index_child(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, memo: Any, **_: Any
) -> dict[OwnerKey, Any]:
    key = owner_key(namespace, labels)
    memo.wakeups.wake(key)
    return {key: essentials(body)}


async def _index_pod(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, memo: Any, **_: Any
) -> dict[OwnerKey, Any]:
    key = owner_key(namespace, labels)
    memo.wakeups.wake(key)
    return {key: essentials(body, pod=True)}


async def _index_link(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[OwnerKey, Any]:
    """A link of a pod's owner chain (a ReplicaSet, a StatefulSet): only who it is and who owns it."""
    meta = body.get("metadata", {})
    kept = shared_strings({key: meta[key] for key in _LINK_METADATA if key in meta})
    return {owner_key(namespace, labels): {"metadata": kept}}


async def _wake_owner(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    memo.wakeups.wake(owner_key(namespace, labels))


def _deleted(type: str | None, **_: Any) -> bool:
    """The filter of the deletions' wake-up: every other event wakes the owner from its indexer."""
    return type == "DELETED"


async def _see_optional(
    type: str | None,
    resource: kopf.Resource,
    namespace: str | None,
    labels: Mapping[str, str],
    body: kopf.Body,
    memo: Any,
    **_: Any,
) -> None:
    key = owner_key(namespace, labels)
    kind = next(kind for kind in children.KINDS if kind.resource.plural == resource.plural)
    memo.seen_children.see(kind, key, body, deleted=type == "DELETED")
    memo.wakeups.wake(key)


def quiet_wakeups(record: logging.LogRecord) -> bool:
    """A logging filter: kopf's "Handler 'wake_for_…' succeeded." for each deletion of a child or a pod and
    each event of an optional child is noise."""
    return not record.getMessage().startswith("Handler 'wake_for_")


def register() -> None:
    """The indexes and wake-up handlers of every kind of child and of pods (called once, on import)."""
    for resource in children.RESOURCES:  # two kinds of child may share an API (the picker's Deployment)
        kind = next(kind for kind in children.KINDS if kind.resource == resource)
        if kind.optional:
            group, version, plural = resource.group, resource.version, resource.plural
            kopf.on.event(group=group, version=version, plural=plural, labels=OURS, id=f"wake_for_{plural}")(
                _see_optional
            )
        else:
            _watch(resource, OURS, index_name(kind), _index_child)
    _watch(PODS, POD_LABELS, POD_INDEX, _index_pod)
    for link, index in LINK_INDEXES.items():
        group, version, plural = link.group, link.version, link.plural
        kopf.index(group=group, version=version, plural=plural, labels=POD_LABELS, id=index)(_index_link)


def _watch(resource: Resource, labels: Mapping[str, Any], index: str, indexer: Any) -> None:
    group, version, plural = resource.group, resource.version, resource.plural
    kopf.index(group=group, version=version, plural=plural, labels=labels, id=index)(indexer)
    kopf.on.event(group=group, version=version, plural=plural, labels=labels, when=_deleted, id=f"wake_for_{plural}")(
        _wake_owner
    )

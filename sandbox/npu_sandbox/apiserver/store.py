"""The stored objects as an API server keeps them: resourceVersions, lookups, garbage collection.

kmock holds the objects (a deleted one stays, soft-deleted), a lock, and one bus of change events
per resource. `Store` is what every step of the emulator asks of them: the next resourceVersion,
whether an object exists (or is being deleted), a copy of it, the kind and status subresource of a
resource, and background garbage collection through owner references.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any

import kmock
from kmock._internal import aiobus, k8s_views, rendering


def plural_of(request: rendering.Request) -> str | None:
    return request.resource.plural if request.resource is not None else None


class Store:
    """kmock's objects, with the API server's resourceVersions and garbage collection."""

    def __init__(self, server: kmock.KubernetesEmulator) -> None:
        self.server = server
        self._versions = itertools.count(1)
        self.last_version = 0  # the newest resourceVersion given out

    @property
    def objects(self) -> k8s_views.ObjectsArray:
        return self.server.objects

    @property
    def resources(self) -> k8s_views.ResourcesArray:
        return self.server.resources

    @property
    def lock(self) -> asyncio.Lock:
        """kmock's lock over the objects and the buses."""
        lock: asyncio.Lock = self.server._lock
        return lock

    def bus(self, resource: Any) -> aiobus.Bus[Any]:
        """The change events of one resource, which its watches stream."""
        bus: aiobus.Bus[Any] = self.server._buses[resource]
        return bus

    def next_version(self) -> str:
        self.last_version = next(self._versions)
        return str(self.last_version)

    def has_status(self, resource: Any) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def exists(self, resource: Any, namespace: str | None, name: str) -> bool:
        """Whether the object is stored (and not deleted), without copying it as `stored` does."""
        key = (resource, namespace, name)
        return key in self.objects and not self.objects[key].deleted

    def stored(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if not self.exists(resource, namespace, name):
            return None
        raw: dict[str, Any] = copy.deepcopy(self.objects[key].raw)
        return raw

    def deleting(self, request: rendering.Request) -> bool:
        """Whether the object addressed is marked for deletion (waiting for its finalizers)."""
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:  # type: ignore[operator,index]
            return False
        return bool(self.objects[key].raw.get("metadata", {}).get("deletionTimestamp"))  # type: ignore[index]

    def kind(self, request: rendering.Request) -> str | None:
        resource = request.resource
        if resource is None or resource not in self.resources:
            return None
        kind: str | None = self.resources[resource].kind
        return kind

    def owner_alive(self, namespace: str | None, owner: Any) -> bool:
        """Whether the object an owner reference names exists with that uid: looked up by its
        kind and name (in the dependent's namespace, or cluster-wide), as the garbage collector's
        owner graph does, not by a scan of every object."""
        if not isinstance(owner, dict):
            return False
        group, _, version = str(owner.get("apiVersion", "")).rpartition("/")
        resources: Any = self.resources  # kmock's views are typed for its own keys
        objects: Any = self.objects
        for resource, info in resources.items():
            if (resource.group or "", resource.version, info.kind) != (group, version, owner.get("kind")):
                continue
            key = (resource, namespace if info.namespaced else None, owner.get("name"))
            if key in objects and not objects[key].deleted:
                return bool(objects[key].raw.get("metadata", {}).get("uid") == owner.get("uid"))
        return False

    async def collect_garbage(self) -> None:
        """Delete every object whose owners are all gone (background propagation), until none is left."""
        while True:
            alive = {obj.get("metadata", {}).get("uid") for key, obj in self.objects.items() if not obj.deleted}
            orphans = [
                key
                for key, obj in self.objects.items()
                if not obj.deleted
                and (owners := obj.get("metadata", {}).get("ownerReferences"))
                and not any(owner.get("uid") in alive for owner in owners)
            ]
            if not orphans:
                return
            async with self.lock:
                for key in orphans:
                    raw = self.objects[key].raw
                    self.objects[key].delete()
                    await self.bus(key[0]).put({"type": "DELETED", "object": raw})

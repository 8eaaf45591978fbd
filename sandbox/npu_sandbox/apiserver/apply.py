"""Server-side apply (`PATCH` with `application/apply-patch+yaml`): create the object, or merge the applied
fields into it, with field ownership recorded in `metadata.managedFields` (see `fields.applied`).

The object an apply yields goes through admission like any write (`Admission.admitted`), and is
stored and announced on its resource's bus here, under kmock's lock.
"""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import rendering
from npu_operator.kube.objects import utc_now

from npu_sandbox.apiserver import fields
from npu_sandbox.apiserver.admission import Admission, generation_body, is_dry_run, merge_patch
from npu_sandbox.apiserver.store import Store


class ServerSideApply:
    """Apply patches: `serve` answers one, or raises the API server's error (kmock.KubernetesError)."""

    def __init__(self, store: Store, admission: Admission) -> None:
        self.store = store
        self.admission = admission

    async def serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Server-side apply: create the object, or merge the applied fields into it (see `fields.applied`)."""
        if is_dry_run(request):
            async with self.store.lock:
                stored, created = self.apply(request)
            return aiohttp.web.json_response(stored, status=201 if created else 200)
        async with self.store.lock:
            stored, created = self.apply(request)
            assert request.resource is not None and request.name is not None  # checked in apply
            key = (request.resource, request.namespace, request.name)
            if key not in self.store.objects:
                self.store.objects[key] = stored
            elif self.store.objects[key].deleted:
                self.store.objects[key].create(stored)
            else:
                self.store.objects[key].patch(merge_patch(self.store.objects[key].raw, stored))
            raw = self.store.objects[key].raw
            await self.store.bus(request.resource).put({"type": "ADDED" if created else "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw, status=201 if created else 200)

    def apply(self, request: rendering.Request) -> tuple[dict[str, Any], bool]:
        """The object an apply patch yields, and whether it creates it; or the API server's error."""
        config = request.data
        if request.name is None or request.subresource is not None or not isinstance(config, dict):
            raise kmock.KubernetesError(
                status=400, reason="BadRequest", message="apply needs an object of a named resource"
            )
        meta = config.get("metadata", {})
        if meta.get("name") != request.name or not config.get("apiVersion") or not config.get("kind"):
            raise kmock.KubernetesError(
                status=400,
                reason="BadRequest",
                message="an applied object needs apiVersion, kind and metadata.name equal to the URL's name",
            )
        manager = request.params.get("fieldManager")
        if not manager:
            raise kmock.KubernetesError(
                status=400, reason="BadRequest", message="PATCH with apply requires a non-empty fieldManager"
            )
        force = request.params.get("force", "").lower() == "true"
        has_status = self.store.has_status(request.resource)
        old = self.store.stored(request.resource, request.namespace, request.name)
        created = old is None
        base: dict[str, Any] = {"metadata": {"name": request.name}} if old is None else old
        if request.namespace:
            base["metadata"]["namespace"] = request.namespace
        try:
            new, owners = fields.applied(base, config, manager, force=force, has_status=has_status)
        except fields.ApplyConflict as exc:
            raise kmock.KubernetesError(status=409, reason="Conflict", message=str(exc)) from None
        new = self.admission.admitted(request, new)
        meta = new["metadata"]
        meta["managedFields"] = fields.managed_fields(owners, config["apiVersion"])
        meta["resourceVersion"] = self.store.next_version()
        if old is None:
            meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=utc_now())
        else:
            generation = int(old.get("metadata", {}).get("generation", 1))
            meta["generation"] = generation + 1 if generation_body(old) != generation_body(new) else generation
        return new, created

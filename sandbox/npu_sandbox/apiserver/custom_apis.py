"""The APIs the stored CRDs serve, as the API server's CRD handler serves them.

`CustomApis.sync` runs after every write to customresourcedefinitions: a served version of a stored
CRD becomes an API with the version's schema, subresources and printer columns (what
`custom_resources.served` reads from it); a changed CRD changes them; an API no CRD serves any more
is gone, with its objects. `version_of` is the CRD version behind a request, which admission,
field validation, the scale subresource, Tables and OpenAPI read.
"""

from __future__ import annotations

from typing import Any

import kmock
from kmock._internal import rendering

from npu_sandbox.apiserver import custom_resources, openapi
from npu_sandbox.apiserver.store import Store


class CustomApis:
    """The CRD versions served now, by (group, version, plural)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # The APIs the stored CRDs serve: (group, version, plural) -> the CRD's version (schema, subresources, columns).
        self.versions: dict[tuple[str, str, str], dict[str, Any]] = {}
        # Each served CRD version's schema as openapi.schema_key_of's text, made once per CRD change, not per write.
        self.schema_keys: dict[tuple[str, str, str], str] = {}

    async def sync(self) -> None:
        """Serve what the stored CRDs define, as the API server's CRD handler does.

        A served version becomes an API with the version's schema, subresources and printer
        columns; a changed CRD changes them; an API no CRD serves any more is gone, and with it every
        object of it (the API server's CRD finalizer deletes them; here at once, finalizers and all).
        """
        crds = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        wanted: dict[tuple[str, str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
        for (resource, _, _), obj in list(self.store.objects.items()):
            if resource == crds and not obj.deleted:
                for path, served in custom_resources.served(obj.raw).items():
                    group, version, plural = path.rsplit("/", 2)
                    wanted[group, version, plural] = served
        for group, version, plural in set(self.versions) - set(wanted):
            del self.versions[group, version, plural]
            del self.schema_keys[group, version, plural]
            del self.store.resources[f"{group}/{version}/{plural}"]
            gone = kmock.resource(group, version, plural)
            async with self.store.lock:
                for key, obj in list(self.store.objects.items()):
                    if key[0] == gone and not obj.deleted:
                        raw = obj.raw
                        obj.delete()
                        await self.store.bus(gone).put({"type": "DELETED", "object": raw})
        for (group, version, plural), (info, spec) in wanted.items():
            self.store.resources[f"{group}/{version}/{plural}"] = info  # type: ignore[assignment]  # kmock's ResourceDict
            self.schema_keys[group, version, plural] = openapi.schema_key_of(spec["schema"]["openAPIV3Schema"])
            self.versions[group, version, plural] = spec

    def version_of(self, request: rendering.Request) -> dict[str, Any] | None:
        """The CRD version that serves this request's resource (schema, subresources, columns), if any."""
        resource = request.resource
        if resource is None or resource.group is None or resource.version is None or resource.plural is None:
            return None
        return self.versions.get((resource.group, resource.version, resource.plural))

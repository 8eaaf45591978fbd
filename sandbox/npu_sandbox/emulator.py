"""A Kubernetes API in memory, over real HTTP: kmock's emulator plus what an API server adds.

kmock stores objects and serves list/watch/get/create/patch/delete. This subclass adds, as a
kube-apiserver would: uid, resourceVersion, generation (bumped by changes outside metadata and
status), creationTimestamp, generateName; the status subresource kept apart from the rest;
label selectors on lists; background garbage collection through owner references;
admission of NPUInference objects against the CRD (defaults, schema, CEL rules), with the
API server's 422 answer; and server-side apply (`application/apply-patch+yaml`) with field
ownership recorded in `metadata.managedFields` (see `fields`). It is for tests and the sandbox
only; no product code imports it.
"""

from __future__ import annotations

import copy
import itertools
import re
import secrets
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import dicts, enums, rendering
from npu_operator import crd
from npu_operator.worker import utc_now

from npu_sandbox import fields, printer

# Resources served by default: what the operator and its tests touch.
RESOURCES: dict[str, Any] = {
    f"{crd.GROUP}/{crd.VERSION}/{crd.PLURAL}": {
        "kind": crd.KIND,
        "singular": "npuinference",
        "namespaced": True,
        "shortnames": {"npuinf"},
        "categories": {"all"},
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
        "subresources": {"status", "scale"},
    },
    "apps/v1/deployments": {
        "kind": "Deployment",
        "singular": "deployment",
        "shortnames": {"deploy"},
        "namespaced": True,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
        "subresources": {"status", "scale"},
    },
    "v1/services": {
        "kind": "Service",
        "singular": "service",
        "shortnames": {"svc"},
        "namespaced": True,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
        "subresources": {"status"},
    },
    "v1/pods": {
        "kind": "Pod",
        "singular": "pod",
        "shortnames": {"po"},
        "namespaced": True,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
        "subresources": {"status"},
    },
    "v1/events": {
        "kind": "Event",
        "singular": "event",
        "shortnames": {"ev"},
        "namespaced": True,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
    },
    # kopf looks the namespaces resource up even when it watches the whole cluster.
    "v1/namespaces": {
        "kind": "Namespace",
        "singular": "namespace",
        "namespaced": False,
        "verbs": {"list", "watch", "get"},
    },
    "policy/v1/poddisruptionbudgets": {
        "kind": "PodDisruptionBudget",
        "singular": "poddisruptionbudget",
        "shortnames": {"pdb"},
        "namespaced": True,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
        "subresources": {"status"},
    },
    "kopf.dev/v1/kopfpeerings": {
        "kind": "KopfPeering",
        "singular": "kopfpeering",
        "namespaced": True,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
    },
    "kopf.dev/v1/clusterkopfpeerings": {
        "kind": "ClusterKopfPeering",
        "singular": "clusterkopfpeering",
        "namespaced": False,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
    },
}
POD_MONITORS: tuple[str, Any] = (
    "monitoring.coreos.com/v1/podmonitors",
    {
        "kind": "PodMonitor",
        "singular": "podmonitor",
        "namespaced": True,
        "verbs": {"list", "watch", "get", "create", "patch", "delete"},
    },
)

_SELECTOR_TERM = re.compile(
    r"^\s*(?P<neg>!)?(?P<key>[A-Za-z0-9./_-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def matches_selector(labels: Mapping[str, str], selector: str) -> bool:
    """Kubernetes' label selector syntax: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    for term in _split_selector(selector):
        match = _SELECTOR_TERM.match(term)
        if not match:
            raise ValueError(f"unable to parse requirement: {term!r}")
        key = match["key"]
        if match["setop"]:
            values = {v.strip() for v in match["values"].split(",")}
            ok = (labels.get(key) in values) if match["setop"] == "in" else (labels.get(key) not in values)
        elif match["op"]:
            ok = (labels.get(key) == match["value"]) if match["op"] != "!=" else (labels.get(key) != match["value"])
        else:
            ok = (key not in labels) if match["neg"] else (key in labels)
        if not ok:
            return False
    return True


def _split_selector(selector: str) -> Iterable[str]:
    depth, current = 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            yield current
            current = ""
        else:
            current += char
    if current.strip():
        yield current


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API-server behaviour listed in the module docstring."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _history: list[rendering.Request] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, info in RESOURCES.items():
            self.resources[key] = info

    def serve_pod_monitors(self) -> None:
        """Pretend the prometheus-operator CRDs are installed."""
        key, info = POD_MONITORS
        self.resources[key] = info

    def _has_status(self, resource: Any) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def _stored(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        raw: dict[str, Any] = copy.deepcopy(self.objects[key].raw)
        return raw

    @property
    def history(self) -> list[rendering.Request]:
        """Every request served so far, in order (kmock's own list holds only those in flight)."""
        return list(self._history)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Serve one request, keeping kmock's list of requests down to those in flight.

        kmock matches a request against each reaction with `request in view`, which iterates every
        request the view has ever seen: each request got slower as the history grew (8 ms per GET
        at first, 45 ms after 600 requests). The history is kept here instead (`history`).
        """
        self._history.append(request)
        try:
            return await self._serve(request)
        finally:
            for index, served in enumerate(self._requests):
                if served is request:
                    del self._requests[index]
                    break

    async def _serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.headers.get("Content-Type", "").startswith(fields.APPLY_PATCH):
            return await self._serve_apply(request)
        if request.resource is not None and isinstance(request.data, dict | list):
            try:
                if request.action == enums.action.CREATE:
                    self._admit_create(request)
                elif request.action == enums.action.UPDATE and request.name is not None:
                    self._admit_update(request)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        response = await super()._handle(request)
        if request.action in (enums.action.DELETE, enums.action.UPDATE) and request.name is not None:
            await self._collect_garbage()  # a delete, or a patch that released the last finalizer
        return response

    def _admit_create(self, request: rendering.Request) -> None:
        data: dict[str, Any] = request.data
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if self._is_npu_inference(request):
            defaulted = self._admitted(data)
            data.clear()
            data.update(defaulted)
        if self._has_status(request.resource) and request.subresource is None:
            data.pop("status", None)
        meta = data["metadata"]
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._versions)),
            generation=1,
            creationTimestamp=utc_now(),
        )
        if request.subresource is None:
            owners = fields.updated({}, data, fields.manager_of(request), self._has_status(request.resource))
            meta["managedFields"] = fields.managed_fields(owners, data.get("apiVersion", ""))

    def _admit_update(self, request: rendering.Request) -> None:
        """Turn the client's patch into one that yields what the API server would store."""
        old = self._stored(request.resource, request.namespace, request.name or "")
        if old is None:
            return  # kmock answers 404
        data: Any = request.data
        if isinstance(data, list):  # a JSON patch (RFC 6902), as kopf sends for finalizers
            try:
                data = jsonpatch.apply_patch(old, data)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=f"the patch failed: {exc}") from None
            data = merge_patch(old, data)
            object.__setattr__(request, "data", data)  # kmock then applies it as a merge patch
        if self._has_status(request.resource):
            # The status subresource changes only status; the main resource changes all but status.
            if request.subresource == "status":
                patch = {"status": data["status"]} if "status" in data else {}
            else:
                patch = {key: value for key, value in data.items() if key != "status"}
        else:
            patch = data
        new: dict[str, Any] = copy.deepcopy(dict(dicts.patch_dict(old, patch)))
        if self._is_npu_inference(request) and request.subresource is None:
            new = self._admitted(new)
        meta = new.setdefault("metadata", {})
        old_meta = old.get("metadata", {})
        meta.update(uid=old_meta.get("uid"), creationTimestamp=old_meta.get("creationTimestamp"))
        meta["resourceVersion"] = str(next(self._versions))
        generation = int(old_meta.get("generation", 1))
        meta["generation"] = generation + 1 if _body(old) != _body(new) else generation
        if request.subresource is None:
            owners = fields.updated(old, new, fields.manager_of(request), self._has_status(request.resource))
            meta["managedFields"] = fields.managed_fields(owners, new.get("apiVersion", ""))
        data.clear()
        data.update(merge_patch(old, new))

    async def _serve_apply(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Server-side apply: create the object, or merge the applied fields into it (see `fields.applied`)."""
        try:
            async with self._lock:
                stored, created = self._apply(request)
                assert request.resource is not None and request.name is not None  # checked in _apply
                key = (request.resource, request.namespace, request.name)
                if key not in self.objects:
                    self.objects[key] = stored
                elif self.objects[key].deleted:
                    self.objects[key].create(stored)
                else:
                    self.objects[key].patch(merge_patch(self.objects[key].raw, stored))
                raw = self.objects[key].raw
                await self._buses[request.resource].put({"type": "ADDED" if created else "MODIFIED", "object": raw})
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        return aiohttp.web.json_response(raw, status=201 if created else 200)

    def _apply(self, request: rendering.Request) -> tuple[dict[str, Any], bool]:
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
        has_status = self._has_status(request.resource)
        old = self._stored(request.resource, request.namespace, request.name)
        created = old is None
        base: dict[str, Any] = {"metadata": {"name": request.name}} if old is None else old
        if request.namespace:
            base["metadata"]["namespace"] = request.namespace
        try:
            new, owners = fields.applied(base, config, manager, force=force, has_status=has_status)
        except fields.ApplyConflict as exc:
            raise kmock.KubernetesError(status=409, reason="Conflict", message=str(exc)) from None
        if self._is_npu_inference(request):
            new = self._admitted(new)
        meta = new["metadata"]
        meta["managedFields"] = fields.managed_fields(owners, config["apiVersion"])
        meta["resourceVersion"] = str(next(self._versions))
        if old is None:
            meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=utc_now())
        else:
            generation = int(old.get("metadata", {}).get("generation", 1))
            meta["generation"] = generation + 1 if _body(old) != _body(new) else generation
        return new, created

    def _is_npu_inference(self, request: rendering.Request) -> bool:
        resource = request.resource
        return bool(resource is not None and resource.group == crd.GROUP and resource.plural == crd.PLURAL)

    def _admitted(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object as the API server stores it (defaults applied), or its 422 answer."""
        defaulted, errors = crd.admit(obj)
        if errors:
            name = obj.get("metadata", {}).get("name")
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f'{crd.KIND}.{crd.GROUP} "{name}" is invalid: ' + "; ".join(errors),
                details={"causes": [{"message": error} for error in errors]},
            )
        return defaulted

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        """Discovery as an API server answers it: `v1` for the core group; subresources without short names."""
        payload: Any = await super()._serve_version(request)
        payload["groupVersion"] = payload["groupVersion"].lstrip("/")  # the core group is "v1", not "/v1"
        for entry in payload.get("resources", []):
            if "/" in entry["name"]:
                entry["shortNames"], entry["categories"] = [], []
        result: rendering.Payload = payload
        return result

    def _wants_table(self, request: rendering.Request) -> bool:
        """kubectl get asks for a server-side Table; only NPUInference has printer columns here."""
        return self._is_npu_inference(request) and "as=Table" in request.headers.get("Accept", "")

    def _as_table(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return printer.table(crd.version_spec().get("additionalPrinterColumns", []), items)

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        payload: Any = await super()._serve_fetch(request)
        result: rendering.Payload = self._as_table([payload]) if self._wants_table(request) else payload
        return result

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        payload: Any = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            try:
                payload["items"] = [
                    item
                    for item in payload["items"]
                    if matches_selector(item.get("metadata", {}).get("labels", {}), selector)
                ]
            except ValueError as exc:
                raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from None
        resource = request.resource
        if resource is not None and resource in self.resources and self.resources[resource].kind:
            payload["kind"] = f"{self.resources[resource].kind}List"
            payload["apiVersion"] = f"{resource.group}/{resource.version}" if resource.group else resource.version
        if self._wants_table(request):
            payload = self._as_table(payload["items"])
        result: rendering.Payload = payload
        return result

    async def _collect_garbage(self) -> None:
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
            async with self._lock:
                for key in orphans:
                    raw = self.objects[key].raw
                    self.objects[key].delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})


def merge_patch(last: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that turns `last` into `desired`: `desired` plus a null for every key it dropped."""
    patch: dict[str, Any] = dict(desired)
    for key, old in last.items():
        if key not in desired:
            patch[key] = None
        elif isinstance(old, Mapping) and isinstance(desired[key], Mapping):
            patch[key] = merge_patch(old, desired[key])
    return patch


def _body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What generation counts: everything but metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}

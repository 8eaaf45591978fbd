"""A Kubernetes API in memory, over real HTTP: kmock's emulator plus what an API server adds.

kmock stores objects and serves list/watch/get/create/patch/delete. This subclass adds, as a
kube-apiserver would: uid, resourceVersion, generation (bumped by changes outside metadata and
status), creationTimestamp, generateName; the status subresource kept apart from the rest;
label selectors on lists; watches that honour resourceVersion and timeoutSeconds (and answer
410 Gone below `compacted_before`); background garbage collection through owner references; and
admission of NPUInference objects against the CRD (defaults, schema, CEL rules), with the
API server's 422 answer; server-side apply (`application/apply-patch+yaml`) with field
ownership recorded in `metadata.managedFields` (see `fields`). For kubectl (and any client-go
client) it also serves what they read and negotiate: OpenAPI v3 and v2 (`openapi`), field
validation (`fieldValidation=Strict` refuses unknown fields, otherwise they are dropped with a
warning), `dryRun=All`, PUT, the `scale` subresource as an autoscaling/v1 Scale, field selectors,
watches as `application/json` (Tables when asked), server-side Tables for NPUInference, Events,
Namespaces, Deployments and Pods, and the namespaces every cluster has. It is for tests and the
sandbox only; no product code imports it.

This module is the HTTP face and the order of the steps; each step is a collaborator of its own
module: `access` (tokens, RBAC), `admission` (PUT as a patch, field validation, admission, dry
run), `subresources` (scale), `apply` (server-side apply), `store` (resourceVersions, garbage
collection), `custom_apis` (what the stored CRDs serve), `watch` (list and watch), `tables`
(server-side Tables) and `discovery` (versions, OpenAPI).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums, rendering

from npu_sandbox.apiserver import fields, kube_protobuf, watch
from npu_sandbox.apiserver.access import Access
from npu_sandbox.apiserver.admission import Admission, is_dry_run, warning
from npu_sandbox.apiserver.apply import ServerSideApply
from npu_sandbox.apiserver.custom_apis import CustomApis
from npu_sandbox.apiserver.discovery import Discovery
from npu_sandbox.apiserver.resources import (
    DISAGGREGATED_SETS,
    INFERENCE_POOLS,
    INITIAL_NAMESPACES,
    LEADER_WORKER_SETS,
    POD_MONITORS,
    RESOURCES,
    ROLE_SCALERS,
    SCALED_OBJECTS,
    initial_namespace,
)
from npu_sandbox.apiserver.store import Store, plural_of
from npu_sandbox.apiserver.subresources import Scale
from npu_sandbox.apiserver.tables import Tables
from npu_sandbox.apiserver.watch import ListWatch

# The namespaces resource itself: /api/v1/namespaces, /api/v1/namespaces/{name}[/status|/finalize].
_NAMESPACES_PATH = re.compile(r"/api/v1/namespaces(?:/(?P<name>[^/]+))?(?P<rest>/status|/finalize)?")


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API-server behaviour listed in the module docstring."""

    # Watches from a resourceVersion below this get 410 Gone, as after an etcd compaction.
    compacted_before: int = attrs.field(default=0, init=False)
    _history: list[rendering.Request] = attrs.field(factory=list, init=False)
    # The steps of a request, made in __attrs_post_init__ (they need the emulator); no part of repr or eq.
    store: Store = attrs.field(init=False, repr=False, eq=False)
    custom_apis: CustomApis = attrs.field(init=False, repr=False, eq=False)
    access: Access = attrs.field(init=False, repr=False, eq=False)
    scale: Scale = attrs.field(init=False, repr=False, eq=False)
    admission: Admission = attrs.field(init=False, repr=False, eq=False)
    server_side_apply: ServerSideApply = attrs.field(init=False, repr=False, eq=False)
    tables: Tables = attrs.field(init=False, repr=False, eq=False)
    list_watch: ListWatch = attrs.field(init=False, repr=False, eq=False)
    discovery: Discovery = attrs.field(init=False, repr=False, eq=False)

    def _KubernetesEmulator__get_obj(self, request: rendering.Request, strict: bool) -> Any:
        """The object one request names, by its key, as an API server reads it from its store.

        kmock 0.8 looks it up by a scan of every stored object (`KubernetesEmulator.__get_obj`, for
        each get, create, update and delete), which made every single-object request cost as much
        as the objects stored: quadratic in a benchmark's fleet, and most for the controller whose
        children are the most objects. Only an exact request (a name, `strict`) is looked up by key;
        the rest go kmock's way."""
        if strict and request.name is not None and request.resource is not None:
            key = (request.resource, request.namespace, request.name)
            objects: Any = self.objects  # kmock's view is typed for its own keys
            return objects[key] if key in objects else None  # noqa: SIM401  (kmock's view has no .get)
        return super()._KubernetesEmulator__get_obj(request, strict)  # type: ignore[misc]

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store = Store(self)
        self.custom_apis = CustomApis(self.store)
        self.access = Access(self.store)
        self.scale = Scale(self.store, self.custom_apis)
        self.admission = Admission(self.store, self.custom_apis, self.scale)
        self.server_side_apply = ServerSideApply(self.store, self.admission)
        self.tables = Tables(self.store, self.custom_apis)
        self.list_watch = ListWatch(self.store, self.tables)
        self.discovery = Discovery(self.store, self.custom_apis)
        self.resources.update(RESOURCES)
        self._serve_what_kubectl_reads()

    def serve_pod_monitors(self) -> None:
        """Pretend the prometheus-operator CRDs are installed."""
        self.resources.update([POD_MONITORS])

    def serve_scaled_objects(self) -> None:
        """Pretend KEDA's CRDs are installed; nothing runs KEDA (tests scale as its HPA would)."""
        self.resources.update([SCALED_OBJECTS])

    def serve_inference_pools(self) -> None:
        """Pretend the Gateway API Inference Extension's CRDs are installed; no gateway runs them."""
        self.resources.update([INFERENCE_POOLS])

    def serve_leader_worker_sets(self) -> None:
        """Serve the LeaderWorkerSet API (kubernetes-sigs/lws), as its CRD does; the sandbox's
        stand-in for its controller is `npu_sandbox.controllers.lws` (nothing runs it unless a kubelet does)."""
        self.resources.update([LEADER_WORKER_SETS])

    def serve_disaggregated_sets(self) -> None:
        """Serve LeaderWorkerSet v0.10's DisaggregatedSet API and its role scalers', as their CRDs do."""
        self.resources.update([DISAGGREGATED_SETS, ROLE_SCALERS])

    @property
    def _last_version(self) -> int:
        """The newest resourceVersion given out (tests compact the history below it)."""
        return self.store.last_version

    @property
    def history(self) -> list[rendering.Request]:
        """Every request served so far, in order (kmock's own list holds only those in flight)."""
        return list(self._history)

    def _get_resources(self) -> list[Any]:
        """Only what is declared is served: kmock would also serve any resource it holds objects of
        (a deleted CRD's objects stay in its store, soft-deleted)."""
        return [resource for resource in super()._get_resources() if resource in self._resources]

    # --- one request, step by step --------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock reads `/api/v1/namespaces/{name}` as a namespace prefix, never as the namespaces
        resource (and fails on `/api/v1/namespaces`): such paths are re-addressed as a namespaced
        `namespaces` resource, whose namespace `_handle` clears again."""
        match = _NAMESPACES_PATH.fullmatch(raw_request.path)
        if match is not None:
            name = f"/{match['name']}" if match["name"] else ""
            path = f"/api/v1/namespaces/-/namespaces{name}{match['rest'] or ''}"
            raw_request = raw_request.clone(
                rel_url=raw_request.rel_url.with_path(path).with_query(raw_request.rel_url.query)
            )
        content_type = raw_request.headers.get("Content-Type", "")
        if "protobuf" in content_type:  # Kubernetes' protobuf is read as the JSON it stands for; no other
            try:
                if content_type.startswith(kube_protobuf.CONTENT_TYPE):
                    raw_request = await _as_json(raw_request)
                elif raw_request.body_exists:
                    raise kube_protobuf.Unsupported(f"not {kube_protobuf.CONTENT_TYPE}: {content_type}")
            except kube_protobuf.Unsupported as exc:
                status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 415}
                message = f"the sandbox reads protobuf bodies of Secrets, ConfigMaps, Namespaces, DeleteOptions: {exc}"
                return aiohttp.web.json_response(
                    status | {"reason": "UnsupportedMediaType", "message": message}, status=415
                )
        return await super().__call__(raw_request)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Serve one request, keeping kmock's list of requests down to those in flight.

        kmock matches a request against each reaction with `request in view`, which iterates every
        request the view has ever seen: each request got slower as the history grew (8 ms per GET
        at first, 45 ms after 600 requests). The history is kept here instead (`history`).
        """
        self._history.append(request)
        if request.resource is not None and (request.resource.group, request.resource.plural) == ("", "namespaces"):
            object.__setattr__(request, "namespace", None)  # see __call__: namespaces are cluster-scoped
        try:
            denied = self.access.authorize(request)
            if denied is not None:
                return denied
            return await self._serve(request)
        finally:
            self._served(request)

    def _served(self, request: rendering.Request) -> None:
        """`request` leaves kmock's list of requests in flight (if it is still there)."""
        for index, served in enumerate(self._requests):
            if served is request:
                del self._requests[index]
                break

    async def _serve(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.resource.plural and request.resource not in self._resources:
            return await self._render_error(
                kmock.KubernetesNotFoundError(
                    reason="NotFound", message="the server could not find the requested resource"
                )
            )
        if request.subresource == "token" and plural_of(request) == "serviceaccounts":
            try:
                return self.access.issue_token(request)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        if plural_of(request) == "customresourcedefinitions" and request.method != enums.method.GET:
            try:
                return await self._serve_object(request)
            finally:
                await self.custom_apis.sync()
        return await self._serve_object(request)

    async def _serve_object(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Admission and validation (or server-side apply), then kmock stores it; then garbage collection."""
        warnings: list[str] = []
        # An object created with an owner that is gone (a controller acting on a stale read while its
        # owner was deleted) is collected at once, as the garbage collector would soon after (its
        # attemptToDeleteItem finds the owner absent). Its owners are looked up by reference: a scan
        # of every object per create made the emulator quadratic in the objects it holds (5,000
        # resources' calibration records: 577 s to settle).
        owners = request.data.get("metadata", {}).get("ownerReferences") if isinstance(request.data, dict) else None
        orphaned = (
            isinstance(owners, list)
            and bool(owners)
            and not any(self.store.owner_alive(request.namespace, owner) for owner in owners)
        )
        if request.resource is not None:
            try:
                if request.headers.get("Content-Type", "").startswith(fields.APPLY_PATCH):
                    applied = await self.server_side_apply.serve(request)
                    if orphaned and applied.status == 201:  # an apply that created the object
                        await self.store.collect_garbage()
                    return applied
                warnings = self._admit(request)
                if is_dry_run(request):
                    return self.admission.dry_run(request, warnings)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        # Only a delete, or a patch that may release the last finalizer, can leave orphans behind.
        collect = request.name is not None and (
            request.action == enums.action.DELETE
            or (request.action == enums.action.UPDATE and self.store.deleting(request))
        )
        collect = collect or (request.action == enums.action.CREATE and orphaned)
        response = await super()._handle(request)
        if collect:
            await self.store.collect_garbage()
        for text in warnings:
            response.headers.add("Warning", warning(text))
        return response

    def _admit(self, request: rendering.Request) -> list[str]:
        """A write turned into what the API server stores (the request's data rewritten); its warnings."""
        self.admission.replace_as_patch(request)
        self.scale.as_patch(request)
        warnings = self.admission.validate_fields(request)
        if isinstance(request.data, dict | list):
            if request.action == enums.action.CREATE:
                self.admission.create(request)
            elif request.action == enums.action.UPDATE and request.name is not None:
                self.admission.update(request)
        return warnings

    # --- kmock's answers, as the API server gives them -------------------------------------------

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        """The Kubernetes version whose schemas the sandbox serves (kubectl warns about a skew)."""
        return self.discovery.server_version()

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        return self.discovery.group_version(await super()._serve_version(request))

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        payload: Any = await super()._serve_fetch(request)
        if request.subresource == "scale":
            return self.scale.of(request, payload)
        result: rendering.Payload = self.tables.of([payload], request) if self.tables.wanted(request) else payload
        return result

    async def _serve_update(self, request: rendering.Request) -> rendering.Payload:
        payload: Any = await super()._serve_update(request)
        return self.scale.of(request, payload) if request.subresource == "scale" else payload

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        return self.list_watch.filter_list(request, await super()._serve_list(request))

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        """A watch as the API server serves it (`watch.ListWatch.stream`), its first events from `_catch_up`."""
        async with contextlib.aclosing(self.list_watch.stream(request, self._catch_up)) as events:
            async for event in events:
                yield event

    def _catch_up(self, objects: list[tuple[bool, dict[str, Any]]], since: str) -> list[dict[str, Any]]:
        return watch.catch_up(objects, since, self.compacted_before)

    async def _watch_as_asked(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        """The watch (or a streaming list), with the selectors applied, as Tables when kubectl asks.

        A watch routed here is matched no more: it leaves kmock's requests in flight now, not when
        its stream ends. Kept there, every open watch was walked by every later request's `request
        in view` for each reaction tried, so each request cost as much as the watches open (a
        controller with an informer per kind paid for all of them on every write)."""
        self._served(request)
        async with contextlib.aclosing(self.list_watch.as_asked(request, self._serve_watch)) as events:
            async for event in events:
                yield event

    def _serve_what_kubectl_reads(self) -> None:
        """Routes an API server has beyond kmock's: OpenAPI, watches as JSON; the usual namespaces."""
        self.fallback["get /openapi/v2"] << self.discovery.openapi_v2
        self.fallback["get /openapi/v3"] << self.discovery.openapi_v3_index
        self.fallback["get", re.compile(r"/openapi/v3/.+")] << self.discovery.openapi_v3_document
        # A watch is a stream of JSON lines; clients pick their decoder by the content type.
        (self.fallback**1)[enums.action.WATCH] << {"Content-Type": "application/json"} << self._watch_as_asked
        namespaces = kmock.resource("", "v1", "namespaces")
        for name in INITIAL_NAMESPACES:
            self.objects[namespaces, None, name] = initial_namespace(name, self.store.next_version())


async def _as_json(raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.BaseRequest:
    """A protobuf request body (see `kube_protobuf`) re-read as the JSON it stands for."""
    clone = raw_request.clone(headers=dict(raw_request.headers) | {"Content-Type": "application/json"})
    body = await clone.read()  # the same stream: a request cannot be cloned once read
    if body:
        clone._read_bytes = json.dumps(kube_protobuf.decode(body)).encode()  # what read(), text(), json() return
    return clone

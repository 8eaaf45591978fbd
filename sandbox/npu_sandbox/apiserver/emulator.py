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
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import itertools
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import dicts, enums, rendering
from npu_operator import crd
from npu_operator.worker import utc_now

from npu_sandbox.apiserver import custom_resources, fields, kube_protobuf, openapi, openapi_v2_proto, printer, rbac


def _api(
    kind: str,
    *,
    shortnames: Iterable[str] = (),
    categories: Iterable[str] = (),
    namespaced: bool = True,
    update: bool = False,
    subresources: Iterable[str] = (),
) -> dict[str, Any]:
    """kmock's resource info of a built-in kind (singular: the kind in lower case); `update`: PUT is
    served too (what helm and kubectl use on the kinds a chart installs)."""
    verbs = custom_resources.VERBS if update else custom_resources.VERBS - {"update"}
    return {
        "kind": kind,
        "singular": kind.lower(),
        "shortnames": set(shortnames),
        "categories": set(categories),
        "namespaced": namespaced,
        "verbs": set(verbs),
        "subresources": set(subresources),
    }


# Resources served by default: what the operator and its tests touch.
RESOURCES: dict[str, Any] = {
    "apps/v1/deployments": _api(
        "Deployment", shortnames={"deploy"}, categories={"all"}, subresources={"status", "scale"}
    ),
    "apps/v1/replicasets": _api("ReplicaSet", shortnames={"rs"}, subresources={"status", "scale"}),
    "apps/v1/statefulsets": _api(
        "StatefulSet", shortnames={"sts"}, categories={"all"}, subresources={"status", "scale"}
    ),
    "apps/v1/controllerrevisions": _api("ControllerRevision"),
    "v1/services": _api("Service", shortnames={"svc"}, categories={"all"}, subresources={"status"}),
    "v1/pods": _api("Pod", shortnames={"po"}, categories={"all"}, subresources={"status"}),
    "v1/persistentvolumeclaims": _api("PersistentVolumeClaim", shortnames={"pvc"}, subresources={"status"}),
    "v1/events": _api("Event", shortnames={"ev"}),
    # kopf looks the namespaces resource up even when it watches the whole cluster.
    "v1/namespaces": _api("Namespace", shortnames={"ns"}, namespaced=False),
    "policy/v1/poddisruptionbudgets": _api("PodDisruptionBudget", shortnames={"pdb"}, subresources={"status"}),
    # What a Helm chart installs, and Helm's own release storage (Secrets).
    "apiextensions.k8s.io/v1/customresourcedefinitions": _api(
        "CustomResourceDefinition", shortnames={"crd", "crds"}, namespaced=False, update=True, subresources={"status"}
    ),
    "v1/secrets": _api("Secret", update=True),
    "v1/configmaps": _api("ConfigMap", shortnames={"cm"}, update=True),
    "v1/serviceaccounts": _api("ServiceAccount", shortnames={"sa"}, update=True, subresources={"token"}),
    "rbac.authorization.k8s.io/v1/roles": _api("Role", update=True),
    "rbac.authorization.k8s.io/v1/rolebindings": _api("RoleBinding", update=True),
    "rbac.authorization.k8s.io/v1/clusterroles": _api("ClusterRole", namespaced=False, update=True),
    "rbac.authorization.k8s.io/v1/clusterrolebindings": _api("ClusterRoleBinding", namespaced=False, update=True),
}
# The namespaces every cluster starts with.
INITIAL_NAMESPACES: tuple[str, ...] = ("default", "kube-system", "kube-public", "kube-node-lease")
POD_MONITORS: tuple[str, Any] = ("monitoring.coreos.com/v1/podmonitors", _api("PodMonitor"))

# Optional APIs of spec.autoscaling and spec.routing (KEDA; the Gateway API Inference Extension).
SCALED_OBJECTS: tuple[str, Any] = (
    "keda.sh/v1alpha1/scaledobjects",
    _api("ScaledObject", shortnames={"so"}, subresources={"status"}),
)
INFERENCE_POOLS: tuple[str, Any] = (
    "inference.networking.k8s.io/v1/inferencepools",
    _api("InferencePool", shortnames={"infpool"}, subresources={"status"}),
)

LEADER_WORKER_SETS: tuple[str, Any] = (
    "leaderworkerset.x-k8s.io/v1/leaderworkersets",
    _api("LeaderWorkerSet", shortnames={"lws"}, subresources={"status", "scale"}),
)
# LeaderWorkerSet v0.10's DisaggregatedSet (config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml:
# no short names, a status subresource); the sandbox's stand-in for its controller is
# `npu_sandbox.controllers.disaggregated`.
DISAGGREGATED_SETS: tuple[str, Any] = (
    "disaggregatedset.x-k8s.io/v1/disaggregatedsets",
    _api("DisaggregatedSet", subresources={"status"}),
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


# The namespaces resource itself: /api/v1/namespaces, /api/v1/namespaces/{name}[/status|/finalize].
_NAMESPACES_PATH = re.compile(r"/api/v1/namespaces(?:/(?P<name>[^/]+))?(?P<rest>/status|/finalize)?")


def matches_fields(obj: Mapping[str, Any], selector: str) -> bool:
    """Field selectors: `metadata.name=x`, `involvedObject.uid==y`, `status.phase!=Running` (a missing field is "")."""
    for term in selector.split(","):
        if not term.strip():
            continue
        match = re.match(r"^\s*([A-Za-z0-9._-]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not match:
            raise ValueError(f"invalid field selector: {term!r}")
        path, op, value = match.groups()
        actual = printer.json_path(obj, path)
        text = "" if actual is None else str(actual)
        if (text == value) != (op != "!="):
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
    _last_version: int = attrs.field(default=0, init=False)
    # Watches from a resourceVersion below this get 410 Gone, as after an etcd compaction.
    compacted_before: int = attrs.field(default=0, init=False)
    _history: list[rendering.Request] = attrs.field(factory=list, init=False)
    _openapi_cache: dict[str, Any] = attrs.field(factory=dict, init=False)
    # The APIs the stored CRDs serve: (group, version, plural) -> the CRD's version (schema, subresources, columns).
    _custom: dict[tuple[str, str, str], dict[str, Any]] = attrs.field(factory=dict, init=False)
    # Each served CRD version's schema as openapi.schema_key_of's text, made once per CRD change, not per write.
    _schema_keys: dict[tuple[str, str, str], str] = attrs.field(factory=dict, init=False)
    # Tokens issued through serviceaccounts/{name}/token: token -> (namespace, ServiceAccount name).
    _tokens: dict[str, tuple[str, str]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
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
        """Serve LeaderWorkerSet v0.10's DisaggregatedSet API, as its CRD does."""
        self.resources.update([DISAGGREGATED_SETS])

    def _get_resources(self) -> list[Any]:
        """Only what is declared is served: kmock would also serve any resource it holds objects of
        (a deleted CRD's objects stay in its store, soft-deleted)."""
        return [resource for resource in super()._get_resources() if resource in self._resources]

    def _has_status(self, resource: Any) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def _exists(self, resource: Any, namespace: str | None, name: str) -> bool:
        """Whether the object is stored (and not deleted), without copying it as `_stored` does."""
        key = (resource, namespace, name)
        return key in self.objects and not self.objects[key].deleted

    def _stored(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if not self._exists(resource, namespace, name):
            return None
        raw: dict[str, Any] = copy.deepcopy(self.objects[key].raw)
        return raw

    def _deleting(self, request: rendering.Request) -> bool:
        """Whether the object addressed is marked for deletion (waiting for its finalizers)."""
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:  # type: ignore[operator,index]
            return False
        return bool(self.objects[key].raw.get("metadata", {}).get("deletionTimestamp"))  # type: ignore[index]

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
        if request.resource is not None and (request.resource.group, request.resource.plural) == ("", "namespaces"):
            object.__setattr__(request, "namespace", None)  # see __call__: namespaces are cluster-scoped
        try:
            denied = self._authorize(request)
            if denied is not None:
                return denied
            return await self._serve(request)
        finally:
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
        if request.subresource == "token" and _plural(request) == "serviceaccounts":
            return await self._serve_token_request(request)
        if _plural(request) == "customresourcedefinitions" and request.method != enums.method.GET:
            try:
                return await self._serve_object(request)
            finally:
                await self._sync_custom_resources()
        return await self._serve_object(request)

    async def _serve_object(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        warnings: list[str] = []
        if request.resource is not None and request.headers.get("Content-Type", "").startswith(fields.APPLY_PATCH):
            return await self._serve_apply(request)
        if request.resource is not None:
            try:
                self._replace_as_patch(request)
                self._scale_as_patch(request)
                warnings = self._validate_fields(request)
                if isinstance(request.data, dict | list):
                    if request.action == enums.action.CREATE:
                        self._admit_create(request)
                    elif request.action == enums.action.UPDATE and request.name is not None:
                        self._admit_update(request)
                if _is_dry_run(request):
                    return self._dry_run(request, warnings)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        # Only a delete, or a patch that may release the last finalizer, can leave orphans behind.
        collect = request.name is not None and (
            request.action == enums.action.DELETE or (request.action == enums.action.UPDATE and self._deleting(request))
        )
        # An object created with an owner that is gone (a controller acting on a stale read while its
        # owner was deleted) is collected at once, as the garbage collector would soon after.
        collect = collect or (
            request.action == enums.action.CREATE
            and isinstance(request.data, dict)
            and bool(request.data.get("metadata", {}).get("ownerReferences"))
        )
        response = await super()._handle(request)
        if collect:
            await self._collect_garbage()
        for warning in warnings:
            response.headers.add("Warning", _warning(warning))
        return response

    def _admit_create(self, request: rendering.Request) -> None:
        data: dict[str, Any] = request.data
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        resource = request.resource
        if resource is not None and self._stored(resource, request.namespace, str(meta.get("name"))) is not None:
            qualified = f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)
            raise kmock.KubernetesError(  # the API server's StatusReasonAlreadyExists, not kmock's wording
                status=409,
                reason="AlreadyExists",
                message=f'{qualified} "{meta.get("name")}" already exists',
                details={"name": meta.get("name"), "group": resource.group, "kind": resource.plural},
            )
        if self._has_status(request.resource) and request.subresource is None:
            data.pop("status", None)
        admitted = self._admitted(request, data)
        data.clear()
        data.update(admitted)
        meta = data["metadata"]
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self._next_version(),
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
        # Only a change outside metadata and status is admitted again: one that leaves the spec as
        # admitted cannot make it invalid (kopf's annotation patches cost a CEL run each otherwise).
        if request.subresource != "status" and _body(old) != _body(new):
            new = self._admitted(request, new)
        meta = new.setdefault("metadata", {})
        old_meta = old.get("metadata", {})
        meta.update(uid=old_meta.get("uid"), creationTimestamp=old_meta.get("creationTimestamp"))
        meta["resourceVersion"] = self._next_version()
        generation = int(old_meta.get("generation", 1))
        meta["generation"] = generation + 1 if _body(old) != _body(new) else generation
        if request.subresource is None:
            owners = fields.updated(old, new, fields.manager_of(request), self._has_status(request.resource))
            meta["managedFields"] = fields.managed_fields(owners, new.get("apiVersion", ""))
        data.clear()
        data.update(merge_patch(old, new))

    def _next_version(self) -> str:
        self._last_version = next(self._versions)
        return str(self._last_version)

    async def _serve_apply(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Server-side apply: create the object, or merge the applied fields into it (see `fields.applied`)."""
        try:
            if _is_dry_run(request):
                async with self._lock:
                    stored, created = self._apply(request)
                return aiohttp.web.json_response(stored, status=201 if created else 200)
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
        new = self._admitted(request, new)
        meta = new["metadata"]
        meta["managedFields"] = fields.managed_fields(owners, config["apiVersion"])
        meta["resourceVersion"] = self._next_version()
        if old is None:
            meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=utc_now())
        else:
            generation = int(old.get("metadata", {}).get("generation", 1))
            meta["generation"] = generation + 1 if _body(old) != _body(new) else generation
        return new, created

    # --- CustomResourceDefinitions, ServiceAccount tokens, RBAC --------------------------------

    async def _sync_custom_resources(self) -> None:
        """Serve what the stored CRDs define, as the API server's CRD handler does.

        A served version becomes an API with the version's schema, subresources and printer
        columns; a changed CRD changes them; an API no CRD serves any more is gone, and with it every
        object of it (the API server's CRD finalizer deletes them; here at once, finalizers and all).
        """
        crds = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        wanted: dict[tuple[str, str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
        for (resource, _, _), obj in list(self.objects.items()):
            if resource == crds and not obj.deleted:
                for path, served in custom_resources.served(obj.raw).items():
                    group, version, plural = path.rsplit("/", 2)
                    wanted[group, version, plural] = served
        for group, version, plural in set(self._custom) - set(wanted):
            del self._custom[group, version, plural]
            del self._schema_keys[group, version, plural]
            del self.resources[f"{group}/{version}/{plural}"]
            gone = kmock.resource(group, version, plural)
            async with self._lock:
                for key, obj in list(self.objects.items()):
                    if key[0] == gone and not obj.deleted:
                        raw = obj.raw
                        obj.delete()
                        await self._buses[gone].put({"type": "DELETED", "object": raw})
        for (group, version, plural), (info, spec) in wanted.items():
            self.resources[f"{group}/{version}/{plural}"] = info  # type: ignore[assignment]  # kmock's ResourceDict
            self._schema_keys[group, version, plural] = openapi.schema_key_of(spec["schema"]["openAPIV3Schema"])
            self._custom[group, version, plural] = spec

    async def _serve_token_request(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """`POST serviceaccounts/{name}/token` (TokenRequest): a token that authenticates as the account,
        as the kubelet asks for one to project into a pod."""
        if request.method != enums.method.POST:
            return await self._render_error(
                kmock.KubernetesError(
                    status=405,
                    reason="MethodNotAllowed",
                    message="the server does not allow this method on the requested resource",
                )
            )
        namespace, name = request.namespace or "", request.name or ""
        if not self._exists(request.resource, namespace, name):
            return await self._render_error(
                kmock.KubernetesObjectNotFoundError(reason="NotFound", message=f'serviceaccounts "{name}" not found')
            )
        spec = dict((request.data or {}).get("spec") or {}) if isinstance(request.data, dict) else {}
        seconds = int(spec.get("expirationSeconds") or 3600)
        token = secrets.token_urlsafe(32)
        self._tokens[token] = (namespace, name)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": utc_now()},
            "spec": {
                "audiences": spec.get("audiences") or ["https://kubernetes.default.svc"],
                "expirationSeconds": seconds,
            }
            | ({"boundObjectRef": spec["boundObjectRef"]} if spec.get("boundObjectRef") else {}),
            "status": {
                "token": token,
                "expirationTimestamp": expires.replace(microsecond=0).isoformat().replace("+00:00", "Z"),
            },
        }
        return aiohttp.web.json_response(body, status=201)

    def _user(self, request: rendering.Request) -> tuple[str, str] | None:
        """The ServiceAccount (namespace, name) a request's bearer token was issued to; None for any other
        client (unrestricted)."""
        header = request.headers.get("Authorization", "")
        return self._tokens.get(header.removeprefix("Bearer ").strip()) if header.startswith("Bearer ") else None

    def _authorize(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """RBAC for ServiceAccount tokens (see `rbac`): None when allowed, else the API server's 401 or 403."""
        found = self._user(request)
        if found is None:
            return None
        namespace, account = found
        if not self._exists(kmock.resource("", "v1", "serviceaccounts"), namespace, account):
            status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
            return aiohttp.web.json_response(
                status | {"message": "Unauthorized", "reason": "Unauthorized", "code": 401}, status=401
            )
        resource = request.resource
        if resource is None or not resource.plural:
            return None  # discovery, /version, /openapi: every identity reads them (system:discovery)
        method = request.method.value
        watch = request.action == enums.action.WATCH
        named = request.name is not None
        verb = rbac.verb_of(method, named=named, watch=watch)
        name = request.name or _name_from_field_selector(request.params.get("fieldSelector", ""))
        attributes = rbac.Attributes(
            user=rbac.User.service_account(namespace, account),
            verb=verb,
            group=resource.group or "",
            resource=resource.plural,
            subresource=request.subresource or "",
            namespace=request.namespace or "",
            name=name,
        )
        checks = [attributes]
        applying = request.headers.get("Content-Type", "").startswith(fields.APPLY_PATCH)
        if verb == "patch" and applying and not self._exists(resource, request.namespace, request.name or ""):
            checks.append(
                dataclasses.replace(attributes, verb="create")
            )  # an apply that creates (patch.go withAuthorization)
        policy = self._policy()
        for check in checks:
            allowed, reason = policy.authorize(check)
            if not allowed:
                return aiohttp.web.json_response(rbac.forbidden(check, reason), status=403)
        return None

    def _policy(self) -> rbac.Policy:
        """The stored Roles, ClusterRoles and their bindings."""
        stored: dict[str, list[dict[str, Any]]] = {}
        for (resource, _, _), obj in self.objects.items():
            if resource.group == "rbac.authorization.k8s.io" and not obj.deleted:
                stored.setdefault(str(resource.plural), []).append(obj.raw)
        return rbac.Policy(
            roles={(r["metadata"].get("namespace", ""), r["metadata"]["name"]): r for r in stored.get("roles", [])},
            cluster_roles={r["metadata"]["name"]: r for r in stored.get("clusterroles", [])},
            role_bindings=stored.get("rolebindings", []),
            cluster_role_bindings=stored.get("clusterrolebindings", []),
        )

    def _custom_version(self, request: rendering.Request) -> dict[str, Any] | None:
        """The CRD version that serves this request's resource (schema, subresources, columns), if any."""
        resource = request.resource
        if resource is None or resource.group is None or resource.version is None or resource.plural is None:
            return None
        return self._custom.get((resource.group, resource.version, resource.plural))

    def _admitted(self, request: rendering.Request, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object as the API server stores it, or its 422 answer: a custom resource defaulted and
        checked against its CRD's schema and CEL rules; a CRD checked and given its status."""
        version = self._custom_version(request)
        if request.resource is not None and (request.resource.group, request.resource.plural) == ("", "namespaces"):
            return dict(obj) | {"status": obj.get("status") or {"phase": "Active"}}  # the lifecycle's first phase
        if _plural(request) == "secrets":
            return dict(obj) | {"type": obj.get("type") or "Opaque"}  # core/v1 SetDefaults_Secret
        if _plural(request) == "customresourcedefinitions":
            errors = custom_resources.errors(obj)
            kind, group = "CustomResourceDefinition", "apiextensions.k8s.io"
            admitted = dict(obj)
            if not errors:
                admitted["status"] = obj.get("status") or custom_resources.status(obj)
        elif version is not None and request.resource is not None:
            kind, group = self._kind(request) or "", request.resource.group or ""
            admitted, errors = crd.admit(obj, version["schema"]["openAPIV3Schema"])
        else:
            return dict(obj)
        if errors:
            name = obj.get("metadata", {}).get("name")
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f'{kind}.{group} "{name}" is invalid: ' + "; ".join(errors),
                details={"name": name, "group": group, "kind": kind, "causes": [_cause(e) for e in errors]},
            )
        return admitted

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
        """kubectl get asks for a server-side Table; a custom resource's columns are its CRD's printer columns."""
        if "as=Table" not in request.headers.get("Accept", "") or request.subresource is not None:
            return False
        kind = self._kind(request)
        return self._custom_version(request) is not None or kind in printer.BUILTIN_KINDS or kind in printer.CRD_COLUMNS

    def _as_table(
        self, items: list[dict[str, Any]], request: rendering.Request, resource_version: str = "1"
    ) -> dict[str, Any]:
        version = self._custom_version(request)
        if version is None:
            kind = self._kind(request)
            if kind in printer.CRD_COLUMNS:  # a third-party CRD the sandbox serves without its object
                return printer.table(printer.CRD_COLUMNS[kind], items, resource_version)
            return printer.builtin_table(kind, items, resource_version)
        # Without printer columns, the API server prints a custom resource's name and age.
        age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        return printer.table(version.get("additionalPrinterColumns") or [age], items, resource_version)

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        payload: Any = await super()._serve_fetch(request)
        if request.subresource == "scale":
            return self._as_scale(request, payload)
        result: rendering.Payload = self._as_table([payload], request) if self._wants_table(request) else payload
        return result

    async def _serve_update(self, request: rendering.Request) -> rendering.Payload:
        payload: Any = await super()._serve_update(request)
        return self._as_scale(request, payload) if request.subresource == "scale" else payload

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
        payload["items"] = [item for item in payload["items"] if self._selected_by_fields(request, item)]
        resource = request.resource
        if resource is not None and resource in self.resources and self.resources[resource].kind:
            payload["kind"] = f"{self.resources[resource].kind}List"
            payload["apiVersion"] = f"{resource.group}/{resource.version}" if resource.group else resource.version
        payload["metadata"] = {"resourceVersion": str(self._last_version)}  # where a watch continues
        if self._wants_table(request):
            payload = self._as_table(payload["items"], request, str(payload["metadata"].get("resourceVersion", "1")))
        result: rendering.Payload = payload
        return result

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        """A watch as the API server serves it: from `resourceVersion`, ended after `timeoutSeconds`.

        Without a resourceVersion every object comes as ADDED, then the changes. With one, only
        objects changed after it come first, so a resource created between a list and the watch
        that follows it is never missed; one below `compacted_before` gets an in-stream 410 Gone.
        The bus is marked before the objects are read, so no change falls between the two.
        """
        yield b""  # the headers, at once
        assert request.resource is not None
        bus = self._buses[request.resource]
        since = request.params.get("resourceVersion") or ""
        seconds = request.params.get("timeoutSeconds") or ""
        async with self._lock:
            marker = await bus.mark()
            # A deleted object keeps its last state (kmock soft-deletes; `raw` refuses those).
            objects = [(obj.deleted, copy.deepcopy(obj.last.raw)) for obj in self._objects_for(request)]
        try:
            async with asyncio.timeout(float(seconds) if seconds.isdigit() and int(seconds) > 0 else None):
                for event in self._catch_up(objects, since):
                    yield event
                    if event["type"] == "ERROR":
                        return
                async for event in bus.stream(since=marker):
                    meta = event.get("object", {}).get("metadata", {})
                    if self._matches(request, meta.get("namespace"), meta.get("name")):
                        yield event
        except TimeoutError:
            return  # the server's timeout: the client re-watches from its last resourceVersion
        finally:
            await bus.unmark(marker)

    def _catch_up(self, objects: list[tuple[bool, dict[str, Any]]], since: str) -> list[dict[str, Any]]:
        if since in ("", "0"):
            return [{"type": "ADDED", "object": raw} for deleted, raw in objects if not deleted]
        if not since.isdigit() or int(since) < self.compacted_before:
            message = f"too old resource version: {since} ({self.compacted_before})"
            gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
            return [{"type": "ERROR", "object": {**gone, "reason": "Expired", "code": 410}}]
        newer = [(deleted, raw) for deleted, raw in objects if _version(raw) > int(since)]
        return [{"type": "DELETED" if deleted else "ADDED", "object": raw} for deleted, raw in newer]

    def _objects_for(self, request: rendering.Request) -> list[Any]:
        found: list[Any] = self._KubernetesEmulator__get_objs(request, strict=False)  # type: ignore[attr-defined]
        return found

    def _matches(self, request: rendering.Request, namespace: str | None, name: str | None) -> bool:
        check = self._KubernetesEmulator__check  # type: ignore[attr-defined]
        return bool(check(request, request.resource, namespace, name, strict=False))

    # --- what kubectl and client-go read and negotiate ----------------------------------------

    def _serve_what_kubectl_reads(self) -> None:
        """Routes an API server has beyond kmock's: OpenAPI, watches as JSON; the usual namespaces."""
        self.fallback["get /openapi/v2"] << self._serve_openapi_v2
        self.fallback["get /openapi/v3"] << self._serve_openapi_v3_index
        self.fallback["get", re.compile(r"/openapi/v3/.+")] << self._serve_openapi_v3
        # A watch is a stream of JSON lines; clients pick their decoder by the content type.
        (self.fallback**1)[enums.action.WATCH] << {"Content-Type": "application/json"} << self._watch_as_asked
        namespaces = kmock.resource("", "v1", "namespaces")
        for name in INITIAL_NAMESPACES:
            self.objects[namespaces, None, name] = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "uid": str(uuid.uuid4()),
                    "resourceVersion": self._next_version(),
                    "creationTimestamp": utc_now(),
                    "labels": {"kubernetes.io/metadata.name": name},
                },
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }

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

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        """The Kubernetes version whose schemas the sandbox serves (kubectl warns about a skew)."""
        major, minor, _ = openapi.KUBERNETES_VERSION.split(".")
        return {
            "major": major,
            "minor": minor,
            "gitVersion": f"v{openapi.KUBERNETES_VERSION}+npu-sandbox",
            "gitTreeState": "clean",
            "platform": "linux/amd64",
        }

    def _served(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        served: dict[tuple[str, str, str], dict[str, Any]] = {}
        for resource in self._get_resources():
            if resource.group is None or resource.version is None or not resource.plural:
                continue
            info = self._resources[resource]
            if info.kind:
                served[resource.group, resource.version, resource.plural] = {
                    "kind": info.kind,
                    "namespaced": info.namespaced,
                    "verbs": sorted(info.verbs),
                    "subresources": sorted(info.subresources),
                }
                custom = self._custom.get((resource.group, resource.version, resource.plural))
                if custom is not None:
                    served[resource.group, resource.version, resource.plural]["schema"] = custom["schema"][
                        "openAPIV3Schema"
                    ]
        return served

    def _openapi_v3(self) -> dict[str, bytes]:
        served = self._served()
        key = json.dumps(sorted(served.items()), sort_keys=True)
        if self._openapi_cache.get("key") != key:
            self._openapi_cache = {"key": key, "v3": openapi.v3_documents(served)}
        documents: dict[str, bytes] = self._openapi_cache["v3"]
        return documents

    async def _serve_openapi_v3_index(self, request: rendering.Request) -> rendering.Payload:
        return openapi.v3_index(self._openapi_v3())

    async def _serve_openapi_v3(self, request: rendering.Request) -> rendering.Payload:
        document = self._openapi_v3().get(request.url.path.removeprefix("/openapi/v3/"))
        if document is None:
            raise kmock.KubernetesNotFoundError(
                reason="NotFound", message="the server could not find the requested resource"
            )
        return rendering.Response(payload=document, headers={"Content-Type": "application/json"})

    async def _serve_openapi_v2(self, request: rendering.Request) -> rendering.Payload:
        """One Swagger 2.0 document: protobuf when asked for it (client-go asks for nothing else), else JSON."""
        accept = request.headers.get("Accept", "")
        served = self._served()
        key = json.dumps(sorted(served.items()), sort_keys=True)
        if self._openapi_cache.get("v2-key") != key:
            document = openapi.v2_document(served)
            self._openapi_cache.update({"v2-key": key, "v2": document, "v2-proto": None})
        if any(media in accept for media in openapi_v2_proto.ACCEPTED):
            if self._openapi_cache["v2-proto"] is None:
                self._openapi_cache["v2-proto"] = openapi_v2_proto.encode(json.loads(self._openapi_cache["v2"]))
            body, content_type = self._openapi_cache["v2-proto"], openapi_v2_proto.CONTENT_TYPE
        elif not accept or "json" in accept or "*/*" in accept:
            body, content_type = self._openapi_cache["v2"], "application/json"
        else:
            raise kmock.KubernetesError(
                status=406,
                reason="NotAcceptable",
                message=f"OpenAPI v2 is served as JSON or {openapi_v2_proto.CONTENT_TYPE}",
            )
        return rendering.Response(payload=body, headers={"Content-Type": content_type})

    async def _watch_as_asked(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        """kmock's watch, with the selectors applied and objects as Tables when kubectl asks for them."""
        as_table = self._wants_table(request)
        labels = request.params.get("labelSelector")
        initial = request.params.get("sendInitialEvents") == "true"
        async for event in self._watch_with_initial_events(request) if initial else self._serve_watch(request):
            if isinstance(event, dict) and event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                obj = event.get("object", {})
                if labels and not matches_selector(obj.get("metadata", {}).get("labels", {}), labels):
                    continue
                if not self._selected_by_fields(request, obj):
                    continue
                if as_table:
                    version = str(obj.get("metadata", {}).get("resourceVersion", "1"))
                    event = {"type": event["type"], "object": self._as_table([obj], request, version)}
            yield event

    async def _watch_with_initial_events(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        """A streaming list (client-go's WatchList, on by default since 1.35): the objects as ADDED, then a
        BOOKMARK marked `k8s.io/initial-events-end` (informers wait for it before they are synced), then
        live events, from the same moment."""
        resource = request.resource
        assert resource is not None
        yield b""
        bus = self._buses[resource]
        async with self._lock:
            mark = await bus.mark()
            existing = [
                obj.raw
                for (res, namespace, name), obj in self.objects.items()
                if res == resource
                and not obj.deleted
                and request.namespace in (None, namespace)
                and request.name in (None, name)
            ]
            version = self._next_version()
        for raw in existing:
            yield {"type": "ADDED", "object": raw}
        api_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        yield {
            "type": "BOOKMARK",
            "object": {
                "kind": self._kind(request),
                "apiVersion": api_version,
                "metadata": {"resourceVersion": version, "annotations": {"k8s.io/initial-events-end": "true"}},
            },
        }
        async for event in mark:
            meta = event.get("object", {}).get("metadata", {})
            if request.namespace in (None, meta.get("namespace")) and request.name in (None, meta.get("name")):
                yield event

    def _selected_by_fields(self, request: rendering.Request, obj: Mapping[str, Any]) -> bool:
        selector = request.params.get("fieldSelector")
        try:
            return not selector or matches_fields(obj, selector)
        except ValueError as exc:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from None

    def _kind(self, request: rendering.Request) -> str | None:
        resource = request.resource
        if resource is None or resource not in self.resources:
            return None
        kind: str | None = self.resources[resource].kind
        return kind

    def _replace_as_patch(self, request: rendering.Request) -> None:
        """PUT (update) replaces the object: a merge patch from the stored one, after the resourceVersion check."""
        if request.method != enums.method.PUT or request.name is None or not isinstance(request.data, dict):
            return
        old = self._stored(request.resource, request.namespace, request.name)
        if old is None:
            raise kmock.KubernetesObjectNotFoundError(reason="NotFound", message=f'"{request.name}" not found')
        expected = request.data.get("metadata", {}).get("resourceVersion")
        if request.subresource != "scale" and expected and expected != old["metadata"].get("resourceVersion"):
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"Operation cannot be fulfilled on {request.resource.plural if request.resource else ''} "
                f'"{request.name}": the object has been modified; please apply your changes to the latest '
                "version and try again",
            )
        object.__setattr__(request, "action", enums.action.UPDATE)
        if request.subresource != "scale":
            object.__setattr__(request, "data", merge_patch(old, request.data))

    def _scale_as_patch(self, request: rendering.Request) -> None:
        """A Scale written to the scale subresource becomes a patch of the object's replicas path."""
        if request.subresource != "scale" or request.action != enums.action.UPDATE or request.name is None:
            return
        old = self._stored(request.resource, request.namespace, request.name)
        if old is None:
            return  # kmock answers 404
        scale = self._as_scale(request, old)
        data: Any = request.data
        try:
            if isinstance(data, list):
                scale = jsonpatch.apply_patch(scale, data)
            elif isinstance(data, dict):
                scale = dict(dicts.patch_dict(scale, data)) if request.method == enums.method.PATCH else data
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=f"the patch failed: {exc}") from None
        replicas = scale.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f'Scale.autoscaling "{request.name}" is invalid: spec.replicas: Invalid value: '
                f"{replicas!r}: must be greater than or equal to 0",
                details={"causes": [{"field": "spec.replicas", "message": "must be greater than or equal to 0"}]},
            )
        spec_path, _, _ = self._scale_paths(request)
        patch: dict[str, Any] = {}
        *parents, leaf = spec_path.lstrip(".").split(".")
        node = patch
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = replicas
        object.__setattr__(request, "data", patch)

    def _scale_paths(self, request: rendering.Request) -> tuple[str, str, str]:
        """The replicas and selector paths of the scale subresource: the CRD's, or a Deployment's."""
        version = self._custom_version(request)
        if version is not None:
            scale = version["subresources"]["scale"]
            return scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath", "")
        return ".spec.replicas", ".status.replicas", ".spec.selector"

    def _as_scale(self, request: rendering.Request, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object seen through its scale subresource: an autoscaling/v1 Scale."""
        spec_path, status_path, selector_path = self._scale_paths(request)
        selector = printer.json_path(obj, selector_path) if selector_path else None
        if isinstance(selector, Mapping):  # a LabelSelector, as a string
            selector = ",".join(f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items()))
        meta = obj.get("metadata", {})
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": printer.json_path(obj, spec_path) or 0},
            "status": {"replicas": printer.json_path(obj, status_path) or 0}
            | ({"selector": selector} if selector else {}),
        }

    def _validate_fields(self, request: rendering.Request) -> list[str]:
        """Unknown fields of a create or patch: refused when `fieldValidation=Strict`, else dropped with a warning.

        The API server decodes the body into the kind's schema: a field it does not know is an error
        in strict mode; otherwise it is dropped (pruned) and named in a `Warning` header. Kinds
        without a published schema (kopf's, PodMonitor) keep every field.
        """
        resource, kind = request.resource, self._kind(request)
        body = request.data
        if (
            resource is None
            or kind is None
            or not isinstance(body, dict)
            or request.action not in (enums.action.CREATE, enums.action.UPDATE)
            or request.subresource == "scale"
        ):
            return []
        if "strategic-merge-patch" in request.headers.get("Content-Type", ""):
            _drop_patch_directives(body)  # applied as a merge patch: its $directives are no fields
        directive = request.params.get("fieldValidation", "Warn")
        custom = self._custom_version(request)
        unknown = openapi.unknown_fields(
            resource.group or "",
            resource.version or "",
            kind,
            body,
            prune=directive != "Strict",
            schema=custom["schema"]["openAPIV3Schema"] if custom is not None else None,
            schema_key=self._schema_keys[resource.group or "", resource.version or "", resource.plural or ""]
            if custom is not None
            else None,
        )
        if not unknown or directive == "Ignore":
            return []
        named = [f'unknown field "{path}"' for path in unknown]
        if directive == "Strict":
            raise kmock.KubernetesError(
                status=400,
                reason="BadRequest",
                message=f'{kind} in version "{resource.version}" cannot be handled as a {kind}: '
                f"strict decoding error: {', '.join(named)}",
            )
        return named

    def _dry_run(self, request: rendering.Request, warnings: list[str]) -> aiohttp.web.StreamResponse:
        """`dryRun=All`: admitted and validated like the real request (done by now), answered, never stored."""
        old = self._stored(request.resource, request.namespace, request.name or "") if request.name else None
        if request.action == enums.action.CREATE:
            meta = request.data.get("metadata", {})
            if self._stored(request.resource, meta.get("namespace"), meta.get("name", "")) is not None:
                raise kmock.KubernetesError(
                    status=409, reason="AlreadyExists", message=f'"{meta.get("name")}" already exists'
                )
            answer, status = request.data, 201
        elif old is None:
            raise kmock.KubernetesObjectNotFoundError(reason="NotFound", message=f'"{request.name}" not found')
        elif request.action == enums.action.UPDATE:
            answer, status = dict(dicts.patch_dict(old, request.data)), 200
            if request.subresource == "scale":
                answer = self._as_scale(request, answer)
        else:  # DELETE
            answer, status = old, 200
        response = aiohttp.web.json_response(answer, status=status)
        for warning in warnings:
            response.headers.add("Warning", _warning(warning))
        return response

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


def _version(obj: Mapping[str, Any]) -> int:
    text = str(obj.get("metadata", {}).get("resourceVersion", "0"))
    return int(text) if text.isdigit() else 0


def merge_patch(last: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that turns `last` into `desired`: `desired` plus a null for every key it dropped."""
    patch: dict[str, Any] = dict(desired)
    for key, old in last.items():
        if key not in desired:
            patch[key] = None
        elif isinstance(old, Mapping) and isinstance(desired[key], Mapping):
            patch[key] = merge_patch(old, desired[key])
    return patch


def _cause(error: str) -> dict[str, str]:
    """A StatusCause from `path: message`, the field apart, as kubectl prints it ("The X "n" is invalid: ...")."""
    field, _, message = error.partition(": ")
    return {"reason": "FieldValueInvalid", "field": field, "message": message or error}


def _drop_patch_directives(value: Any) -> None:
    """Remove a strategic-merge patch's `$setElementOrder/...`, `$patch`, `$retainKeys` (not emulated)."""
    if isinstance(value, dict):
        for key in [key for key in value if key.startswith("$")]:
            del value[key]
        for item in value.values():
            _drop_patch_directives(item)
    elif isinstance(value, list):
        for item in value:
            _drop_patch_directives(item)


async def _as_json(raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.BaseRequest:
    """A protobuf request body (see `kube_protobuf`) re-read as the JSON it stands for."""
    clone = raw_request.clone(headers=dict(raw_request.headers) | {"Content-Type": "application/json"})
    body = await clone.read()  # the same stream: a request cannot be cloned once read
    if body:
        clone._read_bytes = json.dumps(kube_protobuf.decode(body)).encode()  # what read(), text(), json() return
    return clone


def _is_dry_run(request: rendering.Request) -> bool:
    """`?dryRun=All` on a write, or DeleteOptions' `dryRun: [All]` in a DELETE's body (as kubectl sends it)."""
    if request.action not in (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE):
        return False  # reads ignore it, as on an API server
    if request.params.get("dryRun") == "All":
        return True
    body = request.data
    return request.action == enums.action.DELETE and isinstance(body, dict) and "All" in (body.get("dryRun") or ())


def _warning(text: str) -> str:
    """A `Warning` header as the API server writes it (RFC 7234: code 299, no agent)."""
    return "299 - " + json.dumps(text)


def _plural(request: rendering.Request) -> str | None:
    return request.resource.plural if request.resource is not None else None


def _name_from_field_selector(selector: str) -> str:
    """A list or watch of one object by `metadata.name=x` is authorized for that name (requestinfo.go)."""
    match = re.fullmatch(r"\s*metadata\.name\s*==?\s*([^,\s]+)\s*", selector)
    return match[1] if match else ""


def _body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What generation counts: everything but metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}

"""Admission and validation: what the API server does to a write before it stores it.

In the order the emulator runs them: a PUT becomes a merge patch of the stored object, after its
resourceVersion check (`replace_as_patch`); unknown fields are refused (`fieldValidation=Strict`) or
dropped with a warning (`validate_fields`); a create gets its name (generateName), uid,
resourceVersion, generation, creationTimestamp and managed fields (`create`); a patch is turned into
the one that yields what the API server would store, generation bumped by a change outside metadata
and status, the status subresource kept apart (`update`); a custom resource is defaulted and checked
against its CRD's schema and CEL rules, a CRD checked and given its status, with the API server's 422
(`admitted`). `dryRun=All` is answered here and never stored (`dry_run`).
"""

from __future__ import annotations

import copy
import json
import secrets
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import dicts, enums, rendering
from npu_operator.api import crd
from npu_operator.kube.objects import utc_now

from npu_sandbox.apiserver import custom_resources, fields, openapi
from npu_sandbox.apiserver.custom_apis import CustomApis
from npu_sandbox.apiserver.store import Store, plural_of
from npu_sandbox.apiserver.subresources import Scale


class Admission:
    """The admission and validation steps of a write (see the module docstring)."""

    def __init__(self, store: Store, custom: CustomApis, scale: Scale) -> None:
        self.store = store
        self.custom = custom
        self.scale = scale

    def replace_as_patch(self, request: rendering.Request) -> None:
        """PUT (update) replaces the object: a merge patch from the stored one, after the resourceVersion check."""
        if request.method != enums.method.PUT or request.name is None or not isinstance(request.data, dict):
            return
        old = self.store.stored(request.resource, request.namespace, request.name)
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

    def validate_fields(self, request: rendering.Request) -> list[str]:
        """Unknown fields of a create or patch: refused when `fieldValidation=Strict`, else dropped with a warning.

        The API server decodes the body into the kind's schema: a field it does not know is an error
        in strict mode; otherwise it is dropped (pruned) and named in a `Warning` header. Kinds
        without a published schema (kopf's, PodMonitor) keep every field.
        """
        resource, kind = request.resource, self.store.kind(request)
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
        custom = self.custom.version_of(request)
        unknown = openapi.unknown_fields(
            resource.group or "",
            resource.version or "",
            kind,
            body,
            prune=directive != "Strict",
            schema=custom["schema"]["openAPIV3Schema"] if custom is not None else None,
            schema_key=self.custom.schema_keys[resource.group or "", resource.version or "", resource.plural or ""]
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

    def create(self, request: rendering.Request) -> None:
        data: dict[str, Any] = request.data
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        resource = request.resource
        if resource is not None and self.store.stored(resource, request.namespace, str(meta.get("name"))) is not None:
            qualified = f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)
            raise kmock.KubernetesError(  # the API server's StatusReasonAlreadyExists, not kmock's wording
                status=409,
                reason="AlreadyExists",
                message=f'{qualified} "{meta.get("name")}" already exists',
                details={"name": meta.get("name"), "group": resource.group, "kind": resource.plural},
            )
        if self.store.has_status(request.resource) and request.subresource is None:
            data.pop("status", None)
        admitted = self.admitted(request, data)
        data.clear()
        data.update(admitted)
        meta = data["metadata"]
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self.store.next_version(),
            generation=1,
            creationTimestamp=utc_now(),
        )
        if request.subresource is None:
            owners = fields.updated({}, data, fields.manager_of(request), self.store.has_status(request.resource))
            meta["managedFields"] = fields.managed_fields(owners, data.get("apiVersion", ""))

    def update(self, request: rendering.Request) -> None:
        """Turn the client's patch into one that yields what the API server would store."""
        old = self.store.stored(request.resource, request.namespace, request.name or "")
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
        if self.store.has_status(request.resource):
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
        if request.subresource != "status" and generation_body(old) != generation_body(new):
            new = self.admitted(request, new)
        meta = new.setdefault("metadata", {})
        old_meta = old.get("metadata", {})
        meta.update(uid=old_meta.get("uid"), creationTimestamp=old_meta.get("creationTimestamp"))
        meta["resourceVersion"] = self.store.next_version()
        generation = int(old_meta.get("generation", 1))
        meta["generation"] = generation + 1 if generation_body(old) != generation_body(new) else generation
        if request.subresource is None:
            owners = fields.updated(old, new, fields.manager_of(request), self.store.has_status(request.resource))
            meta["managedFields"] = fields.managed_fields(owners, new.get("apiVersion", ""))
        data.clear()
        data.update(merge_patch(old, new))

    def admitted(self, request: rendering.Request, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object as the API server stores it, or its 422 answer: a custom resource defaulted and
        checked against its CRD's schema and CEL rules; a CRD checked and given its status."""
        version = self.custom.version_of(request)
        if request.resource is not None and (request.resource.group, request.resource.plural) == ("", "namespaces"):
            return dict(obj) | {"status": obj.get("status") or {"phase": "Active"}}  # the lifecycle's first phase
        if plural_of(request) == "secrets":
            return dict(obj) | {"type": obj.get("type") or "Opaque"}  # core/v1 SetDefaults_Secret
        if plural_of(request) == "customresourcedefinitions":
            errors = custom_resources.errors(obj)
            kind, group = "CustomResourceDefinition", "apiextensions.k8s.io"
            admitted = dict(obj)
            if not errors:
                admitted["status"] = obj.get("status") or custom_resources.status(obj)
        elif version is not None and request.resource is not None:
            kind, group = self.store.kind(request) or "", request.resource.group or ""
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

    def dry_run(self, request: rendering.Request, warnings: list[str]) -> aiohttp.web.StreamResponse:
        """`dryRun=All`: admitted and validated like the real request (done by now), answered, never stored."""
        old = self.store.stored(request.resource, request.namespace, request.name or "") if request.name else None
        if request.action == enums.action.CREATE:
            meta = request.data.get("metadata", {})
            if self.store.stored(request.resource, meta.get("namespace"), meta.get("name", "")) is not None:
                raise kmock.KubernetesError(
                    status=409, reason="AlreadyExists", message=f'"{meta.get("name")}" already exists'
                )
            answer, status = request.data, 201
        elif old is None:
            raise kmock.KubernetesObjectNotFoundError(reason="NotFound", message=f'"{request.name}" not found')
        elif request.action == enums.action.UPDATE:
            answer, status = dict(dicts.patch_dict(old, request.data)), 200
            if request.subresource == "scale":
                answer = self.scale.of(request, answer)
        else:  # DELETE
            answer, status = old, 200
        response = aiohttp.web.json_response(answer, status=status)
        for text in warnings:
            response.headers.add("Warning", warning(text))
        return response


def merge_patch(last: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that turns `last` into `desired`: `desired` plus a null for every key it dropped."""
    patch: dict[str, Any] = dict(desired)
    for key, old in last.items():
        if key not in desired:
            patch[key] = None
        elif isinstance(old, Mapping) and isinstance(desired[key], Mapping):
            patch[key] = merge_patch(old, desired[key])
    return patch


def generation_body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What generation counts: everything but metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


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


def is_dry_run(request: rendering.Request) -> bool:
    """`?dryRun=All` on a write, or DeleteOptions' `dryRun: [All]` in a DELETE's body (as kubectl sends it)."""
    if request.action not in (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE):
        return False  # reads ignore it, as on an API server
    if request.params.get("dryRun") == "All":
        return True
    body = request.data
    return request.action == enums.action.DELETE and isinstance(body, dict) and "All" in (body.get("dryRun") or ())


def warning(text: str) -> str:
    """A `Warning` header as the API server writes it (RFC 7234: code 299, no agent)."""
    return "299 - " + json.dumps(text)

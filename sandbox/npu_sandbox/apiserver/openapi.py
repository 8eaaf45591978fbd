"""The OpenAPI documents an API server publishes, for the kinds the emulator serves.

kubectl reads them before it writes anything: `kubectl apply` looks up whether the PATCH of a kind
takes `fieldValidation` (then the server validates, strictly), `kubectl explain` prints the
schemas. A kube-apiserver publishes OpenAPI v3 per group-version (`/openapi/v3` lists them,
`/openapi/v3/apis/<group>/<version>` holds one) and v2 as one document (`/openapi/v2`).

The schemas come from where the project already takes them: NPUInference's from its CRD (as the
API server builds it from the CRD: apiVersion, kind and metadata added), Kubernetes' own kinds
from kubernetes-validate's copy of Kubernetes' schemas (converted back from JSON Schema to
OpenAPI). Kinds neither knows (kopf's peerings, PodMonitor) get an object that keeps any field,
as a CRD with `x-kubernetes-preserve-unknown-fields` does. v2 is served as JSON only: client-go
asks for protobuf there, which the sandbox does not encode (kubectl 1.37 reads v3).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import kubernetes_validate

KUBERNETES_VERSION: Final = "1.37.0"
OBJECT_META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
SCALE: Final = "io.k8s.api.autoscaling.v1.Scale"
STATUS: Final = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
V3_REF: Final = "#/components/schemas/"
V2_REF: Final = "#/definitions/"

# What kubectl and client-go look for on write operations (QueryParamVerifierV3 reads PATCH's).
_WRITE_PARAMETERS: Final = (
    ("dryRun", "When present, the request is fully processed (admission, validation) but not stored. 'All'."),
    ("fieldManager", "A name for the actor making the change."),
    ("fieldValidation", "What to do with unknown or duplicate fields: Ignore, Warn (the default) or Strict."),
)


@functools.cache
def _kubernetes_definitions() -> dict[str, Any]:
    """Kubernetes' own definitions (JSON Schema, as kubernetes-validate ships them)."""
    path = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local/_definitions.json"
    ref = importlib.resources.files(kubernetes_validate).joinpath(path)
    definitions: dict[str, Any] = json.loads(ref.read_text(encoding="utf-8"))["$defs"]
    return definitions


def _definition_name(group: str, version: str, kind: str) -> str | None:
    for name, schema in _kubernetes_definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            if (gvk["group"], gvk["version"], gvk["kind"]) == (group, version, kind):
                return name
    return None


def _from_json_schema(schema: Any, ref_prefix: str) -> Any:
    """kubernetes-validate's JSON Schema back to OpenAPI: one type, nulls dropped, refs renamed."""
    if isinstance(schema, list):
        return [_from_json_schema(item, ref_prefix) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, list):
            result[key] = next(t for t in value if t != "null")
        elif key == "$ref":
            result[key] = ref_prefix + value.rsplit("/", 1)[-1]
        elif key == "properties":
            result[key] = {name: _from_json_schema(sub, ref_prefix) for name, sub in value.items()}
        elif key in ("enum", "required", "x-kubernetes-group-version-kind", "x-kubernetes-list-map-keys", "default"):
            result[key] = [v for v in value if v is not None] if key == "enum" else value
        else:
            result[key] = _from_json_schema(value, ref_prefix)
    if "oneOf" in result:  # IntOrString and Quantity: one string in OpenAPI, as the API server says
        del result["oneOf"]
        result["type"] = "string"
    if "$ref" in result and len(result) > 1:  # OpenAPI ignores a $ref's siblings; the API server wraps it
        result["allOf"] = [{"$ref": result.pop("$ref")}]
    return result


def _refs(schema: Any) -> Iterable[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rsplit("/", 1)[-1]
            else:
                yield from _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item)


def _with_dependencies(names: Iterable[str], ref_prefix: str) -> dict[str, Any]:
    """These Kubernetes definitions and every definition they refer to, converted."""
    definitions = _kubernetes_definitions()
    result: dict[str, Any] = {}
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in result or name not in definitions:
            continue
        result[name] = _from_json_schema(definitions[name], ref_prefix)
        pending.extend(_refs(definitions[name]))
    return result


def _crd_schema_name(group: str, version: str, kind: str) -> str:
    """The API server's name for a CRD's schema: the group reversed, e.g. dev.npu.inference.v1alpha1.NPUInference."""
    return ".".join(reversed(group.split("."))) + f".{version}.{kind}"


def _custom_schema(
    group: str, version: str, kind: str, ref_prefix: str, crd_schema: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A custom resource's schema as the API server publishes it: the CRD's, or one that keeps any field."""
    if crd_schema is not None:
        schema = copy.deepcopy(dict(crd_schema))
    else:
        schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    properties = schema.setdefault("properties", {})
    for field in ("apiVersion", "kind"):  # Kubernetes' own wording, as on every kind
        properties[field] = _from_json_schema(_kubernetes_definitions()[STATUS]["properties"][field], ref_prefix)
    properties["metadata"] = {
        "allOf": [{"$ref": ref_prefix + OBJECT_META}],
        "description": "Standard object's metadata.",
    }
    schema["x-kubernetes-group-version-kind"] = [{"group": group, "version": version, "kind": kind}]
    return schema


def _list_schema(group: str, version: str, kind: str, item_ref: str, ref_prefix: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{kind}List is a list of {kind}.",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this representation of an object."},
            "kind": {"type": "string", "description": "Kind of this representation of an object."},
            "items": {"type": "array", "items": {"$ref": item_ref}, "description": f"List of {kind}."},
            "metadata": {"allOf": [{"$ref": ref_prefix + LIST_META}], "description": "Standard list metadata."},
        },
        "x-kubernetes-group-version-kind": [{"group": group, "version": version, "kind": f"{kind}List"}],
    }


def schemas(served: Mapping[tuple[str, str, str], Mapping[str, Any]], ref_prefix: str) -> dict[str, Any]:
    """The schemas of the served kinds (keyed by group, version, plural), their lists and dependencies."""
    kubernetes: list[str] = [STATUS]
    custom: dict[str, Any] = {}
    for (group, version, _), info in served.items():
        kind = info["kind"]
        name = _definition_name(group, version, kind)
        if "scale" in info.get("subresources", ()):
            kubernetes.append(SCALE)
        if name is not None:
            kubernetes.append(name)
            list_name = _definition_name(group, version, f"{kind}List")
            if list_name is not None:
                kubernetes.append(list_name)
            continue
        name = _crd_schema_name(group, version, kind)
        custom[name] = _custom_schema(group, version, kind, ref_prefix, info.get("schema"))
        custom[f"{name}List"] = _list_schema(group, version, kind, ref_prefix + name, ref_prefix)
        kubernetes.extend([OBJECT_META, LIST_META])
    return _with_dependencies(kubernetes, ref_prefix) | custom


def schema_key_of(schema: Mapping[str, Any]) -> str:
    """A CRD schema as the text `unknown_fields` caches its known fields by."""
    return json.dumps(schema, sort_keys=True)


@functools.cache
def _kind_schemas(group: str, version: str, kind: str, crd_schema: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"kind": kind} | ({"schema": json.loads(crd_schema)} if crd_schema else {})
    return schemas({(group, version, ""): info}, V3_REF)


def unknown_fields(
    group: str,
    version: str,
    kind: str,
    obj: Any,
    *,
    prune: bool = False,
    schema: Mapping[str, Any] | None = None,
    schema_key: str | None = None,
) -> list[str]:
    """The paths of fields the kind's schema does not know (`spec.grph`), as strict decoding names them.

    `schema`: a custom resource's, from its CRD; `schema_key`, if given, is `schema_key_of(schema)`,
    computed once per CRD by the caller (the schema can be tens of KB). With `prune`, they are also
    removed from `obj`, as the API server drops them when it is not strict.
    """
    if schema_key is None and schema is not None:
        schema_key = schema_key_of(schema)
    known = _kind_schemas(group, version, kind, schema_key)
    root = known.get(schema_name(group, version, kind))
    found: list[str] = []
    if root is not None and isinstance(obj, dict):
        _walk_unknown(obj, root, known, "", found, prune)
    return found


def _resolve(schema: Mapping[str, Any], known: Mapping[str, Any]) -> Mapping[str, Any]:
    while True:
        ref = schema.get("$ref") or next((s["$ref"] for s in schema.get("allOf", ()) if "$ref" in s), None)
        if ref is None:
            return schema
        schema = known.get(ref.rsplit("/", 1)[-1], {})


def _walk_unknown(
    value: Any, schema: Mapping[str, Any], known: Mapping[str, Any], path: str, found: list[str], prune: bool
) -> None:
    schema = _resolve(schema, known)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key in list(value):
            where = f"{path}.{key}" if path else key
            if properties is not None and key in properties:
                _walk_unknown(value[key], properties[key], known, where, found, prune)
            elif isinstance(extra, Mapping):
                _walk_unknown(value[key], extra, known, where, found, prune)
            elif properties is not None or extra is False:
                found.append(where)
                if prune:
                    del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            _walk_unknown(item, schema["items"], known, f"{path}[{index}]", found, prune)


def schema_name(group: str, version: str, kind: str) -> str:
    return _definition_name(group, version, kind) or _crd_schema_name(group, version, kind)


def _group_version_path(group: str, version: str) -> str:
    return f"api/{version}" if group == "" else f"apis/{group}/{version}"


def _operations(
    group: str, version: str, plural: str, info: Mapping[str, Any], *, v3: bool
) -> dict[str, dict[str, Any]]:
    """Paths and operations of one resource, with the query parameters kubectl looks for."""
    kind = info["kind"]
    ref_prefix = V3_REF if v3 else V2_REF
    gvk = {"group": group, "version": version, "kind": kind}
    ref = ref_prefix + schema_name(group, version, kind)
    list_ref = ref_prefix + schema_name(group, version, f"{kind}List")
    scale_gvk = {"group": "autoscaling", "version": "v1", "kind": "Scale"}

    def parameter(name: str, description: str) -> dict[str, Any]:
        if v3:
            return {"name": name, "in": "query", "description": description, "schema": {"type": "string"}}
        return {"name": name, "in": "query", "description": description, "type": "string", "uniqueItems": True}

    def operation(action: str, schema_ref: str, writes: bool, kind_gvk: Mapping[str, str]) -> dict[str, Any]:
        if v3:
            content = {"application/json": {"schema": {"$ref": schema_ref}}}
            responses: dict[str, Any] = {"200": {"description": "OK", "content": content}}
        else:
            responses = {"200": {"description": "OK", "schema": {"$ref": schema_ref}}}
        params = [parameter(name, text) for name, text in _WRITE_PARAMETERS] if writes else []
        return {
            "operationId": f"{action}{kind}",
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": dict(kind_gvk),
            "parameters": params,
            "responses": responses,
        }

    verbs = set(info.get("verbs", ()))
    base = "/" + _group_version_path(group, version)
    collection = f"{base}/namespaces/{{namespace}}/{plural}" if info.get("namespaced") else f"{base}/{plural}"
    item = collection + "/{name}"
    paths: dict[str, dict[str, Any]] = {collection: {}, item: {}}
    if "list" in verbs:
        paths[collection]["get"] = operation("list", list_ref, False, gvk)
    if "create" in verbs:
        paths[collection]["post"] = operation("post", ref, True, gvk)
    if "get" in verbs:
        paths[item]["get"] = operation("get", ref, False, gvk)
    if "patch" in verbs:
        paths[item]["patch"] = operation("patch", ref, True, gvk)
        paths[item]["put"] = operation("put", ref, True, gvk)
    if "delete" in verbs:
        paths[item]["delete"] = operation("delete", ref_prefix + STATUS, True, gvk)
    for subresource in info.get("subresources", ()):
        sub_ref, sub_gvk = (ref_prefix + SCALE, scale_gvk) if subresource == "scale" else (ref, gvk)
        paths[f"{item}/{subresource}"] = {
            "get": operation("get", sub_ref, False, sub_gvk),
            "patch": operation("patch", sub_ref, True, sub_gvk),
            "put": operation("put", sub_ref, True, sub_gvk),
        }
    return {path: ops for path, ops in paths.items() if ops}


def _by_group_version(
    served: Mapping[tuple[str, str, str], Mapping[str, Any]],
) -> dict[str, dict[tuple[str, str, str], Mapping[str, Any]]]:
    result: dict[str, dict[tuple[str, str, str], Mapping[str, Any]]] = {}
    for key, info in served.items():
        result.setdefault(_group_version_path(key[0], key[1]), {})[key] = info
    return result


def v3_documents(served: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> dict[str, bytes]:
    """One OpenAPI v3 document per group-version path (`api/v1`, `apis/apps/v1`, ...), encoded."""
    documents: dict[str, bytes] = {}
    for gv_path, resources in sorted(_by_group_version(served).items()):
        paths: dict[str, Any] = {}
        for (group, version, plural), info in sorted(resources.items()):
            paths.update(_operations(group, version, plural, info, v3=True))
        document = {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": f"v{KUBERNETES_VERSION}"},
            "paths": paths,
            "components": {"schemas": schemas(resources, V3_REF)},
        }
        documents[gv_path] = json.dumps(document, sort_keys=True).encode()
    return documents


def v3_index(documents: Mapping[str, bytes]) -> dict[str, Any]:
    """`/openapi/v3`: where each group-version's document is, with its hash (clients cache by it)."""
    return {
        "paths": {
            gv_path: {"serverRelativeURL": f"/openapi/v3/{gv_path}?hash={hashlib.sha512(body).hexdigest().upper()}"}
            for gv_path, body in documents.items()
        }
    }


def v2_document(served: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> bytes:
    """`/openapi/v2`: every served kind in one Swagger 2.0 document."""
    paths: dict[str, Any] = {}
    for (group, version, plural), info in sorted(served.items()):
        paths.update(_operations(group, version, plural, info, v3=False))
    document = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": f"v{KUBERNETES_VERSION}"},
        "paths": paths,
        "definitions": schemas(served, V2_REF),
    }
    return json.dumps(document, sort_keys=True).encode()

"""The NPUInference CRD as code: its defaults and its validation, read from the one CRD file.

The API server applies the schema's defaults and checks the schema and the CEL rules before the
operator ever sees an object. This module does the same off-cluster, from the same file, for
`npu-operator render`, for the API emulator of the tests and the sandbox, and for the typed view
in `spec`, which must not depend on a defaulting webhook. CEL needs the optional `cel-python`.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import yaml

GROUP: Final = "inference.npu.dev"
VERSION: Final = "v1alpha1"
KIND: Final = "NPUInference"
PLURAL: Final = "npuinferences"
API_VERSION: Final = f"{GROUP}/{VERSION}"
SAFE_LOADER: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def load_crd() -> dict[str, Any]:
    """The CustomResourceDefinition, as shipped in the package (a copy of crds/)."""
    text = importlib.resources.files("npu_operator.api").joinpath("crd.yaml").read_text(encoding="utf-8")
    # libyaml's loader where PyYAML has it: the pure-Python one takes 0.3-1 s for this file, and
    # the first spec parsed paid it (same document: test_the_package_ships_the_crd_of_crds_folder).
    crd: dict[str, Any] = yaml.load(text, Loader=SAFE_LOADER)
    return crd


def version_spec() -> dict[str, Any]:
    versions: list[dict[str, Any]] = load_crd()["spec"]["versions"]
    return next(v for v in versions if v["name"] == VERSION)


def openapi_schema() -> dict[str, Any]:
    schema: dict[str, Any] = version_spec()["schema"]["openAPIV3Schema"]
    return schema


def _nodes(value: Any, schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[Any, Mapping[str, Any], str]]:
    """Every value with its schema and path, parents first; a parent changed while it is being
    visited (defaults filled in) is walked as changed."""
    yield value, schema, path
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from _nodes(value[key], sub, f"{path}.{key}" if path else key)
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key, item in value.items():
                yield from _nodes(item, extra, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _nodes(item, schema["items"], f"{path}[{index}]")


def apply_defaults(obj: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A copy of `obj` with the schema's defaults filled in, top-down, as the API server does.

    `root`: another CRD version's openAPIV3Schema (the API emulator admits every CRD it serves).
    """
    result = copy.deepcopy(dict(obj))
    for value, schema, _ in _nodes(result, openapi_schema() if root is None else root):
        if isinstance(value, dict):
            for key, sub in schema.get("properties", {}).items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
    return result


def admit(obj: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """What the API server would store for `obj` (defaults applied), and everything it would reject.

    Errors read `path: message`. The schema is checked first; CEL rules only run on an object
    that passes it, since the API server's rules may assume the schema holds.
    """
    errors = list(_metadata_errors(obj))
    if errors:
        return dict(obj), errors
    schema = openapi_schema() if schema is None else schema
    defaulted = apply_defaults(obj, schema)
    errors = list(_schema_errors(defaulted, schema))
    if not errors:
        errors.extend(_cel_errors(defaulted, schema))
    return defaulted, errors


def validate(obj: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> list[str]:
    return admit(obj, schema)[1]


def _metadata_errors(obj: Mapping[str, Any]) -> Iterator[str]:
    """ObjectMeta's own checks, which the API server makes before the CRD's schema."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        yield f"metadata: Required value: an object with a name, got {type(meta).__name__}"
        return
    name, generate = meta.get("name"), meta.get("generateName")
    if not (isinstance(name, str) and name) and not (isinstance(generate, str) and generate):
        yield "metadata.name: Required value: a non-empty string"
    for key in ("name", "generateName", "namespace", "uid", "resourceVersion"):
        if key in meta and meta[key] is not None and not isinstance(meta[key], str):
            yield f"metadata.{key}: Invalid value: must be a string"
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and not (isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())):
            yield f"metadata.{key}: Invalid value: must be a map of strings"


def _schema_errors(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> Iterator[str]:
    import jsonschema

    # The openAPIV3Schema is OpenAPI 3.0, whose keywords are draft 4's (boolean exclusiveMinimum).
    validator = jsonschema.Draft4Validator(_as_json_schema(schema))
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        yield f"{_path(error.absolute_path)}: {error.message}"
    yield from _list_type_errors(obj, schema)


def _as_json_schema(schema: Any) -> Any:
    """Drop the Kubernetes extensions jsonschema does not know; keep everything it checks."""
    if isinstance(schema, dict):
        return {k: _as_json_schema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if isinstance(schema, list):
        return [_as_json_schema(v) for v in schema]
    return schema


def _list_type_errors(obj: Mapping[str, Any], root: Mapping[str, Any]) -> Iterator[str]:
    """`x-kubernetes-list-type: set` and `map` mean unique items and unique keys."""
    for value, schema, path in _nodes(obj, root):
        list_type = schema.get("x-kubernetes-list-type")
        if not isinstance(value, list) or list_type not in ("set", "map"):
            continue
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen: list[Any] = []
        for index, item in enumerate(value):
            if list_type == "map" and not isinstance(item, Mapping):
                continue  # the schema check reports the item's type
            identity = item if list_type == "set" else tuple(item.get(k) for k in keys)
            if identity in seen and list_type == "set":
                yield f"{path}[{index}]: duplicate value {item!r} in a set"
            elif identity in seen:
                yield f"{path}[{index}]: duplicate entry with {dict(zip(keys, identity, strict=True))}"
            seen.append(identity)


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


# --- CEL ----------------------------------------------------------------------------------------


def cel_available() -> bool:
    try:
        import celpy  # noqa: F401
    except ImportError:
        return False
    return True


def _cel_errors(obj: Mapping[str, Any], root: Mapping[str, Any]) -> Iterator[str]:
    """Evaluate every `x-kubernetes-validations` rule where its value is present."""
    if not cel_available():
        return
    for value, schema, path in _nodes(obj, root):
        for rule in schema.get("x-kubernetes-validations", []):
            where = path + rule.get("fieldPath", "") if path else rule.get("fieldPath", "").lstrip(".")
            try:
                if _evaluate(rule["rule"], value) is True:
                    continue
                message = _evaluate(rule["messageExpression"], value) if "messageExpression" in rule else None
            except Exception as exc:  # the API server reports a rule that cannot be evaluated as invalid
                yield f"{where or '<root>'}: rule evaluation error ({type(exc).__name__}): {rule['rule']}"
                continue
            yield f"{where or '<root>'}: {message or rule.get('message') or 'failed rule: ' + rule['rule']}"


def _evaluate(expression: str, value: Any) -> Any:
    from celpy import celtypes
    from celpy.adapter import json_to_cel
    from celpy.evaluation import CELEvalError

    result = _compile(expression).evaluate({"self": json_to_cel(value)})
    if isinstance(result, CELEvalError):
        raise ValueError(f"CEL rule {expression!r} failed to evaluate: {result}")
    return bool(result) if isinstance(result, celtypes.BoolType) else result


@functools.cache
def _compile(expression: str) -> Any:
    import celpy

    environment = celpy.Environment()
    return environment.program(environment.compile(expression), functions=_kubernetes_cel_library())


def _kubernetes_cel_library() -> dict[str, Callable[..., Any]]:
    """The parts of Kubernetes' CEL extension libraries the CRD's rules use (lists: isSorted)."""
    from celpy import celtypes

    def is_sorted(items: Any) -> Any:
        return celtypes.BoolType(all(items[i] <= items[i + 1] for i in range(len(items) - 1)))

    return {"isSorted": is_sorted}

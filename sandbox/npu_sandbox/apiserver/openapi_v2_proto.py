"""OpenAPI v2 as protobuf: the form client-go asks `/openapi/v2` for (helm's and kubectl's validation).

client-go's `DiscoveryClient.OpenAPISchema` sends `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
(see `ACCEPTED`) and unmarshals the body into gnostic's `openapi_v2.Document`; kube-openapi's handler builds that body
from its JSON document with gnostic (`openapi_v2.ParseDocument`, then `proto.Marshal`). This module
does the same from the JSON document `openapi.v2_document` writes: the messages are those of
github.com/google/gnostic-models `openapiv2/OpenAPIv2.proto` (package `openapi.v2`; only the
messages and fields a Kubernetes document uses are declared, with their upstream numbers), built
at import time as a descriptor for the `protobuf` package, which does the encoding.

gnostic's mapping, as in its generated `ParseDocument` code: `$ref` is `_ref`; `type` a `TypeItem`
(a list); `items` an `ItemsItem`; `properties` and `definitions` lists of named schemas;
`additionalProperties` a schema or a boolean; `default`, `example` and `enum` values and every
`x-` vendor extension an `Any` holding the value as YAML (kube-openapi's `proto` package reads
`x-kubernetes-group-version-kind` back from that YAML). Keys Swagger 2.0 does not have are left out.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

# kube-openapi pkg/handler/handler.go: what clients ask for (client-go still sends the `@` form, which
# the handler keeps as `subTypeProtobufDeprecated`) and what the server answers with (Go's
# mime.ParseMediaType refuses the `@`, so kubectl could not read a response labelled with it).
ACCEPTED: Final = (
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
)
CONTENT_TYPE: Final = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
PACKAGE: Final = "openapi.v2"

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_DOUBLE = descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE
_INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_REPEATED = "repeated"

# message -> [(field, number, type: a scalar type or a message name, repeated?, oneof?)]
_MESSAGES: Final[dict[str, list[tuple[str, int, Any, bool, str | None]]]] = {
    "Document": [
        ("swagger", 1, _STRING, False, None),
        ("info", 2, "Info", False, None),
        ("paths", 8, "Paths", False, None),
        ("definitions", 9, "Definitions", False, None),
    ],
    "Info": [("title", 1, _STRING, False, None), ("version", 2, _STRING, False, None)],
    "Paths": [("path", 2, "NamedPathItem", True, None)],
    "NamedPathItem": [("name", 1, _STRING, False, None), ("value", 2, "PathItem", False, None)],
    "PathItem": [
        ("get", 2, "Operation", False, None),
        ("put", 3, "Operation", False, None),
        ("post", 4, "Operation", False, None),
        ("delete", 5, "Operation", False, None),
        ("patch", 8, "Operation", False, None),
    ],
    "Operation": [
        ("description", 3, _STRING, False, None),
        ("operation_id", 5, _STRING, False, None),
        ("produces", 6, _STRING, True, None),
        ("consumes", 7, _STRING, True, None),
        ("parameters", 8, "ParametersItem", True, None),
        ("responses", 9, "Responses", False, None),
        ("vendor_extension", 13, "NamedAny", True, None),
    ],
    "ParametersItem": [("parameter", 1, "Parameter", False, "oneof")],
    "Parameter": [("non_body_parameter", 2, "NonBodyParameter", False, "oneof")],
    "NonBodyParameter": [("query_parameter_sub_schema", 3, "QueryParameterSubSchema", False, "oneof")],
    "QueryParameterSubSchema": [
        ("required", 1, _BOOL, False, None),
        ("in", 2, _STRING, False, None),
        ("description", 3, _STRING, False, None),
        ("name", 4, _STRING, False, None),
        ("type", 6, _STRING, False, None),
        ("unique_items", 20, _BOOL, False, None),
    ],
    "Responses": [("response_code", 1, "NamedResponseValue", True, None)],
    "NamedResponseValue": [("name", 1, _STRING, False, None), ("value", 2, "ResponseValue", False, None)],
    "ResponseValue": [("response", 1, "Response", False, "oneof")],
    "Response": [("description", 1, _STRING, False, None), ("schema", 2, "SchemaItem", False, None)],
    "SchemaItem": [("schema", 1, "Schema", False, "oneof")],
    "Definitions": [("additional_properties", 1, "NamedSchema", True, None)],
    "Properties": [("additional_properties", 1, "NamedSchema", True, None)],
    "NamedSchema": [("name", 1, _STRING, False, None), ("value", 2, "Schema", False, None)],
    "NamedAny": [("name", 1, _STRING, False, None), ("value", 2, "Any", False, None)],
    "Any": [("yaml", 2, _STRING, False, None)],
    "TypeItem": [("value", 1, _STRING, True, None)],
    "ItemsItem": [("schema", 1, "Schema", True, None)],
    "AdditionalPropertiesItem": [
        ("schema", 1, "Schema", False, "oneof"),
        ("boolean", 2, _BOOL, False, "oneof"),
    ],
    "Schema": [
        ("_ref", 1, _STRING, False, None),
        ("format", 2, _STRING, False, None),
        ("title", 3, _STRING, False, None),
        ("description", 4, _STRING, False, None),
        ("default", 5, "Any", False, None),
        ("multiple_of", 6, _DOUBLE, False, None),
        ("maximum", 7, _DOUBLE, False, None),
        ("exclusive_maximum", 8, _BOOL, False, None),
        ("minimum", 9, _DOUBLE, False, None),
        ("exclusive_minimum", 10, _BOOL, False, None),
        ("max_length", 11, _INT64, False, None),
        ("min_length", 12, _INT64, False, None),
        ("pattern", 13, _STRING, False, None),
        ("max_items", 14, _INT64, False, None),
        ("min_items", 15, _INT64, False, None),
        ("unique_items", 16, _BOOL, False, None),
        ("max_properties", 17, _INT64, False, None),
        ("min_properties", 18, _INT64, False, None),
        ("required", 19, _STRING, True, None),
        ("enum", 20, "Any", True, None),
        ("additional_properties", 21, "AdditionalPropertiesItem", False, None),
        ("type", 22, "TypeItem", False, None),
        ("items", 23, "ItemsItem", False, None),
        ("all_of", 24, "Schema", True, None),
        ("properties", 25, "Properties", False, None),
        ("read_only", 27, _BOOL, False, None),
        ("example", 30, "Any", False, None),
        ("vendor_extension", 31, "NamedAny", True, None),
    ],
}

# Swagger's scalar keywords of a schema -> the Schema field.
_SCHEMA_SCALARS: Final = {
    "format": "format",
    "title": "title",
    "description": "description",
    "multipleOf": "multiple_of",
    "maximum": "maximum",
    "exclusiveMaximum": "exclusive_maximum",
    "minimum": "minimum",
    "exclusiveMinimum": "exclusive_minimum",
    "maxLength": "max_length",
    "minLength": "min_length",
    "pattern": "pattern",
    "maxItems": "max_items",
    "minItems": "min_items",
    "uniqueItems": "unique_items",
    "maxProperties": "max_properties",
    "minProperties": "min_properties",
    "readOnly": "read_only",
}


@functools.cache
def _classes() -> dict[str, type[Message]]:
    """The message classes, from a descriptor built here (pool of its own: no clash with other protos)."""
    file = descriptor_pb2.FileDescriptorProto(name="openapiv2/OpenAPIv2.proto", package=PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        oneofs: list[str] = []
        for field_name, number, kind, repeated, oneof in fields:
            field = message.field.add(name=field_name, number=number)
            field.label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            if isinstance(kind, str):
                field.type = field.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{kind}"
            else:
                field.type = kind
            if oneof is not None:
                if oneof not in oneofs:
                    oneofs.append(oneof)
                    message.oneof_decl.add(name=oneof)
                field.oneof_index = oneofs.index(oneof)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in _MESSAGES
    }


def encode(document: Mapping[str, Any]) -> bytes:
    """A Swagger 2.0 document (as JSON-ready data) as gnostic's `openapi.v2.Document`, serialized."""
    result: Any = _classes()["Document"]()  # a dynamic message: its fields are not known to the type checker
    result.swagger = document.get("swagger", "2.0")
    info = document.get("info") or {}
    result.info.title, result.info.version = info.get("title", ""), info.get("version", "")
    for path, item in document.get("paths", {}).items():
        named = result.paths.path.add(name=path)
        for method in ("get", "put", "post", "delete", "patch"):
            if method in item:
                _operation(getattr(named.value, method), item[method])
    for name, schema in document.get("definitions", {}).items():
        _schema(result.definitions.additional_properties.add(name=name).value, schema)
    data: bytes = result.SerializeToString(deterministic=True)
    return data


def decode(data: bytes) -> Message:
    """The `openapi.v2.Document` in `data` (for tests: what a client unmarshals)."""
    document = _classes()["Document"]()
    document.ParseFromString(data)
    return document


def _operation(target: Any, operation: Mapping[str, Any]) -> None:
    target.operation_id = operation.get("operationId", "")
    target.description = operation.get("description", "")
    target.consumes.extend(operation.get("consumes", ()))
    target.produces.extend(operation.get("produces", ()))
    for parameter in operation.get("parameters", ()):
        query = target.parameters.add().parameter.non_body_parameter.query_parameter_sub_schema
        query.name, query.description = parameter["name"], parameter.get("description", "")
        setattr(query, "in", parameter.get("in", "query"))
        query.type, query.unique_items = parameter.get("type", "string"), parameter.get("uniqueItems", False)
        query.required = parameter.get("required", False)
    for code, response in operation.get("responses", {}).items():
        value = target.responses.response_code.add(name=code).value.response
        value.description = response.get("description", "")
        if "schema" in response:
            _schema(value.schema.schema, response["schema"])
    _extensions(target.vendor_extension, operation)


def _schema(target: Any, schema: Mapping[str, Any]) -> None:
    for key, value in schema.items():
        if key in _SCHEMA_SCALARS:
            setattr(target, _SCHEMA_SCALARS[key], value)
        elif key == "$ref":
            target._ref = value
        elif key == "type":
            target.type.value.extend([value] if isinstance(value, str) else value)
        elif key == "required":
            target.required.extend(value)
        elif key in ("default", "example"):
            getattr(target, key).yaml = _yaml(value)
        elif key == "enum":
            for item in value:
                target.enum.add().yaml = _yaml(item)
        elif key == "items":
            for item in value if isinstance(value, list) else [value]:
                _schema(target.items.schema.add(), item)
        elif key == "allOf":
            for item in value:
                _schema(target.all_of.add(), item)
        elif key == "properties":
            for name, sub in value.items():
                _schema(target.properties.additional_properties.add(name=name).value, sub)
        elif key == "additionalProperties":
            if isinstance(value, bool):
                target.additional_properties.boolean = value
            else:
                _schema(target.additional_properties.schema, value)
    _extensions(target.vendor_extension, schema)


def _extensions(target: Any, node: Mapping[str, Any]) -> None:
    for key, value in node.items():
        if key.startswith("x-"):
            target.add(name=key).value.yaml = _yaml(value)


def _yaml(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=False, sort_keys=False)
    return text

"""Kubernetes' protobuf encoding of request bodies, read for the kinds clients send that way to the sandbox.

client-go's typed clients write core kinds as `application/vnd.kubernetes.protobuf`: Helm stores
each release as a Secret (and as a ConfigMap with HELM_DRIVER=configmap) that way, and
`kubectl create namespace` sends a Namespace; deletes carry DeleteOptions. The body is the magic `k8s\\x00` and a
`runtime.Unknown` (apimachinery pkg/runtime/generated.proto: typeMeta = 1 {apiVersion = 1,
kind = 2}, raw = 2, contentEncoding = 3, contentType = 4) whose `raw` is the object's message
(k8s.io/api core/v1/generated.proto, apimachinery pkg/apis/meta/v1/generated.proto). This module
reads the protobuf wire format for those kinds into the JSON form the emulator stores; any other
kind is refused (the caller answers 415), never guessed.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable, Iterator
from typing import Any, Final

MAGIC: Final = b"k8s\x00"
CONTENT_TYPE: Final = "application/vnd.kubernetes.protobuf"


class Unsupported(ValueError):
    """A body this module cannot read (another kind, or not Kubernetes protobuf)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise Unsupported("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value): an int for varints and fixed widths, bytes for length-delimited fields."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            length, at = _varint(data, at)
            yield number, data[at : at + length]
            at += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            yield number, int.from_bytes(data[at : at + size], "little")
            at += size
        else:
            raise Unsupported(f"wire type {wire}")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise Unsupported("a string field holds a number")
    return value.decode("utf-8")


def _entry(value: int | bytes) -> tuple[str, bytes]:
    """A map entry: key = 1, value = 2."""
    if not isinstance(value, bytes):
        raise Unsupported("a map entry holds a number")
    key, item = "", b""
    for number, part in _fields(value):
        if number == 1:
            key = _text(part)
        elif number == 2 and isinstance(part, bytes):
            item = part
    return key, item


def _time(value: int | bytes) -> str:
    """meta/v1 Time: seconds = 1, nanos = 2; written as RFC 3339 in JSON."""
    seconds = 0
    for number, part in _fields(value if isinstance(value, bytes) else b""):
        if number == 1 and isinstance(part, int):
            seconds = part
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


def _object_meta(data: bytes) -> dict[str, Any]:
    """meta/v1 ObjectMeta, the fields a client sets on create or update."""
    meta: dict[str, Any] = {}
    for number, value in _fields(data):
        if number in (1, 2, 3, 5, 6):
            key = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}[number]
            if text := _text(value):
                meta[key] = text
        elif number == 7 and isinstance(value, int):
            meta["generation"] = value
        elif number == 8:
            meta["creationTimestamp"] = _time(value)
        elif number in (11, 12):
            key, item = _entry(value)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = item.decode("utf-8")
        elif number == 14:
            meta.setdefault("finalizers", []).append(_text(value))
        elif number == 13:
            meta.setdefault("ownerReferences", []).append(_owner_reference(value))
    return meta


def _owner_reference(value: int | bytes) -> dict[str, Any]:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    reference: dict[str, Any] = {}
    for number, part in _fields(value if isinstance(value, bytes) else b""):
        if number in names:
            reference[names[number]] = _text(part)
        elif number in (6, 7):
            reference["controller" if number == 6 else "blockOwnerDeletion"] = bool(part)
    return reference


def _secret(data: bytes) -> dict[str, Any]:
    """core/v1 Secret: metadata = 1, data = 2 (bytes, base64 in JSON), type = 3, stringData = 4, immutable = 5."""
    obj: dict[str, Any] = {}
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):
            obj["metadata"] = _object_meta(value)
        elif number == 2:
            key, item = _entry(value)
            obj.setdefault("data", {})[key] = base64.b64encode(item).decode("ascii")
        elif number == 3:
            obj["type"] = _text(value)
        elif number == 4:
            key, item = _entry(value)
            obj.setdefault("stringData", {})[key] = item.decode("utf-8")
        elif number == 5:
            obj["immutable"] = bool(value)
    return obj


def _config_map(data: bytes) -> dict[str, Any]:
    """core/v1 ConfigMap: metadata = 1, data = 2, binaryData = 3 (base64 in JSON), immutable = 4."""
    obj: dict[str, Any] = {}
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):
            obj["metadata"] = _object_meta(value)
        elif number in (2, 3):
            key, item = _entry(value)
            if number == 2:
                obj.setdefault("data", {})[key] = item.decode("utf-8")
            else:
                obj.setdefault("binaryData", {})[key] = base64.b64encode(item).decode("ascii")
        elif number == 4:
            obj["immutable"] = bool(value)
    return obj


def _namespace(data: bytes) -> dict[str, Any]:
    """core/v1 Namespace: metadata = 1, spec = 2 {finalizers = 1}; status (3) is the server's."""
    obj: dict[str, Any] = {}
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):
            obj["metadata"] = _object_meta(value)
        elif number == 2 and isinstance(value, bytes):
            finalizers = [_text(part) for field, part in _fields(value) if field == 1]
            obj["spec"] = {"finalizers": finalizers} if finalizers else {}
    return obj


def _delete_options(data: bytes) -> dict[str, Any]:
    """meta/v1 DeleteOptions: gracePeriodSeconds = 1, preconditions = 2 {uid = 1, resourceVersion = 2},
    orphanDependents = 3, propagationPolicy = 4, dryRun = 5."""
    obj: dict[str, Any] = {}
    for number, value in _fields(data):
        if number == 1 and isinstance(value, int):
            obj["gracePeriodSeconds"] = value
        elif number == 2 and isinstance(value, bytes):
            names = {1: "uid", 2: "resourceVersion"}
            obj["preconditions"] = {names[field]: _text(part) for field, part in _fields(value) if field in names}
        elif number == 3:
            obj["orphanDependents"] = bool(value)
        elif number == 4:
            obj["propagationPolicy"] = _text(value)
        elif number == 5:
            obj.setdefault("dryRun", []).append(_text(value))
    return obj


READERS: Final[dict[tuple[str, str], Callable[[bytes], dict[str, Any]]]] = {
    ("v1", "Secret"): _secret,
    ("v1", "ConfigMap"): _config_map,
    ("v1", "Namespace"): _namespace,
    ("v1", "DeleteOptions"): _delete_options,
    ("meta.k8s.io/v1", "DeleteOptions"): _delete_options,
}


def decode(body: bytes) -> dict[str, Any]:
    """The object in a Kubernetes protobuf body, as JSON data; `Unsupported` for a kind not read here."""
    if not body.startswith(MAGIC):
        raise Unsupported("not Kubernetes protobuf (no k8s\\0 magic)")
    api_version = kind = ""
    raw = b""
    for number, value in _fields(body[len(MAGIC) :]):
        if number == 1 and isinstance(value, bytes):
            for field, part in _fields(value):
                if field == 1:
                    api_version = _text(part)
                elif field == 2:
                    kind = _text(part)
        elif number == 2 and isinstance(value, bytes):
            raw = value
    reader = READERS.get((api_version, kind))
    if reader is None:
        raise Unsupported(f"{kind or 'this kind'} ({api_version or '?'}) is not read from protobuf here")
    return {"apiVersion": api_version, "kind": kind} | reader(raw)

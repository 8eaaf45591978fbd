"""List and watch as the API server serves them: selectors, resourceVersions, timeouts, Tables.

A list gets the label and field selectors applied, its kind (`<Kind>List`) and the resourceVersion a
watch continues from (`ListWatch.filter_list`); with `limit` it comes in chunks, in key order, each
with a `continue` token for the next (`paged`). A watch starts from `resourceVersion` (every object as
ADDED without one; only newer changes with one; an in-stream 410 Gone below the emulator's
`compacted_before`, `catch_up`), ends after `timeoutSeconds` (`stream`), may start with the objects
and a bookmark (`sendInitialEvents`, `with_initial_events`), and is filtered by the selectors and
rendered as Tables when kubectl asks (`as_asked`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import kmock
from kmock._internal import rendering

from npu_sandbox.apiserver.selectors import matches_fields, matches_selector
from npu_sandbox.apiserver.store import Store
from npu_sandbox.apiserver.tables import Tables

# How a watch's first events are made from the objects read when it starts (deleted, raw) and its
# resourceVersion: `catch_up` with the emulator's compacted_before (tests replace it).
CatchUp = Callable[[list[tuple[bool, dict[str, Any]]], str], list[dict[str, Any]]]
Watch = Callable[[rendering.Request], AsyncIterator[rendering.Payload]]


class ListWatch:
    """The list and watch steps over the store; Tables from `tables` when a request asks for them."""

    def __init__(self, store: Store, tables: Tables) -> None:
        self.store = store
        self.tables = tables

    def filter_list(self, request: rendering.Request, payload: Any) -> rendering.Payload:
        """kmock's list as the API server answers it: selected, kind and resourceVersion set, or a Table."""
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
        payload["items"] = [item for item in payload["items"] if self.selected_by_fields(request, item)]
        resource = request.resource
        if resource is not None and resource in self.store.resources and self.store.resources[resource].kind:
            payload["kind"] = f"{self.store.resources[resource].kind}List"
            payload["apiVersion"] = f"{resource.group}/{resource.version}" if resource.group else resource.version
        payload["items"], payload["metadata"] = paged(payload["items"], request.params, self.store.last_version)
        if self.tables.wanted(request):
            payload = self.tables.of(payload["items"], request, str(payload["metadata"].get("resourceVersion", "1")))
        result: rendering.Payload = payload
        return result

    def selected_by_fields(self, request: rendering.Request, obj: Mapping[str, Any]) -> bool:
        selector = request.params.get("fieldSelector")
        try:
            return not selector or matches_fields(obj, selector)
        except ValueError as exc:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from None

    async def stream(self, request: rendering.Request, catch_up: CatchUp) -> AsyncGenerator[rendering.Payload, None]:
        """A watch as the API server serves it: from `resourceVersion`, ended after `timeoutSeconds`.

        Without a resourceVersion every object comes as ADDED, then the changes. With one, only
        objects changed after it come first, so a resource created between a list and the watch
        that follows it is never missed; one below `compacted_before` gets an in-stream 410 Gone.
        The bus is marked before the objects are read, so no change falls between the two.
        `catch_up` makes the first events (see `catch_up`).
        """
        yield b""  # the headers, at once
        assert request.resource is not None
        bus = self.store.bus(request.resource)
        since = request.params.get("resourceVersion") or ""
        seconds = request.params.get("timeoutSeconds") or ""
        async with self.store.lock:
            marker = await bus.mark()
            # A deleted object keeps its last state (kmock soft-deletes; `raw` refuses those).
            objects = [(obj.deleted, copy.deepcopy(obj.last.raw)) for obj in self.objects_for(request)]
        try:
            async with asyncio.timeout(float(seconds) if seconds.isdigit() and int(seconds) > 0 else None):
                for event in catch_up(objects, since):
                    yield event
                    if event["type"] == "ERROR":
                        return
                async for event in bus.stream(since=marker):
                    meta = event.get("object", {}).get("metadata", {})
                    if self.matches(request, meta.get("namespace"), meta.get("name")):
                        yield event
        except TimeoutError:
            return  # the server's timeout: the client re-watches from its last resourceVersion
        finally:
            await bus.unmark(marker)

    async def with_initial_events(self, request: rendering.Request) -> AsyncGenerator[rendering.Payload, None]:
        """A streaming list (client-go's WatchList, on by default since 1.35): the objects as ADDED, then a
        BOOKMARK marked `k8s.io/initial-events-end` (informers wait for it before they are synced), then
        live events, from the same moment."""
        resource = request.resource
        assert resource is not None
        yield b""
        bus = self.store.bus(resource)
        async with self.store.lock:
            mark = await bus.mark()
            existing = [
                obj.raw
                for (res, namespace, name), obj in self.store.objects.items()
                if res == resource
                and not obj.deleted
                and request.namespace in (None, namespace)
                and request.name in (None, name)
            ]
            version = self.store.next_version()
        for raw in existing:
            yield {"type": "ADDED", "object": raw}
        api_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        yield {
            "type": "BOOKMARK",
            "object": {
                "kind": self.store.kind(request),
                "apiVersion": api_version,
                "metadata": {"resourceVersion": version, "annotations": {"k8s.io/initial-events-end": "true"}},
            },
        }
        async for event in mark:
            meta = event.get("object", {}).get("metadata", {})
            if request.namespace in (None, meta.get("namespace")) and request.name in (None, meta.get("name")):
                yield event

    async def as_asked(self, request: rendering.Request, watch: Watch) -> AsyncGenerator[rendering.Payload, None]:
        """kmock's watch, with the selectors applied and objects as Tables when kubectl asks for them."""
        as_table = self.tables.wanted(request)
        labels = request.params.get("labelSelector")
        initial = request.params.get("sendInitialEvents") == "true"
        async for event in self.with_initial_events(request) if initial else watch(request):
            if isinstance(event, dict) and event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                obj = event.get("object", {})
                if labels and not matches_selector(obj.get("metadata", {}).get("labels", {}), labels):
                    continue
                if not self.selected_by_fields(request, obj):
                    continue
                if as_table:
                    version = str(obj.get("metadata", {}).get("resourceVersion", "1"))
                    event = {"type": event["type"], "object": self.tables.of([obj], request, version)}
            yield event

    def objects_for(self, request: rendering.Request) -> list[Any]:
        found: list[Any] = self.store.server._KubernetesEmulator__get_objs(request, strict=False)  # type: ignore[attr-defined]
        return found

    def matches(self, request: rendering.Request, namespace: str | None, name: str | None) -> bool:
        check = self.store.server._KubernetesEmulator__check  # type: ignore[attr-defined]
        return bool(check(request, request.resource, namespace, name, strict=False))


def paged(items: list[Any], params: Mapping[str, str], last_version: int) -> tuple[list[Any], dict[str, Any]]:
    """A list's chunk and its metadata, as the API server pages a list (`limit`, `continue`).

    Items come in key order (namespace, then name: etcd's key order under the resource's prefix).
    With `limit` > 0 a chunk holds at most that many; when more remain, its metadata has a
    `continue` token and `remainingItemCount`. The token is opaque to clients and carries the
    list's resourceVersion and the key to start after (kubernetes/kubernetes,
    staging/src/k8s.io/apiserver/pkg/storage/continue.go, EncodeContinue and DecodeContinue); a
    token that does not decode is a 400. The next chunk reports the first chunk's resourceVersion,
    so a watch that follows starts there, but its objects are read as they are now: the emulator
    keeps no snapshot, so an object changed between two chunks shows its newer state, and that
    change also comes again on the watch (a real API server serves the snapshot instead).
    """
    version, start = last_version, ""
    if token := params.get("continue"):
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            version, start = int(decoded["rv"]), str(decoded["start"])
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise kmock.KubernetesError(
                status=400, reason="BadRequest", message=f"continue key is not valid: {token!r}"
            ) from None
    ordered = sorted(items, key=_list_key)
    if start:
        ordered = [item for item in ordered if _list_key(item) > tuple(start.split("/", 1))]
    metadata: dict[str, Any] = {"resourceVersion": str(version)}  # where a watch continues
    limit = params.get("limit") or ""
    if limit.isdigit() and 0 < int(limit) < len(ordered):
        ordered, rest = ordered[: int(limit)], len(ordered) - int(limit)
        after = "/".join(_list_key(ordered[-1]))
        token = json.dumps({"v": "meta.k8s.io/v1", "rv": version, "start": after})
        metadata["continue"] = base64.urlsafe_b64encode(token.encode()).decode()
        metadata["remainingItemCount"] = rest
    return ordered, metadata


def _list_key(item: Mapping[str, Any]) -> tuple[str, str]:
    meta = item.get("metadata", {})
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def catch_up(objects: list[tuple[bool, dict[str, Any]]], since: str, compacted_before: int) -> list[dict[str, Any]]:
    """A watch's first events: every object as ADDED (no resourceVersion), the objects changed after
    `since` (DELETED when they are gone), or 410 Gone when `since` is below `compacted_before`."""
    if since in ("", "0"):
        return [{"type": "ADDED", "object": raw} for deleted, raw in objects if not deleted]
    if not since.isdigit() or int(since) < compacted_before:
        message = f"too old resource version: {since} ({compacted_before})"
        gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
        return [{"type": "ERROR", "object": {**gone, "reason": "Expired", "code": 410}}]
    newer = [(deleted, raw) for deleted, raw in objects if resource_version_of(raw) > int(since)]
    return [{"type": "DELETED" if deleted else "ADDED", "object": raw} for deleted, raw in newer]


def resource_version_of(obj: Mapping[str, Any]) -> int:
    text = str(obj.get("metadata", {}).get("resourceVersion", "0"))
    return int(text) if text.isdigit() else 0

"""List, then watch, one kind of object with a label selector: an informer, as client-go's.

`inform` keeps a `Sink` equal to what the API server holds of one kind (in one namespace, or in all):
a first list in pages (client-go's pager: 500 a page), then a watch from the list's resourceVersion,
re-opened from the last version seen when the server ends it. What it does on trouble, after
client-go's reflector (k8s.io/client-go/tools/cache/reflector.go, ListAndWatch):
- 410 Gone (an answer, or an ERROR event in the stream): the versions seen are compacted away: list
  again, and the sink is replaced by the fresh list (objects deleted meanwhile leave it);
- any other ERROR event, an error answer, a dropped connection: list again after a backoff (0.5 s
  doubling to 30 s, jittered, reset by a stream that lasted 10 s);
- a stream the server ended early: reopened, after a backoff when it lasted under 10 s (a proxy
  that cuts every stream must not be answered with a reconnect storm);
- 403 or 404 on the list (RBAC refuses the kind, its API is not installed): the sink is emptied,
  the sync counts as done (nothing of that kind can be seen) and the list is asked again every
  `absent_seconds`; logged each time, or told to `absent` instead (the Nodes' informer logs once).
`synced` is set once the first list is in the sink (or the kind is known to be absent), so that
nothing acts on a half-known cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from npu_operator.api.config import backoff_seconds, jittered
from npu_operator.kube.client import ApiError, KubeClient, Resource

logger = logging.getLogger(__name__)

PAGE: Final = 500  # client-go's pager (k8s.io/client-go/tools/pager, defaultPageSize)
# A stream that lasted at least this long was healthy: the next one opens at once. Otherwise the
# next list or watch waits FIRST_RETRY_SECONDS, doubling per strike, at most MAX_RETRY_SECONDS.
HEALTHY_STREAM_SECONDS: Final = 10.0
FIRST_RETRY_SECONDS: Final = 0.5
MAX_RETRY_SECONDS: Final = 30.0


def retry_seconds(strikes: int, rng: Callable[[], float] = random.random) -> float:
    """The pause after `strikes` failures or short streams in a row: doubling, jittered +-50 %."""
    return jittered(backoff_seconds(FIRST_RETRY_SECONDS, strikes), MAX_RETRY_SECONDS, rng)


class Sink(Protocol):
    """Where an informer keeps what it sees (the owner-keyed caches of `controller.watches`)."""

    def replace(self, namespace: str | None, objects: Sequence[Mapping[str, Any]]) -> None:
        """The whole kind (in `namespace`, or everywhere when None) is now `objects`."""

    def put(self, obj: Mapping[str, Any]) -> None:
        """`obj` was added or changed."""

    def remove(self, obj: Mapping[str, Any]) -> None:
        """`obj` was deleted."""


@dataclasses.dataclass(frozen=True)
class Watched:
    """One informer's subject: a kind, the namespace (None: all) and the label selector."""

    resource: Resource
    namespace: str | None
    selector: str


class _Gone(Exception):
    """410: the resourceVersion the watch would go on from is compacted away."""


async def inform(
    client: KubeClient,
    watched: Watched,
    sink: Sink,
    synced: asyncio.Event,
    *,
    watch_seconds: int = 300,
    absent_seconds: float = 60.0,
    page: int = PAGE,
    absent: Callable[[ApiError], None] | None = None,
    keep: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> None:
    """Keep `sink` equal to the API server's objects of `watched`, until cancelled. `absent`: called
    after the sink is emptied because the list was refused (403) or not found (404), in place of the
    log. `keep`: what of each listed object the sink needs (the sink takes its own projection too),
    applied page by page, so that a list of large objects (Nodes) is never held whole."""
    failures = 0
    what = f"{watched.resource.plural} ({watched.selector}) in {watched.namespace or 'all namespaces'}"

    async def back_off(doing: str, exc: BaseException) -> None:
        """A failure: list again after the next pause (an ApiError is expected; anything else, an
        answer that is not what the API promises, is logged with its traceback)."""
        nonlocal failures
        failures += 1
        wait = retry_seconds(failures)
        log = logger.warning if isinstance(exc, ApiError) else logger.exception
        log(f"{doing} {what} failed ({exc}); listing again in {wait:.1f} s")
        await asyncio.sleep(wait)

    while True:
        try:
            version = await _list(client, watched, sink, page, keep)
        except ApiError as exc:
            if exc.status not in (403, 404):
                await back_off("listing", exc)
                continue
            sink.replace(watched.namespace, ())
            if absent is not None:
                absent(exc)
            else:
                logger.warning(f"cannot list {what} ({exc}): none are seen; asking again in {absent_seconds:.0f} s")
            synced.set()
            await asyncio.sleep(absent_seconds)
            continue
        except Exception as exc:  # never the informer's end
            await back_off("listing", exc)
            continue
        synced.set()
        try:
            while True:
                started = time.monotonic()
                version = await _watch(client, watched, sink, version, watch_seconds)
                failures = 0 if time.monotonic() - started >= HEALTHY_STREAM_SECONDS else failures + 1
                if failures:
                    await asyncio.sleep(retry_seconds(failures))
        except _Gone:
            failures = 0
            logger.debug(f"watching {what}: 410 Gone, listing again")
        except Exception as exc:  # an error answer or event, a line that is not JSON: never the end
            await back_off("watching", exc)


async def _list(
    client: KubeClient,
    watched: Watched,
    sink: Sink,
    page_size: int,
    keep: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> str:
    """Every object of `watched` into the sink at once (each as `keep` projects it); the list's resourceVersion."""
    objects: list[Mapping[str, Any]] = []
    token: str | None = None
    while True:
        page = await client.list_page(
            watched.resource, watched.namespace, selector=watched.selector, limit=page_size, token=token
        )
        items = page.get("items") or ()
        objects += [keep(item) for item in items] if keep is not None else items
        meta = page.get("metadata") or {}
        token = meta.get("continue") or None
        if token is None:
            sink.replace(watched.namespace, objects)
            return str(meta.get("resourceVersion") or "")


async def _watch(client: KubeClient, watched: Watched, sink: Sink, version: str, seconds: int) -> str:
    """Events into the sink until the stream ends; the last resourceVersion seen."""
    try:
        async for event in client.watch(
            watched.resource, watched.namespace, selector=watched.selector, resource_version=version, seconds=seconds
        ):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise _Gone()
                raise ApiError(int(code or 0), str(obj.get("reason") or "ERROR"), str(obj.get("message") or obj))
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED"):
                sink.put(obj)
            elif kind == "DELETED":
                sink.remove(obj)
    except ApiError as exc:
        if exc.status == 410:
            raise _Gone() from exc
        raise
    return version

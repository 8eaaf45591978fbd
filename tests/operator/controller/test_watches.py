"""Wake-ups through kopf's own indexing: the worker that a child's change wakes reads that change.

The indexers wake the owner's worker themselves (one kopf handler per event instead of two), which
is right only while kopf stores an indexer's answer before the event loop can run another task.
These tests run kopf's `index_resource` for real, so a kopf that changes that order fails here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from kopf._core.engines import indexing
from npu_operator.children import kinds as children
from npu_operator.controller import watches
from npu_operator.controller.watches import Wakeups
from npu_operator.kube import names as builders

OWNER = ("default", "m")
DEPLOYMENT = children.DEPLOYMENT.resource


def _deployment(generation: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "namespace": "default",
            "name": "m",
            "uid": "d1",
            "generation": generation,
            "labels": {builders.NAME_LABEL: "m", "app.kubernetes.io/managed-by": "npu-operator"},
        },
        "status": {"observedGeneration": generation},
    }


async def _index_and_read(events: list[dict[str, Any]]) -> list[Any]:
    """Index `events` one after another with kopf; after each, what a worker woken by it read first."""
    registry = kopf.OperatorRegistry()
    index_id = watches.index_name(children.DEPLOYMENT)
    kopf.index(DEPLOYMENT.group, DEPLOYMENT.version, DEPLOYMENT.plural, id=index_id, registry=registry)(
        watches._index_child
    )
    indexers = indexing.OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    memo = kopf.Memo(wakeups=Wakeups())
    memory = indexing.IndexingMemory()
    read: list[Any] = []
    for event in events:
        wake = memo.wakeups.for_owner(OWNER)

        async def worker(wake: asyncio.Event = wake) -> None:
            await wake.wait()
            read.append([dict(obj) for obj in indexers[kopf.HandlerId(index_id)].index.get(OWNER, ())])

        woken = asyncio.create_task(worker())
        await asyncio.sleep(0)  # the worker waits on its wake-up
        await indexing.index_resource(
            indexers=indexers,
            registry=registry,
            settings=kopf.OperatorSettings(),
            resource=kopf.Resource(DEPLOYMENT.group, DEPLOYMENT.version, DEPLOYMENT.plural),
            raw_event=event,  # type: ignore[arg-type]
            memory=memory,
            logger=logging.getLogger("test"),
            memo=memo,  # type: ignore[arg-type]
            body=kopf.Body(event["object"]),
        )
        await asyncio.wait_for(woken, 5)
    return read


def test_a_child_change_wakes_its_owner_after_kopf_indexed_it() -> None:
    events: list[dict[str, Any]] = [
        {"type": None, "object": _deployment(1)},
        {"type": "MODIFIED", "object": _deployment(2)},
    ]
    read = asyncio.run(_index_and_read(events))
    assert [[obj["metadata"]["generation"] for obj in found] for found in read] == [[1], [2]]


def test_an_indexed_kinds_event_handler_runs_only_for_a_deletion() -> None:
    # Every other event wakes the owner from the indexer: kopf would run a second handler for nothing.
    from npu_operator.controller import handlers  # noqa: F401  (registers the watches with kopf's default registry)

    indexed = {kind.resource.plural for kind in children.KINDS if not kind.optional} | {"pods"}
    wakes = {
        handler.id: handler.when
        for handler in kopf.get_default_registry()._watching.get_all_handlers()
        if handler.id.startswith("wake_for_") and handler.id.removeprefix("wake_for_") in indexed
    }
    assert set(wakes) == {f"wake_for_{plural}" for plural in indexed}
    assert all(when is watches._deleted for when in wakes.values())
    assert watches._deleted(type="DELETED")
    assert not any(watches._deleted(type=kind) for kind in (None, "ADDED", "MODIFIED"))

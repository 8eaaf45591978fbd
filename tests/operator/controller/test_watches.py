"""The informers' caches: a change wakes its owner once the cache holds it, and only a change does.

The informer itself runs against the sandbox's API server over HTTP: a first list in pages with the
label selector, then the watch; a compacted version (410) is answered with a fresh list that drops
what was deleted meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from npu_operator.children import kinds as children
from npu_operator.controller import watches
from npu_operator.controller.watches import OwnedObjects, OwnerKey
from npu_operator.kube import informer
from npu_operator.kube import names as builders
from npu_operator.kube.client import REPLICA_SETS, STATEFUL_SETS, ApiError, KubeClient
from npu_operator.kube.informer import Watched, inform
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.node.scheduler import register_nodes

OWNER = ("default", "m")
NS = "default"


def _deployment(generation: int, *, owner: str = "m", name: str = "m", replicas: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "namespace": NS,
            "name": name,
            "uid": f"uid-{name}",
            "generation": generation,
            "resourceVersion": str(generation * 10 + replicas),
            "labels": {builders.NAME_LABEL: owner, "app.kubernetes.io/managed-by": "npu-operator"},
            "annotations": {"deployment.kubernetes.io/revision": str(replicas)},  # not kept
        },
        "status": {"observedGeneration": generation},
    }


def _cache() -> tuple[OwnedObjects, list[tuple[OwnerKey, list[int]]]]:
    """A Deployment cache whose wake-up records what the woken owner would read then."""
    woken: list[tuple[OwnerKey, list[int]]] = []
    cache = OwnedObjects(watches.essentials, lambda key: woken.append((key, generations(cache, key))))
    return cache, woken


def generations(cache: OwnedObjects, key: OwnerKey) -> list[int]:
    return [obj["metadata"]["generation"] for obj in cache.get(key)]


def test_a_change_wakes_its_owner_once_the_cache_holds_it() -> None:
    cache, woken = _cache()
    cache.put(_deployment(1))
    cache.put(_deployment(2))
    assert woken == [(OWNER, [1]), (OWNER, [2])]
    cache.remove(_deployment(2))
    assert woken[-1] == (OWNER, []) and OWNER not in cache.by_owner


def test_an_event_that_changes_nothing_kept_wakes_nothing() -> None:
    cache, woken = _cache()
    cache.put(_deployment(1))
    cache.put(_deployment(1, replicas=3))  # a new resourceVersion and annotation: nothing the reconcile reads
    assert woken == [(OWNER, [1])]
    cache.remove(_deployment(9, name="never-seen"))
    assert woken == [(OWNER, [1])]


def test_a_relabelled_object_moves_to_its_new_owner_and_wakes_both() -> None:
    cache, woken = _cache()
    cache.put(_deployment(1))
    cache.put(_deployment(1, owner="other"))
    assert woken[1:] == [(OWNER, []), ((NS, "other"), [1])]
    unlabelled = _deployment(1, owner="other")
    del unlabelled["metadata"]["labels"][builders.NAME_LABEL]
    cache.put(unlabelled)
    assert woken[-1] == ((NS, "other"), []) and cache.by_owner == {}


def test_a_fresh_list_replaces_one_namespace_and_wakes_the_owners_that_changed() -> None:
    cache, woken = _cache()
    cache.put(_deployment(1))
    cache.put(_deployment(1, owner="gone", name="gone"))
    elsewhere = _deployment(1, owner="there", name="there")
    elsewhere["metadata"]["namespace"] = "other"
    cache.put(elsewhere)
    woken.clear()
    cache.replace(NS, [_deployment(1), _deployment(1, owner="new", name="new")])
    assert sorted(woken) == [((NS, "gone"), []), ((NS, "new"), [1])]  # "m" is unchanged
    assert set(cache.by_owner) == {OWNER, (NS, "new"), ("other", "there")}


async def test_the_informer_lists_in_pages_then_follows_the_watch_and_relists_after_410() -> None:
    async with LocalCluster() as cluster:
        labels = {builders.NAME_LABEL: "m", "app.kubernetes.io/managed-by": "npu-operator"}
        for name in [f"c{index}" for index in range(7)] + ["x"]:
            meta = {"name": name, "namespace": NS} | ({"labels": labels} if name != "x" else {})
            await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}, "configmaps")
        client = KubeClient(lambda: kopf.ConnectionInfo(server=cluster.url))
        woken = asyncio.Event()
        cache = OwnedObjects(watches.essentials, lambda _: woken.set())
        synced = asyncio.Event()
        resource = children.CALIBRATION_RECORD.resource
        watched = Watched(resource, NS, watches.OURS)
        task = asyncio.create_task(inform(client, watched, cache, synced, watch_seconds=2, page=3))
        try:
            await asyncio.wait_for(synced.wait(), 10)
            assert sorted(cache.by_owner[OWNER]) == [f"c{index}" for index in range(7)]  # never "x"
            lists = [
                r.params for r in cluster.emulator.history if r.method == "GET" and r.url.path.endswith("/configmaps")
            ]
            pages = [(query.get("labelSelector"), query.get("limit")) for query in lists if "watch" not in query]
            assert pages == [(watches.OURS, "3")] * 3
            woken.clear()
            await cluster.delete("v1", "configmaps", NS, "c0")
            await asyncio.wait_for(woken.wait(), 10)
            assert "c0" not in cache.by_owner[OWNER]
            # Every version seen compacted away, one object deleted meanwhile: the informer lists again.
            cluster.emulator.compacted_before = cluster.emulator._last_version + 1
            await cluster.delete("v1", "configmaps", NS, "c1")
            await asyncio.sleep(3)  # the stream ends (watch_seconds), its reopening gets 410
            assert sorted(cache.by_owner[OWNER]) == [f"c{index}" for index in range(2, 7)]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


async def test_an_informer_outlives_a_stream_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line that is not JSON ends that stream, not the informer: it lists again (after a backoff)."""
    monkeypatch.setattr(informer, "retry_seconds", lambda failures: 0.01)
    deployment = _deployment(1)

    class Client:
        lists = 0

        async def list_page(self, *_: Any, **__: Any) -> dict[str, Any]:
            self.lists += 1
            items = [deployment] if self.lists > 1 else []
            return {"metadata": {"resourceVersion": str(self.lists)}, "items": items}

        async def watch(self, *_: Any, **__: Any) -> AsyncIterator[dict[str, Any]]:
            if self.lists == 1:
                raise ValueError("Expecting value: line 1 column 1 (char 0)")
            await asyncio.sleep(3600)
            yield {}

    client = Client()
    cache, woken = _cache()
    watched = Watched(children.DEPLOYMENT.resource, NS, watches.OURS)
    task = asyncio.create_task(inform(client, watched, cache, asyncio.Event()))  # type: ignore[arg-type]
    try:
        for _ in range(100):
            if woken:
                break
            await asyncio.sleep(0.01)
        assert client.lists == 2 and woken == [(OWNER, [1])]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_each_watched_kind_has_a_cache_of_its_own() -> None:
    """A fresh list replaces its kind's objects: two kinds in one cache would wipe each other (the
    StatefulSets' empty list dropped every ReplicaSet, and with them every pod's owner chain)."""
    informers = watches.Informers(lambda _: None)
    sinks = informers.sinks()
    assert set(sinks) == set(watches.server_selectors())
    assert len({id(sink) for sink in sinks.values()}) == len(sinks)
    replica_set = {"metadata": {"name": "m-abc", "namespace": NS, "uid": "rs", "labels": {builders.NAME_LABEL: "m"}}}
    sinks[REPLICA_SETS].replace(None, [replica_set])
    sinks[STATEFUL_SETS].replace(None, [])
    view = watches.WatchedView(informers)
    assert [link["metadata"]["uid"] for link in view.owner_links(NS, "m")] == ["rs"]


# --- the Nodes (node discovery) ------------------------------------------------------------------


def _node(name: str, npus: int, chip: str = "910B3") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"node.kubernetes.io/npu.chip.name": chip, "zone": "a"}},
        "status": {"allocatable": {"cpu": "192", "huawei.com/Ascend910": str(npus)}, "images": [{"names": ["x"]}]},
    }


def test_the_nodes_are_kept_as_the_few_shapes_they_have_and_refusal_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    offers = watches.NodeOffers()
    assert offers.offer is None  # not listed yet: unknown, not "no node"
    offers.replace(None, [watches.node_essentials(_node(f"n{i}", 8)) for i in range(100)])
    first = offers.offer
    assert first is not None and first.nodes == 100 and len(first.shapes) == 1
    offers.put(_node("n0", 8))  # a heartbeat: the same shape, the same offer object
    assert offers.offer is first
    offers.put(_node("n1", 4))
    offers.remove(_node("n2", 8))
    changed = offers.offer
    assert changed is not None and changed.nodes == 99 and sorted(n for _, n in changed.shapes) == [1, 98]
    refused = ApiError(403, "Forbidden", 'nodes is forbidden: cannot list resource "nodes"')
    for _ in range(3):  # asked again every minute: said once
        offers.replace(None, ())
        offers.absent(refused)
    assert offers.offer is None
    assert len([r for r in caplog.records if "cannot list Nodes" in r.getMessage()]) == 1


async def test_the_node_informer_lists_every_node_and_follows_them() -> None:
    async with LocalCluster() as cluster:
        await register_nodes(cluster, [_node("a", 8), _node("b", 8, "910B4")])
        client = KubeClient(lambda: kopf.ConnectionInfo(server=cluster.url))
        informers = watches.Informers(lambda _: None)
        informers.start(client, [NS], nodes=True)
        try:

            async def listed() -> Any:
                return (offer := informers.nodes.offer) is not None and offer.nodes == 2 and offer

            offer = await cluster.wait_for(listed, within=10, what="the nodes listed")
            assert sorted(shape.labels for shape, _ in offer.shapes) == [
                (("node.kubernetes.io/npu.chip.name", "910B3"),),
                (("node.kubernetes.io/npu.chip.name", "910B4"),),
            ]
            await cluster.delete("v1", "nodes", None, "b")

            async def followed() -> Any:
                return (offer := informers.nodes.offer) is not None and offer.nodes == 1

            await cluster.wait_for(followed, within=10, what="the deleted node gone")
        finally:
            await informers.stop()
            await client.close()

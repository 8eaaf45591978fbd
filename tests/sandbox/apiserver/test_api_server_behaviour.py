"""The sandbox API answers as a kube-apiserver does where clients depend on it, over real HTTP.

OpenAPI v3 and v2, field validation, dry runs, PUT, the scale subresource, field selectors,
watches (content type, streaming lists), namespaces. The real kubectl drives the same API in
tests/e2e/test_kubectl_session.py; here each behaviour is pinned down on its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest
import yaml
from npu_operator.api import crd
from npu_sandbox.apiserver import openapi_v2_proto
from npu_sandbox.cluster import LocalCluster

from tests.examples import example

NPUINF = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/default/{crd.PLURAL}"


@pytest.fixture
async def api() -> AsyncIterator[tuple[LocalCluster, aiohttp.ClientSession]]:
    async with LocalCluster() as cluster, aiohttp.ClientSession(cluster.url) as session:
        yield cluster, session


async def call(
    session: aiohttp.ClientSession, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, Any, aiohttp.ClientResponse]:
    data = None if body is None else json.dumps(body)
    async with session.request(method, path, data=data, headers={"Content-Type": content_type}) as response:
        return response.status, await response.json(content_type=None), response


def tiny(name: str = "tiny-llama") -> dict[str, Any]:
    manifest = example("sandbox-cpu.yaml")
    manifest["metadata"]["name"] = name
    return manifest


async def test_openapi_v3_describes_every_served_kind_and_offers_field_validation(api: Any) -> None:
    _, session = api
    _, index, _ = await call(session, "GET", "/openapi/v3")
    assert {"api/v1", "apis/apps/v1", f"apis/{crd.GROUP}/{crd.VERSION}", "apis/policy/v1"} <= set(index["paths"])
    kinds: dict[tuple[str, str, str], dict[str, Any]] = {}
    for entry in index["paths"].values():
        status, document, response = await call(session, "GET", entry["serverRelativeURL"])
        assert status == 200 and response.content_type == "application/json"
        for schema in document["components"]["schemas"].values():
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                kinds[gvk["group"], gvk["version"], gvk["kind"]] = schema
        defined = set(document["components"]["schemas"])
        assert {ref.removeprefix("#/components/schemas/") for ref in _refs(document)} <= defined
        for path, operations in document["paths"].items():
            if "patch" in operations:
                names = {p["name"] for p in operations["patch"]["parameters"] if p["in"] == "query"}
                assert {"fieldValidation", "dryRun", "fieldManager"} <= names, path
    for group, version, kind in [("", "v1", "Pod"), ("apps", "v1", "Deployment"), ("autoscaling", "v1", "Scale")]:
        assert (group, version, kind) in kinds
    npuinf = kinds[crd.GROUP, crd.VERSION, crd.KIND]
    assert npuinf["properties"]["spec"] == crd.openapi_schema()["properties"]["spec"]
    assert npuinf["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        # A string under "$ref" is a reference; a schema under it is a property of that name (JSONSchemaProps').
        refs = [v for k, v in schema.items() if k == "$ref" and isinstance(v, str)]
        return refs + [r for v in schema.values() for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


async def test_openapi_v2_is_served_as_json_and_as_gnostic_protobuf(api: Any) -> None:
    _, session = api
    status, document, _ = await call(session, "GET", "/openapi/v2")
    assert status == 200 and document["swagger"] == "2.0"
    assert f"dev.npu.inference.{crd.VERSION}.{crd.KIND}" in document["definitions"]
    assert all(ref.startswith("#/definitions/") for ref in _refs(document))
    protobuf = {"Accept": openapi_v2_proto.ACCEPTED[0]}  # what client-go sends
    async with session.get("/openapi/v2", headers=protobuf) as response:
        assert response.status == 200 and response.content_type == openapi_v2_proto.CONTENT_TYPE
        decoded: Any = openapi_v2_proto.decode(await response.read())
    assert decoded.swagger == "2.0"
    definitions = {named.name: named.value for named in decoded.definitions.additional_properties}
    assert set(definitions) == set(document["definitions"])
    assert {named.name for named in decoded.paths.path} == set(document["paths"])
    npuinf = definitions[f"dev.npu.inference.{crd.VERSION}.{crd.KIND}"]
    extensions = {named.name: yaml.safe_load(named.value.yaml) for named in npuinf.vendor_extension}
    assert extensions["x-kubernetes-group-version-kind"] == [
        {"group": crd.GROUP, "version": crd.VERSION, "kind": crd.KIND}
    ]
    properties = {named.name: named.value for named in npuinf.properties.additional_properties}
    spec = crd.openapi_schema()["properties"]["spec"]
    assert set(properties) >= {"apiVersion", "kind", "metadata", "spec", "status"}
    assert {named.name for named in properties["spec"].properties.additional_properties} == set(spec["properties"])
    assert list(properties["spec"].type.value) == ["object"]
    async with session.get("/openapi/v2", headers={"Accept": "application/yaml"}) as response:
        assert response.status == 406


async def test_dry_runs_are_validated_and_answered_but_store_nothing_and_emit_no_watch_event(api: Any) -> None:
    _, session = api
    status, _, _ = await call(session, "POST", NPUINF, tiny())
    assert status in (200, 201)
    events: list[dict[str, Any]] = []
    async with session.get(NPUINF, params={"watch": "true"}) as watch:

        async def read() -> None:
            async for line in watch.content:
                if line.strip():
                    events.append(json.loads(line))

        reader = asyncio.create_task(read())
        status, created, _ = await call(session, "POST", NPUINF + "?dryRun=All", tiny("dry"))
        assert status == 201 and created["metadata"]["name"] == "dry" and created["spec"]["replicas"] == 1
        status, answer, _ = await call(session, "POST", NPUINF + "?dryRun=All", {**tiny("bad"), "spec": {}})
        assert status == 422 and "'model' is a required property" in answer["message"]
        patch = {"spec": {"replicas": 3}}
        status, patched, _ = await call(
            session, "PATCH", NPUINF + "/tiny-llama?dryRun=All", patch, "application/merge-patch+json"
        )
        assert status == 200 and patched["spec"]["replicas"] == 3
        status, _, _ = await call(session, "PUT", NPUINF + "/tiny-llama?dryRun=All", {**tiny(), "spec": {}})
        assert status == 422
        status, _, _ = await call(
            session, "DELETE", NPUINF + "/tiny-llama", {"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]}
        )
        assert status == 200
        # a real change as the last event: everything before it was seen by then
        await call(
            session,
            "PATCH",
            NPUINF + "/tiny-llama",
            {"metadata": {"labels": {"x": "y"}}},
            "application/merge-patch+json",
        )
        for _ in range(50):
            if any(e["type"] == "MODIFIED" for e in events):
                break
            await asyncio.sleep(0.05)
        reader.cancel()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "tiny-llama"),
        ("MODIFIED", "tiny-llama"),
    ]
    assert events[-1]["object"]["spec"]["replicas"] == 1
    status, _, _ = await call(session, "GET", NPUINF + "/dry")
    assert status == 404
    status, _, _ = await call(session, "GET", NPUINF + "/tiny-llama?dryRun=All")  # reads ignore it
    assert status == 200


async def test_unknown_fields_are_refused_when_strict_and_otherwise_dropped_with_a_warning(api: Any) -> None:
    _, session = api
    typo = tiny("typo")
    typo["spec"]["grph"] = {"mode": "NONE"}
    typo["metadata"]["labelz"] = {}
    status, answer, _ = await call(session, "POST", NPUINF + "?fieldValidation=Strict", typo)
    assert status == 400 and answer["reason"] == "BadRequest"
    assert 'strict decoding error: unknown field "metadata.labelz", unknown field "spec.grph"' in answer["message"]
    status, stored, response = await call(session, "POST", NPUINF, typo)
    assert status in (200, 201) and "grph" not in stored["spec"] and "labelz" not in stored["metadata"]
    assert response.headers.getall("Warning") == [
        '299 - "unknown field \\"metadata.labelz\\""',
        '299 - "unknown field \\"spec.grph\\""',
    ]
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "imag": "x"}]}}},
    }
    status, answer, _ = await call(
        session, "POST", "/apis/apps/v1/namespaces/default/deployments?fieldValidation=Strict", deployment
    )
    assert status == 400 and 'unknown field "spec.template.spec.containers[0].imag"' in answer["message"]
    deployment["spec"]["template"]["spec"]["containers"][0] = {"name": "c", "image": "x"}
    await call(session, "POST", "/apis/apps/v1/namespaces/default/deployments", deployment)
    # kubectl apply's strategic-merge patch: its directives are no unknown fields
    smp = {
        "spec": {
            "template": {
                "spec": {"$setElementOrder/containers": [{"name": "c"}], "containers": [{"name": "c", "image": "y"}]}
            }
        }
    }
    status, patched, _ = await call(
        session,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d?fieldValidation=Strict",
        smp,
        "application/strategic-merge-patch+json",
    )
    assert status == 200 and patched["spec"]["template"]["spec"] == {"containers": [{"name": "c", "image": "y"}]}


async def test_put_replaces_the_object_and_refuses_a_stale_resource_version(api: Any) -> None:
    _, session = api
    _, created, _ = await call(session, "POST", NPUINF, tiny())
    replacement = {**created, "spec": {**created["spec"], "replicas": 2}}
    replacement["metadata"] = {**created["metadata"], "labels": {"team": "a"}}
    status, replaced, _ = await call(session, "PUT", NPUINF + "/tiny-llama", replacement)
    assert status == 200 and replaced["spec"]["replicas"] == 2 and replaced["metadata"]["labels"] == {"team": "a"}
    assert replaced["metadata"]["generation"] == 2
    status, answer, _ = await call(session, "PUT", NPUINF + "/tiny-llama", replacement)  # the old resourceVersion
    assert status == 409 and answer["reason"] == "Conflict"


async def test_the_scale_subresource_reads_and_writes_an_autoscaling_v1_scale(api: Any) -> None:
    _, session = api
    await call(session, "POST", NPUINF, tiny())
    await call(
        session,
        "PATCH",
        NPUINF + "/tiny-llama/status",
        {"status": {"replicas": 1, "selector": "inference.npu.dev/name=tiny-llama"}},
        "application/merge-patch+json",
    )
    status, scale, _ = await call(session, "GET", NPUINF + "/tiny-llama/scale")
    assert status == 200
    assert (scale["apiVersion"], scale["kind"], scale["spec"], scale["status"]) == (
        "autoscaling/v1",
        "Scale",
        {"replicas": 1},
        {"replicas": 1, "selector": "inference.npu.dev/name=tiny-llama"},
    )
    status, scale, _ = await call(
        session, "PATCH", NPUINF + "/tiny-llama/scale", {"spec": {"replicas": 3}}, "application/merge-patch+json"
    )
    assert status == 200 and scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    status, scale, _ = await call(session, "PUT", NPUINF + "/tiny-llama/scale", {**scale, "spec": {"replicas": 4}})
    assert status == 200 and scale["spec"]["replicas"] == 4
    _, obj, _ = await call(session, "GET", NPUINF + "/tiny-llama")
    assert obj["spec"]["replicas"] == 4 and obj["metadata"]["generation"] == 3
    status, answer, _ = await call(
        session, "PATCH", NPUINF + "/tiny-llama/scale", {"spec": {"replicas": -1}}, "application/merge-patch+json"
    )
    assert status == 422 and "spec.replicas" in answer["message"]


async def test_field_selectors_filter_lists_and_watches(api: Any) -> None:
    _, session = api
    for name in ("a", "b"):
        await call(session, "POST", NPUINF, tiny(name))
    _, listed, _ = await call(session, "GET", NPUINF + "?fieldSelector=metadata.name%3Db")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["b"]
    _, listed, _ = await call(session, "GET", NPUINF + "?fieldSelector=metadata.name!%3Db,metadata.namespace%3Ddefault")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a"]
    status, _, _ = await call(session, "GET", NPUINF + "?fieldSelector=metadata.name")
    assert status == 400


async def test_lists_come_in_chunks_in_key_order_with_a_continue_token_and_a_label_selector(api: Any) -> None:
    """As kube-apiserver pages a list (`limit`, `continue`; staging/src/k8s.io/apiserver/pkg/storage/continue.go):
    at most `limit` items, in key order, a token while more remain, the first chunk's resourceVersion
    throughout; the label selector applies before the chunking, so every chunk is full."""
    _, session = api
    for name in ("e", "a", "d", "c", "b", "f"):
        manifest = tiny(name)
        manifest["metadata"]["labels"] = {"team": "ours" if name != "c" else "theirs"}
        await call(session, "POST", NPUINF, manifest)
    names: list[str] = []
    chunks: list[int] = []
    versions: set[str] = set()
    token = ""
    while True:
        query = "?limit=2&labelSelector=team%3Dours" + (f"&continue={token}" if token else "")
        status, listed, _ = await call(session, "GET", NPUINF + query)
        assert status == 200
        names += [item["metadata"]["name"] for item in listed["items"]]
        chunks.append(len(listed["items"]))
        versions.add(listed["metadata"]["resourceVersion"])
        token = listed["metadata"].get("continue", "")
        if not token:
            assert "remainingItemCount" not in listed["metadata"]
            break
        assert listed["metadata"]["remainingItemCount"] == 5 - len(names)
    assert names == ["a", "b", "d", "e", "f"] and chunks == [2, 2, 1] and len(versions) == 1
    _, whole, _ = await call(session, "GET", NPUINF)
    assert [item["metadata"]["name"] for item in whole["items"]] == ["a", "b", "c", "d", "e", "f"]
    assert "continue" not in whole["metadata"]
    status, _, _ = await call(session, "GET", NPUINF + "?limit=2&continue=not-a-token")
    assert status == 400


async def test_watches_are_json_and_a_streaming_list_ends_its_initial_events_with_a_bookmark(api: Any) -> None:
    _, session = api
    await call(session, "POST", NPUINF, tiny())
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    async with session.get(NPUINF, params=params) as watch:
        assert watch.content_type == "application/json"
        added = json.loads(await watch.content.readline())
        bookmark = json.loads(await watch.content.readline())
    assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "tiny-llama")
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_namespaces_are_a_cluster_scoped_resource_with_the_usual_ones(api: Any) -> None:
    _, session = api
    _, listed, _ = await call(session, "GET", "/api/v1/namespaces")
    assert {"default", "kube-system"} <= {ns["metadata"]["name"] for ns in listed["items"]}
    status, created, _ = await call(
        session, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    )
    assert status in (200, 201) and created["status"] == {"phase": "Active"}
    status, fetched, _ = await call(session, "GET", "/api/v1/namespaces/team-a")
    assert status == 200 and fetched["metadata"]["uid"] == created["metadata"]["uid"]
    assert "namespace" not in fetched["metadata"]


async def test_a_watch_from_a_resource_version_sees_a_deleted_object_as_deleted(api: Any) -> None:
    """A watch resumed after a pod was deleted gets a DELETED event, not a 500 (kmock soft-deletes)."""
    cluster, session = api
    pods = "/api/v1/pods"  # cluster-wide, as the operator watches them
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gone", "namespace": "default"}}
    pod["spec"] = {"containers": [{"name": "c", "image": "x"}]}
    _, listed, _ = await call(session, "GET", pods)
    await cluster.create(pod, "pods")
    await cluster.delete("v1", "pods", "default", "gone")
    version = listed["metadata"]["resourceVersion"]
    params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "1"}
    async with session.get(pods, params=params) as watch:
        assert watch.status == 200
        events = [json.loads(line) async for line in watch.content if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "gone")]


async def test_one_object_is_found_by_its_key_not_by_a_scan_of_every_object(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kmock 0.8 scans every stored object for each get, create, update and delete; the emulator
    looks the one object up by its key (a scan per request made a benchmark's fleet quadratic)."""
    cluster, session = api
    assert hasattr(kmock.KubernetesEmulator, "_KubernetesEmulator__get_obj")  # what the emulator replaces
    for index in range(20):
        meta = {"name": f"c{index}", "namespace": "default"}
        await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}, "configmaps")
    scans: list[Any] = []
    scan = kmock.KubernetesEmulator._KubernetesEmulator__get_objs  # type: ignore[attr-defined]

    def counted(*args: Any, **kwargs: Any) -> Any:
        scans.append(args)
        return scan(*args, **kwargs)

    monkeypatch.setattr(kmock.KubernetesEmulator, "_KubernetesEmulator__get_objs", counted)
    created = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new", "namespace": "default"}}
    await cluster.create(created, "configmaps")
    assert (await cluster.get("v1", "configmaps", "default", "c7") or {})["metadata"]["name"] == "c7"
    assert await cluster.get("v1", "configmaps", "default", "none") is None
    await cluster.patch("v1", "configmaps", "default", "c3", {"data": {"a": "b"}})
    await cluster.delete("v1", "configmaps", "default", "c4")
    assert scans == []
    status, listed, _ = await call(session, "GET", "/api/v1/namespaces/default/configmaps")
    assert status == 200 and len(listed["items"]) == 20  # a list is still kmock's own
    assert len(scans) == 1


async def test_open_watches_are_not_walked_by_every_later_request(api: Any) -> None:
    """kmock matches each request against each reaction by walking its requests in flight; a watch
    leaves that list once routed, so ten open watches cost a later request nothing."""
    cluster, session = api
    emulator = cluster.emulator
    params = {"watch": "true", "timeoutSeconds": "30"}
    streams = [await session.get("/api/v1/namespaces/default/configmaps", params=params) for _ in range(10)]
    try:
        assert all(stream.status == 200 for stream in streams)
        assert emulator._requests == []  # kmock's list of requests in flight
        created = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seen", "namespace": "default"}}
        await cluster.create(created, "configmaps")
        for stream in streams:  # and every watch still streams
            line = await asyncio.wait_for(stream.content.readline(), 5)
            assert json.loads(line)["object"]["metadata"]["name"] == "seen"
    finally:
        for stream in streams:
            stream.close()


async def test_an_object_created_for_a_deleted_owner_is_collected(api: Any) -> None:
    """The garbage collector deletes what a controller made from a stale read after its owner went."""
    cluster, _ = api
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "gone", "uid": "no-such-uid", "controller": True}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orphan", "namespace": "default", "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    await cluster.create(pod, "pods")
    assert await cluster.get("v1", "pods", "default", "orphan") is None


async def test_an_object_a_server_side_apply_creates_for_a_deleted_owner_is_collected(api: Any) -> None:
    """The same for an apply that creates the object (201): how the operator writes its children."""
    cluster, session = api
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "no-such-uid", "controller": True}
    applied = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late", "ownerReferences": [owner]}}
    path = "/api/v1/namespaces/default/configmaps/late?fieldManager=test"
    status, _, _ = await call(session, "PATCH", path, applied, "application/apply-patch+yaml")
    assert status == 201
    assert await cluster.get("v1", "configmaps", "default", "late") is None


async def test_an_object_created_for_a_living_owner_stays_and_one_for_a_recreated_owner_goes(api: Any) -> None:
    """The owner is found by its reference (kind, name, the dependent's namespace) and must have its uid."""
    cluster, _ = api
    living = await cluster.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": "default"}}, "configmaps"
    )
    uid = living["metadata"]["uid"]

    def owned(name: str, owner_uid: str) -> dict[str, Any]:
        reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "ownerReferences": [reference]},
        }

    await cluster.create(owned("kept", uid), "configmaps")
    assert await cluster.get("v1", "configmaps", "default", "kept") is not None
    await cluster.create(owned("stale", "the-uid-of-an-earlier-owner"), "configmaps")  # same name, another uid
    assert await cluster.get("v1", "configmaps", "default", "stale") is None

"""The emulator's server-side apply, over HTTP with the operator's own client: what ownership it keeps.

Faithful (and tested here): an apply creates or merges, records its fields as the manager's, removes
a field the manager no longer applies, leaves fields of other managers alone, answers 409 on a
conflict unless forced, and a non-apply write takes the fields it changes from their manager.
Simplified (see npu_sandbox.apiserver.fields): lists are atomic; the status subresource is not tracked.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import kopf
import pytest
from npu_operator.kube.client import FIELD_MANAGER, ApiError, KubeClient, Resource, connection_info
from npu_sandbox.cluster import LocalCluster

SERVICES = Resource("", "v1", "services", "Service")


def service(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "default"}, "spec": spec}


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


async def test_apply_creates_merges_removes_and_leaves_others_alone(cluster: LocalCluster) -> None:
    client = KubeClient(lambda: connection_info(kopf.OperatorSettings()))
    try:
        created = await client.apply(SERVICES, "default", service(ports=[{"port": 80}], selector={"a": "1", "b": "2"}))
        assert created["metadata"]["uid"] and created["spec"]["selector"] == {"a": "1", "b": "2"}
        assert managers(created)[(FIELD_MANAGER, "Apply")]["f:spec"]["f:selector"] == {"f:a": {}, "f:b": {}}

        # Another writer (a merge patch from the tests' client) adds a field and changes one of ours.
        await cluster.patch("v1", "services", "default", "s", {"spec": {"type": "NodePort", "ports": [{"port": 81}]}})
        edited = await cluster.get("v1", "services", "default", "s")
        assert edited is not None
        other = next(fields for (who, _), fields in managers(edited).items() if who != FIELD_MANAGER)
        assert other["f:spec"] == {"f:ports": {}, "f:type": {}}
        assert "f:ports" not in managers(edited)[(FIELD_MANAGER, "Apply")]["f:spec"]

        # We stop setting selector.b and take the ports back (forced); their `type` stays.
        again = await client.apply(SERVICES, "default", service(ports=[{"port": 80}], selector={"a": "1"}))
        assert again["spec"] == {"ports": [{"port": 80}], "selector": {"a": "1"}, "type": "NodePort"}
        assert again["metadata"]["generation"] == 3
        assert "f:ports" not in next(f for (w, _), f in managers(again).items() if w != FIELD_MANAGER)["f:spec"]

        # Applying the same thing again changes nothing but the resourceVersion.
        same = await client.apply(SERVICES, "default", service(ports=[{"port": 80}], selector={"a": "1"}))
        assert same["spec"] == again["spec"] and same["metadata"]["generation"] == 3
    finally:
        await client.close()


async def test_an_unforced_apply_conflicting_with_another_manager_is_refused(cluster: LocalCluster) -> None:
    await cluster.create(service(ports=[{"port": 80}]), "services")
    async with cluster._session.patch(  # type: ignore[union-attr]
        cluster.url + "/api/v1/namespaces/default/services/s?fieldManager=someone",
        json=service(ports=[{"port": 90}]),
        headers={"Content-Type": "application/apply-patch+yaml"},
    ) as response:
        assert response.status == 409
        assert 'conflict with "npu-sandbox"' in (await response.json())["message"]


async def test_the_client_maps_errors_and_404s(cluster: LocalCluster) -> None:
    client = KubeClient(lambda: connection_info(kopf.OperatorSettings()))
    try:
        assert await client.get(SERVICES, "default", "absent") is None
        await client.delete(SERVICES, "default", "absent")  # already gone: fine
        with pytest.raises(ApiError) as caught:
            await client.apply(SERVICES, "default", {**service(), "metadata": {"name": "other"}, "kind": ""})
        assert caught.value.status == 400 and not caught.value.transient
    finally:
        await client.close()


async def test_concurrent_callers_share_one_discovery_request(cluster: LocalCluster) -> None:
    # Every worker's first tick asks whether PodMonitors are served at once after a start.
    pod_monitors = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
    client = KubeClient(lambda: connection_info(kopf.OperatorSettings()))
    try:
        before = len(cluster.emulator.history)
        answers = await asyncio.gather(*(client.serves(pod_monitors) for _ in range(20)))
        asked = [r for r in cluster.emulator.history[before:] if r.url.path == pod_monitors.group_version_path]
        assert answers == [False] * 20 and len(asked) == 1
        assert await client.serves(pod_monitors) is False  # from the cache, no request
        assert len(cluster.emulator.history) == before + 1
    finally:
        await client.close()


async def test_a_discovery_answer_that_changed_is_announced(cluster: LocalCluster) -> None:
    # The operator wakes every worker then: a quiet worker sleeps until something wakes it.
    pod_monitors = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
    changes: list[bool] = []
    login = lambda: connection_info(kopf.OperatorSettings())  # noqa: E731
    client = KubeClient(login, discovery_seconds=0.0, on_served_change=lambda: changes.append(True))
    try:
        assert await client.serves(pod_monitors) is False
        assert await client.serves(pod_monitors) is False and changes == []  # asked again: the same answer
        cluster.emulator.serve_pod_monitors()  # the prometheus-operator's CRDs are installed
        assert await client.serves(pod_monitors) is True and changes == [True]
        assert await client.serves(pod_monitors) is True and changes == [True]
    finally:
        await client.close()


@pytest.mark.parametrize("trust_env", [False, True])
async def test_the_environments_proxy_is_used_as_kopfs_connection_says(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, trust_env: bool
) -> None:
    # A proxy nobody listens on: the request only reaches the API server without it.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    info = dataclasses.replace(connection_info(kopf.OperatorSettings()), trust_env=trust_env)
    client = KubeClient(lambda: info)
    try:
        if trust_env:
            with pytest.raises(ApiError, match="Cannot connect"):
                await client.get(SERVICES, "default", "absent")
        else:
            assert await client.get(SERVICES, "default", "absent") is None
    finally:
        await client.close()

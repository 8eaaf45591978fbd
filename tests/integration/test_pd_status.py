"""A disaggregated resource's status per role: the real operator over HTTP, through the chain
DisaggregatedSet -> role LeaderWorkerSets -> StatefulSets -> pods.

The sandbox's DisaggregatedSet stand-in (`npu_sandbox.controllers.disaggregated`, after LeaderWorkerSet
v0.10's controller) makes the role LeaderWorkerSets; the LeaderWorkerSet side is played as in
`test_lws_ranks` (its StatefulSets and pods, LeaderWorkerSet v0.10's labels and owners), each pod's
runtime a `FakeRuntimes` answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from npu_operator.kube.objects import condition
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.controllers import disaggregated
from npu_sandbox.controllers import workloads as controllers

from tests.examples import example
from tests.integration.test_faults import HOSTILE, FakeRuntimes, report
from tests.integration.test_lws_ranks import NS, Controlled, LeaderWorkerSetController, controlled_cluster, status_when

NAME = "tiny-llama-pd"
KINDS = {"leaderworkersets": "leaderworkerset.x-k8s.io/v1", disaggregated.SCALER_PLURAL: disaggregated.API_VERSION}
CAPTURE_FAILED = {
    "from_mode": "FULL_DECODE_ONLY",
    "to_mode": "NONE",
    "reason": "CaptureFailed",
    "message": "capture of size 4 failed",
    "stage": "engine",
}


@pytest.fixture
async def pd_cluster() -> AsyncIterator[Controlled]:
    async with controlled_cluster(disaggregated_sets=True) as controlled:
        yield controlled


async def role_sets(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """One round of the DisaggregatedSet stand-in; its role LeaderWorkerSets by role."""
    ds = await cluster.get(disaggregated.API_VERSION, disaggregated.PLURAL, NS, NAME)
    assert ds is not None
    await disaggregated.reconcile(cluster, await controllers.read_snapshot(cluster, NS, KINDS), ds)
    found = await cluster.list_objects("leaderworkerset.x-k8s.io/v1", "leaderworkersets", NS)
    return {
        o["metadata"]["labels"][disaggregated.ROLE_LABEL]: o
        for o in found
        if disaggregated.ROLE_LABEL in o["metadata"]["labels"]
    }


def role_graph(obj: dict[str, Any], role: str) -> dict[str, Any]:
    graph: dict[str, Any] = obj["status"].get("graph", {}).get("roles", {}).get(role, {})
    return graph


def one_node(mode: str, **extra: Any) -> Any:
    return report(mode, node={"rank": 0, "nodes": 1, "data_parallel_ranks": [0]}, **extra)


async def test_each_role_is_read_through_its_chain_and_shown_with_an_event_naming_it(
    pd_cluster: tuple[LocalCluster, LeaderWorkerSetController, FakeRuntimes],
) -> None:
    cluster, controller, runtimes = pd_cluster
    manifest = example("sandbox-cpu-pd.yaml")
    await cluster.apply_npu_inference(manifest)
    await cluster.wait_for(
        lambda: cluster.get(disaggregated.API_VERSION, disaggregated.PLURAL, NS, NAME), what="the DisaggregatedSet"
    )
    roles = await role_sets(cluster)
    assert sorted(roles) == ["decode", "prefill"]
    for role, lws in roles.items():  # what the controller made: name, our labels, its owner
        meta = lws["metadata"]
        assert meta["name"].startswith(f"{NAME}-0-") and meta["name"].endswith(f"-{role}")
        assert (
            meta["labels"]["inference.npu.dev/name"] == NAME
            and meta["ownerReferences"][0]["kind"] == "DisaggregatedSet"
        )
    # Someone else's LeaderWorkerSet with our labels and a role label: never read.
    foreign = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "other", "namespace": NS, "labels": roles["decode"]["metadata"]["labels"]},
        "spec": roles["decode"]["spec"],
    }
    foreign = await cluster.create(foreign, "leaderworkersets")
    foreign_ports = await controller.make_group(foreign, 0, [HOSTILE])

    await controller.make_group(roles["prefill"], 0, [one_node("NONE")])
    await controller.make_group(roles["decode"], 0, [one_node("NONE", downgrades=[CAPTURE_FAILED])])
    await controller.report(ready=1, name=roles["decode"]["metadata"]["name"])
    obj = await status_when(
        cluster, lambda o: role_graph(o, "decode").get("effectiveMode") == "NONE", "decode's graph", name=NAME
    )
    assert condition(obj, "Ready")["status"] == "False", "no prefill replica is ready yet"
    await controller.report(ready=1, name=roles["prefill"]["metadata"]["name"])
    await asyncio.sleep(3)  # a few ticks: the router is not ready yet, so neither is the resource
    obj = await status_when(cluster, lambda o: bool(o.get("status")), "a status", name=NAME)
    assert condition(obj, "Ready")["status"] == "False", "the router (the endpoint) is not ready"
    router = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}  # as its controller
    await cluster.patch("apps/v1", "deployments", NS, NAME, {"status": router}, subresource="status")
    obj = await status_when(cluster, lambda o: condition(o, "Ready").get("status") == "True", "Ready", name=NAME)
    graph = obj["status"]["graph"]
    assert graph["requestedMode"] == "FULL_DECODE_ONLY" and graph["effectiveMode"] == "NONE"
    prefill, decode = role_graph(obj, "prefill"), role_graph(obj, "decode")
    assert (prefill["requestedMode"], prefill["effectiveMode"]) == ("NONE", "NONE") and "downgrades" not in prefill
    assert decode["requestedMode"] == "FULL_DECODE_ONLY" and decode["downgrades"][0]["reason"] == "CaptureFailed"
    assert decode["ranks"][0]["pod"] == f"{roles['decode']['metadata']['name']}-0"
    assert all(runtimes.hits.get(port, 0) == 0 for port in foreign_ports)
    messages = [
        e["message"]
        for e in await cluster.list_objects("v1", "events", NS)
        if e.get("involvedObject", {}).get("name") == NAME and e.get("reason") == "GraphModeDowngraded"
    ]
    decode_pod = f"{roles['decode']['metadata']['name']}-0"
    assert len(messages) == 1, messages
    assert messages[0].startswith(
        f"role decode, group 0 node 0 (pod {decode_pod}): FULL_DECODE_ONLY -> NONE (CaptureFailed"
    )


async def scale_of(cluster: LocalCluster, api_version: str, plural: str, name: str) -> dict[str, Any]:
    found = await cluster.get(api_version, plural, NS, f"{name}/scale")
    assert found is not None and found["kind"] == "Scale"
    return found


async def test_each_role_scales_through_its_own_scale_target(
    pd_cluster: tuple[LocalCluster, LeaderWorkerSetController, FakeRuntimes],
) -> None:
    """decode through the NPUInference's /scale, prefill through the DisaggregatedSetRoleScaler that
    LeaderWorkerSet's controller makes for its External role: each /scale read and written as KEDA's HPA
    does, and the role's LeaderWorkerSet following it."""
    cluster, _, _ = pd_cluster
    manifest = example("sandbox-cpu-pd.yaml")
    manifest["spec"]["autoscaling"] = {"maxReplicas": 3}
    manifest["spec"]["metrics"] = {"podMonitor": {"enabled": True}}
    await cluster.apply_npu_inference(manifest)
    ds = await cluster.wait_for(
        lambda: cluster.get(disaggregated.API_VERSION, disaggregated.PLURAL, NS, NAME), what="the DisaggregatedSet"
    )
    assert {r["name"]: r.get("scaling") for r in ds["spec"]["roles"]} == {
        "prefill": {"mode": "External"},
        "decode": None,
    }
    roles = await role_sets(cluster)
    scaler_name = f"{NAME}-prefill"
    scaler = await cluster.get(disaggregated.API_VERSION, disaggregated.SCALER_PLURAL, NS, scaler_name)
    assert scaler is not None and scaler["spec"] == {"replicas": 1}, "seeded with 1 for a new role"
    assert scaler["metadata"]["ownerReferences"][0]["kind"] == "DisaggregatedSet"
    assert roles["prefill"]["spec"]["replicas"] == 1 and roles["decode"]["spec"]["replicas"] == 1

    # The prefill role: KEDA's HPA writes the scaler's /scale; the role's LeaderWorkerSet follows.
    scale = await scale_of(cluster, disaggregated.API_VERSION, disaggregated.SCALER_PLURAL, scaler_name)
    assert scale["spec"]["replicas"] == 1
    await cluster.patch(
        disaggregated.API_VERSION,
        disaggregated.SCALER_PLURAL,
        NS,
        scaler_name,
        {"spec": {"replicas": 2}},
        subresource="scale",
    )
    roles = await role_sets(cluster)
    assert roles["prefill"]["spec"]["replicas"] == 2 and roles["decode"]["spec"]["replicas"] == 1
    # ... and reads back what the role runs (LeaderWorkerSet groups) and the leaders' selector.
    prefill_lws = roles["prefill"]["metadata"]["name"]
    await cluster.patch(
        "leaderworkerset.x-k8s.io/v1",
        "leaderworkersets",
        NS,
        prefill_lws,
        {"status": {"replicas": 2}},
        subresource="status",
    )
    await role_sets(cluster)
    scale = await scale_of(cluster, disaggregated.API_VERSION, disaggregated.SCALER_PLURAL, scaler_name)
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == (
        f"disaggregatedset.x-k8s.io/name={NAME},disaggregatedset.x-k8s.io/role=prefill,"
        "leaderworkerset.sigs.k8s.io/worker-index=0"
    )
    # The operator does not fight it: its DisaggregatedSet leaves the External role's replicas alone.
    await asyncio.sleep(1)
    roles = await role_sets(cluster)
    assert roles["prefill"]["spec"]["replicas"] == 2

    # The decode role: the resource's own /scale, as for any resource.
    scale = await scale_of(cluster, "inference.npu.dev/v1alpha1", "npuinferences", NAME)
    assert scale["spec"]["replicas"] == 1
    await cluster.patch(
        "inference.npu.dev/v1alpha1", "npuinferences", NS, NAME, {"spec": {"replicas": 2}}, subresource="scale"
    )

    async def decode_scaled() -> dict[str, Any] | None:
        found = await cluster.get(disaggregated.API_VERSION, disaggregated.PLURAL, NS, NAME)
        replicas = {r["name"]: r["spec"].get("replicas") for r in (found or {}).get("spec", {}).get("roles", ())}
        return found if replicas.get("decode") == 2 else None

    await cluster.wait_for(decode_scaled, what="the decode role at 2")
    roles = await role_sets(cluster)
    assert roles["decode"]["spec"]["replicas"] == 2 and roles["prefill"]["spec"]["replicas"] == 2

"""A resource no node can run, on the sandbox's nodes: the real operator says what was asked and what
the nodes offer, within one status interval.

The cluster's Node objects are the sandbox's per cluster profile (`npu_sandbox.node.scheduler`): the
sandbox's controllers make the Deployment's pods and its kubelet refuses them as kube-scheduler
does (PodScheduled False/Unschedulable, a FailedScheduling Event), so no engine ever starts. With
node discovery the operator reads the Nodes and names their NPU resource; without it, it says what
the scheduler said.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_operator.kube import client
from npu_operator.kube.objects import condition
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.node.scheduler import PROFILE_NODES, register_nodes

from tests.examples import SANDBOX_HOST_PATHS, example

NS = "default"
NAME = "tiny-llama"
INTERVAL = 4.0  # the operator's resync and status interval here
# What a busy machine adds to one interval: the API's round trips, the kopf event loop's turn.
SLACK = 4.0
CONFIG = OperatorConfig(
    resync_seconds=INTERVAL,
    status_poll_seconds=INTERVAL,
    status_timeout_seconds=1.0,
    metrics_port=0,
    health_port=0,
    allowed_host_paths=SANDBOX_HOST_PATHS,
)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, LocalKubelet]]:
    async with LocalCluster() as local:
        kubelet = LocalKubelet(local, NS, workdir=tmp_path / "pods", interval=0.2)
        await kubelet.start()
        try:
            yield local, kubelet
        finally:
            await kubelet.stop()


def manifest() -> dict[str, Any]:
    document = example("sandbox-cpu.yaml")
    document["spec"]["npu"] = {"count": 1}  # an NPU asked of a node, by the operator's cluster profile
    return document


async def refused_pod(cluster: LocalCluster) -> tuple[float, dict[str, Any]]:
    """When the first pod was seen refused by the kubelet, and its PodScheduled condition."""

    async def refused() -> Any:
        for pod in await cluster.list_objects("v1", "pods", NS):
            scheduled = condition(pod, "PodScheduled")
            if scheduled.get("reason") == "Unschedulable":
                return dict(scheduled)
        return None

    scheduled = await cluster.wait_for(refused, within=30, what="a pod refused by the kubelet")
    return time.monotonic(), scheduled


async def degraded(cluster: LocalCluster, reason: str, within: float) -> dict[str, Any]:
    async def probe() -> Any:
        obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
        found = condition(obj or {}, "Degraded")
        return dict(found) if found.get("status") == "True" and found.get("reason") == reason else None

    found: dict[str, Any] = await cluster.wait_for(probe, within=within, interval=0.05, what=f"Degraded {reason}")
    return found


@pytest.mark.parametrize(
    ("profile", "node", "asked", "offered", "hint"),
    [
        ("ascend-docker-runtime", "cce", "huawei.com/Ascend910", "huawei.com/ascend-1980", "npu.clusterProfile=cce"),
        ("cce", "ascend-docker-runtime", "huawei.com/ascend-1980", "huawei.com/Ascend910", "npu.clusterProfile="),
    ],
)
async def test_no_node_offers_the_npu_resource_asked(
    cluster: tuple[LocalCluster, LocalKubelet], profile: str, node: str, asked: str, offered: str, hint: str
) -> None:
    local, _ = cluster
    await register_nodes(local, [PROFILE_NODES[node], PROFILE_NODES["cpu"]])
    await local.start_operator(dataclasses.replace(CONFIG, cluster_profile=profile))
    applied = time.monotonic()
    await local.apply_npu_inference(manifest())
    seen, _ = await refused_pod(local)
    found = await degraded(local, "NoNodeOffersNPUs", within=3 * INTERVAL + 3 * SLACK)
    now = time.monotonic()
    took = now - seen
    print(f"\n{profile}: {now - applied:.2f} s after the apply, {took:.2f} s after the pod's refusal was seen:")
    print(f"Degraded/{found['reason']}: {found['message']}")
    assert found["message"].startswith(f"asks {asked}: 1 per pod; the nodes offer {offered} (1 node, up to 8); ")
    assert hint in found["message"]
    assert took <= INTERVAL + SLACK  # within one status interval (and the API's round trips)
    obj = await local.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
    assert obj is not None and obj["status"]["phase"] == "Degraded" and obj["status"]["reason"] == "NoNodeOffersNPUs"

    async def warned() -> Any:
        events = await local.list_objects("v1", "events", NS)
        return [
            e
            for e in events
            if e["involvedObject"].get("kind") == "NPUInference" and e.get("reason") == "NoNodeOffersNPUs"
        ]

    (event,) = await local.wait_for(warned, within=10, what="the Warning Event")
    assert event["type"] == "Warning" and event["message"] == found["message"]


async def test_without_node_discovery_the_scheduler_verdict_names_the_resource(
    cluster: tuple[LocalCluster, LocalKubelet],
) -> None:
    local, _ = cluster
    await register_nodes(local, [PROFILE_NODES["cce"], PROFILE_NODES["cpu"]])
    await local.start_operator(dataclasses.replace(CONFIG, node_discovery=False))
    applied = time.monotonic()
    await local.apply_npu_inference(manifest())
    seen, scheduled = await refused_pod(local)
    found = await degraded(local, "InsufficientNPU", within=3 * INTERVAL + 3 * SLACK)
    now = time.monotonic()
    took = now - seen
    print(f"\nno node discovery: {now - applied:.2f} s after the apply, {took:.2f} s after the refusal was seen:")
    print(f"Degraded/{found['reason']}: {found['message']}")
    assert f"asks huawei.com/Ascend910: 1 per pod; the scheduler: {scheduled['message']}" in found["message"]
    assert "0/2 nodes are available: 2 Insufficient huawei.com/Ascend910." in found["message"]
    assert took <= INTERVAL + SLACK
    # The operator asked nothing of the Nodes (the kubelet does, each round).
    asked = [r for r in local.emulator.history if r.url.path.startswith("/api/v1/nodes")]
    assert asked and not [r for r in asked if r.headers.get("User-Agent") == client.USER_AGENT]

"""The whole loop on this machine: the operator, the API emulator, and a real `npu-runtime serve` on CPU.

The test plays the kubelet (npu_sandbox.node.kubelet): it starts the Deployment's pod args as a local
process and reports the Pod (its own loopback address as its IP, Ready from /readyz, termination
message on exit). The operator reads the runtime's /status over HTTP and must tell, in the
NPUInference status and Events, what the engine really did.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_operator.kube.objects import condition
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.controllers.workloads import replica_set_owner
from npu_sandbox.node.kubelet import LocalKubelet

from tests.e2e.conftest import engines_progress
from tests.examples import example

NS = "default"
NAME = "tiny-llama"
# The models are hostPath sources in the test's temporary directory: the policy lists it.
CONFIG = OperatorConfig(
    resync_seconds=1.0,
    status_poll_seconds=1.0,
    metrics_port=0,
    health_port=0,
    allowed_host_paths=(tempfile.gettempdir(),),
)


def tiny_manifest(model: Path) -> dict[str, Any]:
    manifest = example("sandbox-cpu.yaml")
    manifest["metadata"]["namespace"] = NS
    manifest["spec"]["model"].update(
        path=str(model), mountPath=str(model.parent), source={"hostPath": {"path": str(model.parent)}}
    )
    return manifest


async def resource(cluster: LocalCluster) -> dict[str, Any]:
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
    assert obj is not None
    return obj


async def events(cluster: LocalCluster, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in await cluster.list_objects("v1", "events", NS)
        if e.get("involvedObject", {}).get("name") == NAME and e.get("reason") == reason
    ]


@pytest.fixture
async def operator() -> AsyncIterator[LocalCluster]:
    async with LocalCluster() as cluster:
        await cluster.start_operator(CONFIG)
        yield cluster
        await cluster.stop_operator()


@contextlib.asynccontextmanager
async def kubelet_for(cluster: LocalCluster, workdir: Path) -> AsyncIterator[LocalKubelet]:
    async def deployment() -> Any:
        return await cluster.get("apps/v1", "deployments", NS, NAME)

    await cluster.wait_for(deployment, what="the operator's Deployment")
    kubelet = LocalKubelet(cluster, NS, NAME, workdir=workdir, environ={"VLLM_CPU_KVCACHE_SPACE": "1"})
    done = asyncio.Event()
    follower = asyncio.create_task(kubelet.follow(done))
    try:
        await kubelet.start_pods()
        yield kubelet
    finally:
        done.set()
        await follower
        codes = await kubelet.stop()
        for pod in kubelet.pods:
            assert pod.process is None or pod.process.returncode is not None, f"{pod.name} left running"
        print(f"kubelet: pods exited with {codes}")


# Its own engine: the in-process operator reads a pod it has not seen before (no earlier report).
@pytest.mark.engine
async def test_the_status_tells_what_the_engine_did(operator: LocalCluster, tiny_model: Path, tmp_path: Path) -> None:
    await operator.apply_npu_inference(tiny_manifest(tiny_model))
    async with kubelet_for(operator, tmp_path) as kubelet:

        async def ready() -> Any:
            obj = await resource(operator)
            graph = obj.get("status", {}).get("graph", {})
            return obj if condition(obj, "Ready").get("status") == "True" and graph.get("downgrades") else None

        try:
            obj = await operator.wait_for(
                ready, interval=1.0, what="Ready with graph facts", progress=engines_progress(kubelet)
            )
        except TimeoutError:
            print(kubelet.pods[0].log_tail())
            raise
        status = obj["status"]
        graph = status["graph"]
        assert status["phase"] == "Ready"
        assert status["ready"] == "1/1"
        assert graph["requestedMode"] == "FULL_DECODE_ONLY"
        assert graph["effectiveMode"] == "NONE"
        assert graph["reportingPods"] == 1
        (downgrade,) = [d for d in graph["downgrades"] if d["stage"] == "plan"]
        assert (downgrade["fromMode"], downgrade["toMode"], downgrade["reason"]) == (
            "FULL_DECODE_ONLY",
            "NONE",
            "CpuHasNoGraphs",
        )
        assert downgrade["pods"] == 1
        assert condition(obj, "Degraded")["status"] == "False"  # onDowngrade: Allow

        # kopf posts Events from its own queue after the status write: wait for each, then count.
        (event,) = await operator.wait_for(lambda: events(operator, "GraphModeDowngraded"), what="the downgrade Event")
        assert event["type"] == "Warning"
        assert event["message"].startswith("FULL_DECODE_ONLY -> NONE (CpuHasNoGraphs, plan stage, 1 pod): ")
        (ready_event,) = await operator.wait_for(lambda: events(operator, "Ready"), what="the Ready Event")
        assert ready_event["type"] == "Normal"

        # Restarting the operator repeats nothing: the status remembers what was announced.
        await operator.stop_operator()
        await operator.start_operator(CONFIG)
        await asyncio.sleep(5 * CONFIG.status_poll_seconds)
        assert len(await events(operator, "GraphModeDowngraded")) == 1
        assert len(await events(operator, "Ready")) == 1
        after = await resource(operator)
        assert after["status"]["graph"]["downgrades"] == graph["downgrades"]


@pytest.mark.engine
async def test_a_runtime_that_cannot_load_its_model_degrades_the_resource(
    operator: LocalCluster, tmp_path: Path
) -> None:
    broken = tmp_path / "models" / "broken"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": ')
    await operator.apply_npu_inference(tiny_manifest(broken))
    async with kubelet_for(operator, tmp_path) as kubelet:
        await asyncio.wait_for(kubelet.pods[0].exited.wait(), timeout=120)
        assert kubelet.pods[0].process is not None and kubelet.pods[0].process.returncode != 0

        async def degraded() -> Any:
            obj = await resource(operator)
            return obj if condition(obj, "Degraded").get("status") == "True" else None

        obj = await operator.wait_for(degraded, within=30)
        found = condition(obj, "Degraded")
        assert found["reason"] == "ModelLoadFailed"
        assert "ModelInvalid" in found["message"]
        assert obj["status"]["phase"] == "Degraded"
        assert obj["status"]["reason"] == "ModelLoadFailed"

        async def warning() -> Any:
            return await events(operator, "ModelLoadFailed")

        (event,) = await operator.wait_for(warning)
        assert event["type"] == "Warning"


async def test_a_capture_oom_termination_message_is_graph_capture_failed(operator: LocalCluster) -> None:
    """The kubelet's side only: a Pod whose runtime ended with the capture-OOM cause (no NPU here)."""
    manifest = example("sandbox-cpu.yaml")
    manifest["metadata"]["namespace"] = NS
    await operator.apply_npu_inference(manifest)

    async def deployment() -> Any:
        return await operator.get("apps/v1", "deployments", NS, NAME)

    template = (await operator.wait_for(deployment))["spec"]["template"]
    await operator.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{NAME}-abc-1",
                "namespace": NS,
                "labels": template["metadata"]["labels"],
                "ownerReferences": [await replica_set_owner(operator, NS, NAME)],
            },
            "spec": template["spec"],
        },
        "pods",
    )
    message = (
        "GraphCaptureOutOfMemory: device out of memory while capturing graphs (size 256): "
        "NPU out of memory. Tried to allocate 2.00 GiB"
    )
    await operator.patch(
        "v1",
        "pods",
        NS,
        f"{NAME}-abc-1",
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "runtime",
                        "ready": False,
                        "restartCount": 3,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 1, "message": message}},
                    }
                ],
            }
        },
        subresource="status",
    )
    await operator.patch(
        "apps/v1",
        "deployments",
        NS,
        NAME,
        {
            "status": {
                "observedGeneration": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "readyReplicas": 0,
            }
        },
        subresource="status",
    )

    async def degraded() -> Any:
        obj = await resource(operator)
        return obj if condition(obj, "Degraded").get("reason") == "GraphCaptureFailed" else None

    obj = await operator.wait_for(degraded, within=30)
    assert "GraphCaptureOutOfMemory" in condition(obj, "Degraded")["message"]
    assert obj["status"]["reason"] == "GraphCaptureFailed"

    async def warning() -> Any:
        return await events(operator, "GraphCaptureFailed")

    (event,) = await operator.wait_for(warning)
    assert event["type"] == "Warning"

"""spec.autoscaling in the sandbox, with a real engine and a real Prometheus: the ScaledObject the operator
applies is evaluated as KEDA's Prometheus scaler would (its query, by Prometheus, against the running
engine while requests are in flight), then the resource is scaled to 2 through its scale subresource as
KEDA's HPA would, a second engine comes up, and `kubectl get npuinf` shows 2/2.

KEDA itself cannot run here (no kube-apiserver to host its HPA): the emulator serves the ScaledObject
API, nothing acts on it, and this test plays KEDA's two parts (query, then scale). Two engine starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from npu_operator import crd
from npu_sandbox import prometheus
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.emulator import KubeEmulator
from npu_sandbox.kubelet import LocalKubelet, free_port

from tests.e2e.test_status_loop import CONFIG, ENGINE_STARTUP, NAME, NS, tiny_manifest
from tests.e2e.test_workload_rollout import ready
from tests.operator import traffic_schemas

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".cache" / "k8s-tools" / "bin" / "kubectl"


async def generate(url: str, tokens: int) -> None:
    body = {"model": NAME, "prompt": "Hello", "max_tokens": tokens, "ignore_eos": True}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session,
        session.post(f"{url}/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()


async def instant(server: prometheus.LocalPrometheus, query: str) -> list[Any]:
    result: list[Any] = (await server.api("query", {"query": query}))["result"]
    return result


@pytest.mark.engine
@pytest.mark.timeout(1200)
async def test_the_scaled_objects_query_under_load_then_a_scale_to_two(tiny_model: Path, tmp_path: Path) -> None:
    if prometheus.binary() is None:
        pytest.skip("prometheus not found: install Debian's prometheus package (scripts/bootstrap does it as root)")
    emulator = KubeEmulator()
    emulator.serve_scaled_objects()
    server = prometheus.LocalPrometheus(tmp_path / "prometheus")
    async with LocalCluster(emulator=emulator) as cluster:
        await cluster.start_operator(CONFIG)
        kubelet = LocalKubelet(cluster, NS, NAME, workdir=tmp_path / "pods", environ={"VLLM_CPU_KVCACHE_SPACE": "1"})
        load: list[asyncio.Task[None]] = []
        try:
            manifest = tiny_manifest(tiny_model)
            manifest["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
            await cluster.apply_npu_inference(manifest)
            (first,) = await kubelet.start_pods()
            await cluster.wait_for(lambda: ready(cluster, 1, 1), within=ENGINE_STARTUP, interval=1.0, what="Ready")

            scaled = await cluster.get("keda.sh/v1alpha1", "scaledobjects", NS, NAME)
            assert scaled is not None, "the operator applies a ScaledObject where KEDA's API is served"
            traffic_schemas.validate_scaled_object(scaled)
            trigger = next(t for t in scaled["spec"]["triggers"] if t["name"] == "running-requests")["metadata"]
            print(f"\nScaledObject trigger: {trigger['query']} (threshold {trigger['threshold']})")

            await server.start([], free_port())
            pod = await cluster.get("v1", "pods", NS, first.name)
            assert pod is not None
            server.set_targets("pods", prometheus.pod_targets(pod, first.ports))
            await server.wait_for_scrapes_after(time.time(), within=60)  # the engine is scraped before the load

            # Requests in flight (as many as the engine's max_num_seqs, 8: all run at once, none wait), and
            # the query KEDA would send, sampled until they are done: Prometheus scrapes every second.
            load = [asyncio.create_task(generate(first.api_url, 240)) for _ in range(8)]
            samples: list[float] = []
            while not all(task.done() for task in load):
                answer = await instant(server, trigger["query"])
                assert len(answer) <= 1, answer  # KEDA's scaler refuses more than one element
                samples.append(float(answer[0]["value"][1]) if answer else 0.0)
                await asyncio.sleep(0.5)
            value, threshold = max(samples), float(trigger["threshold"])
            print(f"running requests by the ScaledObject's query while 8 were in flight: {value:g} (samples {samples})")
            print(
                f"KEDA's HPA (AverageValue) would ask for ceil({value:g} / {threshold:g}) = "
                f"{math.ceil(value / threshold)} replica(s)"
            )
            assert 1 <= value <= 8
            # The same query for a neighbour finds nothing: it is one resource's value.
            neighbour = trigger["query"].replace(f'"{NAME}"', '"neighbour"')
            assert await instant(server, neighbour) == []
            await asyncio.gather(*load)  # every request answered

            status = (await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME) or {}).get("status", {})
            print(f"status.autoscaling: {status.get('autoscaling')}")
            assert status["autoscaling"]["runningRequestsPerReplica"] == int(threshold)

            # Scale to 2 through the scale subresource, as KEDA's HPA writes it.
            began = time.monotonic()
            path = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{NS}/{crd.PLURAL}/{NAME}/scale"
            await cluster._call("PATCH", path, {"spec": {"replicas": 2}}, "application/merge-patch+json")
            current = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
            assert current is not None
            await cluster.wait_for(
                lambda: ready(cluster, 2, current["metadata"]["generation"]),
                within=ENGINE_STARTUP,
                interval=1.0,
                what="2/2 Ready",
            )
            print(f"scaled to 2 replicas through the scale subresource: {time.monotonic() - began:.0f}s")
            assert len(kubelet.pods) == 2
            if KUBECTL.is_file():
                env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(cluster.kubeconfig)}
                shown = await asyncio.to_thread(
                    subprocess.run,
                    [str(KUBECTL), "get", "npuinf", "-n", NS],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=env,
                )
                print(f"$ kubectl get npuinf -n {NS}\n{shown.stdout}")
                assert shown.returncode == 0, shown.stderr
                assert "2/2" in shown.stdout.splitlines()[1]
        finally:
            for task in load:
                task.cancel()
            with contextlib.suppress(Exception):
                await server.stop()
            codes = await kubelet.stop()
            await cluster.stop_operator()
            print(f"kubelet: pods exited with {codes}")

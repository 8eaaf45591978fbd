"""The sandbox's kubelet follows the operator's Deployment with real engines: a template change
rolled out (old pod down, then new one up: the operator's maxSurge 0, maxUnavailable 1), then a
scale out from 1 to 2 replicas through the NPUInference's scale subresource, both serving.

Three engine starts in a row; the module's only test. The same behaviour without engines, and
in more detail, is in tests/sandbox/test_kubelet.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from npu_operator import crd
from npu_operator.api import is_true
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.kubelet import LocalKubelet

from tests.e2e.test_status_loop import CONFIG, ENGINE_STARTUP, NAME, NS, tiny_manifest
from tests.runtime.serve_helpers import alive


async def ready(cluster: LocalCluster, replicas: int, generation: int) -> dict[str, Any] | None:
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME) or {}
    status = obj.get("status", {})
    done = status.get("observedGeneration", 0) >= generation and status.get("ready") == f"{replicas}/{replicas}"
    return obj if done and is_true(obj, "Ready") else None


async def complete(url: str) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
        session.post(f"{url}/v1/completions", json={"model": NAME, "prompt": "Hello", "max_tokens": 4}) as response,
    ):
        assert response.status == 200, await response.text()
        answer = await response.json()
    return str(answer["choices"][0]["text"])


@pytest.mark.engine
@pytest.mark.timeout(1200)
async def test_a_template_change_rolls_out_and_a_scale_out_serves_on_two_engines(
    tiny_model: Path, tmp_path: Path
) -> None:
    async with LocalCluster() as cluster:
        await cluster.start_operator(CONFIG)
        kubelet = LocalKubelet(cluster, NS, NAME, workdir=tmp_path / "pods", environ={"VLLM_CPU_KVCACHE_SPACE": "1"})
        try:
            manifest = tiny_manifest(tiny_model)
            await cluster.apply_npu_inference(manifest)
            began = time.monotonic()
            (first,) = await kubelet.start_pods()
            await cluster.wait_for(lambda: ready(cluster, 1, 1), within=ENGINE_STARTUP, interval=1.0, what="Ready")
            print(f"one replica Ready: {time.monotonic() - began:.0f}s")
            assert first.process is not None
            old_pid = first.process.pid

            # A template change: the old pod goes first, then the new one starts (maxSurge 0).
            began = time.monotonic()
            manifest["spec"]["engine"]["maxNumSeqs"] = 4
            changed = await cluster.apply_npu_inference(manifest)
            seen: list[tuple[int, int]] = []  # (old pods, new pods) as the kubelet runs them

            async def rolled_out() -> dict[str, Any] | None:
                running = [p for p in kubelet.pods if not p.exited.is_set()]
                counts = (sum(p.uid == first.uid for p in running), sum(p.uid != first.uid for p in running))
                if not seen or seen[-1] != counts:
                    seen.append(counts)
                return await ready(cluster, 1, changed["metadata"]["generation"])

            await cluster.wait_for(rolled_out, within=ENGINE_STARTUP, interval=0.5, what="the rollout")
            print(f"template change rolled out: {time.monotonic() - began:.0f}s, pods seen {seen}")
            assert (1, 1) not in seen, seen  # never the old and the new pod at once
            assert seen[-1] == (0, 1), seen
            assert not alive(old_pid)
            (new,) = kubelet.pods
            pod_object = await cluster.get("v1", "pods", NS, new.name)
            assert pod_object is not None and pod_object["metadata"]["uid"] == new.uid
            args = pod_object["spec"]["containers"][0]["args"]
            assert args[args.index("--max-num-seqs") + 1] == "4"

            # Scale out through the resource's scale subresource, as kubectl scale or an autoscaler does.
            began = time.monotonic()
            path = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{NS}/{crd.PLURAL}/{NAME}/scale"
            await cluster._call("PATCH", path, {"spec": {"replicas": 2}}, "application/merge-patch+json")
            scaled = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
            assert scaled is not None
            await cluster.wait_for(
                lambda: ready(cluster, 2, scaled["metadata"]["generation"]),
                within=ENGINE_STARTUP,
                interval=1.0,
                what="2/2 Ready",
            )
            print(f"scaled out to 2 replicas: {time.monotonic() - began:.0f}s")
            pods = kubelet.pods
            assert len(pods) == 2 and new in pods
            for pod in pods:  # both engines serve
                assert isinstance(await complete(pod.api_url), str)
        finally:
            codes = await kubelet.stop()
            await cluster.stop_operator()
            print(f"kubelet: pods exited with {codes}")

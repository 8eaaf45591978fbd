"""The sandbox's kubelet follows the operator's workloads with real engines, on one NPUInference with
spec.autoscaling (1 to 2 replicas) started once for the module's tests, which run in this order:

1. the ScaledObject the operator applies is evaluated as KEDA's Prometheus scaler would (its query, by
   a real Prometheus, against the running engine while requests are in flight);
2. the calibration loop end to end: the first engine's measurements (its /status) -> the operator
   -> the `<name>-calibration` ConfigMap, where they wait for a second pod that agrees (the
   rolled-out one) -> the pod of the scale out, whose plan uses them; on the way a
   template change rolls out (old pod down, then new one up: the operator's maxSurge 0,
   maxUnavailable 1), then the resource is scaled out to 2 through its scale subresource, as KEDA's
   HPA (or `kubectl scale`) writes it: a second engine comes up, both serve, `kubectl get npuinf`
   shows 2/2.

KEDA itself cannot run here (no kube-apiserver to host its HPA): the emulator serves the ScaledObject
API, nothing acts on it, and these tests play KEDA's two parts (query, then scale). Three engine starts
in all, one operator. The same workload behaviour without engines, and in more detail, is in
tests/sandbox/test_kubelet.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from npu_operator.api import crd
from npu_sandbox.apiserver.emulator import KubeEmulator
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo import prometheus
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.node.network import free_port
from npu_sandbox.node.pod import LocalPod

from tests.e2e.conftest import engines_progress, ready, scale, wait_ready
from tests.e2e.test_status_loop import CONFIG, NAME, NS, tiny_manifest
from tests.operator import traffic_schemas
from tests.runtime.serve_helpers import alive

# One event loop for the module: its tests share the fixture's operator and engines.
pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".cache" / "k8s-tools" / "bin" / "kubectl"


@dataclasses.dataclass
class Serving:
    cluster: LocalCluster
    kubelet: LocalKubelet
    manifest: dict[str, Any]
    first: LocalPod
    workdir: Path


# Its own engines: a resource with autoscaling, rolled out and scaled (three starts by design).
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Serving]:
    """The operator, and the resource's first replica Ready (max_num_seqs 8, one engine)."""
    workdir = tmp_path_factory.mktemp("workloads")
    emulator = KubeEmulator()
    emulator.serve_scaled_objects()
    async with LocalCluster(emulator=emulator) as cluster:
        await cluster.start_operator(CONFIG)
        kubelet = LocalKubelet(cluster, NS, NAME, workdir=workdir / "pods", environ={"VLLM_CPU_KVCACHE_SPACE": "1"})
        try:
            manifest = tiny_manifest(tiny_model)
            manifest["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
            # Autoscaling reads the series the resource's PodMonitor labels (required since the
            # queries would read nothing without it); this API serves no PodMonitors: a note.
            manifest["spec"]["metrics"] = {"podMonitor": {"enabled": True}}
            await cluster.apply_npu_inference(manifest)
            began = time.monotonic()
            (first,) = await kubelet.start_pods()
            await wait_ready(cluster, NS, NAME, 1, 1, progress=engines_progress(kubelet))
            print(f"\none replica Ready: {time.monotonic() - began:.0f}s")
            yield Serving(cluster, kubelet, manifest, first, workdir)
        finally:
            codes = await kubelet.stop()
            await cluster.stop_operator()
            print(f"kubelet: pods exited with {codes}")


async def generate(url: str, tokens: int) -> None:
    body = {"model": NAME, "prompt": "Hello", "max_tokens": tokens, "ignore_eos": True}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session,
        session.post(f"{url}/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()


async def runtime_status(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/status") as response:
        assert response.status == 200
        document: dict[str, Any] = await response.json()
    return document


async def complete(url: str) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
        session.post(f"{url}/v1/completions", json={"model": NAME, "prompt": "Hello", "max_tokens": 4}) as response,
    ):
        assert response.status == 200, await response.text()
        answer = await response.json()
    return str(answer["choices"][0]["text"])


async def instant(server: prometheus.LocalPrometheus, query: str) -> list[Any]:
    result: list[Any] = (await server.api("query", {"query": query}))["result"]
    return result


async def test_the_scaled_objects_query_under_load(serving: Serving) -> None:
    cluster, first = serving.cluster, serving.first
    scaled = await cluster.get("keda.sh/v1alpha1", "scaledobjects", NS, NAME)
    assert scaled is not None, "the operator applies a ScaledObject where KEDA's API is served"
    traffic_schemas.validate_scaled_object(scaled)
    trigger = next(t for t in scaled["spec"]["triggers"] if t["name"] == "running-requests")["metadata"]
    print(f"\nScaledObject trigger: {trigger['query']} (threshold {trigger['threshold']})")
    if prometheus.binary() is None:
        pytest.skip("prometheus not found: install Debian's prometheus package (scripts/bootstrap does it as root)")

    server = prometheus.LocalPrometheus(serving.workdir / "prometheus")
    load: list[asyncio.Task[None]] = []
    try:
        await server.start([], free_port())
        pod = await cluster.get("v1", "pods", NS, first.name)
        assert pod is not None
        server.set_targets("pods", prometheus.pod_targets(pod))
        await server.wait_for_scrapes_after(time.time(), within=60)  # the engine is scraped before the load

        # Requests in flight (8 clients, each sending its next request when one is answered: the engine's
        # max_num_seqs, all run at once, none wait), and the query KEDA would send, sampled every 0.5 s
        # until three answers counted running requests. A fast CPU decodes the 8 requests in half a
        # second, less than Prometheus' 1 s scrape interval: a single round could fall between scrapes.
        enough = asyncio.Event()

        async def client() -> None:
            while not enough.is_set():
                await generate(first.api_url, 240)

        load = [asyncio.create_task(client()) for _ in range(8)]
        samples: list[float] = []
        scrapes: set[str] = set()  # what Prometheus said of the engine's targets meanwhile
        began = time.monotonic()
        while sum(sample > 0 for sample in samples) < 3 and time.monotonic() - began < 90:
            if any(task.done() for task in load):
                break  # a client failed: its error, below
            answer = await instant(server, trigger["query"])
            assert len(answer) <= 1, answer  # KEDA's scaler refuses more than one element
            samples.append(float(answer[0]["value"][1]) if answer else 0.0)
            scrapes |= {prometheus.describe_target(t) for t in await server.active_targets()}
            await asyncio.sleep(0.5)
        enough.set()
        await asyncio.gather(*load)  # every request answered (else its error, not a sample of 0)
        value, threshold = max(samples), float(trigger["threshold"])
        print(f"running requests by the ScaledObject's query while 8 were in flight: {value:g} (samples {samples})")
        print(f"sampled for {time.monotonic() - began:.1f}s; the targets meanwhile:", *sorted(scrapes), sep="\n  ")
        print(
            f"KEDA's HPA (AverageValue) would ask for ceil({value:g} / {threshold:g}) = "
            f"{math.ceil(value / threshold)} replica(s)"
        )
        assert 1 <= value <= 8, f"samples {samples}; targets {sorted(scrapes)}"
        # The same query for a neighbour finds nothing: it is one resource's value.
        neighbour = trigger["query"].replace(f'"{NAME}"', '"neighbour"')
        assert await instant(server, neighbour) == []
    finally:
        for task in load:
            task.cancel()
        with contextlib.suppress(Exception):
            await server.stop()

    status = (await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME) or {}).get("status", {})
    print(f"status.autoscaling: {status.get('autoscaling')}")
    assert status["autoscaling"]["runningRequestsPerReplica"] == int(threshold)


async def test_a_template_change_rolls_out_and_a_scale_to_two_serves_on_two_engines(serving: Serving) -> None:
    cluster, kubelet, manifest, first = serving.cluster, serving.kubelet, serving.manifest, serving.first
    assert first.process is not None
    old_pid = first.process.pid

    # The calibration loop: what the first engine measured, read by the operator from its
    # /status, is kept in the resource's record (a ConfigMap it owns, mounted into its pods), but
    # one pod never decides a figure: it waits there for a second pod that agrees (QUORUM).
    def recorded(check: Any) -> Any:
        async def probe() -> dict[str, Any] | None:
            found = await cluster.get("v1", "configmaps", NS, f"{NAME}-calibration")
            text = ((found or {}).get("data") or {}).get("record.json")
            record = json.loads(text) if text is not None else None
            return record if record is not None and check(record) else None

        return probe

    def reported_kv(record: dict[str, Any]) -> bool:
        return any("kv_cache_bytes" in run["measured"] for run in record["reports"])

    began = time.monotonic()
    record = await cluster.wait_for(recorded(reported_kv), within=60, interval=0.5, what="the first report")
    assert record["measured"] == {}, record  # one pod alone
    first_plan = (await runtime_status(first.metrics_url))["plan"]
    assert first_plan["calibration"]["record"] == "none"  # the first pod had no record yet
    print(f"\ncalibration record after one pod (waited {time.monotonic() - began:.1f}s):", json.dumps(record))

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
        return await ready(cluster, NS, NAME, 1, changed["metadata"]["generation"])

    await cluster.wait_for(rolled_out, interval=0.5, what="the rollout", progress=engines_progress(kubelet))
    print(f"template change rolled out: {time.monotonic() - began:.0f}s, pods seen {seen}")
    assert (1, 1) not in seen, seen  # never the old and the new pod at once
    assert seen[-1] == (0, 1), seen
    assert not alive(old_pid)
    (new,) = kubelet.pods
    pod_object = await cluster.get("v1", "pods", NS, new.name)
    assert pod_object is not None and pod_object["metadata"]["uid"] == new.uid
    args = pod_object["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "4"
    # The second pod planned with the record of the same key, which holds no agreed figure yet; its
    # own report (the same KV cache: VLLM_CPU_KVCACHE_SPACE) makes two pods that agree.
    second_plan = (await runtime_status(new.metrics_url))["plan"]
    applied = second_plan["calibration"]
    assert applied["record"] == "applied" and applied["key"] == record["key"], applied
    assert applied["measured_used"] == []
    began = time.monotonic()
    record = await cluster.wait_for(
        recorded(lambda r: "kv_cache_bytes" in r["measured"]), within=60, interval=0.5, what="two pods agreeing"
    )
    shown = (await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME) or {})["status"]["graph"]["calibration"]
    assert shown["record"] == f"{NAME}-calibration" and "kv_cache_bytes" in shown["measured"], shown
    print(
        f"calibration record after two pods (waited {time.monotonic() - began:.1f}s):",
        json.dumps(record),
        f"(first plan's KV estimate {first_plan['memory']['kv_cache_bytes']}); status.graph.calibration:",
        json.dumps(shown),
    )

    # Scale to 2 through the resource's scale subresource, as KEDA's HPA or kubectl scale writes it.
    began = time.monotonic()
    await scale(cluster, NS, NAME, 2, progress=engines_progress(kubelet))
    print(f"scaled to 2 replicas through the scale subresource: {time.monotonic() - began:.0f}s")
    pods = kubelet.pods
    assert len(pods) == 2 and new in pods
    for pod in pods:  # both engines serve
        assert isinstance(await complete(pod.api_url), str)
    # The third pod planned with the two pods' agreed measurement: its KV cache is what they
    # allocated, not the estimate.
    (third,) = [pod for pod in pods if pod is not new]
    third_plan = (await runtime_status(third.metrics_url))["plan"]
    assert "kv_cache_bytes" in third_plan["calibration"]["measured_used"], third_plan["calibration"]
    assert third_plan["memory"]["kv_cache_bytes"] == record["measured"]["kv_cache_bytes"]
    print(
        "third plan:",
        json.dumps({"calibration": third_plan["calibration"], "kv": third_plan["memory"]["kv_cache_bytes"]}),
    )
    if KUBECTL.is_file():
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(serving.workdir), "KUBECONFIG": str(cluster.kubeconfig)}
        listed = await asyncio.to_thread(
            subprocess.run,
            [str(KUBECTL), "get", "npuinf", "-n", NS],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        print(f"$ kubectl get npuinf -n {NS}\n{listed.stdout}")
        assert listed.returncode == 0, listed.stderr
        assert "2/2" in listed.stdout.splitlines()[1]

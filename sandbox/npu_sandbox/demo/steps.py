"""The story's steps around the model's pods: waiting for Ready, and what is tried once it is.

`wait_ready` prints each change on the way to Ready; `second_resource` applies a second resource
of the same repository (its pod finds the local hub's files in the cache); `kill_worker_engine`
kills a multi-node group's worker and times its recreation; `delete_resource` deletes the resource
and waits until nothing of it is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from typing import Any, Final

import aiohttp
from npu_operator.api import crd
from npu_operator.kube.names import DS_API_VERSION, LWS_API_VERSION, LWS_WORKER_INDEX_LABEL
from npu_operator.kube.objects import is_true

from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo.console import SandboxFailed, heading, say
from npu_sandbox.demo.probes import events_of, process_alive, runtime_state
from npu_sandbox.fixtures.local_hub import LocalHub
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.progress import Progress

# How long a Ready resource may go without status.graph before the sandbox goes on without it.
GRAPH_GRACE_SECONDS: Final = 30.0


async def workload_of(
    cluster: LocalCluster, namespace: str, name: str, multi_node: bool, pd: bool = False
) -> dict[str, Any] | None:
    if pd:
        return await cluster.get(DS_API_VERSION, "disaggregatedsets", namespace, name)
    if multi_node:
        return await cluster.get(LWS_API_VERSION, "leaderworkersets", namespace, name)
    return await cluster.get("apps/v1", "deployments", namespace, name)


async def wait_ready(
    cluster: LocalCluster, namespace: str, name: str, kubelet: LocalKubelet, progress: Progress, started: float
) -> dict[str, Any]:
    """Print each change of phase, condition reason and engine states until Ready (or a failure, or
    `progress` saying the pods stopped advancing)."""
    last: tuple[Any, ...] = ()
    ready_since: float | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
        while True:
            obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name) or {}
            status = obj.get("status", {})
            pods = kubelet.pods
            engines = ",".join([await runtime_state(session, pod) or "-" for pod in pods])
            download = status.get("model", {}).get("progress")
            now = (
                status.get("phase"),
                status.get("reason"),
                engines,
                status.get("graph", {}).get("effectiveMode"),
                download,
            )
            if now != last:
                say(
                    f"[{time.monotonic() - started:6.1f}s] phase={now[0]} reason={now[1] or '-'} "
                    f"engine={now[2] or '-'} effectiveMode={now[3] or '-'}"
                    + (f" download={download}" if download else "")
                )
                last = now
            if is_true(obj, "Ready"):
                if status.get("graph", {}).get("effectiveMode"):
                    return obj
                ready_since = ready_since or time.monotonic()
                if time.monotonic() - ready_since > GRAPH_GRACE_SECONDS:
                    say(f"(Ready, but no status.graph after {GRAPH_GRACE_SECONDS:.0f}s: no pod of it was read)")
                    return obj
            if exited := [pod for pod in pods if pod.exited.is_set()]:
                pod = exited[0]
                raise SandboxFailed(
                    f"the runtime of pod {pod.name} exited (phase {status.get('phase')}, reason "
                    f"{status.get('reason')}).\nLast lines of {pod.log_path}:\n{pod.log_tail(25)}"
                )
            if (why := progress.check()) is not None:
                tails = "\n".join(f"--- {pod.log_path}\n{pod.log_tail(25)}" for pod in pods)
                raise SandboxFailed(f"not Ready: {why}; last lines of the pods' logs:\n{tails}")
            await asyncio.sleep(1.0)


async def second_resource(
    cluster: LocalCluster, kubelet: LocalKubelet, manifest: dict[str, Any], hub: LocalHub
) -> dict[str, Any]:
    """A second NPUInference with the same repository and revision: its pod finds the cache complete."""
    before = dict(hub.served)
    second = json.loads(json.dumps(manifest))
    name, namespace = f"{manifest['metadata']['name']}-2", manifest["metadata"]["namespace"]
    second["metadata"]["name"] = name
    heading(f"a second resource with the same repository: {name}")
    await cluster.apply_npu_inference(second)
    try:

        async def model_ready() -> dict[str, Any] | None:
            obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name) or {}
            model = obj.get("status", {}).get("model", {})
            return model if model.get("phase") in ("Ready", "Failed") else None

        model = await cluster.wait_for(model_ready, within=120, what=f"{name}'s status.model")
    finally:  # its engine is not needed to make the point: the kubelet stops its pod once it is deleted
        await cluster.delete(crd.API_VERSION, crd.PLURAL, namespace, name)
        await cluster.wait_for(
            lambda: asyncio.sleep(0, not [p for p in kubelet.pods if p.name.startswith(f"{name}-")]), within=60
        )
    downloaded = {
        key: hub.served[key] - before.get(key, 0) for key in hub.served if hub.served[key] != before.get(key, 0)
    }
    say(f"{name}: status.model.phase={model['phase']} revision={model.get('revision')}")
    say(f"files the hub served for it: {sum(downloaded.values())} (for the first resource: {sum(before.values())})")
    return {"first_downloads": before, "second_downloads": downloaded, "second_model": model}


async def kill_worker_engine(
    cluster: LocalCluster, kubelet: LocalKubelet, namespace: str, name: str, progress: Progress
) -> dict[str, Any]:
    """Kill the engine of the last worker pod; watch the group come back (RecreateGroupOnPodRestart)."""
    workers = [pod for pod in kubelet.pods if pod.labels.get(LWS_WORKER_INDEX_LABEL, "0") != "0"]
    if not workers:
        raise SandboxFailed("--kill-worker: no worker pod (a multi-node example has one per extra node)")
    worker = workers[-1]
    before = {pod.uid for pod in kubelet.pods}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"{worker.metrics_url}/status") as response,
    ):
        engine = (await response.json(content_type=None))["engine"]["pid"]
    heading(f"kill -9 {engine}: the engine of worker pod {worker.name}")
    killed = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(engine, signal.SIGKILL)  # the engine runs in a process group of its own
    seen: list[str] = []
    last: tuple[Any, ...] = ()
    while True:
        obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name) or {}
        status = obj.get("status", {})
        progressing: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Progressing"), {})
        now = (status.get("phase"), status.get("reason"), progressing.get("status"), progressing.get("reason"))
        pods = ",".join(f"{p.name}{'(ready)' if p.ready.is_set() else ''}" for p in kubelet.pods)
        if now != last:
            say(
                f"[{time.monotonic() - killed:6.1f}s] phase={now[0]} reason={now[1] or '-'} "
                f"Progressing={now[2]}/{now[3]} pods={pods}"
            )
            seen.append(f"{now[0]}/{now[3]}")
            last = now
        renewed = kubelet.pods and not ({pod.uid for pod in kubelet.pods} & before)
        if renewed and is_true(obj, "Ready") and "Progressing" in " ".join(seen) and len(seen) > 1:
            break
        if (why := progress.check()) is not None:
            raise SandboxFailed(f"the group was not Ready again after its worker's engine died: {why}")
        await asyncio.sleep(0.5)
    seconds = round(time.monotonic() - killed, 1)
    say(f"Ready again {seconds}s after the worker's engine was killed; new pods: {[p.name for p in kubelet.pods]}")
    events = [e for e in await events_of(cluster, namespace, name) if e["reason"] == "RecreateGroup"]
    for e in events:
        say(f"Event {e['type']} {e['reason']} ({e['involvedObject']['kind']}): {e['message']}")
    return {
        "seconds_to_ready": seconds,
        "states": seen,
        "recreate_events": [e["message"] for e in events],
        "graph": obj["status"].get("graph", {}),
    }


async def delete_resource(cluster: LocalCluster, kubelet: LocalKubelet, namespace: str, name: str) -> dict[str, Any]:
    """`kubectl delete npuinf NAME`: every child, pod and process goes (owner references, the kubelet),
    with or without the operator: it keeps no finalizer on the resource."""
    pids = [pod.process.pid for pod in kubelet.pods if pod.process is not None]
    began = time.monotonic()
    heading(f"kubectl delete npuinf {name}")
    await cluster.delete(crd.API_VERSION, crd.PLURAL, namespace, name)
    kinds = (
        ("apps/v1", "deployments"),
        ("apps/v1", "replicasets"),
        ("apps/v1", "statefulsets"),
        (LWS_API_VERSION, "leaderworkersets"),
        (DS_API_VERSION, "disaggregatedsets"),
        ("v1", "services"),
        ("v1", "pods"),
    )

    async def left() -> list[str]:
        found = [
            f"{plural}/{obj['metadata']['name']}"
            for api_version, plural in kinds
            for obj in await cluster.list_objects(api_version, plural, namespace)
        ]
        return found + [f"pid {pid}" for pid in pids if process_alive(pid)]

    with contextlib.suppress(TimeoutError):
        await cluster.wait_for(lambda: _none(left), within=180, interval=0.5, what="everything deleted")
    remaining = await left()
    outcome = "nothing left" if not remaining else "left: " + ", ".join(remaining)
    say(f"deleted: {outcome} after {time.monotonic() - began:.1f}s")
    return {"left": remaining, "seconds": round(time.monotonic() - began, 1)}


async def _none(probe: Any) -> bool:
    return not await probe()

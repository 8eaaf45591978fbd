"""What a user looks at while the sandbox runs: `kubectl get`, the pod behind a Service, a completion.

Each is one look through the API or at a pod's mapped ports, as the story (`npu_sandbox.demo.cli`)
and its helm steps (`npu_sandbox.demo.helm`) take them; none changes anything.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import Any

import aiohttp
from npu_operator.api import crd
from npu_operator.kube.objects import is_true

from npu_sandbox.apiserver import tables
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo import printer
from npu_sandbox.demo.console import SandboxFailed
from npu_sandbox.demo.repository import KUBECTL
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.node.pod import LocalPod


async def kubectl_get(cluster: LocalCluster, namespace: str, kinds: str = "npuinf") -> str:
    """The real kubectl when scripts/bootstrap fetched it; else the same Table, printed here."""
    kubectl = shutil.which("kubectl", path=f"{KUBECTL.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if kubectl is not None:
        result = await asyncio.to_thread(
            subprocess.run,
            [kubectl, "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "get", kinds],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode == 0:
            return result.stdout.rstrip()
    objects = await cluster.list_objects(crd.API_VERSION, crd.PLURAL, namespace)
    return printer.text(tables.table(crd.version_spec()["additionalPrinterColumns"], objects))


async def ready_resource(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name)
    return obj if obj is not None and is_true(obj, "Ready") else None


async def events_of(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events of the resource and of its workload (a LeaderWorkerSet has the resource's name)."""
    return [
        e
        for e in await cluster.list_objects("v1", "events", namespace)
        if e.get("involvedObject", {}).get("name") == name
    ]


async def behind_service(cluster: LocalCluster, kubelet: LocalKubelet, namespace: str, name: str) -> LocalPod:
    """The pod the resource's Service sends a request to here: a ready pod its selector matches (for a
    LeaderWorkerSet, a leader), reached on the local port mapped to the Service's targetPort."""
    service = await cluster.get("v1", "services", namespace, name)
    if service is None:
        raise SandboxFailed(f"no Service {namespace}/{name}")
    selector = service["spec"].get("selector", {})
    for pod in kubelet.pods:
        if pod.ready.is_set() and not pod.exited.is_set() and all(pod.labels.get(k) == v for k, v in selector.items()):
            return pod
    raise SandboxFailed(f"no ready pod behind Service {namespace}/{name} (selector {selector})")


async def completion(pod: LocalPod, model_name: str) -> str | None:
    """One OpenAI completion from the pod (None: it did not answer 200)."""
    request = {"model": model_name, "prompt": "Graph capture on Ascend", "max_tokens": 8, "temperature": 0}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(f"{pod.api_url}/v1/completions", json=request) as response,
    ):
        answer = await response.json(content_type=None)
    return str(answer["choices"][0]["text"]) if response.status == 200 else None


async def runtime_state(session: aiohttp.ClientSession, pod: LocalPod) -> str | None:
    try:
        async with session.get(f"{pod.metrics_url}/status") as response:
            document = await response.json(content_type=None)
            return str(document.get("state"))
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
        return None


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False

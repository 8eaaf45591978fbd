"""spec.lora end to end: the operator, the API emulator, the sandbox's kubelet and a real vLLM CPU engine.

One NPUInference of the tiny model with one LoRA adapter (the tiny PEFT adapter, rank 8, on a host
directory), and vLLM's own API server started by hand with `--enable-lora --lora-modules` for the same
adapter (the reference answer). Then the spec changes as a user changes it: a second adapter and a
broken one (rank 16 over maxLoraRank 8) added, then the second removed. The pod must follow each
change through the ConfigMap its runtime re-reads, with the same pod, the same engine process and no
restart, and the status must say which adapter is served and why one is not.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from npu_operator.kube.objects import condition
from npu_runtime.contract import parse_serve_args, plan_argv
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo.probes import kubectl_get
from npu_sandbox.node.network import free_port

from tests.e2e.conftest import engines_progress
from tests.e2e.test_status_loop import CONFIG, NAME, NS, kubelet_for, resource, tiny_manifest
from tests.runtime.serve_helpers import serve_environment

PROMPT = "The capital of France is"
pytestmark = pytest.mark.engine


@pytest.fixture
async def operator() -> AsyncIterator[LocalCluster]:
    async with LocalCluster() as cluster:
        await cluster.start_operator(CONFIG)
        yield cluster
        await cluster.stop_operator()


def build_lora(directory: Path, *flags: str) -> None:
    subprocess.run([sys.executable, "-m", "npu_sandbox.fixtures.tiny_lora", *flags, str(directory)], check=True)


def adapter(name: str, root: Path) -> dict[str, Any]:
    return {"name": name, "source": {"hostPath": {"path": str(root), "subPath": name}}}


async def completion(session: aiohttp.ClientSession, url: str, model: str) -> tuple[int, str]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "seed": 1}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        answer = await response.json()
        return response.status, answer["choices"][0]["text"] if response.status == 200 else json.dumps(answer)


async def set_adapters(cluster: LocalCluster, adapters: list[dict[str, Any]]) -> None:
    obj = await resource(cluster)
    obj["spec"]["lora"]["adapters"] = adapters
    await cluster.apply_npu_inference({k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")})


async def adapters_become(cluster: LocalCluster, states: dict[str, str], progress: Any) -> dict[str, Any]:
    async def settled() -> Any:
        obj = await resource(cluster)
        status = obj.get("status", {})
        seen = {entry["name"]: entry["state"] for entry in status.get("adapters", [])}
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and seen == states else None

    found: dict[str, Any] = await cluster.wait_for(settled, interval=1.0, what=f"adapters {states}", progress=progress)
    return found


def start_reference(model: Path, args: list[str], lora: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """vLLM's API server by hand, with the pod's own engine flags (its plan's vllm_args) and --lora-modules."""
    plan = dataclasses.replace(parse_serve_args(args).plan, calibration=None)
    planned = subprocess.run(
        [sys.executable, "-m", "npu_runtime.cli", "plan", "--model", str(model), "--json", *plan_argv(plan)],
        check=True, capture_output=True, text=True, env=serve_environment(),
    )  # fmt: skip
    module = {"name": "a1", "path": str(lora), "base_model_name": NAME}
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port),
        *json.loads(planned.stdout)["vllm_args"], "--lora-modules", json.dumps(module),
    ]  # fmt: skip
    with log.open("w") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=serve_environment(), start_new_session=True
        )


async def reference_ready(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/health") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def test_adapters_follow_the_spec_without_a_restart(
    operator: LocalCluster, tiny_model: Path, tmp_path: Path
) -> None:
    root = tmp_path / "adapters"
    build_lora(root / "a1")
    build_lora(root / "a2", "--seed", "11")
    build_lora(root / "big", "--rank", "16")
    manifest = tiny_manifest(tiny_model)
    manifest["spec"]["lora"] = {"maxLoras": 2, "maxLoraRank": 8, "maxCpuLoras": 4, "adapters": [adapter("a1", root)]}
    await operator.apply_npu_inference(manifest)
    deployment = await operator.wait_for(lambda: operator.get("apps/v1", "deployments", NS, NAME))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"][2:]
    port = free_port()
    reference = start_reference(tiny_model, args, root / "a1", port, tmp_path / "vllm.log")
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        async with kubelet_for(operator, tmp_path / "pods") as kubelet, aiohttp.ClientSession(timeout=timeout) as http:
            progress = engines_progress(kubelet)
            obj = await adapters_become(operator, {"a1": "Loaded"}, progress)
            assert obj["status"]["adaptersReady"] == "1/1" and condition(obj, "AdapterFailed")["status"] == "False"
            pod = kubelet.pods[0]
            assert pod.process is not None
            engine_pid, uid = pod.process.pid, pod.uid

            base, tuned = await completion(http, pod.api_url, NAME), await completion(http, pod.api_url, "a1")
            assert base[0] == tuned[0] == 200 and base[1] != tuned[1], (base, tuned)
            reference_url = f"http://127.0.0.1:{port}"
            await operator.wait_for(
                lambda: reference_ready(http, reference_url), interval=1.0, within=900, what="vLLM by hand"
            )
            assert await completion(http, reference_url, "a1") == tuned
            assert await completion(http, reference_url, NAME) == base

            # A second adapter and a broken one: the second is served, the broken one named, a1 keeps serving.
            await set_adapters(operator, [adapter("a1", root), adapter("a2", root), adapter("big", root)])
            obj = await adapters_become(operator, {"a1": "Loaded", "a2": "Loaded", "big": "Failed"}, progress)
            (big,) = [entry for entry in obj["status"]["adapters"] if entry["name"] == "big"]
            failed = condition(obj, "AdapterFailed")
            assert failed["status"] == "True" and "big" in failed["message"] and "16" in big["message"], obj["status"]
            second = await completion(http, pod.api_url, "a2")
            assert second[0] == 200 and second[1] not in (base[1], tuned[1])
            assert await completion(http, pod.api_url, "a1") == tuned
            print(await kubectl_get(operator, NS))
            print(json.dumps(obj["status"]["adapters"], indent=2))

            # Removed from the spec: unloaded, the engine answers 404 for it.
            await set_adapters(operator, [adapter("a1", root), adapter("big", root)])
            await adapters_become(operator, {"a1": "Loaded", "big": "Failed"}, progress)

            async def unloaded() -> tuple[int, str] | None:  # the kubelet's ConfigMap sync, then the runtime's poll
                answer = await completion(http, pod.api_url, "a2")
                return answer if answer[0] != 200 else None

            gone = await operator.wait_for(unloaded, interval=1.0, within=60, what="a2 unloaded")
            assert gone[0] == 404 and "a2" in gone[1]

            # The same pod, engine process and container throughout.
            assert [p.uid for p in kubelet.pods] == [uid] and pod.process.pid == engine_pid
            live = await operator.get("v1", "pods", NS, pod.name)
            assert live is not None and live["status"]["containerStatuses"][0]["restartCount"] == 0
    finally:
        reference.terminate()
        try:
            reference.wait(30)
        except subprocess.TimeoutExpired:
            reference.kill()

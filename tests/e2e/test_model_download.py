"""A hub source through the whole loop: the operator, the API emulator, the local kubelet running the pod's
init container (the real `npu-runtime fetch` with huggingface_hub) against a local hub on 127.0.0.1.

The operator must show the download's progress in status.model (what `kubectl get npuinf` prints)
while it runs, and a download the hub refuses as Degraded/ModelAccessDenied with one Event. The
serving container is not waited for: the engine's own loop is tested in test_status_loop.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_operator.kube.objects import condition
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.fixtures.local_hub import LocalHub, Repo
from npu_sandbox.node.kubelet import LocalKubelet

from tests.examples import example

NS = "default"
NAME = "tiny-llama"
REPO = "org/tiny-llama"
CONFIG = OperatorConfig(resync_seconds=1.0, status_poll_seconds=0.5, metrics_port=0, health_port=0)
SHARD = "model-00002-of-00002.safetensors"


@pytest.fixture
async def operator() -> AsyncIterator[LocalCluster]:
    async with LocalCluster() as cluster:
        await cluster.start_operator(CONFIG)
        yield cluster
        await cluster.stop_operator()


@pytest.fixture
def hub(tiny_model: Path, tmp_path: Path) -> Any:
    """The tiny model plus a 40 MiB shard (huggingface_hub writes in 10 MiB chunks: progress in steps)."""
    directory = tmp_path / "repo"
    directory.mkdir()
    for item in tiny_model.iterdir():
        (directory / item.name).write_bytes(item.read_bytes())
    (directory / SHARD).write_bytes(random.Random(3).randbytes(40 << 20))
    with LocalHub([Repo.from_directory(REPO, directory)]) as running:
        yield running


def manifest(endpoint: str, **source: Any) -> dict[str, Any]:
    document = example("sandbox-cpu.yaml")
    document["metadata"]["namespace"] = NS
    model = document["spec"]["model"]
    for key in ("path", "mountPath"):
        model.pop(key)
    model["source"] = {"huggingFace": {"repository": REPO, "endpoint": endpoint, **source}}
    model["cache"] = {"claimName": "model-cache", "create": {"size": "1Gi"}}
    return document


async def resource(cluster: LocalCluster) -> dict[str, Any]:
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
    assert obj is not None
    return obj


async def start_pod(cluster: LocalCluster, tmp_path: Path) -> LocalKubelet:
    await cluster.wait_for(lambda: cluster.get("apps/v1", "deployments", NS, NAME), what="the Deployment")
    kubelet = LocalKubelet(cluster, NS, NAME, workdir=tmp_path / "pods")
    await kubelet.start_pods()
    return kubelet


async def test_the_status_shows_the_download_progress_then_ready(
    operator: LocalCluster, hub: LocalHub, tmp_path: Path
) -> None:
    hub.rate = 10 << 20  # 40 MiB in about 4 s: several polls
    await operator.apply_npu_inference(manifest(hub.url))
    claim = await operator.wait_for(lambda: operator.get("v1", "persistentvolumeclaims", NS, "model-cache"))
    assert "ownerReferences" not in claim["metadata"]  # shared: it outlives the resource
    kubelet = await start_pod(operator, tmp_path)
    seen: list[str] = []
    try:

        async def model_ready() -> Any:
            model = (await resource(operator)).get("status", {}).get("model", {})
            if model.get("progress") and (not seen or seen[-1] != model["progress"]):
                seen.append(model["progress"])
            return model if model.get("phase") == "Ready" else None

        model = await operator.wait_for(model_ready, within=120, interval=0.2, what="status.model Ready")
    finally:
        await kubelet.stop()
    downloading = [p for p in seen if p.startswith("Downloading ") and p.endswith("%")]
    assert any(0 < int(p.split()[1][:-1]) < 100 for p in downloading), seen
    total = sum(f.size for f in hub.repos[REPO].files.values())
    # The branch was resolved once for the rollout (the first pod's `fetch --hold` reported the commit)
    # and pinned into the pod template.
    resolved = model.pop("resolved")
    assert (resolved["revision"], resolved["commit"]) == ("main", hub.repos[REPO].commit)
    deployment = await operator.get("apps/v1", "deployments", NS, NAME)
    assert deployment is not None
    args = deployment["spec"]["template"]["spec"]["initContainers"][0]["args"]
    assert args[args.index("--revision") + 1] == hub.repos[REPO].commit and "--hold" not in args
    assert model == {
        "source": "huggingFace",
        "repository": REPO,
        "revision": hub.repos[REPO].commit,
        "phase": "Ready",
        "progress": "Ready",
        "bytesDone": total,
        "bytesTotal": total,
        "filesDone": len(hub.repos[REPO].files),
        "filesTotal": len(hub.repos[REPO].files),
    }
    # Every file came once; the holding pod is replaced when the commit is pinned, maybe mid-file, and
    # then the pinned pod resumes that file from where it stopped (a Range from a later byte).
    resumed = {path for path, start in hub.ranges if start > 0}
    assert all(count == 1 or key.removeprefix(f"{REPO}/") in resumed for key, count in hub.served.items())


async def test_a_refused_download_degrades_the_resource_once(
    operator: LocalCluster, hub: LocalHub, tmp_path: Path
) -> None:
    hub.faults.token = "not-the-one-we-have"
    await operator.apply_npu_inference(manifest(hub.url))
    kubelet = await start_pod(operator, tmp_path)
    try:

        async def degraded() -> Any:
            obj = await resource(operator)
            return obj if condition(obj, "Degraded").get("reason") == "ModelAccessDenied" else None

        obj = await operator.wait_for(degraded, within=120, interval=0.2, what="Degraded/ModelAccessDenied")
    finally:
        await kubelet.stop()
    assert REPO in condition(obj, "Degraded")["message"]
    model = obj["status"]["model"]
    assert (model["phase"], model["reason"], model["progress"]) == (
        "Failed",
        "ModelAccessDenied",
        "Failed (ModelAccessDenied)",
    )

    async def denied_events() -> Any:
        return [
            e
            for e in await operator.list_objects("v1", "events", NS)
            if e.get("involvedObject", {}).get("name") == NAME and e.get("reason") == "ModelAccessDenied"
        ]

    (event,) = await operator.wait_for(denied_events)
    assert event["type"] == "Warning" and REPO in event["message"]

"""One sandbox run (README's first command) per test session, shared by the tests that judge it, all
in test_sandbox.py (the engine tests run a file per worker: one file, one run): the chain itself and,
when Prometheus is installed, what a real Prometheus scraped from it (every dashboard panel's query:
test_dashboard_queries.py says how). Starting the sandbox takes a minute or two; doing it once keeps
the suite short. Also the waits the in-process e2e tests share: an NPUInference n/n Ready at a
generation, and a scale through its scale subresource, both following the engines' progress."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api import crd
from npu_operator.kube.objects import is_true
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.progress import Progress, logs_progress

from tests.conftest import ENGINE_TEST_TIMEOUT

# The ceiling of one sandbox run, inside the engine tests' own (tests/conftest.py ENGINE_TEST_TIMEOUT).
SANDBOX_CEILING = ENGINE_TEST_TIMEOUT - 300


@dataclasses.dataclass(frozen=True)
class SandboxRun:
    result: subprocess.CompletedProcess[str]
    summary: dict[str, Any]
    workdir: Path


def run_sandbox(folder: Path, *args: str, timeout: float = SANDBOX_CEILING) -> SandboxRun:
    """`npu-sandbox ARGS` in `folder` (its stdout kept as stdout.txt, what a user would have seen),
    judged by its exit status; the run and its JSON summary. The sandbox's own waits follow its pods'
    progress (`--stall`); `timeout` is only the ceiling of the whole run."""
    workdir, summary_path = folder / "sandbox", folder / "summary.json"
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "npu_sandbox", *args, "--workdir", str(workdir), "--summary", str(summary_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(f"sandbox run {' '.join(args)}: {time.monotonic() - began:.0f}s")
    (folder / "stdout.txt").write_text(result.stdout, encoding="utf-8")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    return SandboxRun(result, json.loads(summary_path.read_text()), workdir)


@pytest.fixture(scope="session")
def sandbox_run(tmp_path_factory: pytest.TempPathFactory) -> SandboxRun:
    return run_sandbox(tmp_path_factory.mktemp("sandbox-run"))


async def ready(
    cluster: LocalCluster, namespace: str, name: str, replicas: int, generation: int
) -> dict[str, Any] | None:
    """The NPUInference once Ready with `replicas`/`replicas` ready, for `generation` or a later one; else None."""
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name) or {}
    status = obj.get("status", {})
    done = status.get("observedGeneration", 0) >= generation and status.get("ready") == f"{replicas}/{replicas}"
    return obj if done and is_true(obj, "Ready") else None


async def wait_ready(
    cluster: LocalCluster, namespace: str, name: str, replicas: int, generation: int, *, progress: Progress
) -> dict[str, Any]:
    """Wait (polling every second) until `ready`; a TimeoutError once `progress` says the start stopped
    advancing (`engines_progress`: no pod's log grew for a while)."""
    found: dict[str, Any] = await cluster.wait_for(
        lambda: ready(cluster, namespace, name, replicas, generation),
        interval=1.0,
        what=f"{replicas}/{replicas} Ready",
        progress=progress,
    )
    return found


def engines_progress(kubelet: LocalKubelet) -> Progress:
    """The progress of the kubelet's pods while their engines start: their logs grow, pods come and go."""
    return logs_progress(lambda: [pod.log_path for pod in kubelet.pods])


async def scale(
    cluster: LocalCluster, namespace: str, name: str, replicas: int, *, progress: Progress
) -> dict[str, Any]:
    """Write spec.replicas through the scale subresource, as `kubectl scale` or KEDA's HPA does, then wait
    until that many replicas are Ready."""
    await cluster.patch(
        crd.API_VERSION, crd.PLURAL, namespace, name, {"spec": {"replicas": replicas}}, subresource="scale"
    )
    scaled = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name)
    assert scaled is not None
    return await wait_ready(cluster, namespace, name, replicas, scaled["metadata"]["generation"], progress=progress)

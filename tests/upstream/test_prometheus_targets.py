"""Which pods the PodMonitors make scrape targets of, decided by Prometheus' own relabeling.

prometheus-operator v0.93.0 turns each `podMetricsEndpoints` entry into a scrape job whose
relabelings keep the pod's container port of the endpoint's name, add namespace, pod and the
`podTargetLabels`, then append the endpoint's own `relabelings`
(pkg/prometheus/promcfg.go, `generatePodMonitorConfig`). That subset is rebuilt here, around our
PodMonitors' endpoints as rendered, and handed to a real Prometheus (Debian's package, installed
by scripts/bootstrap) with file-discovered pods that carry Kubernetes' pod metadata labels; which
targets it keeps and drops is Prometheus' relabel engine's answer, not ours. The pods: a
Deployment's, a LeaderWorkerSet group's leader and headless worker, a P/D router.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from npu_operator.api.spec import parse_spec
from npu_operator.children import workloads
from npu_operator.kube.names import (
    LWS_GROUP_INDEX_LABEL,
    LWS_WORKER_INDEX_LABEL,
    ROLE_LABEL,
    ROUTER,
    pod_label_meta,
    selector_labels,
)
from npu_sandbox.node.network import free_port

from tests.examples import example

JSON = dict[str, Any]
PODS: dict[str, dict[str, str]] = {
    "deployment-pod": {},
    "group-leader": {LWS_GROUP_INDEX_LABEL: "0", LWS_WORKER_INDEX_LABEL: "0"},
    "group-worker": {LWS_GROUP_INDEX_LABEL: "0", LWS_WORKER_INDEX_LABEL: "1"},
    "pd-router": {ROLE_LABEL: ROUTER},
}
# (pod, endpoint) pairs a correct PodMonitor scrapes: every pod's runtime on `metrics`, vLLM's API
# (`http`) only where an API server runs.
EXPECTED = {
    ("deployment-pod", "metrics"),
    ("group-leader", "metrics"),
    ("group-worker", "metrics"),
    ("pd-router", "metrics"),
    ("deployment-pod", "http"),
    ("group-leader", "http"),
}


def relabel_config(relabeling: JSON) -> JSON:
    """A PodMonitor relabeling (camelCase) as Prometheus' relabel_config (snake_case)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(key, key): value for key, value in relabeling.items()}


def scrape_jobs(monitor: JSON, targets: Path) -> list[JSON]:
    """generatePodMonitorConfig's subset: keep the endpoint's port by name, name the pod, then ours."""
    jobs = []
    for index, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        relabelings = [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"],
            },
            {"action": "replace", "source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"action": "replace", "replacement": endpoint["port"], "target_label": "endpoint"},
            *(relabel_config(r) for r in endpoint.get("relabelings", [])),
        ]
        jobs.append(
            {
                "job_name": f"podMonitor/{index}",
                "scrape_interval": "1h",  # discovery is what is asked, not the scrape
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                "relabel_configs": relabelings,
            }
        )
    return jobs


def discovered_pods(port: int) -> list[JSON]:
    """One discovered target per container port of each pod, labelled as Kubernetes' SD labels it."""
    groups = []
    for name, labels in PODS.items():
        for port_name in ("http", "metrics"):
            meta = {pod_label_meta(key): value for key, value in {**selector_labels("m"), **labels}.items()}
            meta |= {"__meta_kubernetes_pod_name": name, "__meta_kubernetes_pod_container_port_name": port_name}
            groups.append({"targets": [f"127.0.0.1:{port}"], "labels": meta})
    return groups


async def kept_targets(config: JSON, workdir: Path, port: int) -> set[tuple[str, str]]:
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    command = [
        shutil.which("prometheus") or "prometheus",
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/api/v1/targets?state=any") as answer:
                        data = (await answer.json())["data"]
                except aiohttp.ClientError:
                    data = {}
                discovered = len(data.get("activeTargets", [])) + len(data.get("droppedTargets", []))
                if discovered >= 2 * len(PODS) * len(config["scrape_configs"]):
                    return {(t["labels"]["pod"], t["labels"]["endpoint"]) for t in data["activeTargets"]}
                await asyncio.sleep(0.5)
        raise AssertionError("Prometheus did not discover the targets within 60 s")
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=30)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus (scripts/bootstrap)")
async def test_the_pod_monitor_scrapes_vllm_only_where_an_api_server_runs(tmp_path: Path) -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    monitor = workloads.build_pod_monitor("m", "llm", parse_spec(manifest["spec"]))
    targets = tmp_path / "pods.json"
    targets.write_text(json.dumps(discovered_pods(free_port())), encoding="utf-8")
    config = {"global": {"scrape_interval": "1h"}, "scrape_configs": scrape_jobs(monitor, targets)}
    kept = await kept_targets(config, tmp_path, free_port())
    assert kept == EXPECTED

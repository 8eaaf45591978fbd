"""Other tenants' objects cost the operator nothing: the API server filters its lists and watches.

The real operator runs in its own process (`python -m npu_operator.cli run`), as in its pod, against
the in-process API over HTTP, with 250 MiB of ConfigMaps, unlabelled, in another namespace.
Before the watches sent their label selector to the API server, kopf (which watched them then) listed and streamed every
ConfigMap in the cluster and dropped the foreign ones only after parsing them: the operator's peak
RSS grew past the foreign data itself (issue 33: 862 MiB for 263 MiB, against the chart's 512 MiB
limit; a crash loop, since every restart lists again). Now its peak stays well below the foreign
data's size and the requests show why: every list and watch of a child kind, of pods and of their
owner-chain links carries our label selector, and every list is chunked.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import yaml
from npu_operator.api import crd
from npu_operator.controller import watches
from npu_operator.kube import informer
from npu_sandbox.cluster import LocalCluster, operator_process

from tests.examples import example

ROOT = Path(__file__).resolve().parents[2]
TENANT = "another-tenant"
# 250 MiB in all, in objects of 512 KiB (the in-process API, as aiohttp serves it, takes request
# bodies of at most 1 MiB; a real API server's limit is about 1.5 MiB an object).
FOREIGN_CONFIGMAPS = 500
FOREIGN_BYTES = 512 << 10  # each
FOREIGN_MIB = FOREIGN_CONFIGMAPS * FOREIGN_BYTES / (1 << 20)


def chart_memory_limit_mib() -> float:
    values = yaml.safe_load((ROOT / "charts" / "npu-inference-operator" / "values.yaml").read_text())
    limit = str(values["resources"]["limits"]["memory"])
    assert limit.endswith("Mi"), limit
    return float(limit.removesuffix("Mi"))


def peak_rss_mib(pid: int) -> float:
    """The process's high-water mark of resident memory (Linux's VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc: this test needs Linux")


async def fill_tenant_namespace(cluster: LocalCluster) -> None:
    await cluster.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}}, "namespaces")
    blob = "x" * FOREIGN_BYTES
    for index in range(FOREIGN_CONFIGMAPS):
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"bulk-{index:03d}", "namespace": TENANT},
            "data": {"blob": blob},
        }
        await cluster.create(configmap, "configmaps")


async def test_the_operator_peak_memory_does_not_grow_with_other_tenants_configmaps() -> None:
    async with LocalCluster() as cluster:
        await fill_tenant_namespace(cluster)
        manifest = example("sandbox-cpu.yaml")
        manifest["metadata"]["namespace"] = "default"
        name = manifest["metadata"]["name"]
        await cluster.create(manifest, crd.PLURAL)
        env = operator_process.operator_env(cluster.kubeconfig)
        log = cluster.workdir / "operator.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "npu_operator.cli", "run", env=env, stdout=out, stderr=out
            )
        try:

            async def settled() -> Any:
                if process.returncode is not None:
                    raise AssertionError("the operator exited:\n" + log.read_text(errors="replace")[-3000:])
                obj = await cluster.get(crd.API_VERSION, crd.PLURAL, "default", name)
                return (obj or {}).get("status", {}).get("observedGeneration") == 1

            # Its resource is reconciled: every watch's first listing is done (kopf starts the
            # workers only then), the ConfigMap kind's included.
            await cluster.wait_for(settled, within=120, what="the operator reconciled its resource")
            await asyncio.sleep(2)
            peak = peak_rss_mib(process.pid)
        finally:
            await operator_process.stop(process)
        print(f"operator peak RSS with {FOREIGN_MIB:.0f} MiB of foreign ConfigMaps: {peak:.0f} MiB")
        assert peak < min(FOREIGN_MIB * 0.6, chart_memory_limit_mib()), (
            f"peak RSS {peak:.0f} MiB with {FOREIGN_MIB:.0f} MiB of other tenants' ConfigMaps"
        )
        # Why: the API server filtered every list and watch of the kinds that have a selector, and
        # the lists came in chunks.
        selectors = {resource.plural: selector for resource, selector in watches.server_selectors().items()}
        reads = [
            request
            for request in cluster.emulator.history
            if request.method == "GET"
            and request.url.path.rsplit("/", 1)[-1] in selectors
            and not request.headers.get("User-Agent", "").startswith("npu-sandbox")
            and "/namespaces/" not in request.url.path  # the informers' cluster-wide lists and watches
        ]
        assert any(request.url.path.endswith("/configmaps") for request in reads)
        for request in reads:
            plural = request.url.path.rsplit("/", 1)[-1]
            assert request.params.get("labelSelector") == selectors[plural], request.url
            if request.params.get("watch") != "true":
                assert request.params.get("limit") == str(informer.PAGE), request.url

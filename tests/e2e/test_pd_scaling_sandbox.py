"""A P/D resource scaled per role in the sandbox while it serves: the whole chain with fake engines.

The real operator (kopf) over the emulated API with KEDA's and LeaderWorkerSet's APIs served; the
sandbox's DisaggregatedSet and LeaderWorkerSet stand-ins make the role LeaderWorkerSets, the role
scaler, the StatefulSets and pods; its kubelet runs the real router (`npu-runtime route`, resolving
the role Services through the sandbox's DNS) and, for each engine, `tests.sandbox.node.fake_engine`
given the very `npu-runtime serve` arguments the operator rendered (decode 1 -> 2 and prefill 1 -> 2
in seconds). The `engine`-marked variant runs real vLLM CPU engines instead (the tiny model, their
Mooncake connector mapped to vLLM's file-based ExampleConnector) and scales decode only: three
engines at once on this 2-CPU machine.

KEDA itself cannot run here (no kube-apiserver for its HPA): the test writes each role's scale target
as KEDA's HPA would (decode: the NPUInference's /scale, 1 -> 2; prefill: the DisaggregatedSetRoleScaler
`<name>-prefill`'s /scale, 1 -> 2) while a client keeps sending completions through the router, every
one of which must succeed; then both decode engines must have served, and `kubectl get` shows it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_sandbox.apiserver.emulator import KubeEmulator
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.controllers import disaggregated
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.node.pod import LocalPod
from npu_sandbox.node.runners import DEFAULT_RUNNERS, ServeRunner

from tests.e2e.conftest import engines_progress, scale, wait_ready
from tests.examples import example
from tests.operator import traffic_schemas

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".cache" / "k8s-tools" / "bin" / "kubectl"
NS, NAME = "default", "tiny-llama-pd"
CONFIG = OperatorConfig(
    resync_seconds=1.0,
    status_poll_seconds=1.0,
    metrics_port=0,
    health_port=0,
    allowed_host_paths=(tempfile.gettempdir(),),
)
ROLE_LABEL = "inference.npu.dev/role"

pytestmark = pytest.mark.timeout(300)


class FakeEngineRunner:
    """`npu-runtime serve` as the fake engine, with the args the kubelet's ServeRunner would give it."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return ServeRunner().accepts(container)

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        return [sys.executable, "-m", "tests.sandbox.node.fake_engine", *ServeRunner().command(pod, container, args)]


def kubectl() -> str | None:
    return str(KUBECTL) if KUBECTL.is_file() else shutil.which("kubectl")


class Load:
    """A client sending completions through the router, one after another, counting who decoded each."""

    def __init__(self, url: str, pause: float) -> None:
        self.url = url
        self.pause = pause
        self.failures: list[str] = []
        self.decoded_by: dict[str, int] = {}
        self.sent = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            while not self._stop.is_set():
                body = {"model": "tiny-llama", "prompt": "Hello " * 40, "max_tokens": 4}
                self.sent += 1
                try:
                    async with session.post(f"{self.url}/v1/completions", json=body) as response:
                        answer = await response.text()
                        if response.status != 200:
                            self.failures.append(f"{response.status}: {answer[:200]}")
                            continue
                        text = (await response.json())["choices"][0]["text"]
                        pod = text.removeprefix("decoded by ")
                        self.decoded_by[pod] = self.decoded_by.get(pod, 0) + 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self.failures.append(repr(exc))
                await asyncio.sleep(self.pause)

    def stop(self) -> None:
        self._stop.set()


async def engines_chosen(metrics_url: str) -> dict[str, set[str]]:
    """The engines of each role the router has sent requests to (npu_router_engine_requests_total)."""
    async with aiohttp.ClientSession() as session, session.get(f"{metrics_url}/metrics") as response:
        text = await response.text()
    chosen: dict[str, set[str]] = {"prefill": set(), "decode": set()}
    for line in text.splitlines():
        found = re.match(r"npu_router_engine_requests_total\{(.*)\} (\S+)", line)
        if found and float(found[2]) > 0:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', found[1]))
            chosen.setdefault(labels["role"], set()).add(labels["engine"])
    return chosen


async def role_pods(cluster: LocalCluster, role: str) -> list[dict[str, Any]]:
    pods = await cluster.list_objects("v1", "pods", NS)
    return [p for p in pods if p["metadata"].get("labels", {}).get(ROLE_LABEL) == role]


async def ready_role_pods(cluster: LocalCluster, role: str, count: int) -> list[dict[str, Any]]:
    async def ready() -> list[dict[str, Any]] | None:
        found = [
            p
            for p in await role_pods(cluster, role)
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", ()))
        ]
        return found if len(found) == count else None

    result: list[dict[str, Any]] = await cluster.wait_for(ready, within=120, what=f"{count} ready {role} pods")
    return result


async def test_a_p_d_resource_scales_per_role_while_it_serves(tmp_path: Path) -> None:
    """Fake engines: decode 1 -> 2 and prefill 1 -> 2, in seconds."""
    models = tmp_path / "models"
    (models / "tiny-llama").mkdir(parents=True)
    await scale_while_serving(tmp_path, models / "tiny-llama", [FakeEngineRunner(), *DEFAULT_RUNNERS], prefill=True)


# Its own engines: a P/D resource scaled while it serves, from the in-process operator (not the CLI).
@pytest.mark.engine
async def test_real_cpu_engines_keep_serving_while_decode_scales_out(tiny_model: Path, tmp_path: Path) -> None:
    """Real vLLM CPU engines (the tiny model; their Mooncake connector mapped to vLLM's file-based
    ExampleConnector): decode 1 -> 2 through the resource's /scale; three engines in all."""
    # One completion a second: under back-to-back completions the two running engines keep both cores
    # busy and the new one (its OpenMP threads on the same cores) took over 300 s to start on a 2-core
    # CI machine; with the pause it took 156 s there. The waits follow the engines' logs.
    await scale_while_serving(tmp_path, tiny_model, list(DEFAULT_RUNNERS), prefill=False, pause=1.0)


async def scale_while_serving(
    tmp_path: Path, model: Path, runners: list[Any], *, prefill: bool, pause: float = 0.02
) -> None:
    """The P/D resource with spec.autoscaling Ready, a client sending completions through the router, then
    decode 1 -> 2 through the resource's /scale and (with `prefill`) prefill 1 -> 2 through its role
    scaler's /scale, as KEDA's HPA writes them; every completion must succeed and the router must send
    work to every engine; `kubectl get` shows the result."""
    manifest = example("sandbox-cpu-pd.yaml")
    manifest["spec"]["model"].update(
        {"path": str(model), "mountPath": str(model.parent), "source": {"hostPath": {"path": str(model.parent)}}}
    )
    manifest["spec"]["disaggregation"]["connector"]["extraConfig"] = {"shared_storage_path": str(tmp_path / "kv")}
    manifest["spec"]["autoscaling"] = {"maxReplicas": 2}
    manifest["spec"]["metrics"] = {"podMonitor": {"enabled": True}}
    manifest["spec"]["disaggregation"]["prefill"]["maxReplicas"] = 2
    emulator = KubeEmulator()
    emulator.serve_scaled_objects()
    async with LocalCluster(emulator=emulator, leader_worker_sets=True, disaggregated_sets=True) as cluster:
        await cluster.start_operator(CONFIG)
        environ = {
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
        kubelet = LocalKubelet(cluster, NS, workdir=tmp_path / "pods", environ=environ, runners=runners)
        load: Load | None = None
        try:
            await kubelet.start()
            await cluster.apply_npu_inference(manifest)
            began = time.monotonic()
            await wait_ready(cluster, NS, NAME, 1, 1, progress=engines_progress(kubelet))
            print(f"\nP/D resource Ready: {time.monotonic() - began:.0f}s")

            # Both roles' ScaledObjects are applied, each valid for KEDA v2.20.2, each on its own target.
            scaled = {
                o["metadata"]["name"]: o for o in await cluster.list_objects("keda.sh/v1alpha1", "scaledobjects", NS)
            }
            assert sorted(scaled) == [NAME, f"{NAME}-prefill"]
            for scaled_object in scaled.values():
                traffic_schemas.validate_scaled_object(scaled_object)
            assert scaled[f"{NAME}-prefill"]["spec"]["scaleTargetRef"]["kind"] == disaggregated.SCALER_KIND

            (router,) = [pod for pod in kubelet.pods if pod.object["metadata"]["labels"].get(ROLE_LABEL) == "router"]
            load = Load(router.api_url, pause)
            sending = asyncio.create_task(load.run())
            await cluster.wait_for(lambda: _answered(load), within=60, what="a first completion")
            assert not load.failures, load.failures

            # decode 1 -> 2 through the resource's /scale (as KEDA's HPA writes it), serving throughout.
            began = time.monotonic()
            await scale(cluster, NS, NAME, 2, progress=engines_progress(kubelet))
            print(f"decode scaled to 2 Ready: {time.monotonic() - began:.0f}s")
            await ready_role_pods(cluster, "decode", 2)
            prefills = 1
            scaler = f"{NAME}-prefill"
            if prefill:  # prefill 1 -> 2 through its DisaggregatedSetRoleScaler's /scale.
                await cluster.patch(
                    disaggregated.API_VERSION,
                    disaggregated.SCALER_PLURAL,
                    NS,
                    scaler,
                    {"spec": {"replicas": 2}},
                    subresource="scale",
                )
                prefills = 2
            await ready_role_pods(cluster, "prefill", prefills)

            async def every_engine_served() -> bool | None:
                chosen = await engines_chosen(router.metrics_url)
                return (len(chosen["prefill"]) == prefills and len(chosen["decode"]) == 2) or None

            # The router follows the role Services' records (--resolve-seconds): the new engines get work.
            await cluster.wait_for(every_engine_served, within=120, what="every engine of each role serving")

            async def scaler_counts() -> bool | None:
                found = await cluster.get(disaggregated.API_VERSION, disaggregated.SCALER_PLURAL, NS, f"{scaler}/scale")
                return (found is not None and found["status"].get("replicas") == prefills) or None

            await cluster.wait_for(scaler_counts, within=30, what=f"the prefill scaler's status at {prefills}")
            await asyncio.sleep(2)  # one more round of the stand-ins' status writes, for the kubectl output
            load.stop()
            await sending
            assert load.failures == [], load.failures
            print(
                f"{load.sent} completions through the router, none failed; {await engines_chosen(router.metrics_url)}"
            )
            # Every prefill's KV parameters named a prefill engine the router knows: none was dropped.
            async with aiohttp.ClientSession() as session, session.get(f"{router.metrics_url}/metrics") as response:
                dropped = [line for line in (await response.text()).splitlines() if 'reason="kv_params_' in line]
            assert all(line.endswith(" 0.0") for line in dropped), dropped

            scale_doc = await cluster.get(disaggregated.API_VERSION, disaggregated.SCALER_PLURAL, NS, f"{scaler}/scale")
            assert scale_doc is not None and scale_doc["spec"]["replicas"] == prefills
            obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
            assert obj is not None and obj["status"]["ready"] == "2/2"
            assert obj["status"]["autoscaling"]["prefill"]["maxReplicas"] == 2

            binary = kubectl()
            if binary is not None:
                env = {
                    "PATH": os.environ.get("PATH", ""),
                    "HOME": str(tmp_path / "home"),
                    "KUBECONFIG": str(cluster.kubeconfig),
                }
                shown = await asyncio.to_thread(
                    subprocess.run,
                    [binary, "get", "npuinf,disaggregatedsets,dsrs,leaderworkersets,scaledobjects,pods"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=env,
                )
                assert shown.returncode == 0, shown.stderr
                print(shown.stdout)
                assert f"{NAME}-prefill" in shown.stdout
        finally:
            if load is not None:
                load.stop()
            await kubelet.stop()
            await cluster.stop_operator()


async def _answered(load: Load) -> bool | None:
    """A completion came back (or one failed: the caller's assertion says which)."""
    return bool(load.decoded_by or load.failures) or None

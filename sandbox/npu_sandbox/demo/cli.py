"""`npu-sandbox`: the whole chain on this machine, no cluster and no NPU, in a few minutes.

1. an in-memory Kubernetes API over HTTP; the real helm installs the chart into it (README's
   cluster command), and a local kubelet runs the chart's operator Deployment as `npu-operator
   run` with its ServiceAccount's token, so the operator works under the chart's RBAC;
2. examples/sandbox-cpu.yaml applied through the API, as kubectl apply would;
3. the kubelet runs the model Deployment's pod args (the real `npu-runtime serve`, which plans
   and starts a real vLLM engine on CPU) and reports the pod back to the API;
4. progress until the NPUInference is Ready; then what a user would look at: `kubectl get npuinf`,
   status.graph, the Events, one OpenAI completion, the npu_graph_* metrics;
5. when the `prometheus` binary is there (or with --prometheus): a real Prometheus scraping the
   operator and the pod with the chart's alerts loaded, and what its HTTP API holds at the end,
   the npu_graph_* series and the alerts pending or firing;
6. `helm upgrade` with a changed value (the operator's pod rolls, the model keeps serving) and
   `helm uninstall` (the operator goes; the CRDs and the NPUInference stay, as the chart documents),
   then the resource deleted without the operator (nothing holds it: no finalizer), as the chart's
   NOTES say;
7. every process stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml
from npu_operator import crd
from npu_operator.api import is_true
from npu_operator.builders import LWS_API_VERSION, LWS_WORKER_INDEX_LABEL
from npu_operator.disaggregation import DS_API_VERSION, ROLE_LABEL

from npu_sandbox.apiserver import tables
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo import printer
from npu_sandbox.demo import prometheus as prom
from npu_sandbox.demo.helm import CHART, Helm, HelmFailed, operator_runners, values_args
from npu_sandbox.fixtures.local_hub import LocalHub, Repo
from npu_sandbox.node.kubelet import DEFAULT_RUNNERS, LOCAL_IP, LocalKubelet, LocalPod, free_port

ROOT: Final = Path(__file__).resolve().parents[3]
DEFAULT_MANIFEST: Final = ROOT / "examples" / "sandbox-cpu.yaml"
DEFAULT_WORKDIR: Final = Path("/tmp/npu-sandbox")
KUBECTL: Final = ROOT / ".cache" / "k8s-tools" / "bin" / "kubectl"
HUB_REPOSITORY: Final = "sandbox/tiny-llama"
HUB_FIELDS: Final = {"hf": "huggingFace", "ms": "modelScope"}
# How long a Ready resource may go without status.graph before the sandbox goes on without it.
GRAPH_GRACE_SECONDS: Final = 30.0


# README's quick start: the release and namespace a user installs the chart with.
RELEASE: Final = "npu-operator"
OPERATOR_NAMESPACE: Final = "npu-system"
# What the sandbox sets on top of the chart's defaults: quicker rounds for a short demo.
SANDBOX_VALUES: Final = {"operator.resyncSeconds": 2, "operator.statusPollSeconds": 2}
# The value `helm upgrade` changes: the operator's log level (its Deployment's env, so its pod rolls).
UPGRADE_VALUES: Final = {"operator.logLevel": "DEBUG"}
LOCAL_URL: Final = f"http://{LOCAL_IP}"
PEERING_NAME: Final = "npu-operator"  # values.yaml operator.peeringName


class SandboxFailed(Exception):
    """The chain broke somewhere; the message says where, with the evidence."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="npu-sandbox", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="serve this model directory instead of the generated tiny one")
    parser.add_argument(
        "--example",
        "--manifest",
        dest="manifest",
        type=example_path,
        default=DEFAULT_MANIFEST,
        help="the NPUInference to apply: a file, or the name of one in examples/ (default sandbox-cpu.yaml;\n"
        "sandbox-cpu-2node.yaml: one replica over two nodes, a LeaderWorkerSet group)",
    )
    parser.add_argument(
        "--kill-worker",
        action="store_true",
        help="multi-node: once Ready, kill the worker's engine and time the group's recreation until Ready",
    )
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="models, logs, kubeconfig")
    parser.add_argument("--keep-running", action="store_true", help="stay up for exploration until Ctrl-C")
    parser.add_argument("--summary", type=Path, help="write the final JSON summary to this file")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for Ready")
    parser.add_argument(
        "--prometheus",
        action=argparse.BooleanOptionalAction,
        help="scrape everything with a real Prometheus and load the chart's alerts "
        "(default: when the prometheus binary is installed)",
    )
    parser.add_argument(
        "--model-source",
        choices=("volume", "hf", "ms"),
        default="volume",
        help="volume: the model directory as a hostPath; hf, ms: a Hugging Face or ModelScope repository\n"
        "served by a local hub on 127.0.0.1, downloaded by the pod's init container into a fresh cache",
    )
    parser.add_argument(
        "--hub-rate", type=float, default=256 * 1024, help="the local hub's bytes/s per file (to watch progress)"
    )
    args = parser.parse_args(argv)
    try:
        workdir = args.workdir.resolve()
        (workdir / "pods").mkdir(parents=True, exist_ok=True)
        (workdir / "cluster").mkdir(exist_ok=True)
        model = prepare_model(args.model, workdir)
        if args.model_source == "volume":
            manifest = sandbox_manifest(args.manifest, model)
            summary = asyncio.run(run(args, manifest, workdir))
        else:
            shutil.rmtree(workdir / "volumes", ignore_errors=True)  # a fresh cache: the download is the point
            with LocalHub([Repo.from_directory(HUB_REPOSITORY, model)]) as hub:
                hub.rate = args.hub_rate or None
                manifest = hub_manifest(args.manifest, model, args.model_source, hub.url)
                summary = asyncio.run(run(args, manifest, workdir, hub))
    except SandboxFailed as exc:
        print(f"\nnpu-sandbox: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nnpu-sandbox: interrupted; everything is stopped", file=sys.stderr)
        return 130
    if args.summary:
        args.summary.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return 0


def example_path(text: str) -> Path:
    """A path as given, or a file of the repository's examples/ named by its file name."""
    path = Path(text)
    return path if path.exists() or path.parent != Path(".") else ROOT / "examples" / text


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(text: str) -> None:
    say(f"\n=== {text}")


async def run(
    args: argparse.Namespace, manifest: dict[str, Any], workdir: Path, hub: LocalHub | None = None
) -> dict[str, Any]:
    started, wall_started = time.monotonic(), time.time()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    with contextlib.suppress(NotImplementedError):  # SIGTERM stops like Ctrl-C: cleanly
        loop.add_signal_handler(signal.SIGTERM, main_task.cancel)

    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    prometheus = choose_prometheus(args.prometheus, workdir / "prometheus")

    # The API's log goes to a file (the operator's is its pod's): the terminal shows the story, the files the detail.
    log_file = workdir / "api.log"
    handler = logging.FileHandler(log_file, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)

    multi_node = int(manifest["spec"].get("npu", {}).get("nodes", 1)) > 1
    pd = "disaggregation" in manifest["spec"]
    async with LocalCluster(
        workdir=workdir / "cluster", leader_worker_sets=True, disaggregated_sets=True, crds=False
    ) as cluster:
        heading("Kubernetes API (in memory, over HTTP)")
        say(f"API server  {cluster.url}")
        say(f"kubeconfig  {cluster.kubeconfig}  (API log {log_file})")
        helm = Helm(cluster.kubeconfig, workdir / "helm")
        operator_kubelet = LocalKubelet(
            cluster, OPERATOR_NAMESPACE, workdir=workdir / "pods", runners=operator_runners(DEFAULT_RUNNERS)
        )
        kubelet = LocalKubelet(cluster, namespace, name, workdir=workdir / "pods")
        try:
            operator_pod = await install_operator(cluster, helm, operator_kubelet, host_path_values(manifest))

            heading(f"kubectl apply -f {args.manifest}")
            await cluster.apply_npu_inference(manifest)
            say(f"npuinference.inference.npu.dev/{name} created")

            if prometheus is not None:
                await start_prometheus(prometheus, operator_pod.ports["metrics"])
            workload = ("leaderworkersets", "LeaderWorkerSet") if multi_node else ("deployments", "Deployment")
            if pd:
                workload = ("disaggregatedsets", "DisaggregatedSet")
            await cluster.wait_for(lambda: workload_of(cluster, namespace, name, multi_node, pd), within=60)
            heading(
                f"kubelet: the {workload[1]}'s pods on this machine"
                + (" (the LeaderWorkerSet controller's stand-in makes its StatefulSets)" if multi_node else "")
                + (
                    " (the DisaggregatedSet stand-in makes a LeaderWorkerSet per role; the router waits for both)"
                    if pd
                    else ""
                )
            )
            pods = await kubelet.start_pods()
            for pod in pods:
                say(f"pod {pod.name}: npu-runtime serve ... (log {pod.log_path})")
                say("  ports: " + ", ".join(f"{key} {value}" for key, value in pod.ports.items()) + " (127.0.0.1)")
            if prometheus is not None:
                await set_pod_targets(cluster, kubelet, prometheus)

            heading("waiting for Ready")
            obj = await wait_ready(cluster, namespace, name, kubelet, args.timeout, started)
            if prometheus is not None:
                # A scrape of vLLM's counters before the completion, so that its histograms
                # (time to first token: one observation) rise between two samples.
                await prometheus.wait_for_scrapes_after(time.time())
            summary = await report(cluster, kubelet, namespace, name, obj, time.monotonic() - started)
            if prometheus is not None:
                summary["prometheus"] = await prometheus_report(prometheus, since=wall_started)
            if hub is not None:
                summary["hub"] = await second_resource(cluster, kubelet, manifest, hub)
            if args.kill_worker:
                summary["recovery"] = await kill_worker_engine(cluster, kubelet, namespace, name, args.timeout)
            if args.keep_running:
                pod = kubelet.pods[0]
                operator_pod = operator_kubelet.pods[0]
                heading("kept running: explore, then Ctrl-C")
                say(f"export KUBECONFIG={cluster.kubeconfig} PATH={KUBECTL.parent}:$PATH")
                say(f"kubectl get {'npuinf,lws,sts,svc,pods' if multi_node else 'npuinf,deploy,svc,pods'}")
                say(f"kubectl describe npuinf {name}   (more in README.md: Explore the sandbox with kubectl)")
                say(
                    f"helm list -A; helm upgrade {RELEASE} {CHART.relative_to(ROOT)} -n {OPERATOR_NAMESPACE} "
                    "--reuse-values --set operator.logLevel=DEBUG"
                )
                say(f"OpenAI API        {pod.api_url}/v1  (model {manifest['spec']['model']['name']})")
                say(f"runtime metrics   {pod.metrics_url}/metrics   status {pod.metrics_url}/status")
                say(
                    f"operator metrics  {LOCAL_URL}:{operator_pod.ports['metrics']}/metrics"
                    f"  (log {operator_pod.log_path})"
                )
                if prometheus is not None:
                    say(f"Prometheus        {prometheus.url}  (alerts {prometheus.url}/alerts)")
                await asyncio.Event().wait()
            summary["helm"] = {
                "upgrade": await upgrade_operator(
                    cluster, helm, operator_kubelet, kubelet, namespace, name, host_path_values(manifest)
                ),
                "uninstall": await uninstall_operator(cluster, helm, operator_kubelet, kubelet, namespace, name),
                "operator_pids": [p.process.pid for p in operator_kubelet.stopped if p.process is not None],
            }
            summary["deletion"] = await delete_resource(cluster, kubelet, namespace, name)
            return summary
        finally:
            heading("cleaning up")
            codes = await kubelet.stop()
            operator_codes = await operator_kubelet.stop()
            if prometheus is not None:
                await prometheus.stop()
            say(
                f"pods stopped (exit codes {codes}, operator {operator_codes}), API closed"
                + (", Prometheus stopped" if prometheus else "")
            )


# --- the product, installed with helm ------------------------------------------------------------


def helm_command(verb: str, values: dict[str, Any]) -> list[str]:
    chart = str(CHART.relative_to(ROOT))
    extra = ["--create-namespace"] if verb == "install" else []
    return [verb, RELEASE, chart, "-n", OPERATOR_NAMESPACE, *extra, *values_args(values)]


async def run_helm(helm: Helm, args: list[str], *, lines: int | None = None) -> str:
    heading("helm " + " ".join(args))
    try:
        output = await helm(*args)
    except HelmFailed as exc:
        raise SandboxFailed(str(exc)) from exc
    shown = output.rstrip().splitlines()
    say("\n".join(shown[:lines] if lines else shown))
    return output


async def operator_deployment(cluster: LocalCluster) -> dict[str, Any] | None:
    found = await cluster.list_objects("apps/v1", "deployments", OPERATOR_NAMESPACE)
    return found[0] if found else None


def host_path_values(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod-template policy's default (Restricted) refuses hostPath sources outside the listed
    directories: the sandbox lists its model's, as a platform engineer lists the nodes' model disk."""
    host_path = manifest["spec"]["model"]["source"].get("hostPath")
    return {"operator.podTemplatePolicy.allowedHostPaths": "{" + host_path["path"] + "}"} if host_path else {}


async def install_operator(
    cluster: LocalCluster, helm: Helm, kubelet: LocalKubelet, values: dict[str, Any]
) -> LocalPod:
    """README's quick start on a cluster: helm install; the operator's pod then runs here."""
    await run_helm(helm, helm_command("install", SANDBOX_VALUES | values), lines=6)
    await run_helm(helm, ["list", "-A"])
    kinds = "deploy,sa,clusterrole,clusterrolebinding"
    heading(f"kubectl get {kinds} -n {OPERATOR_NAMESPACE}")
    say(await kubectl_get(cluster, OPERATOR_NAMESPACE, kinds))
    deployment = await operator_deployment(cluster)
    if deployment is None:
        raise SandboxFailed(f"helm install made no Deployment in {OPERATOR_NAMESPACE}")
    kubelet.workload = deployment["metadata"]["name"]
    (pod,) = await kubelet.start_pods()
    account = deployment["spec"]["template"]["spec"].get("serviceAccountName")
    heading("kubelet: the chart's operator pod on this machine")
    say(f"pod {pod.name}: npu-operator run (ServiceAccount {OPERATOR_NAMESPACE}/{account}; log {pod.log_path})")
    say("  ports: " + ", ".join(f"{key} {value}" for key, value in pod.ports.items()) + " (127.0.0.1)")
    return pod


async def completion(pod: LocalPod, model_name: str) -> str | None:
    """One OpenAI completion from the pod (None: it did not answer 200)."""
    request = {"model": model_name, "prompt": "Graph capture on Ascend", "max_tokens": 8, "temperature": 0}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(f"{pod.api_url}/v1/completions", json=request) as response,
    ):
        answer = await response.json(content_type=None)
    return str(answer["choices"][0]["text"]) if response.status == 200 else None


async def upgrade_operator(
    cluster: LocalCluster,
    helm: Helm,
    operator_kubelet: LocalKubelet,
    kubelet: LocalKubelet,
    namespace: str,
    name: str,
    values: dict[str, Any],
) -> dict[str, Any]:
    """helm upgrade with a changed value: the operator's pod rolls (Recreate), the model keeps serving."""
    before = {pod.uid for pod in operator_kubelet.pods}
    model_pods = {pod.uid for pod in kubelet.pods}
    old_peers = await peers(cluster)
    await run_helm(helm, helm_command("upgrade", SANDBOX_VALUES | values | UPGRADE_VALUES), lines=6)

    async def rolled() -> list[LocalPod] | None:
        pods = [pod for pod in operator_kubelet.pods if pod.uid not in before and pod.process is not None]
        old = [pod for pod in operator_kubelet.stopped if pod.uid in before]
        return pods if pods and all(pod.exited.is_set() for pod in old) else None

    (pod,) = await cluster.wait_for(rolled, within=120, what="the operator's pod rolled")
    deployment = await operator_deployment(cluster) or {}
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    say(f"operator pod {pod.name} replaced the old one; NPU_OPERATOR_LOG_LEVEL={env.get('NPU_OPERATOR_LOG_LEVEL')}")

    async def announced() -> set[str]:  # the new operator's keep-alive: a patch its RBAC must allow
        return await peers(cluster) - old_peers

    new_peers = await cluster.wait_for(announced, within=60, what="the new operator in its peering object")
    say(f"clusterkopfpeering/{PEERING_NAME}: the new operator announced itself as {sorted(new_peers)}")
    await run_helm(helm, ["history", RELEASE, "-n", OPERATOR_NAMESPACE])
    obj = await cluster.wait_for(
        lambda: ready_resource(cluster, namespace, name), within=60, what=f"{name} Ready under the new operator"
    )
    serving = await behind_service(cluster, kubelet, namespace, name)
    answer = await completion(serving, obj["spec"]["model"]["name"])
    unchanged = {pod.uid for pod in kubelet.pods} == model_pods
    say(f"{name}: Ready, model pods unchanged: {unchanged}, completion {answer!r}")
    return {
        "revision": json.loads(await helm("status", RELEASE, "-n", OPERATOR_NAMESPACE, "-o", "json"))["version"],
        "log_level": env.get("NPU_OPERATOR_LOG_LEVEL"),
        "operator_pods": {"before": sorted(before), "after": [pod.uid]},
        "peers": {"before": sorted(old_peers), "new": sorted(new_peers)},
        "ready": is_true(obj, "Ready"),
        "model_pods_unchanged": unchanged,
        "completion": answer,
    }


async def peers(cluster: LocalCluster) -> set[str]:
    """The operators alive in the chart's ClusterKopfPeering (kopf writes each one's id in its status)."""
    obj = await cluster.get("kopf.dev/v1", "clusterkopfpeerings", None, PEERING_NAME)
    return set((obj or {}).get("status") or {})


async def ready_resource(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name)
    return obj if obj is not None and is_true(obj, "Ready") else None


async def uninstall_operator(
    cluster: LocalCluster, helm: Helm, operator_kubelet: LocalKubelet, kubelet: LocalKubelet, namespace: str, name: str
) -> dict[str, Any]:
    """helm uninstall: the operator goes; the CRDs (keep policy) and the users' resources stay, and serve."""
    await run_helm(helm, ["uninstall", RELEASE, "-n", OPERATOR_NAMESPACE])

    async def gone() -> bool:
        return not operator_kubelet.pods and all(pod.exited.is_set() for pod in operator_kubelet.stopped)

    await cluster.wait_for(gone, within=120, what="the operator's pod stopped")
    left = {
        plural: [obj["metadata"]["name"] for obj in await cluster.list_objects(version, plural, OPERATOR_NAMESPACE)]
        for version, plural in (("apps/v1", "deployments"), ("v1", "serviceaccounts"), ("v1", "pods"))
    }
    roles = [
        obj["metadata"]["name"]
        for obj in await cluster.list_objects("rbac.authorization.k8s.io/v1", "clusterroles")
        if obj["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == RELEASE
    ]
    crds = [
        obj["metadata"]["name"]
        for obj in await cluster.list_objects("apiextensions.k8s.io/v1", "customresourcedefinitions")
    ]
    releases = (await helm("list", "-A", "-q")).split()
    heading(f"kubectl get deploy,sa,pods -n {OPERATOR_NAMESPACE}; kubectl get crd; helm list -A")
    say(f"{OPERATOR_NAMESPACE}: {left}; the release's ClusterRoles: {roles}; releases: {releases}")
    say(await kubectl_get(cluster, namespace, "crd"))
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name)
    serving = await behind_service(cluster, kubelet, namespace, name)
    answer = await completion(serving, (obj or {})["spec"]["model"]["name"])
    say(
        f"npuinference {name} kept (as the chart documents): Ready={is_true(obj or {}, 'Ready')}, completion {answer!r}"
    )
    return {
        "left": left,
        "cluster_roles": roles,
        "releases": releases,
        "crds": crds,
        "resource_kept": obj is not None,
        "completion": answer,
    }


def choose_prometheus(wanted: bool | None, workdir: Path) -> prom.LocalPrometheus | None:
    """--prometheus: required; --no-prometheus: off; neither: on when the binary is installed."""
    if wanted is False:
        return None
    if prom.binary() is None:
        if wanted:
            raise SandboxFailed(
                "--prometheus: no prometheus binary (apt-get install --no-install-recommends prometheus; "
                "scripts/bootstrap does it as root on Debian)"
            )
        say("(no prometheus binary: running without Prometheus; scripts/bootstrap installs it as root on Debian)")
        return None
    shutil.rmtree(workdir / "data", ignore_errors=True)  # this run's series only
    workdir.mkdir(parents=True, exist_ok=True)
    return prom.LocalPrometheus(workdir)


async def start_prometheus(prometheus: prom.LocalPrometheus, operator_metrics_port: int) -> None:
    try:
        groups = await asyncio.to_thread(prom.chart_rule_groups)
        await prometheus.start(groups, free_port())
    except prom.PrometheusUnavailable as exc:
        raise SandboxFailed(f"Prometheus: {exc}") from exc
    prometheus.set_targets("operator", prom.operator_targets(operator_metrics_port))
    rules = sum(len(group["rules"]) for group in groups)
    heading("Prometheus: scraping the operator and, once it runs, the pod; the chart's alerts loaded")
    say(f"Prometheus  {prometheus.url} (scrapes every {prom.SCRAPE_INTERVAL_SECONDS}s, {rules} alerts)")
    say(f"log         {prometheus.log_path}")


async def prometheus_report(prometheus: prom.LocalPrometheus, since: float) -> dict[str, Any]:
    """After one more scrape of everything: the npu_graph_* series and the alerts, from the API."""
    await prometheus.wait_for_scrapes_after(time.time())
    found = await prom.report(prometheus, since)
    heading(f"Prometheus {prometheus.url}: npu_graph_* series scraped (GET /api/v1/series)")
    say("\n".join(found["series"]) or "(none)")
    heading(f"Prometheus {prometheus.url}: alerts pending or firing (GET /api/v1/alerts)")
    say(
        printer.columns(
            [("ALERT", "STATE", "SUMMARY")] + [(a["name"], a["state"], a["summary"]) for a in found["alerts"]]
        )
        if found["alerts"]
        else "(none)"
    )
    found["window"] = {"start": since, "end": time.time()}
    return found


def prepare_model(model: Path | None, workdir: Path) -> Path:
    if model is not None:
        if not (model / "config.json").is_file():
            raise SandboxFailed(f"--model {model}: no config.json there")
        return model.resolve()
    tiny = workdir / "models" / "tiny-llama"
    if not (tiny / "config.json").is_file():
        say(f"generating the tiny model into {tiny} (seeded, no download)")
        command = [sys.executable, "-m", "npu_sandbox.fixtures.tiny_model", str(tiny)]
        if subprocess.run(command, check=False).returncode != 0:
            raise SandboxFailed("could not generate the tiny model (is the sandbox extra installed?)")
    return tiny


def hub_manifest(path: Path, model: Path, source: str, endpoint: str) -> dict[str, Any]:
    """The example, its model taken from the local hub's repository into a cache claim the operator creates."""
    manifest = sandbox_manifest(path, model)
    spec_model = manifest["spec"]["model"]
    for key in ("path", "mountPath"):
        spec_model.pop(key, None)
    spec_model["source"] = {HUB_FIELDS[source]: {"repository": HUB_REPOSITORY, "endpoint": endpoint}}
    spec_model["cache"] = {"claimName": "model-cache", "create": {"size": "10Gi"}}
    return manifest


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


def sandbox_manifest(path: Path, model: Path) -> dict[str, Any]:
    """The example, pointed at the model directory on this machine (a hostPath volume)."""
    if not path.is_file():
        raise SandboxFailed(f"{path}: not found (run from a clone of the repository, or pass --manifest)")
    manifest: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    manifest["metadata"].setdefault("namespace", "default")
    spec_model = manifest["spec"]["model"]
    spec_model.update(path=str(model), mountPath=str(model.parent), source={"hostPath": {"path": str(model.parent)}})
    if model.name != "tiny-llama":
        spec_model["name"] = model.name
    connector = manifest["spec"].get("disaggregation", {}).get("connector", {})
    if "shared_storage_path" in connector.get("extraConfig", {}):  # the KV files, under the workdir
        connector["extraConfig"]["shared_storage_path"] = str(model.parent.parent / "kv")
    return manifest


async def workload_of(
    cluster: LocalCluster, namespace: str, name: str, multi_node: bool, pd: bool = False
) -> dict[str, Any] | None:
    if pd:
        return await cluster.get(DS_API_VERSION, "disaggregatedsets", namespace, name)
    if multi_node:
        return await cluster.get(LWS_API_VERSION, "leaderworkersets", namespace, name)
    return await cluster.get("apps/v1", "deployments", namespace, name)


async def set_pod_targets(cluster: LocalCluster, kubelet: LocalKubelet, prometheus: prom.LocalPrometheus) -> None:
    targets = []
    for pod in kubelet.pods:
        pod_object = await cluster.get("v1", "pods", pod.namespace, pod.name) or {}
        targets += prom.pod_targets(pod_object, pod.ports)
    prometheus.set_targets("pods", targets)


async def wait_ready(
    cluster: LocalCluster, namespace: str, name: str, kubelet: LocalKubelet, within: float, started: float
) -> dict[str, Any]:
    """Print each change of phase, condition reason and engine states until Ready (or a failure)."""
    deadline = time.monotonic() + within
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
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {pod.log_path}\n{pod.log_tail(25)}" for pod in pods)
                raise SandboxFailed(f"not Ready after {within:.0f}s; last lines of the pods' logs:\n{tails}")
            await asyncio.sleep(1.0)


async def runtime_state(session: aiohttp.ClientSession, pod: LocalPod) -> str | None:
    try:
        async with session.get(f"{pod.metrics_url}/status") as response:
            document = await response.json(content_type=None)
            return str(document.get("state"))
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
        return None


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


async def report(
    cluster: LocalCluster, kubelet: LocalKubelet, namespace: str, name: str, obj: dict[str, Any], elapsed: float
) -> dict[str, Any]:
    """Show what a user would look at, and return it as the summary."""
    multi_node = int(obj["spec"].get("npu", {}).get("nodes", 1)) > 1
    heading(f"Ready after {elapsed:.0f}s")
    kinds = "npuinf,leaderworkersets,statefulsets,pods" if multi_node else "npuinf,deployments,pods"
    if "disaggregation" in obj["spec"]:
        kinds = "npuinf,leaderworkersets,deployments,pods"
    heading(f"kubectl get {kinds}")
    say(await kubectl_get(cluster, namespace, kinds))

    heading(f"kubectl get npuinf {name} -o yaml | yq .status.graph")
    graph = obj["status"].get("graph", {})
    say(yaml.safe_dump(graph, sort_keys=False).rstrip() if graph else "(none)")

    heading("Events")
    events = await events_of(cluster, namespace, name)
    say(
        printer.columns(
            [("TYPE", "REASON", "OBJECT", "MESSAGE")]
            + [
                (e["type"], e["reason"], f"{e['involvedObject']['kind'].lower()}/{name}", e.get("message", ""))
                for e in events
            ]
        )
    )

    model_name = obj["spec"]["model"]["name"]
    pod = await behind_service(cluster, kubelet, namespace, name)
    heading(f"POST http://{name}.{namespace}.svc:8000/v1/completions -> pod {pod.name}: {pod.api_url}/v1/completions")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        request = {"model": model_name, "prompt": "Graph capture on Ascend", "max_tokens": 16, "temperature": 0}
        say(json.dumps(request))
        async with session.post(f"{pod.api_url}/v1/completions", json=request) as response:
            answer = await response.json(content_type=None)
        completion = answer.get("choices", [{}])[0].get("text", "") if response.status == 200 else None
        say(f"-> {response.status}: {completion!r}" if completion is not None else f"-> {response.status}: {answer}")

        # A P/D resource's Service reaches its router: the graph metrics are the decode engine's.
        engine = next((p for p in kubelet.pods if p.labels.get(ROLE_LABEL) == "decode"), pod)
        heading(f"GET {engine.metrics_url}/metrics | grep ^npu_graph_")
        async with session.get(f"{engine.metrics_url}/metrics") as response:
            metrics_text = await response.text()
        metric_lines = [line for line in metrics_text.splitlines() if line.startswith("npu_graph_")]
        say("\n".join(metric_lines))
        pids: dict[str, int | None] = {}
        for each in kubelet.pods:
            pids[f"{each.name} runtime"] = each.process.pid if each.process else None
            if each.labels.get(ROLE_LABEL) == "router":  # `npu-runtime route` runs no engine
                continue
            async with session.get(f"{each.metrics_url}/status") as response:
                runtime_status = await response.json(content_type=None)
            pids[f"{each.name} engine"] = runtime_status["engine"]["pid"]

    status = obj["status"]
    pd = await disaggregated_run(kubelet, obj, pod) if "disaggregation" in obj["spec"] else None
    return {
        **({"pd": pd} if pd is not None else {}),
        "ready": is_true(obj, "Ready"),
        "phase": status.get("phase"),
        "seconds_to_ready": round(elapsed, 1),
        "model": status.get("model"),
        "requested_mode": graph.get("requestedMode"),
        "effective_mode": graph.get("effectiveMode"),
        "downgrades": graph.get("downgrades", []),
        "graph": graph,
        "events": [{"type": e["type"], "reason": e["reason"], "message": e.get("message", "")} for e in events],
        "completion": completion,
        "served_by": pod.name,
        "metrics": metric_lines,
        "pids": pids,
        "pods": [each.name for each in kubelet.pods],
        "logs": [str(each.log_path) for each in kubelet.pods],
    }


# Longer than one KV block (128 tokens on CPU), so that the prefill role's KV goes over as files.
PD_PROMPT: Final = " ".join(f"the quick brown fox number {i} jumps over the lazy dog" for i in range(15))


def kv_handover(storage: Path, decode_logs: list[Path]) -> tuple[list[str], bool]:
    """The KV files the prefill engine saved, and whether a decode engine logged loading them."""
    files = (
        sorted(str(path.relative_to(storage)) for path in storage.rglob("*.safetensors")) if storage.is_dir() else []
    )
    return files, any("External Cache Hit!" in log.read_text(errors="replace") for log in decode_logs)


async def disaggregated_run(kubelet: LocalKubelet, obj: dict[str, Any], router: LocalPod) -> dict[str, Any]:
    """Prefill/decode: a long prompt through the router (the resource's Service), then the KV handed
    over (files in the connector's folder, the decode engine's cache hit), then the same prompt
    straight to the prefill engine, which prefills and decodes it alone: greedy, the texts must agree."""
    by_role = {role: [p for p in kubelet.pods if p.labels.get(ROLE_LABEL) == role] for role in ("prefill", "decode")}
    storage = Path(obj["spec"]["disaggregation"]["connector"]["extraConfig"]["shared_storage_path"])
    request = {"model": obj["spec"]["model"]["name"], "prompt": PD_PROMPT, "max_tokens": 12, "temperature": 0}
    request["return_token_ids"] = True  # vLLM's extension: the tiny model's tokens may print as nothing
    heading(f"P/D: a {len(PD_PROMPT)}-character prompt through the router, then straight to the prefill engine")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async with session.post(f"{router.api_url}/v1/completions", json=request) as response:
            routed = await response.json(content_type=None)
        files, hit = kv_handover(storage, [p.log_path for p in by_role["decode"]])
        async with session.post(f"{by_role['prefill'][0].api_url}/v1/completions", json=request) as response:
            direct = await response.json(content_type=None)
        roles = {}
        for role, pods in by_role.items():
            async with session.get(f"{pods[0].metrics_url}/status") as response:
                roles[role] = (await response.json(content_type=None)).get("plan", {}).get("kv_transfer")
    answers = {"routed": routed, "direct": direct}
    text = {key: answer.get("choices", [{}])[0].get("text") for key, answer in answers.items()}
    token_ids = {key: answer.get("choices", [{}])[0].get("token_ids") for key, answer in answers.items()}
    say(f"routed   -> {text['routed']!r} ({routed.get('usage', {}).get('prompt_tokens')} prompt tokens)")
    say(f"prefill  -> {text['direct']!r}")
    say(f"KV files in {storage}: {len(files)}; decode engine's log has 'External Cache Hit!': {hit}")
    say(f"token ids: routed {token_ids['routed']}, prefill {token_ids['direct']}")
    return {
        "routed": text["routed"],
        "direct": text["direct"],
        "routed_token_ids": token_ids["routed"],
        "direct_token_ids": token_ids["direct"],
        "prompt_tokens": routed.get("usage", {}).get("prompt_tokens"),
        "kv_files": files,
        "decode_cache_hit": hit,
        "kv_transfer": roles,
        "pods": {role: [p.name for p in pods] for role, pods in by_role.items()},
        "decode_log": [str(p.log_path) for p in by_role["decode"]],
    }


async def events_of(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events of the resource and of its workload (a LeaderWorkerSet has the resource's name)."""
    return [
        e
        for e in await cluster.list_objects("v1", "events", namespace)
        if e.get("involvedObject", {}).get("name") == name
    ]


async def kill_worker_engine(
    cluster: LocalCluster, kubelet: LocalKubelet, namespace: str, name: str, within: float
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
        if time.monotonic() - killed > within:
            raise SandboxFailed(f"the group was not Ready again {within:.0f}s after its worker's engine died")
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


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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


if __name__ == "__main__":
    sys.exit(main())

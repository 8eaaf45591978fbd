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
import dataclasses
import json
import logging
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Final

from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo import prometheus as prom
from npu_sandbox.demo.console import SandboxFailed, heading, say
from npu_sandbox.demo.helm import (
    OPERATOR_NAMESPACE,
    RELEASE,
    Helm,
    install_operator,
    operator_runners,
    operator_values,
    uninstall_operator,
    upgrade_operator,
)
from npu_sandbox.demo.manifests import (
    DEFAULT_MANIFEST,
    HUB_REPOSITORY,
    example_path,
    hub_manifest,
    prepare_model,
    sandbox_manifest,
)
from npu_sandbox.demo.reports import prometheus_report, report
from npu_sandbox.demo.repository import CHART, KUBECTL, ROOT
from npu_sandbox.demo.steps import (
    delete_resource,
    kill_worker_engine,
    second_resource,
    wait_ready,
    workload_of,
)
from npu_sandbox.fixtures.local_hub import LocalHub, Repo
from npu_sandbox.node.isolation import IsolationUnavailable
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.node.network import free_port
from npu_sandbox.node.runners import DEFAULT_RUNNERS
from npu_sandbox.progress import CEILING_SECONDS, STALL_SECONDS, logs_progress

DEFAULT_WORKDIR: Final = Path("/tmp/npu-sandbox")


def main(argv: list[str] | None = None) -> int:
    """`npu-sandbox`: the model prepared, the story told (`run`), the summary written; 1 when it failed."""
    args = command_line().parse_args(argv)
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


def command_line() -> argparse.ArgumentParser:
    """The command line: this module's docstring is its help."""
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
    parser.add_argument(
        "--timeout",
        type=float,
        default=CEILING_SECONDS,
        help="the most seconds to wait for Ready (sooner, see --stall, when the pods stop advancing)",
    )
    parser.add_argument(
        "--stall",
        type=float,
        default=STALL_SECONDS,
        help="give up waiting for Ready after this many seconds in which no pod's log grew",
    )
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
    return parser


@dataclasses.dataclass
class Sandbox:
    """One run's parts: the API, helm, a kubelet for the operator's namespace and one for the model's."""

    args: argparse.Namespace
    manifest: dict[str, Any]
    cluster: LocalCluster
    helm: Helm
    operator_kubelet: LocalKubelet
    kubelet: LocalKubelet
    prometheus: prom.LocalPrometheus | None
    hub: LocalHub | None
    started: float  # time.monotonic() at the start
    wall_started: float  # time.time() at the start

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"]["namespace"])

    @property
    def multi_node(self) -> bool:
        return int(self.manifest["spec"].get("npu", {}).get("nodes", 1)) > 1

    @property
    def pd(self) -> bool:
        return "disaggregation" in self.manifest["spec"]


async def run(
    args: argparse.Namespace, manifest: dict[str, Any], workdir: Path, hub: LocalHub | None = None
) -> dict[str, Any]:
    """The story (the module's docstring), from an empty API to every process stopped; the summary."""
    started, wall_started = time.monotonic(), time.time()
    stop_on_sigterm()
    prometheus = choose_prometheus(args.prometheus, workdir / "prometheus")
    log_file = log_api_to(workdir / "api.log")
    async with LocalCluster(
        workdir=workdir / "cluster", leader_worker_sets=True, disaggregated_sets=True, crds=False
    ) as cluster:
        heading("Kubernetes API (in memory, over HTTP)")
        say(f"API server  {cluster.url}")
        say(f"kubeconfig  {cluster.kubeconfig}  (API log {log_file})")
        sandbox = Sandbox(
            args=args,
            manifest=manifest,
            cluster=cluster,
            helm=Helm(cluster.kubeconfig, workdir / "helm"),
            operator_kubelet=LocalKubelet(
                cluster, OPERATOR_NAMESPACE, workdir=workdir / "pods", runners=operator_runners(DEFAULT_RUNNERS)
            ),
            kubelet=LocalKubelet(
                cluster, manifest["metadata"]["namespace"], manifest["metadata"]["name"], workdir=workdir / "pods"
            ),
            prometheus=prometheus,
            hub=hub,
            started=started,
            wall_started=wall_started,
        )
        try:
            return await tell(sandbox)
        except IsolationUnavailable as exc:  # the kubelet cannot give pods their own names here
            raise SandboxFailed(str(exc)) from exc
        finally:
            await clean_up(sandbox)


def stop_on_sigterm() -> None:
    """SIGTERM stops the story like Ctrl-C: cleanly."""
    main_task = asyncio.current_task()
    assert main_task is not None
    with contextlib.suppress(NotImplementedError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)


def log_api_to(log_file: Path) -> Path:
    """The API's log goes to a file (the operator's is its pod's): the terminal shows the story, the files
    the detail."""
    handler = logging.FileHandler(log_file, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    return log_file


async def tell(sandbox: Sandbox) -> dict[str, Any]:
    """Steps 1 to 6 of the module's docstring, in order; the summary of what each showed."""
    cluster, helm, manifest = sandbox.cluster, sandbox.helm, sandbox.manifest
    operator_pod = await install_operator(cluster, helm, sandbox.operator_kubelet, operator_values(manifest))
    heading(f"kubectl apply -f {sandbox.args.manifest}")
    await cluster.apply_npu_inference(manifest)
    say(f"npuinference.inference.npu.dev/{sandbox.name} created")
    if sandbox.prometheus is not None:
        await start_prometheus(sandbox.prometheus, operator_pod.ip, operator_pod.ports["metrics"])
    await start_model_pods(sandbox)
    summary = await once_ready(sandbox)
    if sandbox.args.keep_running:
        await keep_running(sandbox)
    summary["helm"] = await upgrade_and_uninstall(sandbox)
    summary["deletion"] = await delete_resource(cluster, sandbox.kubelet, sandbox.namespace, sandbox.name)
    return summary


async def start_model_pods(sandbox: Sandbox) -> None:
    """Once the operator made the workload, the kubelet runs its pods here (and Prometheus scrapes them)."""
    cluster, namespace, name = sandbox.cluster, sandbox.namespace, sandbox.name
    multi_node, pd = sandbox.multi_node, sandbox.pd
    workload = ("leaderworkersets", "LeaderWorkerSet") if multi_node else ("deployments", "Deployment")
    if pd:
        workload = ("disaggregatedsets", "DisaggregatedSet")
    await cluster.wait_for(lambda: workload_of(cluster, namespace, name, multi_node, pd), within=60)
    heading(
        f"kubelet: the {workload[1]}'s pods on this machine"
        + (" (the LeaderWorkerSet controller's stand-in makes its StatefulSets)" if multi_node else "")
        + (" (the DisaggregatedSet stand-in makes a LeaderWorkerSet per role; then the router)" if pd else "")
    )
    pods = await sandbox.kubelet.start_pods()
    for pod in pods:
        say(f"pod {pod.name}: npu-runtime serve ... (log {pod.log_path})")
        say(f"  address {pod.ip}, ports " + ", ".join(f"{key} {value}" for key, value in pod.ports.items()))
    if sandbox.prometheus is not None:
        await set_pod_targets(cluster, sandbox.kubelet, sandbox.prometheus)


async def once_ready(sandbox: Sandbox) -> dict[str, Any]:
    """Wait for Ready; then the report, and what the options ask for (Prometheus, the hub, --kill-worker)."""
    cluster, kubelet, namespace, name = sandbox.cluster, sandbox.kubelet, sandbox.namespace, sandbox.name
    prometheus = sandbox.prometheus
    heading("waiting for Ready")
    progress = logs_progress(lambda: [p.log_path for p in kubelet.pods], sandbox.args.stall, sandbox.args.timeout)
    obj = await wait_ready(cluster, namespace, name, kubelet, progress, sandbox.started)
    if prometheus is not None:
        # A scrape of vLLM's counters before the completion, so that its histograms
        # (time to first token: one observation) rise between two samples.
        await prometheus.wait_for_scrapes_after(time.time())
    summary = await report(cluster, kubelet, namespace, name, obj, time.monotonic() - sandbox.started)
    if prometheus is not None:
        summary["prometheus"] = await prometheus_report(prometheus, since=sandbox.wall_started)
    if sandbox.hub is not None:
        summary["hub"] = await second_resource(cluster, kubelet, sandbox.manifest, sandbox.hub)
    if sandbox.args.kill_worker:
        recovery = logs_progress(lambda: [p.log_path for p in kubelet.pods], sandbox.args.stall, sandbox.args.timeout)
        summary["recovery"] = await kill_worker_engine(cluster, kubelet, namespace, name, recovery)
    return summary


async def keep_running(sandbox: Sandbox) -> None:
    """--keep-running: say where everything is, then wait for Ctrl-C."""
    pod = sandbox.kubelet.pods[0]
    operator_pod = sandbox.operator_kubelet.pods[0]
    heading("kept running: explore, then Ctrl-C")
    say(f"export KUBECONFIG={sandbox.cluster.kubeconfig} PATH={KUBECTL.parent}:$PATH")
    say(f"kubectl get {'npuinf,lws,sts,svc,pods' if sandbox.multi_node else 'npuinf,deploy,svc,pods'}")
    say(f"kubectl describe npuinf {sandbox.name}   (more in README.md: Explore the sandbox with kubectl)")
    say(
        f"helm list -A; helm upgrade {RELEASE} {CHART.relative_to(ROOT)} -n {OPERATOR_NAMESPACE} "
        "--reuse-values --set operator.logLevel=DEBUG"
    )
    say(f"OpenAI API        {pod.api_url}/v1  (model {sandbox.manifest['spec']['model']['name']})")
    say(f"runtime metrics   {pod.metrics_url}/metrics   status {pod.metrics_url}/status")
    say(f"operator metrics  {operator_pod.metrics_url}/metrics  (log {operator_pod.log_path})")
    if sandbox.prometheus is not None:
        say(f"Prometheus        {sandbox.prometheus.url}  (alerts {sandbox.prometheus.url}/alerts)")
    await asyncio.Event().wait()


async def upgrade_and_uninstall(sandbox: Sandbox) -> dict[str, Any]:
    """helm upgrade (the operator's pod rolls), then helm uninstall (the operator goes, the resource stays)."""
    cluster, helm, operator_kubelet, kubelet = sandbox.cluster, sandbox.helm, sandbox.operator_kubelet, sandbox.kubelet
    namespace, name = sandbox.namespace, sandbox.name
    return {
        "upgrade": await upgrade_operator(
            cluster, helm, operator_kubelet, kubelet, namespace, name, operator_values(sandbox.manifest)
        ),
        "uninstall": await uninstall_operator(cluster, helm, operator_kubelet, kubelet, namespace, name),
        "operator_pids": [p.process.pid for p in operator_kubelet.stopped if p.process is not None],
    }


async def clean_up(sandbox: Sandbox) -> None:
    """Step 7: every pod's processes stopped, and Prometheus; the API closes after."""
    heading("cleaning up")
    codes = await sandbox.kubelet.stop()
    operator_codes = await sandbox.operator_kubelet.stop()
    if sandbox.prometheus is not None:
        await sandbox.prometheus.stop()
    say(
        f"pods stopped (exit codes {codes}, operator {operator_codes}), API closed"
        + (", Prometheus stopped" if sandbox.prometheus else "")
    )


# --- Prometheus, when there is one ---------------------------------------------------------------


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


async def start_prometheus(prometheus: prom.LocalPrometheus, operator_address: str, operator_metrics_port: int) -> None:
    try:
        groups = await asyncio.to_thread(prom.chart_rule_groups)
        await prometheus.start(groups, free_port())
    except prom.PrometheusUnavailable as exc:
        raise SandboxFailed(f"Prometheus: {exc}") from exc
    prometheus.set_targets("operator", prom.operator_targets(operator_address, operator_metrics_port))
    rules = sum(len(group["rules"]) for group in groups)
    heading("Prometheus: scraping the operator and, once it runs, the pod; the chart's alerts loaded")
    say(f"Prometheus  {prometheus.url} (scrapes every {prom.SCRAPE_INTERVAL_SECONDS}s, {rules} alerts)")
    say(f"log         {prometheus.log_path}")


async def set_pod_targets(cluster: LocalCluster, kubelet: LocalKubelet, prometheus: prom.LocalPrometheus) -> None:
    targets = []
    for pod in kubelet.pods:
        pod_object = await cluster.get("v1", "pods", pod.namespace, pod.name) or {}
        targets += prom.pod_targets(pod_object)
    prometheus.set_targets("pods", targets)


if __name__ == "__main__":
    sys.exit(main())

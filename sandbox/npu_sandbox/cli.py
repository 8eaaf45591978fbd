"""`npu-sandbox`: the whole chain on this machine, no cluster and no NPU, in a few minutes.

1. an in-memory Kubernetes API over HTTP and the real operator against it;
2. examples/sandbox-cpu.yaml applied through the API, as kubectl apply would;
3. a local kubelet that runs the Deployment's pod args (the real `npu-runtime serve`, which plans
   and starts a real vLLM engine on CPU) and reports the pod back to the API;
4. progress until the NPUInference is Ready; then what a user would look at: `kubectl get npuinf`,
   status.graph, the Events, one OpenAI completion, the npu_graph_* metrics;
5. when the `prometheus` binary is there (or with --prometheus): a real Prometheus scraping the
   operator and the pod with the chart's alerts loaded, and what its HTTP API holds at the end,
   the npu_graph_* series and the alerts pending or firing;
6. every process stopped on exit, Ctrl-C included.
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
import prometheus_client
import yaml
from npu_operator import crd
from npu_operator.api import is_true
from npu_operator.config import OperatorConfig

from npu_sandbox import printer
from npu_sandbox import prometheus as prom
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.kubelet import LocalKubelet, LocalPod, free_port
from npu_sandbox.local_hub import LocalHub, Repo

ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_MANIFEST: Final = ROOT / "examples" / "sandbox-cpu.yaml"
DEFAULT_WORKDIR: Final = Path("/tmp/npu-sandbox")
KUBECTL: Final = ROOT / ".cache" / "k8s-tools" / "bin" / "kubectl"
HUB_REPOSITORY: Final = "sandbox/tiny-llama"
HUB_FIELDS: Final = {"hf": "huggingFace", "ms": "modelScope"}


class SandboxFailed(Exception):
    """The chain broke somewhere; the message says where, with the evidence."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="npu-sandbox", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="serve this model directory instead of the generated tiny one")
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST, help="the NPUInference to apply")
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
    # The operator's metrics are served by this process, on 127.0.0.1 only (not by the operator's
    # own start-up, which listens on every interface as it must in a pod).
    # The pod-template policy's default (Restricted) refuses hostPath sources outside the listed
    # directories: the sandbox lists its model's, as a platform engineer lists the nodes' model disk.
    host_path = manifest["spec"]["model"]["source"].get("hostPath")
    config = OperatorConfig(
        resync_seconds=2.0,
        status_poll_seconds=2.0,
        metrics_port=0,
        health_port=0,
        allowed_host_paths=(host_path["path"],) if host_path else (),
    )
    operator_metrics_port = free_port() if args.keep_running or prometheus else 0
    if operator_metrics_port:
        prometheus_client.start_http_server(operator_metrics_port, addr="127.0.0.1")

    # The operator's and the API's logs go to a file: the terminal shows the story, the file the detail.
    log_file = workdir / "operator.log"
    handler = logging.FileHandler(log_file, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)

    async with LocalCluster(workdir=workdir / "cluster") as cluster:
        heading("Kubernetes API (in memory, over HTTP) and the operator")
        say(f"API server  {cluster.url}")
        say(f"kubeconfig  {cluster.kubeconfig}")
        await cluster.start_operator(config)
        say(f"npu-operator running (kopf, peering on, against the API above; log {log_file})")

        heading(f"kubectl apply -f {args.manifest}")
        await cluster.apply_npu_inference(manifest)
        say(f"npuinference.inference.npu.dev/{name} created")

        kubelet = LocalKubelet(cluster, namespace, name, workdir=workdir / "pods")
        following = asyncio.Event()
        follower: asyncio.Task[None] | None = None
        try:
            if prometheus is not None:
                await start_prometheus(prometheus, operator_metrics_port)
            await cluster.wait_for(lambda: cluster.get("apps/v1", "deployments", namespace, name), within=60)
            heading("kubelet: running the Deployment's pod on this machine")
            (pod,) = await kubelet.start_pods()
            follower = asyncio.create_task(kubelet.follow(following))
            say(f"pod {pod.name}: npu-runtime serve ... (log {pod.log_path})")
            say(f"pod ports: http {pod.ports['http']}, metrics {pod.ports['metrics']} (127.0.0.1)")
            if prometheus is not None:
                pod_object = await cluster.get("v1", "pods", namespace, pod.name) or {}
                prometheus.set_targets("pods", prom.pod_targets(pod_object, pod.ports))

            heading("waiting for Ready")
            obj = await wait_ready(cluster, namespace, name, pod, args.timeout, started)
            if prometheus is not None:
                # A scrape of vLLM's counters before the completion, so that its histograms
                # (time to first token: one observation) rise between two samples.
                await prometheus.wait_for_scrapes_after(time.time())
            summary = await report(cluster, namespace, name, pod, obj, time.monotonic() - started)
            if prometheus is not None:
                summary["prometheus"] = await prometheus_report(prometheus, since=wall_started)
            if hub is not None:
                summary["hub"] = await second_resource(cluster, manifest, workdir, hub)
            if args.keep_running:
                heading("kept running: explore, then Ctrl-C")
                say(f"export KUBECONFIG={cluster.kubeconfig}")
                say(f"{KUBECTL} get npuinf,deploy,svc,pods")
                say(f"{KUBECTL} describe npuinf {name}   (more in README.md: Explore the sandbox with kubectl)")
                say(f"OpenAI API        {pod.api_url}/v1  (model {manifest['spec']['model']['name']})")
                say(f"runtime metrics   {pod.metrics_url}/metrics   status {pod.metrics_url}/status")
                say(f"operator metrics  http://127.0.0.1:{operator_metrics_port}/metrics")
                if prometheus is not None:
                    say(f"Prometheus        {prometheus.url}  (alerts {prometheus.url}/alerts)")
                await asyncio.Event().wait()
            return summary
        finally:
            following.set()
            if follower is not None:
                await follower
            heading("cleaning up")
            codes = await kubelet.stop()
            await cluster.stop_operator()
            if prometheus is not None:
                await prometheus.stop()
            say(
                f"pods stopped (exit codes {codes}), operator stopped, API closed"
                + (", Prometheus stopped" if prometheus else "")
            )


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
        if subprocess.run([sys.executable, "-m", "npu_sandbox.tiny_model", str(tiny)], check=False).returncode != 0:
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
    cluster: LocalCluster, manifest: dict[str, Any], workdir: Path, hub: LocalHub
) -> dict[str, Any]:
    """A second NPUInference with the same repository and revision: its pod finds the cache complete."""
    before = dict(hub.served)
    second = json.loads(json.dumps(manifest))
    name, namespace = f"{manifest['metadata']['name']}-2", manifest["metadata"]["namespace"]
    second["metadata"]["name"] = name
    heading(f"a second resource with the same repository: {name}")
    await cluster.apply_npu_inference(second)
    kubelet = LocalKubelet(cluster, namespace, name, workdir=workdir / "pods")
    try:
        await cluster.wait_for(lambda: cluster.get("apps/v1", "deployments", namespace, name), within=60)
        await kubelet.start_pods()

        async def model_ready() -> dict[str, Any] | None:
            obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name) or {}
            model = obj.get("status", {}).get("model", {})
            return model if model.get("phase") in ("Ready", "Failed") else None

        model = await cluster.wait_for(model_ready, within=120, what=f"{name}'s status.model")
    finally:
        await kubelet.stop()  # its engine is not needed to make the point
        await cluster.delete(crd.API_VERSION, crd.PLURAL, namespace, name)
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
    return manifest


async def wait_ready(
    cluster: LocalCluster, namespace: str, name: str, pod: LocalPod, within: float, started: float
) -> dict[str, Any]:
    """Print each change of phase, condition reason and engine state until Ready (or a failure)."""
    deadline = time.monotonic() + within
    last: tuple[Any, ...] = ()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
        while True:
            obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name) or {}
            status = obj.get("status", {})
            engine = await runtime_state(session, pod)
            download = status.get("model", {}).get("progress")
            now = (
                status.get("phase"),
                status.get("reason"),
                engine,
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
            if is_true(obj, "Ready") and status.get("graph", {}).get("effectiveMode"):
                return obj
            if pod.exited.is_set():
                raise SandboxFailed(
                    f"the runtime exited (phase {status.get('phase')}, reason {status.get('reason')}).\n"
                    f"Last lines of {pod.log_path}:\n{pod.log_tail(25)}"
                )
            if time.monotonic() > deadline:
                raise SandboxFailed(f"not Ready after {within:.0f}s; last lines of {pod.log_path}:\n{pod.log_tail(25)}")
            await asyncio.sleep(1.0)


async def runtime_state(session: aiohttp.ClientSession, pod: LocalPod) -> str | None:
    try:
        async with session.get(f"{pod.metrics_url}/status") as response:
            document = await response.json(content_type=None)
            return str(document.get("state"))
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
        return None


async def report(
    cluster: LocalCluster, namespace: str, name: str, pod: LocalPod, obj: dict[str, Any], elapsed: float
) -> dict[str, Any]:
    """Show what a user would look at, and return it as the summary."""
    heading(f"Ready after {elapsed:.0f}s")
    heading("kubectl get npuinf")
    say(await kubectl_get(cluster, namespace))

    heading(f"kubectl get npuinf {name} -o yaml | yq .status.graph")
    graph = obj["status"]["graph"]
    say(yaml.safe_dump(graph, sort_keys=False).rstrip())

    heading("Events")
    events = [
        e
        for e in await cluster.list_objects("v1", "events", namespace)
        if e.get("involvedObject", {}).get("name") == name
    ]
    say(
        printer.columns(
            [("TYPE", "REASON", "MESSAGE")] + [(e["type"], e["reason"], e.get("message", "")) for e in events]
        )
    )

    model_name = obj["spec"]["model"]["name"]
    heading(f"POST {pod.api_url}/v1/completions")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        request = {"model": model_name, "prompt": "Graph capture on Ascend", "max_tokens": 16, "temperature": 0}
        say(json.dumps(request))
        async with session.post(f"{pod.api_url}/v1/completions", json=request) as response:
            answer = await response.json(content_type=None)
        completion = answer.get("choices", [{}])[0].get("text", "") if response.status == 200 else None
        say(f"-> {response.status}: {completion!r}" if completion is not None else f"-> {response.status}: {answer}")

        heading(f"GET {pod.metrics_url}/metrics | grep ^npu_graph_")
        async with session.get(f"{pod.metrics_url}/metrics") as response:
            metrics_text = await response.text()
        metric_lines = [line for line in metrics_text.splitlines() if line.startswith("npu_graph_")]
        say("\n".join(metric_lines))
        async with session.get(f"{pod.metrics_url}/status") as response:
            runtime_status = await response.json(content_type=None)

    status = obj["status"]
    return {
        "ready": is_true(obj, "Ready"),
        "phase": status.get("phase"),
        "seconds_to_ready": round(elapsed, 1),
        "model": status.get("model"),
        "requested_mode": graph.get("requestedMode"),
        "effective_mode": graph.get("effectiveMode"),
        "downgrades": graph.get("downgrades", []),
        "events": [{"type": e["type"], "reason": e["reason"], "message": e.get("message", "")} for e in events],
        "completion": completion,
        "metrics": metric_lines,
        "pids": {"runtime": pod.process.pid if pod.process else None, "engine": runtime_status["engine"]["pid"]},
        "logs": str(pod.log_path),
    }


async def kubectl_get(cluster: LocalCluster, namespace: str) -> str:
    """The real kubectl when scripts/bootstrap fetched it; else the same Table, printed here."""
    kubectl = shutil.which("kubectl", path=f"{KUBECTL.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if kubectl is not None:
        result = await asyncio.to_thread(
            subprocess.run,
            [kubectl, "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "get", "npuinf"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode == 0:
            return result.stdout.rstrip()
    objects = await cluster.list_objects(crd.API_VERSION, crd.PLURAL, namespace)
    return printer.text(printer.table(crd.version_spec()["additionalPrinterColumns"], objects))


if __name__ == "__main__":
    sys.exit(main())

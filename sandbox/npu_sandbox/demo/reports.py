"""What the demo shows once the resource is Ready, and returns as its summary.

`report`: what a user would look at (kubectl get, status.graph, the Events, one OpenAI completion,
the npu_graph_* metrics); `disaggregated_run`: a prefill/decode resource's KV handover through its
router; `prometheus_report`: what a real Prometheus scraped, and the alerts pending or firing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml
from npu_operator.kube.names import ROLE_LABEL
from npu_operator.kube.objects import is_true

from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo import printer
from npu_sandbox.demo import prometheus as prom
from npu_sandbox.demo.console import heading, say
from npu_sandbox.demo.probes import behind_service, events_of, kubectl_get
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.node.pod import LocalPod


async def report(
    cluster: LocalCluster, kubelet: LocalKubelet, namespace: str, name: str, obj: dict[str, Any], elapsed: float
) -> dict[str, Any]:
    """Show what a user would look at, and return it as the summary."""
    graph, events = await show_resource(cluster, namespace, name, obj, elapsed)
    pod = await behind_service(cluster, kubelet, namespace, name)
    completion, metric_lines, pids = await ask_the_pods(kubelet, pod, namespace, name, obj["spec"]["model"]["name"])
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


async def show_resource(
    cluster: LocalCluster, namespace: str, name: str, obj: dict[str, Any], elapsed: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The resource through the API: `kubectl get` of it and its workload, its status.graph, its Events."""
    multi_node = int(obj["spec"].get("npu", {}).get("nodes", 1)) > 1
    heading(f"Ready after {elapsed:.0f}s")
    kinds = "npuinf,leaderworkersets,statefulsets,pods" if multi_node else "npuinf,deployments,pods"
    if "disaggregation" in obj["spec"]:
        kinds = "npuinf,leaderworkersets,deployments,pods"
    heading(f"kubectl get {kinds}")
    say(await kubectl_get(cluster, namespace, kinds))

    heading(f"kubectl get npuinf {name} -o yaml | yq .status.graph")
    graph: dict[str, Any] = obj["status"].get("graph", {})
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
    return graph, events


async def ask_the_pods(
    kubelet: LocalKubelet, pod: LocalPod, namespace: str, name: str, model_name: str
) -> tuple[str | None, list[str], dict[str, int | None]]:
    """One OpenAI completion through the resource's Service (`pod` is behind it), the engine's npu_graph_*
    metrics, and each pod's runtime and engine pids."""
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
    return completion, metric_lines, pids


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

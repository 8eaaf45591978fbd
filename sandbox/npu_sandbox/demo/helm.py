"""The product installed as a user installs it: the real helm and the chart, the operator as the chart's pod.

`Helm` runs the helm binary that scripts/bootstrap fetches (.cache/k8s-tools/bin, else PATH)
against the sandbox's API with its kubeconfig: `helm install` creates the CRDs, the ServiceAccount,
the RBAC objects and the operator's Deployment through the API, and stores the release as a
Secret, as on a cluster. The kubelet then runs that Deployment's pod with `OperatorRunner`: the
chart's container (image `.../npu-operator`, whose ENTRYPOINT is `npu-operator`, Dockerfile
`operator` target) becomes the installed `npu-operator` command with the container's args and
env; the env's health and metrics ports become the pod's mapped local ports; the kubelet gives it
its ServiceAccount's token, so every request it makes is authorized by the chart's RBAC.

The release's lifecycle, as the demo tells it (README's quick start): `install_operator` (helm
install, then the operator's pod runs here), `upgrade_operator` (a changed value rolls the
operator's pod while the model keeps serving), `uninstall_operator` (the operator goes; the CRDs
and the users' resources stay).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from npu_operator.api import crd
from npu_operator.kube.objects import is_true

from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo.console import SandboxFailed, heading, say
from npu_sandbox.demo.probes import behind_service, completion, kubectl_get, ready_resource
from npu_sandbox.demo.repository import CHART, ROOT, TOOLS
from npu_sandbox.node.container import mounts
from npu_sandbox.node.kubelet import LocalKubelet
from npu_sandbox.node.pod import LocalPod

OPERATOR_IMAGE: Final = "npu-operator"  # the repository's last path segment (values.yaml image.repository)
# The operator's ports come from its env (values.yaml operator.healthPort / metricsPort).
PORT_ENV: Final = {"health": "NPU_OPERATOR_HEALTH_PORT", "metrics": "NPU_OPERATOR_METRICS_PORT"}


class HelmFailed(Exception):
    """helm is missing, or a helm command failed (the message holds its stderr)."""


def helm_binary() -> str:
    found = TOOLS / "helm" if (TOOLS / "helm").is_file() else shutil.which("helm")
    if not found:
        raise HelmFailed("helm not found: scripts/bootstrap fetches it into .cache/k8s-tools/bin")
    return str(found)


class Helm:
    """The helm binary pointed at one cluster by its kubeconfig, with a private cache and config."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "KUBECONFIG": str(kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    async def __call__(self, *args: str) -> str:
        command = [helm_binary(), *args]
        result = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, timeout=180, env=self.env, cwd=ROOT
        )
        if result.returncode != 0:
            raise HelmFailed(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout


def values_args(values: Mapping[str, Any]) -> list[str]:
    """`--set key=value` for each flattened key (dots between levels)."""
    args: list[str] = []
    for key, value in sorted(values.items()):
        text = str(value).lower() if isinstance(value, bool) else str(value)
        args += ["--set", f"{key}={text}"]
    return args


class OperatorRunner:
    """The chart's operator container: its image's ENTRYPOINT (`npu-operator`) with the container's args."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        image = str(container.get("image", "")).split("@", 1)[0]
        repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
        return repository.rsplit("/", 1)[-1] == OPERATOR_IMAGE

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        given = [*container.get("command", [])]
        return args if given else [OPERATOR_IMAGE, *args]

    def environment(self, pod: LocalPod, container: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]:
        """The ports the chart puts in env, mapped to free ports (`npu-operator run` listens on all
        addresses and has no flag to take the pod's: on the declared ports it would hold them on
        every pod's address); the /tmp emptyDir as TMPDIR."""
        result = dict(env)
        for port_name, variable in PORT_ENV.items():
            if variable in result and port_name in pod.ports:
                result[variable] = str(pod.map_port(port_name))
        for mount_path, local in mounts(container, pod.volumes):
            if mount_path == "/tmp":
                result["TMPDIR"] = str(local)
        return result


def operator_runners(defaults: Sequence[Any]) -> list[Any]:
    return [OperatorRunner(), *defaults]


# --- the release's lifecycle, as the demo tells it ---------------------------------------------

# README's quick start: the release and namespace a user installs the chart with.
RELEASE: Final = "npu-operator"
OPERATOR_NAMESPACE: Final = "npu-system"
# What the sandbox sets on top of the chart's defaults: quicker rounds for a short demo.
SANDBOX_VALUES: Final = {"operator.resyncSeconds": 2, "operator.statusPollSeconds": 2}
# The value `helm upgrade` changes: the operator's log level (its Deployment's env, so its pod rolls).
UPGRADE_VALUES: Final = {"operator.logLevel": "DEBUG"}
PEERING_NAME: Final = "npu-operator"  # values.yaml operator.peeringName


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


def operator_values(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a platform engineer sets for the resource `manifest`: the namespace it lives in, among the
    ones the operator serves (the chart's default serves its release namespace only, with write
    rights there and nowhere else), and its hostPath directory, which the pod-template policy's
    default (Restricted) refuses unless listed, as a platform engineer lists the nodes' model disk."""
    values = {"watch.namespaces": "{" + manifest["metadata"]["namespace"] + "}"}
    host_path = manifest["spec"]["model"]["source"].get("hostPath")
    if host_path:
        values["operator.podTemplatePolicy.allowedHostPaths"] = "{" + host_path["path"] + "}"
    return values


async def install_operator(
    cluster: LocalCluster, helm: Helm, kubelet: LocalKubelet, values: dict[str, Any]
) -> LocalPod:
    """README's quick start on a cluster: helm install; the operator's pod then runs here."""
    await run_helm(helm, helm_command("install", SANDBOX_VALUES | values), lines=6)
    await run_helm(helm, ["list", "-A"])
    kinds = "deploy,sa,clusterrole,clusterrolebinding"  # the Role and RoleBinding are in the served namespace
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
    say(f"  address {pod.ip}, ports " + ", ".join(f"{key} {value}" for key, value in pod.ports.items()))
    return pod


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
    old_peers = await peers(cluster, namespace)
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
        return await peers(cluster, namespace) - old_peers

    new_peers = await cluster.wait_for(announced, within=60, what="the new operator in its peering object")
    say(f"kopfpeering/{PEERING_NAME} -n {namespace}: the new operator announced itself as {sorted(new_peers)}")
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


async def peers(cluster: LocalCluster, namespace: str) -> set[str]:
    """The operators alive in the chart's KopfPeering of the served `namespace` (kopf writes each one's
    id in its status; the chart's default, namespaced, makes one in each namespace it serves)."""
    obj = await cluster.get("kopf.dev/v1", "kopfpeerings", namespace, PEERING_NAME)
    return set((obj or {}).get("status") or {})


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

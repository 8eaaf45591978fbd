"""The product installed as a user installs it: the real helm and the chart, the operator as the chart's pod.

`Helm` runs the helm binary that scripts/bootstrap fetches (.cache/k8s-tools/bin, else PATH)
against the sandbox's API with its kubeconfig: `helm install` creates the CRDs, the ServiceAccount,
the RBAC objects and the operator's Deployment through the API, and stores the release as a
Secret, as on a cluster. The kubelet then runs that Deployment's pod with `OperatorRunner`: the
chart's container (image `.../npu-operator`, whose ENTRYPOINT is `npu-operator`, Dockerfile
`operator` target) becomes the installed `npu-operator` command with the container's args and
env; the env's health and metrics ports become the pod's mapped local ports; the kubelet gives it
its ServiceAccount's token, so every request it makes is authorized by the chart's RBAC.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from npu_sandbox.node.kubelet import LocalPod, mounts

ROOT: Final = Path(__file__).resolve().parents[3]
CHART: Final = ROOT / "charts" / "npu-inference-operator"
TOOLS: Final = ROOT / ".cache" / "k8s-tools" / "bin"
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
        """The ports the chart puts in env, moved to the pod's mapped local ports; the /tmp emptyDir as TMPDIR."""
        result = dict(env)
        for port_name, variable in PORT_ENV.items():
            if variable in result and port_name in pod.ports:
                result[variable] = str(pod.ports[port_name])
        for mount_path, local in mounts(container, pod.volumes):
            if mount_path == "/tmp":
                result["TMPDIR"] = str(local)
        return result


def operator_runners(defaults: Sequence[Any]) -> list[Any]:
    return [OperatorRunner(), *defaults]

"""The operator logs in as kubectl does: with a token that only an exec credential plugin prints.

Managed clusters (EKS, GKE, AKS, CCE and most others) hand out kubeconfigs whose user is an `exec`
entry: a command (a cloud CLI) that prints an ExecCredential with a short-lived token. kopf's own
minimal kubeconfig login does not run it; the operator logs in through the `kubernetes` package
(`kopf.login_via_client`), which does. Here the sandbox's API refuses every request without a token
it knows (kube-apiserver's `--anonymous-auth=false`), the only token it accepts besides its own
admin's is printed by a plugin script named in the kubeconfig, and the real operator process
(`python -m npu_operator.cli run`) must reconcile a resource through it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from npu_operator.api import crd
from npu_sandbox.cluster import LocalCluster, operator_process

from tests.examples import example

# An exec credential plugin, as `aws eks get-token` or `gke-gcloud-auth-plugin` are: it reads
# KUBERNETES_EXEC_INFO, prints an ExecCredential of the same apiVersion with the token from its own
# credentials file (a cloud CLI's cache), and here also counts its runs.
PLUGIN = """
import json, os, sys
request = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
with open(sys.argv[1], "a") as runs:
    runs.write(request["apiVersion"] + "\\n")
with open(sys.argv[2]) as credentials:
    token = credentials.read().strip()
print(json.dumps({"apiVersion": request["apiVersion"], "kind": "ExecCredential", "status": {"token": token}}))
"""


def exec_kubeconfig(server: str, plugin: Path, runs: Path, credentials: Path) -> dict[str, Any]:
    """A kubeconfig as a managed cluster hands it out: no token, only the plugin that prints one."""
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin), str(runs), str(credentials)],
            "interactiveMode": "Never",
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "managed", "cluster": {"server": server}}],
        "users": [{"name": "cloud-user", "user": user}],
        "contexts": [{"name": "managed", "context": {"cluster": "managed", "user": "cloud-user"}}],
        "current-context": "managed",
    }


async def status_code(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status


async def test_the_operator_logs_in_with_a_token_only_an_exec_plugin_prints(tmp_path: Path) -> None:
    token = secrets.token_urlsafe(24)
    async with LocalCluster() as cluster:
        cluster.emulator.access.static_tokens[token] = "cloud-user"
        cluster.emulator.access.anonymous = False
        pods = f"{cluster.url}/api/v1/namespaces/default/pods"
        # What the API now accepts: its own admin and the plugin's token; nobody else.
        assert await status_code(pods, None) == 401
        assert await status_code(pods, "a-token-nobody-issued") == 401
        assert await status_code(pods, token) == 200

        plugin, runs = tmp_path / "credential_plugin.py", tmp_path / "plugin-runs.txt"
        plugin.write_text(PLUGIN, encoding="utf-8")
        credentials = tmp_path / "cloud-credentials"
        credentials.write_text(token, encoding="utf-8")
        kubeconfig = tmp_path / "kubeconfig"
        document = exec_kubeconfig(cluster.url, plugin, runs, credentials)
        kubeconfig.write_text(yaml.safe_dump(document), encoding="utf-8")
        assert token not in kubeconfig.read_text()  # only the plugin knows it

        manifest = example("sandbox-cpu.yaml")
        manifest["metadata"]["namespace"] = "default"
        name = manifest["metadata"]["name"]
        await cluster.create(manifest, crd.PLURAL)
        log = tmp_path / "operator.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "npu_operator.cli",
                "run",
                env=operator_process.operator_env(kubeconfig),
                stdout=out,
                stderr=out,
            )
        try:

            async def reconciled() -> bool:
                if process.returncode is not None:
                    raise AssertionError("the operator exited:\n" + log.read_text(errors="replace")[-3000:])
                obj = await cluster.get(crd.API_VERSION, crd.PLURAL, "default", name) or {}
                deployment = await cluster.get("apps/v1", "deployments", "default", name)
                return obj.get("status", {}).get("observedGeneration") == 1 and deployment is not None

            await cluster.wait_for(reconciled, within=120, what="the operator reconciled its resource")
        finally:
            await operator_process.stop(process)

    assert runs.read_text().splitlines()[0] == "client.authentication.k8s.io/v1"  # the plugin ran
    theirs = [
        request
        for request in cluster.emulator.history
        if request.headers.get("User-Agent", "").startswith(("npu-operator", "kopf"))
    ]
    assert theirs, "no request from the operator reached the API"
    carried = {request.headers.get("Authorization") for request in theirs}
    assert carried == {f"Bearer {token}"}, json.dumps(sorted(str(c) for c in carried))

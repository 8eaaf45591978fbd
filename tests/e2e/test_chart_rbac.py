"""A chart that lacks one RBAC rule: the operator, with its ServiceAccount's token, fails with the API server's 403.

The chart is copied and one verb removed from one rule of templates/rbac.yaml (`patch` of Deployments:
the classic missing verb, which only shows on a cluster; watches still work); the real helm
installs the copy into the sandbox's API; the real operator logs in with a token of the chart's
ServiceAccount (a TokenRequest, as a kubelet gets the one it projects into the pod). Its first
write of a model's Deployment is refused as a kube-apiserver's RBAC authorizer refuses it, and
the resource's status names the verb and the resource. `helm upgrade` back to the real chart
restores the rule, and the same operator, without a restart, creates the Deployment. No engine runs.

The chart's default RBAC (issue 33 item 8) is namespaced: a Role in each namespace the operator
serves (`watch.namespaces`) and nothing cluster-wide but kopf's read-only discovery. Under it the
operator, watching only those namespaces, serves a resource there; its token cannot write a
ConfigMap, Deployment, Service, ServiceAccount, Role or RoleBinding in kube-system or another
namespace (403 from the API's RBAC authorizer), which the chart's earlier cluster-wide default
allowed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from npu_operator.api import crd
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.cluster.client import resource_path
from npu_sandbox.demo.helm import Helm, HelmFailed, helm_binary
from npu_sandbox.demo.repository import CHART

from tests.examples import TEST_CONFIG, example

NAMESPACE, RELEASE = "npu-system", "npu"
SERVED = "default"  # the examples' namespace: the one namespace the operator is installed to serve
SERVE = ("--set", f"watch.namespaces={{{SERVED}}}")
ACCOUNT = f"{RELEASE}-npu-inference-operator"
DEPLOYMENTS_RULE = """- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
"""

pytestmark = pytest.mark.timeout(240)


def without_deployments_patch(tmp: Path) -> Path:
    chart = tmp / "chart"
    shutil.copytree(CHART, chart)
    rbac = chart / "templates" / "rbac.yaml"
    text = rbac.read_text(encoding="utf-8")
    assert text.count(DEPLOYMENTS_RULE) == 1, "templates/rbac.yaml changed: update DEPLOYMENTS_RULE"
    rbac.write_text(text.replace(DEPLOYMENTS_RULE, DEPLOYMENTS_RULE.replace('"patch", ', "")), encoding="utf-8")
    return chart


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    try:
        helm_binary()
    except HelmFailed as exc:
        pytest.skip(str(exc))
    async with LocalCluster(workdir=tmp_path, crds=False) as cluster:
        yield cluster
        await cluster.stop_operator()


async def start_as_the_charts_account(cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The operator, watching the served namespace as the chart configures it (NPU_OPERATOR_NAMESPACES),
    logged in with a token of the chart's ServiceAccount, as in its pod; the token."""
    token = await cluster.create_token(NAMESPACE, ACCOUNT)
    kubeconfig = tmp_path / "operator-kubeconfig"
    kubeconfig.write_text(json.dumps(cluster.kubeconfig_document(token)), encoding="utf-8")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # With peering, as in its pod: kopf keeps it in the served namespace's KopfPeering (the chart's
    # hook made it; start_operator's own ClusterKopfPeering goes unused by a namespaced operator).
    await cluster.start_operator(dataclasses.replace(TEST_CONFIG, namespaces=(SERVED,)))
    return token


async def test_a_missing_rule_fails_the_operator_with_the_403_and_restoring_it_heals(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helm = Helm(cluster.kubeconfig, tmp_path / "helm")
    broken = without_deployments_patch(tmp_path)
    await helm("install", RELEASE, str(broken), "-n", NAMESPACE, "--create-namespace", *SERVE)
    await start_as_the_charts_account(cluster, tmp_path, monkeypatch)

    manifest = example("sandbox-cpu.yaml")
    await cluster.apply_npu_inference(manifest)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"].get("namespace", "default")

    async def refused() -> str | None:
        obj = await cluster.get(crd.API_VERSION, crd.PLURAL, namespace, name) or {}
        messages = [c.get("message", "") for c in obj.get("status", {}).get("conditions", [])]
        return next((m for m in messages if "forbidden" in m), None)

    message = await cluster.wait_for(refused, within=60, what="the 403 in the resource's status")
    expected = (
        f'deployments.apps "{name}" is forbidden: User "system:serviceaccount:{NAMESPACE}:{ACCOUNT}" '
        f'cannot patch resource "deployments" in API group "apps" in the namespace "{namespace}"'
    )
    assert expected in message
    assert await cluster.get("apps/v1", "deployments", namespace, name) is None

    await helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *SERVE)  # the real chart: the rule is back

    async def created() -> dict[str, Any] | None:
        return await cluster.get("apps/v1", "deployments", namespace, name)

    deployment = await cluster.wait_for(created, within=60, what="the Deployment once the rule is back")
    assert deployment["metadata"]["ownerReferences"][0]["name"] == name


# What a compromised operator would write to take over a namespace: a workload, a Service in front of
# another's pods, a ConfigMap another controller reads, an account and the rights to bind it.
FOREIGN_WRITES: list[tuple[str, str, dict[str, Any]]] = [
    ("v1", "configmaps", {"data": {"k": "v"}}),
    (
        "apps/v1",
        "deployments",
        {
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "template": {
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            }
        },
    ),
    ("v1", "services", {"spec": {"ports": [{"port": 80}]}}),
    ("v1", "serviceaccounts", {}),
    ("rbac.authorization.k8s.io/v1", "roles", {"rules": []}),
    (
        "rbac.authorization.k8s.io/v1",
        "rolebindings",
        {
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": NAMESPACE}],
        },
    ),
]
KINDS = {
    "configmaps": "ConfigMap",
    "deployments": "Deployment",
    "services": "Service",
    "serviceaccounts": "ServiceAccount",
    "roles": "Role",
    "rolebindings": "RoleBinding",
}


async def write_as(
    cluster: LocalCluster, token: str, api_version: str, plural: str, namespace: str, body: dict[str, Any]
) -> int:
    """The status of a dry-run create (`?dryRun=All`: authorized and admitted, never stored) made with `token`."""
    obj = {
        "apiVersion": api_version,
        "kind": KINDS[plural],
        "metadata": {"name": "probe", "namespace": namespace},
        **body,
    }
    url = cluster.url + resource_path(api_version, plural, namespace) + "?dryRun=All"
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.post(url, json=obj, headers=headers) as response:
        return response.status


async def test_under_the_default_rbac_the_operator_serves_its_namespace_and_writes_nowhere_else(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helm = Helm(cluster.kubeconfig, tmp_path / "helm")
    await helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", *SERVE)
    token = await start_as_the_charts_account(cluster, tmp_path, monkeypatch)

    manifest = example("sandbox-cpu.yaml")
    await cluster.apply_npu_inference(manifest)
    name = manifest["metadata"]["name"]
    assert manifest["metadata"]["namespace"] == SERVED

    async def created() -> dict[str, Any] | None:
        return await cluster.get("apps/v1", "deployments", SERVED, name)

    deployment = await cluster.wait_for(created, within=60, what="the Deployment, made under the namespaced RBAC")
    assert deployment["metadata"]["ownerReferences"][0]["name"] == name
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, SERVED, name) or {}
    assert not [c for c in obj.get("status", {}).get("conditions", []) if "forbidden" in c.get("message", "")]

    for api_version, plural, body in FOREIGN_WRITES:
        assert await write_as(cluster, token, api_version, plural, SERVED, body) < 300, plural  # its namespace
        for elsewhere in ("kube-system", NAMESPACE, "other-tenant"):
            status = await write_as(cluster, token, api_version, plural, elsewhere, body)
            assert status == 403, f"the operator's account may create {plural} in {elsewhere} ({status})"
    peering = await cluster.get("kopf.dev/v1", "kopfpeerings", SERVED, "npu-operator")
    assert peering is not None and peering.get("status"), "the operator keeps its peering entry: patched under its Role"


async def test_the_charts_defaults_give_no_write_right_in_kube_system(cluster: LocalCluster, tmp_path: Path) -> None:
    """`helm install` with no values at all: the account may write in its release namespace, which
    it serves, and nowhere else (the earlier default, cluster-wide, let it write everywhere)."""
    await Helm(cluster.kubeconfig, tmp_path / "helm")(
        "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace"
    )
    token = await cluster.create_token(NAMESPACE, ACCOUNT)
    for api_version, plural, body in FOREIGN_WRITES:
        assert await write_as(cluster, token, api_version, plural, NAMESPACE, body) < 300, plural
        status = await write_as(cluster, token, api_version, plural, "kube-system", body)
        assert status == 403, f"the operator's account may create {plural} in kube-system ({status})"

"""A chart that lacks one RBAC rule: the operator, with its ServiceAccount's token, fails with the API server's 403.

The chart is copied and one verb removed from one rule of templates/rbac.yaml (`patch` of Deployments:
the classic missing verb, which only shows on a cluster; watches still work); the real helm
installs the copy into the sandbox's API; the real operator logs in with a token of the chart's
ServiceAccount (a TokenRequest, as a kubelet gets the one it projects into the pod). Its first
write of a model's Deployment is refused as a kube-apiserver's RBAC authorizer refuses it, and
the resource's status names the verb and the resource. `helm upgrade` back to the real chart
restores the rule, and the same operator, without a restart, creates the Deployment. No engine runs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api import crd
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.demo.helm import Helm, HelmFailed, helm_binary
from npu_sandbox.demo.repository import CHART

from tests.examples import TEST_CONFIG, example

NAMESPACE, RELEASE = "npu-system", "npu"
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


async def test_a_missing_rule_fails_the_operator_with_the_403_and_restoring_it_heals(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helm = Helm(cluster.kubeconfig, tmp_path / "helm")
    broken = without_deployments_patch(tmp_path)
    await helm("install", RELEASE, str(broken), "-n", NAMESPACE, "--create-namespace")
    token = await cluster.create_token(NAMESPACE, ACCOUNT)
    kubeconfig = tmp_path / "operator-kubeconfig"
    kubeconfig.write_text(json.dumps(cluster.kubeconfig_document(token)), encoding="utf-8")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # what the operator logs in with, as in its pod
    await cluster.start_operator(TEST_CONFIG, peering=False)  # the chart's hook made the peering object

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

    await helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE)  # the real chart: the rule is back

    async def created() -> dict[str, Any] | None:
        return await cluster.get("apps/v1", "deployments", namespace, name)

    deployment = await cluster.wait_for(created, within=60, what="the Deployment once the rule is back")
    assert deployment["metadata"]["ownerReferences"][0]["name"] == name

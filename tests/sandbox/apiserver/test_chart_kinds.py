"""What a chart needs from the sandbox API, answered as a kube-apiserver answers it.

The kinds helm installs and stores releases in (CustomResourceDefinitions, Secrets, ConfigMaps,
ServiceAccounts, Roles, ClusterRoles and their bindings, Namespaces): the stored objects checked
against Kubernetes' own schemas (kubernetes-validate), and 404, 409 and 422 where the API server
answers them. A CRD is an API: creating it serves its kind with its schema and printer columns,
updating it changes them, deleting it takes the API and its objects away. ServiceAccount tokens
(TokenRequest) authenticate as the account, and stop working when it is deleted. The real helm
installs the chart; a CRD changed in the chart reaches the API on `helm upgrade` (the chart
templates its CRD; helm's crds/ folder would never upgrade it) and stays after `helm uninstall`
(helm.sh/resource-policy: keep), as values.yaml documents.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml
from npu_operator.api import crd
from npu_sandbox.cluster import ApiRejected, LocalCluster
from npu_sandbox.cluster.local import kopf_peering_crd
from npu_sandbox.demo.helm import Helm, HelmFailed, helm_binary
from npu_sandbox.demo.repository import CHART

ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".cache" / "k8s-tools" / "bin" / "kubectl"
KUBERNETES_VERSION = "1.37.0"
CRDS = "apiextensions.k8s.io/v1"
RBAC = "rbac.authorization.k8s.io/v1"

JSON = dict[str, Any]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(workdir=tmp_path, crds=False) as cluster:
        yield cluster


def objects() -> list[tuple[JSON, str]]:
    """One object of each kind a chart installs, with its plural."""
    meta = {"name": "x", "namespace": "default", "labels": {"app.kubernetes.io/name": "x"}}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "x"}
    subjects = [{"kind": "ServiceAccount", "name": "x", "namespace": "default"}]
    rules = [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]}]
    cluster_meta = {"name": "x"}
    return [
        ({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": {"k": "dg=="}}, "secrets"),
        ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}, "configmaps"),
        ({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}, "serviceaccounts"),
        ({"apiVersion": RBAC, "kind": "Role", "metadata": meta, "rules": rules}, "roles"),
        (
            {"apiVersion": RBAC, "kind": "RoleBinding", "metadata": meta, "roleRef": role_ref, "subjects": subjects},
            "rolebindings",
        ),
        ({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": cluster_meta, "rules": rules}, "clusterroles"),
        (
            {
                "apiVersion": RBAC,
                "kind": "ClusterRoleBinding",
                "metadata": cluster_meta,
                "roleRef": role_ref,
                "subjects": subjects,
            },
            "clusterrolebindings",
        ),
        ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "chart-ns"}}, "namespaces"),
        (kopf_peering_crd("KopfPeering", "kopfpeerings", "Namespaced"), "customresourcedefinitions"),
    ]


async def test_the_kinds_a_chart_installs_are_stored_as_kubernetes_schemas_say_with_404_and_409(
    cluster: LocalCluster,
) -> None:
    for obj, plural in objects():
        namespace = obj["metadata"].get("namespace")
        name = obj["metadata"]["name"]
        assert await cluster.get(obj["apiVersion"], plural, namespace, name) is None  # 404
        created = await cluster.create(copy.deepcopy(obj), plural)
        stored = await cluster.get(obj["apiVersion"], plural, namespace, name)
        assert stored is not None and stored["metadata"]["uid"] == created["metadata"]["uid"]
        kubernetes_validate.validate(stored, KUBERNETES_VERSION, strict=True)
        with pytest.raises(ApiRejected) as again:
            await cluster.create(copy.deepcopy(obj), plural)
        assert again.value.status == 409 and again.value.body["reason"] == "AlreadyExists"
        listed = await cluster.list_objects(obj["apiVersion"], plural, namespace)
        assert [o["metadata"]["name"] for o in listed if o["metadata"]["name"] == name] == [name]
    namespace = await cluster.get("v1", "namespaces", None, "chart-ns")
    assert namespace is not None and namespace["status"] == {"phase": "Active"}
    definition = await cluster.get(CRDS, "customresourcedefinitions", None, "kopfpeerings.kopf.dev")
    assert definition is not None
    conditions = {c["type"]: c["status"] for c in definition["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert definition["status"]["acceptedNames"]["listKind"] == "KopfPeeringList"


async def test_an_invalid_crd_is_refused_with_422_and_serves_nothing(cluster: LocalCluster) -> None:
    bad = kopf_peering_crd("KopfPeering", "kopfpeerings", "Namespaced")
    bad["metadata"]["name"] = "peerings.kopf.dev"
    bad["spec"]["versions"][0]["storage"] = False
    with pytest.raises(ApiRejected) as refused:
        await cluster.create(bad, "customresourcedefinitions")
    assert refused.value.status == 422 and refused.value.body["reason"] == "Invalid"
    message = refused.value.body["message"]
    assert 'metadata.name: Invalid value: "peerings.kopf.dev": must be spec.names.plural+"."+spec.group' in message
    assert "must have exactly one version marked as storage version" in message
    with pytest.raises(ApiRejected) as missing:
        await cluster.list_objects("kopf.dev/v1", "kopfpeerings", "default")
    assert missing.value.status == 404


async def test_a_crd_is_an_api_created_changed_and_deleted_with_it(cluster: LocalCluster) -> None:
    with pytest.raises(ApiRejected) as before:
        await cluster.list_objects(crd.API_VERSION, crd.PLURAL, "default")
    assert before.value.status == 404
    definition = crd.load_crd()
    await cluster.create(copy.deepcopy(definition), "customresourcedefinitions")
    manifest = yaml.safe_load((ROOT / "examples" / "sandbox-cpu.yaml").read_text(encoding="utf-8"))
    manifest["metadata"]["namespace"] = "default"
    stored = await cluster.create(copy.deepcopy(manifest), crd.PLURAL)
    assert stored["spec"]["graph"]["mode"] == "FULL_DECODE_ONLY"  # the CRD's defaults, applied on admission
    invalid = copy.deepcopy(manifest)
    invalid["metadata"]["name"] = "invalid"
    invalid["spec"]["replicas"] = -1
    with pytest.raises(ApiRejected) as refused:
        await cluster.create(invalid, crd.PLURAL)
    assert refused.value.status == 422 and "spec.replicas" in refused.value.body["message"]

    async with aiohttp.ClientSession(cluster.url) as session:
        table = "application/json;as=Table;v=v1;g=meta.k8s.io"
        path = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/default/{crd.PLURAL}"

        async def columns() -> list[str]:
            async with session.get(path, headers={"Accept": table}) as response:
                return [c["name"] for c in (await response.json())["columnDefinitions"]]

        assert "Owner" not in await columns()
        changed = await cluster.get(CRDS, "customresourcedefinitions", None, definition["metadata"]["name"])
        assert changed is not None
        version = next(v for v in changed["spec"]["versions"] if v["name"] == crd.VERSION)
        version["additionalPrinterColumns"].append({"name": "Owner", "type": "string", "jsonPath": ".spec.owner"})
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["owner"] = {"type": "string"}
        await cluster.patch(
            CRDS, "customresourcedefinitions", None, definition["metadata"]["name"], {"spec": changed["spec"]}
        )
        assert (await columns())[-1] == "Owner"
        owned = await cluster.patch(
            crd.API_VERSION, crd.PLURAL, "default", manifest["metadata"]["name"], {"spec": {"owner": "me"}}
        )
        assert owned["spec"]["owner"] == "me"  # the changed schema keeps the new field (it was pruned before)

    await cluster.delete(CRDS, "customresourcedefinitions", None, definition["metadata"]["name"])
    with pytest.raises(ApiRejected) as after:
        await cluster.list_objects(crd.API_VERSION, crd.PLURAL, "default")
    assert after.value.status == 404
    await cluster.create(copy.deepcopy(definition), "customresourcedefinitions")  # installed again: empty
    assert await cluster.list_objects(crd.API_VERSION, crd.PLURAL, "default") == []


async def test_a_service_account_token_authenticates_until_the_account_is_deleted(cluster: LocalCluster) -> None:
    account: JSON = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "op", "namespace": "default"}}
    await cluster.create(account, "serviceaccounts")
    with pytest.raises(ApiRejected) as missing:
        await cluster.create_token("default", "nobody")
    assert missing.value.status == 404
    token = await cluster.create_token("default", "op")
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(cluster.url, headers=headers) as session:
        async with session.get("/api/v1/namespaces/default/pods") as response:
            assert response.status == 403
            body = await response.json()
        assert body["message"] == (
            'pods is forbidden: User "system:serviceaccount:default:op" cannot list resource "pods" in API group ""'
            ' in the namespace "default"'
        )
        async with session.get("/apis") as response:
            assert response.status == 200  # discovery: every identity may read it
        await cluster.delete("v1", "serviceaccounts", "default", "op")
        async with session.get("/api/v1/namespaces/default/pods") as response:
            assert response.status == 401


def kubectl(cluster: LocalCluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.run([str(KUBECTL), *args], capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.skipif(not KUBECTL.is_file(), reason="needs kubectl (scripts/bootstrap fetches it into .cache)")
async def test_kubectl_creates_namespaces_and_secrets_in_protobuf(cluster: LocalCluster, tmp_path: Path) -> None:
    for args in (
        ("create", "namespace", "made"),
        ("create", "secret", "generic", "s", "-n", "made", "--from-literal=k=v"),
    ):
        result = await asyncio.to_thread(kubectl, cluster, tmp_path, *args)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    secret = await cluster.get("v1", "secrets", "made", "s")
    assert secret is not None and secret["data"] == {"k": "dg=="} and secret["type"] == "Opaque"
    kubernetes_validate.validate(secret, KUBERNETES_VERSION, strict=True)


@pytest.mark.skipif(not KUBECTL.is_file(), reason="needs kubectl (scripts/bootstrap fetches it into .cache)")
async def test_kubectl_reads_the_openapi_v2_protobuf(cluster: LocalCluster, tmp_path: Path) -> None:
    """`kubectl explain --output plaintext-openapiv2` parses /openapi/v2 as kube-openapi's proto models."""
    await cluster.create(copy.deepcopy(crd.load_crd()), "customresourcedefinitions")
    result = await asyncio.to_thread(
        kubectl, cluster, tmp_path, "explain", "npuinf.spec.graph.mode", "--output=plaintext-openapiv2"
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "FIELD:    mode <string>" in result.stdout and "FULL_DECODE_ONLY" in result.stdout
    result = await asyncio.to_thread(
        kubectl, cluster, tmp_path, "explain", "clusterrolebinding.subjects", "--output=plaintext-openapiv2"
    )
    assert result.returncode == 0 and "KIND:     ClusterRoleBinding" in result.stdout, result.stderr


def chart_with_a_new_printer_column(tmp: Path) -> Path:
    chart = tmp / "chart"
    shutil.copytree(CHART, chart)
    path = chart / "files" / "crds" / "inference.npu.dev_npuinferences.yaml"
    definition = yaml.safe_load(path.read_text(encoding="utf-8"))
    version = next(v for v in definition["spec"]["versions"] if v["name"] == crd.VERSION)
    version["additionalPrinterColumns"].append({"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"})
    path.write_text(yaml.safe_dump(definition, sort_keys=False), encoding="utf-8")
    return chart


async def test_the_chart_installs_its_crds_upgrades_them_and_keeps_them_on_uninstall(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    try:
        helm_binary()
    except HelmFailed as exc:
        pytest.skip(str(exc))
    helm = Helm(cluster.kubeconfig, tmp_path / "helm")
    name = f"{crd.PLURAL}.{crd.GROUP}"
    await helm("install", "npu", str(CHART), "-n", "npu-system", "--create-namespace")
    installed = await cluster.get(CRDS, "customresourcedefinitions", None, name)
    assert installed is not None
    assert installed["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert installed["spec"] == crd.load_crd()["spec"]  # the chart's copy is the repository's CRD
    releases = json.loads(await helm("list", "-A", "-o", "json"))
    assert [(r["name"], r["status"], r["revision"]) for r in releases] == [("npu", "deployed", "1")]

    await helm("upgrade", "npu", str(chart_with_a_new_printer_column(tmp_path)), "-n", "npu-system")
    upgraded = await cluster.get(CRDS, "customresourcedefinitions", None, name)
    assert upgraded is not None
    version = next(v for v in upgraded["spec"]["versions"] if v["name"] == crd.VERSION)
    assert version["additionalPrinterColumns"][-1]["name"] == "Replicas"

    await helm("uninstall", "npu", "-n", "npu-system")
    assert await cluster.get(CRDS, "customresourcedefinitions", None, name) is not None
    assert await cluster.list_objects(crd.API_VERSION, crd.PLURAL, "default") == []  # its API still served
    assert await cluster.list_objects("v1", "secrets", "npu-system") == []  # helm's release records
    assert await cluster.list_objects(RBAC, "clusterroles") == []

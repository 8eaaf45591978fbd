"""A pod's volumes on this machine, made as a kubelet makes them before its containers start: each
volume's directory, a configMap's keys projected as files, the ServiceAccount token as a kubeconfig."""

from __future__ import annotations

import json
from pathlib import Path

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers.workloads import JSON
from npu_sandbox.node.container import NotYet


async def project_config_maps(cluster: ApiClient, namespace: str, spec: JSON, directory: Path) -> None:
    """Each configMap volume's keys as files in the pod's `directory` for it, as a kubelet projects
    them before the containers start; an optional ConfigMap that does not exist is an empty
    directory, a required one waits (NotYet). Called again while the pod runs (`Pod.resync`): as a
    kubelet's sync does (kubernetes pkg/volume/configmap, through pkg/volume/util AtomicWriter), a
    changed key replaces its file whole (a new file renamed over the old: a reader never sees half
    of it) and a removed key's file goes."""
    for volume in spec.get("volumes", []):
        if "configMap" not in volume:
            continue
        source = volume["configMap"]
        found = await cluster.get("v1", "configmaps", namespace, source["name"])
        if found is None and not source.get("optional"):
            raise NotYet(f"ConfigMap {namespace}/{source['name']} does not exist")
        volume_directory = directory / volume["name"]
        volume_directory.mkdir(parents=True, exist_ok=True)
        data = (found or {}).get("data") or {}
        for key, value in data.items():
            target = volume_directory / key
            if not target.is_file() or target.read_text(encoding="utf-8") != value:
                staged = volume_directory / f".{key}.new"
                staged.write_text(value, encoding="utf-8")
                staged.replace(target)
        for stale in volume_directory.iterdir():
            if stale.name not in data and not stale.name.startswith("."):
                stale.unlink()


def volume_paths(spec: JSON, workdir: Path, directory: Path) -> dict[str, Path]:
    """Each pod volume's directory on this machine: hostPath as it is, a claim under the kubelet's
    volumes/ (beside its `workdir`, shared by every pod that mounts it), an emptyDir (or a
    configMap's files) per pod, in the pod's `directory`."""
    paths: dict[str, Path] = {}
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            paths[volume["name"]] = Path(volume["hostPath"]["path"])
            continue
        if "persistentVolumeClaim" in volume:
            path = workdir.parent / "volumes" / volume["persistentVolumeClaim"]["claimName"]
        else:
            path = directory / volume["name"]
        path.mkdir(parents=True, exist_ok=True)
        paths[volume["name"]] = path
    return paths


async def service_account_env(cluster: ApiClient, namespace: str, spec: JSON, directory: Path) -> dict[str, str]:
    """The pod's ServiceAccount token, as a kubelet projects it (a TokenRequest), given to the process
    as a kubeconfig (KUBECONFIG): a process here cannot read /var/run/secrets/kubernetes.io/serviceaccount.
    None without automountServiceAccountToken, or for the `default` account the sandbox does not create."""
    if spec.get("automountServiceAccountToken") is False:
        return {}
    account = spec.get("serviceAccountName") or "default"
    try:
        token = await cluster.create_token(namespace, account)
    except ApiRejected as exc:
        if exc.status == 404 and account == "default":
            return {}
        raise NotYet(f"no token for ServiceAccount {namespace}/{account}: {exc}") from exc
    account_directory = directory / "serviceaccount"
    account_directory.mkdir(parents=True, exist_ok=True)
    (account_directory / "token").write_text(token, encoding="utf-8")
    (account_directory / "namespace").write_text(namespace, encoding="utf-8")
    kubeconfig = account_directory / "kubeconfig"
    kubeconfig.write_text(json.dumps(cluster.kubeconfig_document(token)), encoding="utf-8")
    return {"KUBECONFIG": str(kubeconfig)}

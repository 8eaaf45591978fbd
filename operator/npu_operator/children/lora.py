"""spec.lora in the engine pods: the adapter list's ConfigMap, the volumes its adapters live on, the flags. Pure.

The list is a ConfigMap (`<resource>-lora`, key `adapters.json`, the format of
`npu_runtime.adapters`) mounted as a directory, never through subPath: the kubelet then replaces
the file when the ConfigMap changes (kubernetes pkg/volume/configmap, an atomic writer per sync),
and `npu-runtime serve` loads and unloads adapters to match it. The pod template holds only what
does not change with the list: the ConfigMap volume, one volume per distinct claim or host directory
the adapters come from, the hub cache, and the limits as planner flags. Adding an adapter in a claim
or host directory already mounted, or from a hub, therefore leaves the template (and the pods) as
they are; one in a new claim or directory adds a volume, which rolls the pods like any template change.

Where each adapter is inside the pod: a claim's volume at `/var/run/npu-lora/<volume>`, a host
directory at its own path (as a model's host directory is mounted), the adapter at its subPath
below; a hub adapter is downloaded into the model cache (spec.model.cache, mounted writable at
`/var/run/npu-lora/cache`), else into an emptyDir there (each pod downloads its own). The cache is
mounted whether or not an adapter comes from a hub, so the first one added needs no new mount. The
init container, where the model has one, downloads the hub adapters after the model; `serve`
downloads those added later, and all of them where the model comes from a volume (no init container).
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any, Final

from npu_runtime.adapters import ADAPTER_LIST_FILE, AdapterList, AdapterSource

from npu_operator.api.spec import LORA_DIR, LORA_LIST_MOUNT, LoraAdapterSpec, NPUInferenceSpec
from npu_operator.children.kinds import LORA_ADAPTERS
from npu_operator.kube.names import labels

JSON = dict[str, Any]

LIST_VOLUME: Final = "lora-adapters"
CACHE_VOLUME: Final = "lora-cache"
CACHE_DIR: Final = f"{LORA_DIR}/cache"
LIST_FILE: Final = f"{LORA_LIST_MOUNT}/{ADAPTER_LIST_FILE}"


def volume_of(adapter: LoraAdapterSpec) -> str | None:
    """The pod volume an adapter's claim or host directory is mounted from (None: a hub adapter).
    Named by a digest of the source, so the same claim or directory is one volume whatever the list."""
    if adapter.claim_name is not None:
        return "lora-claim-" + _digest(adapter.claim_name)
    if adapter.host_path is not None:
        return "lora-host-" + _digest(posixpath.normpath(adapter.host_path))
    return None


def mount_path_of(adapter: LoraAdapterSpec) -> str | None:
    """Where the pod mounts an adapter's volume: a claim under LORA_DIR, a host directory at its own
    path (as the node has it, so a path in the list means the same inside the pod and on the node)."""
    if adapter.host_path is not None:
        return posixpath.normpath(adapter.host_path)
    volume = volume_of(adapter)
    return posixpath.join(LORA_DIR, volume) if volume is not None else None


def adapter_list(spec: NPUInferenceSpec) -> AdapterList:
    """The list the pods serve: each adapter where the pod sees it."""
    assert spec.lora is not None
    sources: list[AdapterSource] = []
    for adapter in spec.lora.adapters:
        mount = mount_path_of(adapter)
        if mount is not None:
            sources.append(AdapterSource(adapter.name, path=posixpath.join(mount, adapter.sub_path)))
        else:
            hub = adapter.hub
            assert hub is not None  # the CRD requires exactly one source
            sources.append(AdapterSource(adapter.name, None, hub.hub, hub.repository, hub.revision, hub.endpoint))
    return AdapterList(spec.model.name, CACHE_DIR, tuple(sources))


def build_adapter_list(name: str, namespace: str, spec: NPUInferenceSpec) -> JSON:
    """The ConfigMap the pods read their adapters from."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": LORA_ADAPTERS.child_name(name), "namespace": namespace, "labels": labels(name)},
        "data": {ADAPTER_LIST_FILE: adapter_list(spec).text()},
    }


def add_lora_volumes(pod_spec: JSON, name: str, spec: NPUInferenceSpec) -> None:
    """The list's ConfigMap, the adapters' claims and host directories and the hub cache, as volumes of a
    pod spec built by `engine_pod.pod_template`, mounted in the engine container and the init container
    (which downloads the hub adapters before the engine starts)."""
    if spec.lora is None:
        return
    # Not optional: the ConfigMap is applied before the workload, and a pod that started without its
    # list would serve no adapter until the next sync.
    volumes: list[JSON] = [{"name": LIST_VOLUME, "configMap": {"name": LORA_ADAPTERS.child_name(name)}}]
    mounts: list[JSON] = [{"name": LIST_VOLUME, "mountPath": LORA_LIST_MOUNT, "readOnly": True}]
    seen: set[str] = set()
    for adapter in spec.lora.adapters:
        volume = volume_of(adapter)
        if volume is None or volume in seen:
            continue
        seen.add(volume)
        source: JSON = (
            {"persistentVolumeClaim": {"claimName": adapter.claim_name, "readOnly": True}}
            if adapter.claim_name is not None
            else {"hostPath": {"path": adapter.host_path, "type": "Directory"}}
        )
        volumes.append({"name": volume, **source})
        mounts.append({"name": volume, "mountPath": mount_path_of(adapter), "readOnly": True})
    # Always there, so that the first hub adapter added to a list needs no new mount either.
    mounts.append({"name": _cache_volume(pod_spec, spec), "mountPath": CACHE_DIR})
    pod_spec["volumes"] += sorted(volumes, key=lambda v: str(v["name"]))
    for container in [*pod_spec.get("initContainers", ()), *pod_spec["containers"]]:
        container.setdefault("volumeMounts", []).extend(mounts)


def _cache_volume(pod_spec: JSON, spec: NPUInferenceSpec) -> str:
    """The volume hub adapters download into: the model cache's claim where the spec has one (the pod
    mounts it already, as the model's volume), else an emptyDir of the pod's own."""
    if spec.model.cache is not None:
        claim = spec.model.cache.claim_name
        for volume in pod_spec["volumes"]:
            if (volume.get("persistentVolumeClaim") or {}).get("claimName") == claim:
                return str(volume["name"])
    if all(volume["name"] != CACHE_VOLUME for volume in pod_spec["volumes"]):
        pod_spec["volumes"].append({"name": CACHE_VOLUME, "emptyDir": {}})
    return CACHE_VOLUME


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]

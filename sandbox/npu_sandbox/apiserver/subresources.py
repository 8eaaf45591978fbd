"""The scale subresource: an object seen as an autoscaling/v1 Scale, and a Scale written back as a patch.

`Scale` reads and writes the replicas where the kind keeps them: a CRD's `subresources.scale` paths,
or a Deployment's (`.spec.replicas`, `.status.replicas`, `.spec.selector`). Writing a Scale (PUT or
PATCH of `.../scale`) becomes a patch of the object's replicas path, validated as the API server does.
(The status subresource is admission's: see `admission.Admission.update`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer
import kmock
from kmock._internal import dicts, enums, rendering

from npu_sandbox.apiserver.custom_apis import CustomApis
from npu_sandbox.apiserver.resources import SCALE_PATHS
from npu_sandbox.apiserver.store import Store
from npu_sandbox.apiserver.tables import json_path


class Scale:
    """The scale subresource of the kinds that have one."""

    def __init__(self, store: Store, custom: CustomApis) -> None:
        self.store = store
        self.custom = custom

    def paths(self, request: rendering.Request) -> tuple[str, str, str]:
        """The replicas and selector paths of the scale subresource: the CRD's (a stored one, or one of
        `resources.SCALE_PATHS`), or a Deployment's."""
        version = self.custom.version_of(request)
        if version is not None:
            scale = version["subresources"]["scale"]
            return scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath", "")
        resource = request.resource
        if resource is not None and resource.group and resource.version and resource.plural:
            known = SCALE_PATHS.get((resource.group, resource.version, resource.plural))
            if known is not None:
                return known
        return ".spec.replicas", ".status.replicas", ".spec.selector"

    def of(self, request: rendering.Request, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object seen through its scale subresource: an autoscaling/v1 Scale."""
        spec_path, status_path, selector_path = self.paths(request)
        selector = json_path(obj, selector_path) if selector_path else None
        if isinstance(selector, Mapping):  # a LabelSelector, as a string
            selector = ",".join(f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items()))
        meta = obj.get("metadata", {})
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": json_path(obj, spec_path) or 0},
            "status": {"replicas": json_path(obj, status_path) or 0} | ({"selector": selector} if selector else {}),
        }

    def as_patch(self, request: rendering.Request) -> None:
        """A Scale written to the scale subresource becomes a patch of the object's replicas path."""
        if request.subresource != "scale" or request.action != enums.action.UPDATE or request.name is None:
            return
        old = self.store.stored(request.resource, request.namespace, request.name)
        if old is None:
            return  # kmock answers 404
        scale = self.of(request, old)
        data: Any = request.data
        try:
            if isinstance(data, list):
                scale = jsonpatch.apply_patch(scale, data)
            elif isinstance(data, dict):
                scale = dict(dicts.patch_dict(scale, data)) if request.method == enums.method.PATCH else data
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=f"the patch failed: {exc}") from None
        replicas = scale.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f'Scale.autoscaling "{request.name}" is invalid: spec.replicas: Invalid value: '
                f"{replicas!r}: must be greater than or equal to 0",
                details={"causes": [{"field": "spec.replicas", "message": "must be greater than or equal to 0"}]},
            )
        spec_path, _, _ = self.paths(request)
        patch: dict[str, Any] = {}
        *parents, leaf = spec_path.lstrip(".").split(".")
        node = patch
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = replicas
        object.__setattr__(request, "data", patch)

"""Discovery and OpenAPI, as kubectl and client-go read and negotiate them.

The server's version (the Kubernetes version whose schemas are served), discovery's group versions
as an API server writes them, and OpenAPI v3 (an index and one document per group version) and v2
(JSON, or gnostic's protobuf when asked), made from what is served now, built-in kinds and CRDs
alike (`openapi`, `openapi_v2_proto`), and cached until that changes.
"""

from __future__ import annotations

import json
from typing import Any

import kmock
from kmock._internal import rendering

from npu_sandbox.apiserver import openapi, openapi_v2_proto
from npu_sandbox.apiserver.custom_apis import CustomApis
from npu_sandbox.apiserver.store import Store


class Discovery:
    """What a client reads before it calls: versions, discovery documents, OpenAPI."""

    def __init__(self, store: Store, custom: CustomApis) -> None:
        self.store = store
        self.custom = custom
        self._cache: dict[str, Any] = {}  # the OpenAPI documents, by the served APIs' key

    def server_version(self) -> rendering.Payload:
        """The Kubernetes version whose schemas the sandbox serves (kubectl warns about a skew)."""
        major, minor, _ = openapi.KUBERNETES_VERSION.split(".")
        return {
            "major": major,
            "minor": minor,
            "gitVersion": f"v{openapi.KUBERNETES_VERSION}+npu-sandbox",
            "gitTreeState": "clean",
            "platform": "linux/amd64",
        }

    def group_version(self, payload: Any) -> rendering.Payload:
        """kmock's discovery of a group version as an API server answers it: `v1` for the core group;
        subresources without short names."""
        payload["groupVersion"] = payload["groupVersion"].lstrip("/")  # the core group is "v1", not "/v1"
        for entry in payload.get("resources", []):
            if "/" in entry["name"]:
                entry["shortNames"], entry["categories"] = [], []
        result: rendering.Payload = payload
        return result

    def served(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        served: dict[tuple[str, str, str], dict[str, Any]] = {}
        for resource in self.store.server._get_resources():
            if resource.group is None or resource.version is None or not resource.plural:
                continue
            info = self.store.server._resources[resource]
            if info.kind:
                served[resource.group, resource.version, resource.plural] = {
                    "kind": info.kind,
                    "namespaced": info.namespaced,
                    "verbs": sorted(info.verbs),
                    "subresources": sorted(info.subresources),
                }
                custom = self.custom.versions.get((resource.group, resource.version, resource.plural))
                if custom is not None:
                    served[resource.group, resource.version, resource.plural]["schema"] = custom["schema"][
                        "openAPIV3Schema"
                    ]
        return served

    def openapi_v3(self) -> dict[str, bytes]:
        served = self.served()
        key = json.dumps(sorted(served.items()), sort_keys=True)
        if self._cache.get("key") != key:
            self._cache = {"key": key, "v3": openapi.v3_documents(served)}
        documents: dict[str, bytes] = self._cache["v3"]
        return documents

    async def openapi_v3_index(self, request: rendering.Request) -> rendering.Payload:
        return openapi.v3_index(self.openapi_v3())

    async def openapi_v3_document(self, request: rendering.Request) -> rendering.Payload:
        document = self.openapi_v3().get(request.url.path.removeprefix("/openapi/v3/"))
        if document is None:
            raise kmock.KubernetesNotFoundError(
                reason="NotFound", message="the server could not find the requested resource"
            )
        return rendering.Response(payload=document, headers={"Content-Type": "application/json"})

    async def openapi_v2(self, request: rendering.Request) -> rendering.Payload:
        """One Swagger 2.0 document: protobuf when asked for it (client-go asks for nothing else), else JSON."""
        accept = request.headers.get("Accept", "")
        served = self.served()
        key = json.dumps(sorted(served.items()), sort_keys=True)
        if self._cache.get("v2-key") != key:
            document = openapi.v2_document(served)
            self._cache.update({"v2-key": key, "v2": document, "v2-proto": None})
        if any(media in accept for media in openapi_v2_proto.ACCEPTED):
            if self._cache["v2-proto"] is None:
                self._cache["v2-proto"] = openapi_v2_proto.encode(json.loads(self._cache["v2"]))
            body, content_type = self._cache["v2-proto"], openapi_v2_proto.CONTENT_TYPE
        elif not accept or "json" in accept or "*/*" in accept:
            body, content_type = self._cache["v2"], "application/json"
        else:
            raise kmock.KubernetesError(
                status=406,
                reason="NotAcceptable",
                message=f"OpenAPI v2 is served as JSON or {openapi_v2_proto.CONTENT_TYPE}",
            )
        return rendering.Response(payload=body, headers={"Content-Type": content_type})

"""The sandbox's API from a client's side: calls over HTTP, as kubectl would make them.

`ApiClient` is what the controllers (`npu_sandbox.controllers`) and the kubelet
(`npu_sandbox.node`) need of a cluster: create, get, list, patch and delete objects, and poll until
something holds. `LocalCluster` (`npu_sandbox.cluster.local`) is one, for the API it serves itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from npu_operator.api import crd
from npu_operator.kube.client import Resource

from npu_sandbox.apiserver.access import ADMIN_TOKEN
from npu_sandbox.progress import Progress

# How the tests' and the sandbox's own requests name themselves (the API server's default field manager).
USER_AGENT = "npu-sandbox"


def resource_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    return Resource.of(api_version, plural).path(namespace, name)


class ApiRejected(Exception):
    """The API answered with an error status (e.g. 422 for an invalid NPUInference)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status = status
        self.body = body


class ApiClient:
    """API calls over HTTP to the API at `url`, through `_session` (opened by the subclass that owns it)."""

    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def kubeconfig_document(self, token: str = ADMIN_TOKEN) -> dict[str, Any]:
        """A kubeconfig for this API: as the sandbox's admin, or with a ServiceAccount's `token` (`create_token`)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "sandbox", "user": {"token": token}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "sandbox"}}],
            "current-context": "sandbox",
        }

    async def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        assert self._session is not None
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self._session.request(method, self.url + path, data=data, headers=headers) as response:
            answer = await response.json(content_type=None)
            if response.status >= 300:
                raise ApiRejected(response.status, answer or {})
            return answer

    async def create(self, obj: dict[str, Any], plural: str, *, dry_run: bool = False) -> dict[str, Any]:
        """POST the object; with `dry_run`, admitted and validated (`dryRun=All`) but not stored."""
        path = resource_path(obj["apiVersion"], plural, obj["metadata"].get("namespace"))
        result: dict[str, Any] = await self._call("POST", path + ("?dryRun=All" if dry_run else ""), obj)
        return result

    async def create_token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A token of the ServiceAccount (TokenRequest, as a kubelet asks for the token it projects into a pod)."""
        path = resource_path("v1", "serviceaccounts", namespace, service_account) + "/token"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        answer = await self._call("POST", path, request)
        token: str = answer["status"]["token"]
        return token

    async def ensure(self, obj: dict[str, Any], plural: str) -> None:
        with contextlib.suppress(ApiRejected):
            await self.create(obj, plural)

    async def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", resource_path(api_version, plural, namespace, name))
        except ApiRejected as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list_objects(self, api_version: str, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        answer = await self._call("GET", resource_path(api_version, plural, namespace))
        return list(answer.get("items", []))

    async def patch(
        self,
        api_version: str,
        plural: str,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        path = Resource.of(api_version, plural).path(namespace, name, subresource)
        result: dict[str, Any] = await self._call("PATCH", path, patch, "application/merge-patch+json")
        return result

    async def report_deployment(
        self, namespace: str, name: str, generation: int, replicas: int, ready: int, *, updated: int | None = None
    ) -> dict[str, Any]:
        """Play the Deployment controller: `replicas` pods at `generation`, `updated` of them (all by
        default) of the current template, `ready` of them ready (and available: minReadySeconds is 0).

        The one place a Deployment's status is written (`npu_sandbox.controllers.workloads` and tests call it).
        """
        updated = replicas if updated is None else updated
        status = {"observedGeneration": generation, "replicas": replicas, "updatedReplicas": updated}
        status |= {"readyReplicas": ready, "availableReplicas": ready, "unavailableReplicas": max(0, replicas - ready)}
        return await self.patch("apps/v1", "deployments", namespace, name, {"status": status}, subresource="status")

    async def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> None:
        await self._call("DELETE", resource_path(api_version, plural, namespace, name))

    async def apply_npu_inference(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the NPUInference, or merge-patch its spec when it exists (like `kubectl apply`)."""
        meta = manifest["metadata"]
        namespace = meta.get("namespace", "default")
        manifest = {**manifest, "metadata": {**meta, "namespace": namespace}}
        existing = await self.get(crd.API_VERSION, crd.PLURAL, namespace, meta["name"])
        if existing is None:
            return await self.create(manifest, crd.PLURAL)
        return await self.patch(crd.API_VERSION, crd.PLURAL, namespace, meta["name"], {"spec": manifest["spec"]})

    async def wait_for(
        self,
        probe: Any,
        *,
        within: float = 30.0,
        interval: float = 0.1,
        what: str = "",
        progress: Progress | None = None,
    ) -> Any:
        """Poll the async callable `probe` until it returns something truthy; that is returned. The wait
        ends after `within` seconds, or, given `progress`, once that says the awaited thing stopped
        advancing (an engine start on a busy machine takes as long as it takes)."""
        deadline = asyncio.get_running_loop().time() + within
        last: Any = None
        while True:
            last = await probe()
            if last:
                return last
            if progress is not None:
                if (why := progress.check()) is not None:
                    raise TimeoutError(f"gave up waiting for {what or probe}: {why}; last: {last!r}")
            elif asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"timed out after {within}s waiting for {what or probe}; last: {last!r}")
            await asyncio.sleep(interval)

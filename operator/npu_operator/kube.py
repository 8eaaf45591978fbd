"""A small async Kubernetes API client for the operator's children, on the credentials kopf uses.

kopf watches and patches the NPUInference itself; the children (Deployment, Service, PDB,
PodMonitor) and the pod listing go through this client. It speaks plain REST with JSON merge
patches, so it works against any API server, the in-process emulator of the tests included.
Credentials come from the same kopf login functions as the operator's (`connection_info`).
"""

from __future__ import annotations

import dataclasses
import json
import ssl
import time
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import kopf

from npu_operator import crd

JSON = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @classmethod
    def of(cls, api_version: str, plural: str, kind: str = "") -> Resource:
        group, _, version = api_version.rpartition("/")
        return cls(group, version, plural, kind)

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = self.group_version_path
        if namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if subresource is not None:
            base += f"/{subresource}"
        return base


DEPLOYMENTS: Final = Resource("apps", "v1", "deployments", "Deployment")
SERVICES: Final = Resource("", "v1", "services", "Service")
POD_DISRUPTION_BUDGETS: Final = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
POD_MONITORS: Final = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
# kubernetes-sigs/lws: one group of pods per replica of a multi-node NPUInference.
LEADER_WORKER_SETS: Final = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
PODS: Final = Resource("", "v1", "pods", "Pod")
PERSISTENT_VOLUME_CLAIMS: Final = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
REPLICA_SETS: Final = Resource("apps", "v1", "replicasets", "ReplicaSet")
EVENTS: Final = Resource("", "v1", "events", "Event")
NPU_INFERENCES: Final = Resource(crd.GROUP, crd.VERSION, crd.PLURAL, crd.KIND)
BY_KIND: Final = {
    r.kind: r for r in (DEPLOYMENTS, LEADER_WORKER_SETS, SERVICES, POD_DISRUPTION_BUDGETS, POD_MONITORS, PODS, EVENTS)
}


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: conflicts, throttling, server-side trouble."""
        return self.status in (409, 429) or self.status >= 500


class ApiUnreachable(ConnectionError):
    """No answer from the API server (timeout, refused, cut); the message names the request."""


def connection_info(settings: kopf.OperatorSettings, logger: Any = None) -> kopf.ConnectionInfo:
    """In-cluster service account first, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    info = kopf.login_with_service_account(settings=settings, logger=logger) or kopf.login_with_kubeconfig(
        settings=settings, logger=logger
    )
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig: cannot reach the Kubernetes API")
    return info


class KubeClient:
    """REST calls against one API server. Create it inside the event loop; close it when done."""

    def __init__(self, info: kopf.ConnectionInfo, *, timeout: float = 30.0, discovery_seconds: float = 300.0) -> None:
        self._discovery_seconds = discovery_seconds
        self._discovered: dict[Resource, tuple[bool, float]] = {}
        ssl_context: ssl.SSLContext | bool = info.as_ssl_context() if info.server.startswith("https") else False
        self._server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            headers={**info.as_http_headers(), "Accept": "application/json"},
            connector=aiohttp.TCPConnector(ssl=ssl_context),
            timeout=aiohttp.ClientTimeout(total=timeout),
        )

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> JSON | None:
        headers = {"Content-Type": content_type or "application/json"} if body is not None else {}
        data = json.dumps(body) if body is not None else None
        try:
            async with self._session.request(
                method, self._server + path, data=data, headers=headers, params=params
            ) as response:
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError) as exc:
            why = str(exc) or ("no answer in time" if isinstance(exc, TimeoutError) else type(exc).__name__)
            raise ApiUnreachable(f"{method} {path}: {why}") from exc
        if response.status == 404 and method == "GET":
            return None
        if response.status >= 300:
            try:
                status = json.loads(text)
                raise ApiError(response.status, status.get("reason", ""), status.get("message", text))
            except (ValueError, AttributeError):
                raise ApiError(response.status, response.reason or "", text[:500]) from None
        return json.loads(text) if text else None

    async def get(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        """The object, or None when it does not exist."""
        return await self._request("GET", resource.path(namespace, name))

    async def list(self, resource: Resource, namespace: str, label_selector: str | None = None) -> list[JSON]:
        params = {"labelSelector": label_selector} if label_selector else None
        answer = await self._request("GET", resource.path(namespace), params=params)
        return list((answer or {}).get("items", []))

    async def create(self, resource: Resource, namespace: str, obj: JSON) -> JSON:
        answer = await self._request("POST", resource.path(namespace), body=obj)
        assert answer is not None
        return answer

    async def patch(
        self, resource: Resource, namespace: str, name: str, patch: JSON, *, subresource: str | None = None
    ) -> JSON:
        """A JSON merge patch (RFC 7386): maps merge, lists are replaced, null removes a key."""
        answer = await self._request(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )
        assert answer is not None
        return answer

    async def delete(self, resource: Resource, namespace: str, name: str) -> None:
        try:
            await self._request("DELETE", resource.path(namespace, name), body={"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def serves(self, resource: Resource) -> bool:
        """Whether the API server offers this resource (e.g. PodMonitors of monitoring.coreos.com/v1).

        Asked once per `discovery_seconds` for the whole operator, not once per reconcile: a CRD
        installed later is noticed within that time.
        """
        now = time.monotonic()
        cached = self._discovered.get(resource)
        if cached is not None and now - cached[1] < self._discovery_seconds:
            return cached[0]
        try:
            listing = await self._request("GET", resource.group_version_path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            listing = None
        served = any(item.get("name") == resource.plural for item in (listing or {}).get("resources", []))
        self._discovered[resource] = (served, now)
        return served

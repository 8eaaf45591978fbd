"""The operator's calls to the Kubernetes API: the official client (`kubernetes.aio`) on kopf's login.

kopf watches the NPUInference, its children and their pods and patches kopf's own bookkeeping;
everything else goes through `KubeClient`: server-side apply of the children (field manager
`npu-operator`), their deletion, a GET when creating a child met someone else's object, the status
subresource of the NPUInference, and whether an optional API (PodMonitor) is served.

Credentials come from the same kopf login functions as kopf's own (`connection_info`: in-cluster
service account, else the kubeconfig), turned into kopf's Authorization header and TLS context; on
a 401 the login is done again (a rotated service-account token is re-read) and the call retried
once. Paths are built from a fixed table (`Resource`), not by discovery: `kubernetes.aio`'s
dynamic discoverer re-runs the whole discovery on every lookup of an API that is not installed
(`LazyDiscoverer.search` -> `invalidate_cache`) and keeps a cache file under the temp directory,
so only its transport (`DynamicClient.request`: auth, serialization, error mapping) is used, and
"is this API served" is asked once per `discovery_seconds` for the whole operator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import aiohttp
import kopf
from kubernetes.aio import client as k8s
from kubernetes.aio.dynamic import DynamicClient
from kubernetes.aio.dynamic.exceptions import DynamicApiError

from npu_operator.api import crd

JSON = dict[str, Any]
FIELD_MANAGER: Final = "npu-operator"
APPLY_PATCH: Final = "application/apply-patch+yaml"
MERGE_PATCH: Final = "application/merge-patch+json"


@dataclasses.dataclass(frozen=True)
class Resource:
    """One API resource, addressed without discovery."""

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


NPU_INFERENCES: Final = Resource(crd.GROUP, crd.VERSION, crd.PLURAL, crd.KIND)
PODS: Final = Resource("", "v1", "pods", "Pod")
REPLICA_SETS: Final = Resource("apps", "v1", "replicasets", "ReplicaSet")
STATEFUL_SETS: Final = Resource("apps", "v1", "statefulsets", "StatefulSet")
PERSISTENT_VOLUME_CLAIMS: Final = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
EVENTS: Final = Resource("", "v1", "events", "Event")


class ApiError(Exception):
    """A non-2xx answer from the API server (or none at all: status 0)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: conflicts, throttling, server-side trouble, no answer."""
        return self.status in (0, 409, 429) or self.status >= 500

    @classmethod
    def of(cls, exc: DynamicApiError | k8s.ApiException) -> ApiError:
        status = int(getattr(exc, "status", 0) or 0)
        reason = str(getattr(exc, "reason", "") or "")
        body = getattr(exc, "body", None)
        message = str(body or exc)
        try:
            answer = json.loads(body) if isinstance(body, str | bytes) else None
            if isinstance(answer, dict):
                reason = str(answer.get("reason") or reason)
                message = str(answer.get("message") or message)
        except ValueError:
            pass
        return cls(status, reason, message[:1000])


def connection_info(settings: kopf.OperatorSettings, logger: Any = None) -> kopf.ConnectionInfo:
    """In-cluster service account first, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    info = kopf.login_with_service_account(settings=settings, logger=logger) or kopf.login_with_kubeconfig(
        settings=settings, logger=logger
    )
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig: cannot reach the Kubernetes API")
    return info


def _identity(_client: Any, data: Any) -> Any:
    return data


class KubeClient:
    """`kubernetes.aio` on kopf's credentials. Create it inside the event loop; close it when done.

    `login` returns fresh credentials (it is called again after a 401). `connections` bounds the
    requests in flight to the API server.
    """

    def __init__(
        self,
        login: Callable[[], kopf.ConnectionInfo],
        *,
        timeout: float = 30.0,
        discovery_seconds: float = 300.0,
        connections: int = 100,
        on_served_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._login = login
        self._timeout = timeout
        self._connections = connections
        self._discovery_seconds = discovery_seconds
        self._on_served_change = on_served_change
        self._discovered: dict[Resource, tuple[bool, float]] = {}
        self._discovering: dict[Resource, asyncio.Future[bool]] = {}
        self._relogin = asyncio.Lock()
        self._api, self._dynamic, self._connector = self._connect(login())
        self.requests = 0  # for the operator's own accounting and the benchmark

    def _connect(self, info: kopf.ConnectionInfo) -> tuple[k8s.ApiClient, DynamicClient, aiohttp.TCPConnector]:
        connector = aiohttp.TCPConnector(
            ssl=info.as_ssl_context() if info.server.startswith("https") else False, limit=self._connections
        )
        configuration = k8s.Configuration(
            host=info.server.rstrip("/"),
            # kopf's header: Bearer token or basic auth, whichever the login found.
            api_key={"authorization": auth} if (auth := info.as_http_headers().get("Authorization")) else None,
            # Proxies and .netrc from the environment as kopf's own session takes them (kopf's
            # default: not at all). kubernetes.aio trusts the environment by default, and aiohttp
            # then looks both up in a thread for every request.
            client_session_kwargs={"connector": connector, "trust_env": info.trust_env},
        )
        api = k8s.ApiClient(configuration)
        return api, DynamicClient(api), connector  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]
        await self._connector.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        query: Sequence[tuple[str, str]] = (),
    ) -> JSON:
        for attempt in (1, 2):
            api = self._api
            self.requests += 1
            try:
                answer: JSON = await self._dynamic.request(
                    method,
                    path,
                    body=body,
                    content_type=content_type,
                    query_params=list(query),
                    _request_timeout=self._timeout,
                    serializer=_identity,
                )
                return answer
            except (DynamicApiError, k8s.ApiException) as exc:
                error = ApiError.of(exc)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Named with the request: a bare TimeoutError() has no message of its own.
                why = str(exc) or "no answer from the API server"
                raise ApiError(0, type(exc).__name__, f"{method} {path}: {why}") from exc
            if error.status == 401 and attempt == 1:
                await self._login_again(api)
                continue
            raise error
        raise AssertionError("unreachable")

    async def _login_again(self, failed: k8s.ApiClient) -> None:
        """New credentials (a rotated token is re-read), once for all the calls that got the 401."""
        async with self._relogin:
            if self._api is not failed:
                return  # another call already logged in again
            old_connector = self._connector
            self._api, self._dynamic, self._connector = self._connect(await asyncio.to_thread(self._login))
            await failed.close()  # type: ignore[no-untyped-call]
            await old_connector.close()

    async def apply(self, resource: Resource, namespace: str, obj: JSON, *, force: bool = True) -> JSON:
        """Server-side apply of `obj` as field manager `npu-operator`.

        Only the fields in `obj` are ours: fields the API server defaults or others add are left
        alone, and a field that was ours and is no longer in `obj` is removed by the API server.
        With `force`, fields of `obj` that another manager changed are taken back; without, such a
        conflict is answered with 409.
        """
        return await self._request(
            "PATCH",
            resource.path(namespace, obj["metadata"]["name"]),
            body=obj,
            content_type=APPLY_PATCH,
            query=(("fieldManager", FIELD_MANAGER), ("force", "true" if force else "false")),
        )

    async def create(self, resource: Resource, namespace: str, obj: JSON) -> JSON:
        """POST `obj` as field manager `npu-operator`: 409 (AlreadyExists) when its name is taken,
        whoever took it; never a merge into an object that exists (an apply would be one)."""
        return await self._request("POST", resource.path(namespace), body=obj, query=(("fieldManager", FIELD_MANAGER),))

    async def get(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        """The object, or None when it does not exist."""
        try:
            return await self._request("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def delete(self, resource: Resource, namespace: str, name: str) -> None:
        try:
            await self._request("DELETE", resource.path(namespace, name), body={"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def patch_status(self, resource: Resource, namespace: str, name: str, status: JSON) -> JSON:
        """A JSON merge patch of the status subresource (the worker is its only writer)."""
        return await self._request(
            "PATCH",
            resource.path(namespace, name, "status"),
            body={"status": status},
            content_type=MERGE_PATCH,
            query=(("fieldManager", FIELD_MANAGER),),
        )

    def served_now(self, resource: Resource) -> bool | None:
        """What `serves` would answer without a request, or None while it would have to ask."""
        cached = self._discovered.get(resource)
        if cached is not None and time.monotonic() - cached[1] < self._discovery_seconds:
            return cached[0]
        return None

    async def serves(self, resource: Resource) -> bool:
        """Whether the API server offers this resource (e.g. PodMonitors of monitoring.coreos.com/v1).

        Asked once per `discovery_seconds` for the whole operator, not once per reconcile, by the
        first caller after that time: an answer that differs from the one before (a CRD installed
        or removed) calls `on_served_change`.
        """
        if (known := self.served_now(resource)) is not None:
            return known
        # Every worker's first tick asks at once after a start: they share one request.
        asking = self._discovering.get(resource)
        if asking is None:
            asking = self._discovering[resource] = asyncio.ensure_future(self._discover(resource))
            asking.add_done_callback(lambda _: self._discovering.pop(resource, None))
        return await asyncio.shield(asking)  # a cancelled caller leaves the request to the others

    async def _discover(self, resource: Resource) -> bool:
        now = time.monotonic()
        try:
            listing: JSON | None = await self._request("GET", resource.group_version_path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            listing = None
        served = any(item.get("name") == resource.plural for item in (listing or {}).get("resources", []))
        before = self._discovered.get(resource)
        self._discovered[resource] = (served, now)
        if before is not None and before[0] != served:
            self._on_served_change()
        return served

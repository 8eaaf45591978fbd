"""The operator's calls to the Kubernetes API, on kopf's login: aiohttp, as kopf's own client.

kopf watches the NPUInference and patches kopf's own bookkeeping; everything else goes through
`KubeClient`: server-side apply of the children (field manager `npu-operator`), their deletion, a GET
when creating a child met someone else's object, the status subresource of the NPUInference, whether
an optional API (PodMonitor) is served, and the lists and watch streams of the children and pods
(`kube.informer`).

Credentials come from the `kubernetes` package, as kopf's `login_via_client` takes them (`connection_info`:
in-cluster service account, else the kubeconfig with exec credential plugins and auth providers, as
kubectl reads it), turned into kopf's Authorization header and TLS context; on a 401 the login is
done again (a rotated service-account token is re-read, an exec plugin run again) and the call
retried once. Paths are built from a fixed table (`Resource`), not by discovery; "is this API served" is
asked once per `discovery_seconds` for the whole operator.

Requests go out on aiohttp directly, not through the `kubernetes` package's asyncio client: its
ApiClient (parameter sanitising, the dynamic client's request building, the answer's
deserialisation) was a sixth of the operator's CPU at 1,000 resources for what is a method, a path,
a JSON body and a status code here (docs/operator.md, eighth pass). The package only logs in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

import aiohttp
import kopf

from npu_operator.api import crd

JSON = dict[str, Any]
FIELD_MANAGER: Final = "npu-operator"
APPLY_PATCH: Final = "application/apply-patch+yaml"
MERGE_PATCH: Final = "application/merge-patch+json"
# Who the API server's audit log and access log say made our requests (kopf's own say kopf).
USER_AGENT: Final = "npu-operator"
LOGGER: Final = logging.getLogger(__name__)


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
# Read-only, cluster-wide, with the setting node_discovery: which NPUs the nodes offer (status.placement).
NODES: Final = Resource("", "v1", "nodes", "Node")


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
    def of(cls, status: int, reason: str, body: str) -> ApiError:
        """From an answer that is not 2xx: the reason and message of its Status, where it is one."""
        message = body or reason
        try:
            answer = json.loads(body)
            if isinstance(answer, dict):
                reason = str(answer.get("reason") or reason)
                message = str(answer.get("message") or message)
        except ValueError:
            pass
        return cls(status, reason, message[:1000])


def connection_info(settings: kopf.OperatorSettings, logger: Any = None) -> kopf.ConnectionInfo:
    """Credentials as the `kubernetes` package finds them: the in-cluster service account, else the
    kubeconfig read as kubectl reads it, with exec credential plugins (EKS, GKE, AKS, CCE...), auth
    providers, token files and client certificates. Called again after a 401, so a rotated token is
    re-read and an exec plugin run again.

    kopf's `login_via_client` (kopf/_core/intents/piggybacking.py) does the same into the package's
    global default Configuration and reads KUBECONFIG as it was when the package was first imported
    (kube_config.KUBE_CONFIG_DEFAULT_LOCATION); here each login reads KUBECONFIG as it is now, into a
    Configuration of its own, and never writes the kubeconfig back (persist_config off: an operator
    does not rewrite its user's file)."""
    try:
        from kubernetes import client as kube_client
        from kubernetes import config as kube_config
    except ImportError as exc:
        raise kopf.LoginError("the kubernetes package is missing: install npu-inference[operator]") from exc
    found = kube_client.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=found)  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        try:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.environ.get("KUBECONFIG", "~/.kube/config"),
                client_configuration=found,
                persist_config=False,
            )
        except kube_config.ConfigException as exc:
            raise kopf.LoginError(f"no service account token and no usable kubeconfig: {exc}") from exc
    (logger or LOGGER).debug(f"logged in to {found.host} through the kubernetes package")
    # The package keeps the header in api_key["BearerToken"] since 36.0.1, in "authorization" before.
    header = found.get_api_key_with_prefix("BearerToken") or found.get_api_key_with_prefix("authorization")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=found.host,
        ca_path=found.ssl_ca_cert,
        insecure=not found.verify_ssl,
        username=found.username or None,
        password=found.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=found.cert_file,
        private_key_path=found.key_file,
        trust_env=settings.networking.trust_env,
    )


class KubeClient:
    """Requests to the API server on kopf's credentials, over one aiohttp session. Create it inside
    the event loop; close it when done.

    `login` returns fresh credentials (it is called again after a 401). `connections` bounds the
    requests in flight to the API server (watch streams included).
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
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._connections = connections
        self._discovery_seconds = discovery_seconds
        self._on_served_change = on_served_change
        self._discovered: dict[Resource, tuple[bool, float]] = {}
        self._discovering: dict[Resource, asyncio.Future[bool]] = {}
        self._relogin = asyncio.Lock()
        self._server, self._session = self._connect(login())
        self.requests = 0  # for the operator's own accounting and the benchmark

    def _connect(self, info: kopf.ConnectionInfo) -> tuple[str, aiohttp.ClientSession]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # kopf's, on its way to the SSL context
            ssl_context = info.as_ssl_context() if info.server.startswith("https") else False
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context, limit=self._connections),
            # kopf's header: Bearer token or basic auth, whichever the login found.
            headers={"Accept": "application/json", "User-Agent": USER_AGENT, **info.as_http_headers()},
            # Proxies and .netrc from the environment only where kopf's own session takes them.
            proxy=info.proxy_url,
            trust_env=info.trust_env,
        )
        return info.server.rstrip("/"), session

    async def close(self) -> None:
        await self._session.close()

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
            session = self._session
            self.requests += 1
            data = None if body is None else json.dumps(body, separators=(",", ":"))
            headers = {"Content-Type": content_type or "application/json"} if data is not None else None
            try:
                async with session.request(
                    method, self._server + path, params=query, data=data, headers=headers, timeout=self._timeout
                ) as response:
                    text = await response.text()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Named with the request: a bare TimeoutError() has no message of its own.
                why = str(exc) or "no answer from the API server"
                raise ApiError(0, type(exc).__name__, f"{method} {path}: {why}") from exc
            if 200 <= status < 300:
                answer: JSON = json.loads(text) if text else {}
                return answer
            if status == 401 and attempt == 1:
                await self._login_again(session)
                continue
            raise ApiError.of(status, response.reason or "", text)
        raise AssertionError("unreachable")

    async def _login_again(self, failed: aiohttp.ClientSession) -> None:
        """New credentials (a rotated token is re-read), once for all the calls that got the 401."""
        async with self._relogin:
            if self._session is not failed:
                return  # another call already logged in again
            self._server, self._session = self._connect(await asyncio.to_thread(self._login))
            await failed.close()

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

    async def list_page(
        self, resource: Resource, namespace: str | None, *, selector: str, limit: int, token: str | None = None
    ) -> JSON:
        """One page of the objects with `selector` (all namespaces where `namespace` is None):
        `metadata.continue` names the next page, `metadata.resourceVersion` where a watch goes on."""
        query = [("labelSelector", selector), ("limit", str(limit))] + ([("continue", token)] if token else [])
        return await self._request("GET", resource.path(namespace), query=query)

    async def watch(
        self, resource: Resource, namespace: str | None, *, selector: str, resource_version: str, seconds: int
    ) -> AsyncIterator[JSON]:
        """The events of a watch stream from `resource_version`, one per line, until the API server
        ends the stream (after `seconds`) or the connection goes (an ApiError with status 0).

        Lines are split here, not by aiohttp's `readline` (whose limit an object of a few hundred
        KB passes); a bookmark comes as an event like any other."""
        session = self._session
        self.requests += 1
        query = [
            ("watch", "true"),
            ("labelSelector", selector),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(seconds)),
        ]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total, sock_read=seconds + 30)
        path = resource.path(namespace)
        try:
            async with session.get(self._server + path, params=query, timeout=timeout) as response:
                if response.status == 401:
                    await self._login_again(session)
                if response.status >= 300:
                    raise ApiError.of(response.status, response.reason or "", await response.text())
                pending = b""
                async for chunk in response.content.iter_any():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = str(exc) or "the stream went silent"
            raise ApiError(0, type(exc).__name__, f"watch {path}: {why}") from exc

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

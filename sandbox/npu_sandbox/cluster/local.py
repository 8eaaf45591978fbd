"""A local cluster in one event loop: the API emulator on a real port, a kubeconfig, the real operator.

Used by the operator's tests and by the sandbox. The operator runs exactly as in production
(`kopf.operator` with npu_operator's handlers), logging in through the kubeconfig written here;
nothing in it is patched. Clients (tests, the sandbox's kubelet) talk to the API over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Self

import aiohttp
import kmock
import yaml
from npu_operator import crd
from npu_operator.client import Resource
from npu_operator.config import OperatorConfig

from npu_sandbox.apiserver.emulator import KubeEmulator

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# How the tests' and the sandbox's own requests name themselves (the API server's default field manager).
USER_AGENT = "npu-sandbox"


def kopf_peering_crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    """kopf's peering CRDs (group kopf.dev), as the chart's templates/peering-crds.yaml defines them."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": scope,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }


def product_crds() -> list[dict[str, Any]]:
    """What `kubectl apply -f crds/` installs, plus kopf's peering CRDs: for clusters set up without the chart."""
    return [
        crd.load_crd(),
        kopf_peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        kopf_peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
    ]


def resource_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    return Resource.of(api_version, plural).path(namespace, name)


class ApiRejected(Exception):
    """The API answered with an error status (e.g. 422 for an invalid NPUInference)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status = status
        self.body = body


class LocalCluster:
    """`async with LocalCluster() as cluster:` then `await cluster.start_operator(config)`."""

    def __init__(
        self,
        *,
        pod_monitors: bool = False,
        leader_worker_sets: bool = False,
        disaggregated_sets: bool = False,
        workdir: Path | None = None,
        emulator: KubeEmulator | None = None,
        crds: bool = True,
    ) -> None:
        """`crds`: install the product's CRDs through the API at the start (`product_crds`); off when
        they come from elsewhere (the sandbox's `helm install`)."""
        self.emulator = emulator if emulator is not None else KubeEmulator()  # tests bring one with faults
        if pod_monitors:
            self.emulator.serve_pod_monitors()
        if leader_worker_sets:
            self.emulator.serve_leader_worker_sets()
        if disaggregated_sets:
            self.emulator.serve_disaggregated_sets()
        self._server = kmock.Server(self.emulator)
        self._stack = contextlib.AsyncExitStack()
        self._tmp = tempfile.TemporaryDirectory(prefix="npu-cluster-") if workdir is None else None
        self.workdir = workdir or Path(self._tmp.name if self._tmp else ".")
        self.kubeconfig = self.workdir / "kubeconfig"
        self._operator: tuple[threading.Thread, threading.Event, list[BaseException]] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._old_kubeconfig: str | None = None
        self._crds = crds

    @property
    def url(self) -> str:
        return str(self._server.url).rstrip("/")

    async def __aenter__(self) -> Self:
        await self._stack.enter_async_context(self.emulator)
        await self._stack.enter_async_context(self._server)
        self._session = await self._stack.enter_async_context(aiohttp.ClientSession(headers={"User-Agent": USER_AGENT}))
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_document()), encoding="utf-8")
        self._old_kubeconfig = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(self.kubeconfig)
        if self._crds:
            for definition in product_crds():
                await self._call("POST", CRDS_PATH, definition)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_operator()
        if self._old_kubeconfig is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = self._old_kubeconfig
        await self._stack.aclose()
        if self._tmp is not None:
            self._tmp.cleanup()

    def kubeconfig_document(self, token: str = "sandbox") -> dict[str, Any]:
        """A kubeconfig for this API: as the sandbox's admin, or with a ServiceAccount's `token` (`create_token`)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "sandbox", "user": {"token": token}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "sandbox"}}],
            "current-context": "sandbox",
        }

    # --- the operator -------------------------------------------------------------------------

    async def start_operator(self, config: OperatorConfig, *, peering: bool = True) -> None:
        """Run the real operator until `stop_operator`, in its own thread and event loop.

        kopf owns its loop (on exit it cancels every task the loop has), as in production where
        it is alone in its process; the API stays here and the two talk only over HTTP. It runs
        under the same supervisor as in production (`npu_operator.supervision.run_supervised`).
        """
        import npu_operator.handlers  # noqa: F401  (registers the handlers)
        from npu_operator import supervision

        if self._operator is not None:
            raise RuntimeError("the operator is already running")
        if peering and not config.standalone:
            await self.ensure(
                {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": config.peering_name}},
                "clusterkopfpeerings",
            )
        stop = threading.Event()
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                asyncio.run(
                    supervision.run_supervised(
                        config, standalone=config.standalone or not peering, stop_flag=stop, ready_flag=ready
                    )
                )
            except BaseException as exc:  # reported by stop_operator
                failure.append(exc)

        thread = threading.Thread(target=serve, name="npu-operator", daemon=True)
        thread.start()
        self._operator = (thread, stop, failure)
        await asyncio.to_thread(ready.wait, 30)

    async def stop_operator(self) -> None:
        """Stop the operator gracefully; raise what it failed with, if anything."""
        if self._operator is None:
            return
        thread, stop, failure = self._operator
        self._operator = None
        stop.set()
        await asyncio.to_thread(thread.join, 60)
        if thread.is_alive():
            raise RuntimeError("the operator did not stop within 60 s")
        if failure:
            raise RuntimeError("the operator failed") from failure[0]

    # --- API calls over HTTP, as kubectl would make them ----------------------------------------

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

        The one place a Deployment's status is written (`npu_sandbox.controllers` and tests call it).
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

    # --- observation --------------------------------------------------------------------------

    def writes(self) -> list[Any]:
        """Every write request the API has served so far (POST, PUT, PATCH, DELETE)."""
        return [request for request in self.emulator.history if request.method.value in WRITE_METHODS]

    async def wait_for(self, probe: Any, *, within: float = 30.0, interval: float = 0.1, what: str = "") -> Any:
        """Poll the async callable `probe` until it returns something truthy; that is returned."""
        deadline = asyncio.get_running_loop().time() + within
        last: Any = None
        while True:
            last = await probe()
            if last:
                return last
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"timed out after {within}s waiting for {what or probe}; last: {last!r}")
            await asyncio.sleep(interval)

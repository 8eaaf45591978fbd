"""A local cluster in one event loop: the API emulator on a real port, a kubeconfig, the real operator.

Used by the operator's tests and by the sandbox. The operator runs exactly as in production
(`kopf.operator` with npu_operator's handlers), logging in through the kubeconfig written here;
nothing in it is patched. Clients (tests, the sandbox's kubelet) talk to the API over HTTP, with the
calls `LocalCluster` inherits from `npu_sandbox.cluster.client.ApiClient`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Self

import aiohttp
import kmock
import yaml
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig

from npu_sandbox.apiserver.access import ADMIN_TOKEN
from npu_sandbox.apiserver.emulator import KubeEmulator
from npu_sandbox.cluster.client import USER_AGENT, ApiClient

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


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


class LocalCluster(ApiClient):
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
        self._session = None
        self._old_kubeconfig: str | None = None
        self._crds = crds

    @property
    def url(self) -> str:
        return str(self._server.url).rstrip("/")

    async def __aenter__(self) -> Self:
        await self._stack.enter_async_context(self.emulator)
        await self._stack.enter_async_context(self._server)
        self._session = await self._stack.enter_async_context(
            aiohttp.ClientSession(headers={"User-Agent": USER_AGENT, "Authorization": f"Bearer {ADMIN_TOKEN}"})
        )
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

    # --- the operator -------------------------------------------------------------------------

    async def start_operator(self, config: OperatorConfig, *, peering: bool = True) -> None:
        """Run the real operator until `stop_operator`, in its own thread and event loop.

        kopf owns its loop (on exit it cancels every task the loop has), as in production where
        it is alone in its process; the API stays here and the two talk only over HTTP. It runs
        under the same supervisor as in production (`npu_operator.supervision.run_supervised`).
        """
        from npu_operator.controller import handlers, supervision

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
                        config,
                        handlers.registry,
                        standalone=config.standalone or not peering,
                        stop_flag=stop,
                        ready_flag=ready,
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

    # --- observation --------------------------------------------------------------------------

    def writes(self) -> list[Any]:
        """Every write request the API has served so far (POST, PUT, PATCH, DELETE)."""
        return [request for request in self.emulator.history if request.method.value in WRITE_METHODS]

"""A kubelet (and deployment controller) for one Deployment, on this machine, over the API.

It reads the Deployment the operator created, starts the pod template's container args as a
local process (the real `npu-runtime serve`), and keeps a Pod object and the Deployment's status
up to date through the API, as the kubelet and the deployment controller would: the pod's IP,
its Ready condition (from the runtime's /readyz, like the readiness probe), and on exit the
container's termination message and CrashLoopBackOff. The only liberty: each pod has its own IP
in a cluster; here the pod's ports are mapped to free local ports, and the Pod object says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
from npu_operator.builders import CONTAINER_NAME
from npu_operator.worker import utc_now
from npu_runtime.contract import parse_serve_args, serve_argv

from npu_sandbox.cluster import LocalCluster

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the sandbox dies, however it dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalPod:
    """One pod of the Deployment, running as a local process."""

    def __init__(self, cluster: LocalCluster, namespace: str, name: str, workdir: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.workdir = workdir
        self.ports: dict[str, int] = {}
        self.started_at = ""
        self.process: asyncio.subprocess.Process | None = None
        self.log_path = workdir / f"{name}.log"
        self.termination_log = workdir / f"{name}.termination-log"
        self._watch: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.exited = asyncio.Event()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    async def start(self, template: dict[str, Any], labels: dict[str, str], environ: dict[str, str]) -> None:
        spec = template["spec"]
        container = next(c for c in spec["containers"] if c["name"] == CONTAINER_NAME)
        args = list(container["args"])
        self.ports = {"http": free_port(), "metrics": free_port()}
        for port in container.get("ports", []):
            port["containerPort"] = self.ports.get(port["name"], port["containerPort"])
        # The serve contract's own parser and writer: the pod's args with this machine's ports.
        options = dataclasses.replace(
            parse_serve_args(args[2:]),
            port=self.ports["http"],
            metrics_port=self.ports["metrics"],
            termination_log=str(self.termination_log),
        )
        args = [*args[:2], *serve_argv(options)]
        executable = shutil.which(args[0], path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        if executable is None:
            raise FileNotFoundError(f"{args[0]} is not installed next to {sys.executable}")
        env = {**os.environ, **environ}
        env.update({var["name"]: var["value"] for var in container.get("env", []) if "value" in var})
        await self.cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": self.name, "namespace": self.namespace, "labels": labels},
                "spec": spec,
            },
            "pods",
        )
        await self._set_status(phase="Pending", ready=False, state={"waiting": {"reason": "ContainerCreating"}})
        with self.log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                executable,
                *args[1:],
                env=env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.started_at = utc_now()
        await self._set_status(phase="Running", ready=False, state={"running": {"startedAt": self.started_at}})
        self._watch = asyncio.create_task(self._probe_until_exit(), name=f"kubelet {self.name}")

    async def _set_status(
        self,
        *,
        phase: str,
        ready: bool,
        state: dict[str, Any],
        last_state: dict[str, Any] | None = None,
        restarts: int = 0,
    ) -> None:
        flag = "True" if ready else "False"
        container_status = {
            "name": CONTAINER_NAME,
            "ready": ready,
            "restartCount": restarts,
            "state": state,
            "lastState": last_state or {},
        }
        await self.cluster.patch(
            "v1",
            "pods",
            self.namespace,
            self.name,
            {
                "status": {
                    "phase": phase,
                    "podIP": "127.0.0.1",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "ContainersReady", "status": flag},
                        {"type": "Ready", "status": flag},
                    ],
                    "containerStatuses": [container_status],
                }
            },
            subresource="status",
        )

    async def _probe_until_exit(self) -> None:
        """The readiness probe, until the process exits; then the container's last state."""
        assert self.process is not None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            ready = False
            while self.process.returncode is None:
                try:
                    async with session.get(f"{self.metrics_url}/readyz") as response:
                        now_ready = response.status == 200
                except (aiohttp.ClientError, TimeoutError, OSError):
                    now_ready = False
                if now_ready != ready:
                    ready = now_ready
                    await self._set_status(
                        phase="Running", ready=ready, state={"running": {"startedAt": self.started_at}}
                    )
                    if ready:
                        self.ready.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.process.wait(), timeout=1.0)
        code = self.process.returncode
        message = self.termination_log.read_text(encoding="utf-8") if self.termination_log.exists() else ""
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": message}
        with contextlib.suppress(Exception):  # the pod may be gone already
            await self._set_status(
                phase="Running",
                ready=False,
                restarts=1,
                state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}},
                last_state={"terminated": terminated},
            )
        self.exited.set()

    async def stop(self, grace: float = 60.0) -> int | None:
        """SIGTERM, the grace period, then SIGKILL for the whole process group; delete the Pod object."""
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._watch, timeout=10)
        with contextlib.suppress(Exception):
            await self.cluster.delete("v1", "pods", self.namespace, self.name)
        return process.returncode if process is not None else None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


class LocalKubelet:
    """Runs the pods of one Deployment locally and reports them, as kubelet + deployment controller."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str,
        deployment: str,
        *,
        workdir: Path,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.deployment = deployment
        self.workdir = workdir
        self.environ = environ or {}
        self.pods: list[LocalPod] = []
        self._reported: tuple[int, ...] | None = None

    async def start_pods(self) -> list[LocalPod]:
        """Start as many pods as the Deployment asks for (at least the operator must have made it)."""
        deployment = await self.cluster.get("apps/v1", "deployments", self.namespace, self.deployment)
        if deployment is None:
            raise LookupError(f"Deployment {self.namespace}/{self.deployment} does not exist")
        template = deployment["spec"]["template"]
        labels = dict(template["metadata"].get("labels", {}))
        suffix = secrets.token_hex(4)
        for index in range(int(deployment["spec"].get("replicas", 1))):
            pod = LocalPod(self.cluster, self.namespace, f"{self.deployment}-{suffix}-{index}", self.workdir)
            self.pods.append(pod)
            await pod.start(template, labels, self.environ)
        await self.report_deployment()
        return self.pods

    async def report_deployment(self) -> None:
        """The deployment controller's part: replicas, updated and ready counts, observed generation."""
        deployment = await self.cluster.get("apps/v1", "deployments", self.namespace, self.deployment)
        if deployment is None:
            return
        ready = sum(1 for pod in self.pods if pod.ready.is_set() and not pod.exited.is_set())
        generation = int(deployment["metadata"]["generation"])
        if self._reported == (generation, len(self.pods), ready):
            return  # like the controller, write only what changed
        self._reported = (generation, len(self.pods), ready)
        await self.cluster.patch(
            "apps/v1",
            "deployments",
            self.namespace,
            self.deployment,
            {
                "status": {
                    "observedGeneration": generation,
                    "replicas": len(self.pods),
                    "updatedReplicas": len(self.pods),
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                }
            },
            subresource="status",
        )

    async def follow(self, until: asyncio.Event) -> None:
        """Keep the Deployment's status in step with the pods until `until` is set."""
        while not until.is_set():
            await self.report_deployment()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), timeout=1.0)

    async def stop(self) -> list[int | None]:
        codes = [await pod.stop() for pod in self.pods]
        with contextlib.suppress(Exception):
            await self.report_deployment()
        return codes

"""A kubelet (and deployment controller) for one Deployment, on this machine, over the API.

It reads the Deployment the operator created, starts the pod template's container args as a
local process (the real `npu-runtime serve`), and keeps a Pod object and the Deployment's status
up to date through the API, as the kubelet and the deployment controller would (a ReplicaSet
owned by the Deployment, pods owned by the ReplicaSet), the pod's IP,
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


def mounts(container: dict[str, Any], volumes: dict[str, Path]) -> list[tuple[str, Path]]:
    """(mountPath, directory on this machine) of a container, longest mount path first."""
    found = [(m["mountPath"], volumes[m["name"]]) for m in container.get("volumeMounts", []) if m["name"] in volumes]
    return sorted(found, key=lambda item: -len(item[0]))


def map_paths(args: list[str], mounted: list[tuple[str, Path]]) -> list[str]:
    """The args with every path under a mount rewritten to where that volume lies on this machine."""
    result = []
    for arg in args:
        for mount_path, local in mounted:
            if arg == mount_path or arg.startswith(mount_path.rstrip("/") + "/"):
                arg = str(local) + arg[len(mount_path.rstrip("/")) :]
                break
        result.append(arg)
    return result


async def replica_set_owner(cluster: LocalCluster, namespace: str, deployment: str) -> dict[str, Any]:
    """The deployment controller's part: a ReplicaSet the Deployment controls (made when missing).

    Returns the controller owner reference that pods of this ReplicaSet carry.
    """
    found = await cluster.get("apps/v1", "deployments", namespace, deployment)
    if found is None:
        raise LookupError(f"Deployment {namespace}/{deployment} does not exist")
    template = found["spec"]["template"]
    name = f"{deployment}-{str(found['metadata']['uid'])[:8]}"
    replica_set = await cluster.get("apps/v1", "replicasets", namespace, name)
    if replica_set is None:
        replica_set = await cluster.create(
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(template["metadata"].get("labels", {})),
                    "ownerReferences": [_controller_reference(found)],
                },
                "spec": {"replicas": found["spec"].get("replicas", 1), "template": template},
            },
            "replicasets",
        )
    return _controller_reference(replica_set)


def _controller_reference(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


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
        self.init_termination_log = workdir / f"{name}.init-termination-log"
        self.init_statuses: list[dict[str, Any]] = []
        self._started = asyncio.Event()
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.exited = asyncio.Event()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    async def start(
        self, template: dict[str, Any], labels: dict[str, str], environ: dict[str, str], owner: dict[str, Any]
    ) -> None:
        spec = template["spec"]
        container = next(c for c in spec["containers"] if c["name"] == CONTAINER_NAME)
        self.ports = {"http": free_port(), "metrics": free_port()}
        for port in container.get("ports", []):
            port["containerPort"] = self.ports.get(port["name"], port["containerPort"])
        volumes = self.volume_paths(spec)
        # The serve contract's own parser and writer: the pod's args with this machine's ports and paths.
        args = map_paths(list(container["args"]), mounts(container, volumes))
        options = dataclasses.replace(
            parse_serve_args(args[2:]),
            port=self.ports["http"],
            metrics_port=self.ports["metrics"],
            termination_log=str(self.termination_log),
        )
        args = [*args[:2], *serve_argv(options)]
        env = {**os.environ, **environ}
        env.update({var["name"]: var["value"] for var in container.get("env", []) if "value" in var})
        await self.cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": labels,
                    "ownerReferences": [owner],
                },
                "spec": spec,
            },
            "pods",
        )
        await self._set_status(phase="Pending", ready=False, state={"waiting": {"reason": "ContainerCreating"}})
        inits = [self._init_args(c, volumes) for c in spec.get("initContainers", [])]
        self._watch = asyncio.create_task(self._run(inits, args, env), name=f"kubelet {self.name}")
        if not inits:  # as before: the server's process exists when start() returns
            await self._started.wait()
            if self._watch.done() and (error := self._watch.exception()) is not None:
                raise error

    def volume_paths(self, spec: dict[str, Any]) -> dict[str, Path]:
        """Each pod volume's directory on this machine: hostPath as it is, a claim under the kubelet's
        volumes/ (shared by every pod that mounts it), an emptyDir per pod."""
        paths: dict[str, Path] = {}
        for volume in spec.get("volumes", []):
            if "hostPath" in volume:
                paths[volume["name"]] = Path(volume["hostPath"]["path"])
                continue
            if "persistentVolumeClaim" in volume:
                path = self.workdir.parent / "volumes" / volume["persistentVolumeClaim"]["claimName"]
            else:
                path = self.workdir / self.name / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            paths[volume["name"]] = path
        return paths

    def _init_args(self, container: dict[str, Any], volumes: dict[str, Path]) -> tuple[str, list[str], dict[str, str]]:
        args = map_paths(list(container["args"]), mounts(container, volumes))
        if "--status-port" in args:  # the pod's metrics port, where the operator reads /status
            args[args.index("--status-port") + 1] = str(self.ports["metrics"])
        if args[:2] == ["npu-runtime", "fetch"]:
            args[2:2] = ["--termination-message-path", str(self.init_termination_log)]
        env = {var["name"]: var["value"] for var in container.get("env", []) if "value" in var}
        return container["name"], args, env

    async def _exec(self, args: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
        executable = shutil.which(args[0], path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        if executable is None:
            raise FileNotFoundError(f"{args[0]} is not installed next to {sys.executable}")
        with self.log_path.open("ab") as log:
            return await asyncio.create_subprocess_exec(
                executable,
                *args[1:],
                env=env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    async def _run(
        self, inits: list[tuple[str, list[str], dict[str, str]]], args: list[str], env: dict[str, str]
    ) -> None:
        """The init containers one after another, as the kubelet runs them; then the server."""
        for name, init_args, init_env in inits:
            self.process = await self._exec(init_args, {**env, **init_env})
            started = utc_now()
            self.init_statuses = [
                {"name": name, "ready": False, "restartCount": 0, "state": {"running": {"startedAt": started}}}
            ]
            await self._set_status(phase="Pending", ready=False, state={"waiting": {"reason": "PodInitializing"}})
            code = await self.process.wait()
            path = self.init_termination_log
            message = path.read_text(encoding="utf-8") if path.exists() else ""
            terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": message}
            self.init_statuses = [
                {"name": name, "ready": code == 0, "restartCount": 0, "state": {"terminated": terminated}}
            ]
            if code != 0 or self._stopping:
                # A real kubelet restarts it with back-off; here the pod stays failed, and says why.
                with contextlib.suppress(Exception):
                    await self._set_status(
                        phase="Pending", ready=False, state={"waiting": {"reason": "PodInitializing"}}
                    )
                self.exited.set()
                self._started.set()
                return
        try:
            self.process = await self._exec(args, env)
        finally:
            self._started.set()
        self.started_at = utc_now()
        await self._set_status(phase="Running", ready=False, state={"running": {"startedAt": self.started_at}})
        await self._probe_until_exit()

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
                    **({"initContainerStatuses": self.init_statuses} if self.init_statuses else {}),
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
        self._stopping = True
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
        owner = await replica_set_owner(self.cluster, self.namespace, self.deployment)
        for index in range(int(deployment["spec"].get("replicas", 1))):
            pod = LocalPod(self.cluster, self.namespace, f"{self.deployment}-{suffix}-{index}", self.workdir)
            self.pods.append(pod)
            await pod.start(template, labels, self.environ, owner)
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
        await self.cluster.report_deployment(self.namespace, self.deployment, generation, len(self.pods), ready)

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

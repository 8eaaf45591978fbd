"""One Pod object run as local processes: its address, ports, env, command line and name files, its
init containers then its main container, the readiness probe until it exits, and its stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import aiohttp
from npu_operator.kube.names import CONTAINER_NAME
from npu_operator.kube.objects import utc_now

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers import workloads
from npu_sandbox.controllers.workloads import JSON
from npu_sandbox.node import dns
from npu_sandbox.node.container import NotYet, container_args, container_env, expand, map_paths, mounts
from npu_sandbox.node.isolation import PodNamespace
from npu_sandbox.node.network import LOCAL_IP, PodNetwork, free_port
from npu_sandbox.node.process import exec_in_pod, terminate
from npu_sandbox.node.status import StatusReporter, probe, readiness_url, terminated
from npu_sandbox.node.volumes import project_config_maps, service_account_env, volume_paths

# How often a running pod's configMap volumes are brought up to date (a kubelet's sync period is 60 s
# plus its cache's TTL; the sandbox's demos and tests change a ConfigMap and wait for the pods).
CONFIG_MAP_SYNC_SECONDS: Final = 3.0


class Runner(Protocol):
    """Decides how one container runs on this machine."""

    def accepts(self, container: Mapping[str, Any]) -> bool: ...

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        """The command line, from the container's command and args ($(VAR) expanded, paths mapped).
        May raise NotYet."""
        ...


@runtime_checkable
class EnvironmentRunner(Runner, Protocol):
    """A runner that also rewrites the container's environment (e.g. ports it takes from env, mapped)."""

    def environment(self, pod: LocalPod, container: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]: ...


class Node(Protocol):
    """What a pod needs of the kubelet that runs it (`npu_sandbox.node.kubelet.Kubelet`)."""

    @property
    def cluster(self) -> ApiClient: ...

    @property
    def network(self) -> PodNetwork: ...

    @property
    def workdir(self) -> Path: ...

    @property
    def environ(self) -> Mapping[str, str]: ...

    @property
    def runners(self) -> Sequence[Runner]: ...


class LocalPod:
    """One Pod object, running as local processes: its init containers, then its main container."""

    def __init__(self, kubelet: Node, pod: JSON) -> None:
        meta = pod["metadata"]
        self.kubelet = kubelet
        self.cluster = kubelet.cluster
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.labels: dict[str, str] = dict(meta.get("labels", {}))
        self.controller_uid = workloads.controller_uid(pod)
        self.spec: JSON = pod["spec"]
        self.object = pod
        self.workdir = kubelet.workdir
        self.container: JSON = next(
            (c for c in self.spec["containers"] if c["name"] == CONTAINER_NAME), self.spec["containers"][0]
        )
        self.ip = kubelet.network.address(self.uid)  # this pod's own, on the loopback (see network)
        # The main container's ports by name, where its processes listen on the pod's address: as
        # declared, unless a runner mapped one (`map_port`).
        self.ports: dict[str, int] = {
            p["name"]: int(p["containerPort"]) for p in self.container.get("ports", []) if p.get("name")
        }
        self.mapped: set[str] = set()
        self.started_at = ""
        self.reporter = StatusReporter(self.cluster, self.namespace, self.name, self.ip, self.container["name"])
        self.process: asyncio.subprocess.Process | None = None
        stem = f"{self.name}-{self.uid[:8]}"
        self.directory = self.workdir / stem  # the pod's own files: its emptyDirs, configMaps, token
        # What its processes see as /etc/hosts, /etc/resolv.conf, /etc/nsswitch.conf, and its hostname.
        self.names = PodNamespace(self.directory / "etc", dns.pod_hostname(pod))
        self._hosts = ""  # the hosts file's text as last written
        self.volumes: dict[str, Path] = {}  # volume_paths(), once start() has made them
        self.log_path = self.workdir / f"{stem}.log"
        self.termination_log = self.workdir / f"{stem}.termination-log"
        self.init_termination_log = self.workdir / f"{stem}.init-termination-log"
        self._started = asyncio.Event()
        self._synced_at = time.monotonic()
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.exited = asyncio.Event()

    @property
    def metrics_url(self) -> str:
        return f"http://{self.ip}:{self.ports['metrics']}"

    @property
    def api_url(self) -> str:
        return f"http://{self.ip}:{self.ports['http']}"

    def map_port(self, name: str) -> int:
        """Move the container port `name` to a port free on every address of this machine, for a process
        that can only listen on all addresses (0.0.0.0): on the declared port it would take that port
        from every other pod. The Pod object's containerPorts say where it went."""
        if name not in self.mapped:
            self.ports[name] = free_port("0.0.0.0")
            self.mapped.add(name)
        return self.ports[name]

    def environment(self, container: Mapping[str, Any]) -> dict[str, str]:
        """The container's env as written: values (with `$(VAR)` expansion) and the downward API's pod fields."""
        fields = {
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": LOCAL_IP,
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
        }
        return container_env(container, fields)

    def runner(self, container: Mapping[str, Any]) -> Runner:
        runner = next((r for r in self.kubelet.runners if r.accepts(container)), None)
        if runner is None:
            raise NotYet(f"no runner on this machine accepts container {container['name']}")
        return runner

    def command(self, container: Mapping[str, Any], env: Mapping[str, str], volumes: Mapping[str, Path]) -> list[str]:
        args = [expand(arg, env) for arg in container_args(container)]
        args = map_paths(args, mounts(container, volumes))
        return self.runner(container).command(self, container, args)

    def volume_paths(self) -> dict[str, Path]:
        """Each pod volume's directory on this machine (see `npu_sandbox.node.volumes.volume_paths`)."""
        return volume_paths(self.spec, self.workdir, self.directory)

    async def start(self) -> None:
        """Run the pod (its address and any mapped port said in the Pod object first); NotYet leaves nothing behind."""
        await project_config_maps(self.cluster, self.namespace, self.spec, self.directory)
        self.volumes = volumes = self.volume_paths()
        env = {**self.kubelet.environ, **self.environment(self.container)}
        if isinstance(runner := self.runner(self.container), EnvironmentRunner):
            env = runner.environment(self, self.container, env)
        env |= await service_account_env(self.cluster, self.namespace, self.spec, self.directory)
        args = self.command(self.container, env, volumes)
        inits = []
        for init in self.spec.get("initContainers", []):
            init_env = {**self.kubelet.environ, **self.environment(init)}
            inits.append((init["name"], self.command(init, init_env, volumes), init_env))
        if self.mapped:
            containers = [dict(c) for c in self.spec["containers"]]
            for container in containers:
                if container["name"] == self.container["name"]:
                    container["ports"] = [
                        {**p, "containerPort": self.ports.get(p.get("name", ""), p["containerPort"])}
                        for p in container.get("ports", [])
                    ]
            await self.cluster.patch("v1", "pods", self.namespace, self.name, {"spec": {"containers": containers}})
        await self.reporter.report(phase="Pending", ready=False, state={"waiting": {"reason": "ContainerCreating"}})
        self.write_names(self.kubelet.network.dns())
        local_env = {**os.environ, **env}
        self._watch = asyncio.create_task(self._run(inits, args, local_env), name=f"kubelet {self.name}")
        if not inits:  # the server's process exists when start() returns
            await self._started.wait()
            if self._watch.done() and (error := self._watch.exception()) is not None:
                raise error

    def write_names(self, cluster_dns: dns.ClusterDns) -> bool:
        """The pod's name files as the cluster DNS answers now; the hosts file rewritten in place (the
        bind mount shows the same file) when its text changed. True when it did."""
        directory = self.names.directory
        obj = {**self.object, "status": {**self.object.get("status", {}), "podIP": self.ip}}
        hosts = cluster_dns.hosts_file(obj)
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            resolv = dns.resolv_conf(self.namespace, self.kubelet.network.nameserver)
            (directory / "resolv.conf").write_text(resolv, encoding="utf-8")
            host_nsswitch = Path("/etc/nsswitch.conf")
            node = host_nsswitch.read_text(encoding="utf-8") if host_nsswitch.exists() else ""
            (directory / "nsswitch.conf").write_text(dns.nsswitch_conf(node), encoding="utf-8")
        if hosts == self._hosts:
            return False
        with (directory / "hosts").open("w", encoding="utf-8") as file:  # truncate and write: the same inode
            file.write(hosts)
        self._hosts = hosts
        return True

    async def _run(
        self, inits: list[tuple[str, list[str], dict[str, str]]], args: list[str], env: dict[str, str]
    ) -> None:
        """The init containers one after another, as the kubelet runs them; then the server."""
        for name, init_args, init_env in inits:
            self.process = await exec_in_pod(init_args, {**env, **init_env}, self.names, self.log_path)
            started = utc_now()
            self.reporter.init_statuses = [
                {"name": name, "ready": False, "restartCount": 0, "state": {"running": {"startedAt": started}}}
            ]
            await self.reporter.report(phase="Pending", ready=False, state={"waiting": {"reason": "PodInitializing"}})
            code = await self.process.wait()
            self.reporter.init_statuses = [
                {
                    "name": name,
                    "ready": code == 0,
                    "restartCount": 0,
                    "state": {"terminated": terminated(code, self.init_termination_log)},
                }
            ]
            if code != 0 or self._stopping:
                # A real kubelet restarts it with back-off; here the pod stays failed, and says why.
                with contextlib.suppress(Exception):
                    await self.reporter.report(
                        phase="Pending", ready=False, state={"waiting": {"reason": "PodInitializing"}}
                    )
                self.exited.set()
                self._started.set()
                return
        try:
            self.process = await exec_in_pod(args, env, self.names, self.log_path)
        finally:
            self._started.set()
        self.started_at = utc_now()
        await self.reporter.report(phase="Running", ready=False, state={"running": {"startedAt": self.started_at}})
        await self._probe_until_exit()

    async def resync(self) -> None:
        """The running pod's configMap volumes brought up to date, every CONFIG_MAP_SYNC_SECONDS (a
        kubelet's sync period, shortened); a failed read keeps the files as they are until the next."""
        now = time.monotonic()
        if now - self._synced_at < CONFIG_MAP_SYNC_SECONDS:
            return
        self._synced_at = now
        with contextlib.suppress(ApiRejected, NotYet, OSError, aiohttp.ClientError):
            await project_config_maps(self.cluster, self.namespace, self.spec, self.directory)

    async def fail_to_start(self, message: str) -> None:
        """The container could not be started here: the pod says so and stays down (no retry)."""
        self.exited.set()
        with contextlib.suppress(ApiRejected):
            await self.reporter.report(
                phase="Pending", ready=False, state={"waiting": {"reason": "RunContainerError", "message": message}}
            )

    async def _probe_until_exit(self) -> None:
        """The readiness probe, until the process exits; then the container's last state."""
        assert self.process is not None
        url = readiness_url(self.container, self.ports, self.ip)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            ready = False
            while self.process.returncode is None:
                now_ready = await probe(session, url)
                if now_ready != ready and not self._stopping:
                    ready = now_ready
                    with contextlib.suppress(ApiRejected):  # deleted meanwhile
                        await self.reporter.report(
                            phase="Running", ready=ready, state={"running": {"startedAt": self.started_at}}
                        )
                    if ready:
                        self.ready.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.process.wait(), timeout=1.0)
                await self.resync()
        last_state = {"terminated": terminated(self.process.returncode, self.termination_log)}
        if not self._stopping:
            with contextlib.suppress(Exception):  # the pod may be gone already
                await self.reporter.report(
                    phase="Running",
                    ready=False,
                    restarts=1,
                    state={
                        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}
                    },
                    last_state=last_state,
                )
        self.exited.set()

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM, the grace period (the pod's), then SIGKILL for the whole process group."""
        self._stopping = True
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30)) if grace is None else grace
        process = self.process
        if process is not None:
            await terminate(process, grace)
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._watch, timeout=10)
        return process.returncode if process is not None else None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

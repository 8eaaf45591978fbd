"""A kubelet for this machine: it runs the Pod objects of a namespace as local processes.

Each round (`Kubelet.sync`) reads the namespace over HTTP and makes the local processes match the
Pod objects: a pod without a process is started (its init containers one after another, then its
container), a process whose pod is gone is stopped (SIGTERM, the pod's grace period, SIGKILL). The
Pod objects come from the workload controllers (`npu_sandbox.controllers`), whose loop is the
`ControllerManager`'s, not this one; `LocalKubelet` is this kubelet with its namespace's manager
started and stopped beside it, the sandbox's node. So scale out and in, rollouts, group restarts and
deletions all happen through the API, as in a cluster; anything that writes the API (the operator,
kubectl, a test, an autoscaler through the scale subresource) drives it.

Each pod reports back as a kubelet does: its IP, phase, Ready condition (from its readiness
probe: an HTTP GET on the pod's address), init container statuses, and on exit the container's
termination message, with restartCount 1 and CrashLoopBackOff (a real kubelet restarts the
container with back-off; here it stays down and says why, which is also what LeaderWorkerSet's
RecreateGroupOnPodRestart reacts to).

How a container runs here is pluggable: the first of the kubelet's `runners` that accepts the
container turns it into a command line (`ServeRunner` for `npu-runtime serve`, `FetchRunner` for
`npu-runtime fetch`, `RouteRunner` for `npu-runtime route`, `ProcessRunner` for anything else;
tests add their own). Before a runner sees them, the args get Kubernetes' `$(VAR)` expansion from
the container's env, volume paths are rewritten to where the volumes lie on this machine
(hostPath as is, a claim under volumes/, an emptyDir per pod, a configMap's keys as files per pod,
projected when the pod starts).

The network, as a cluster's (`npu_sandbox.node.network`, `npu_sandbox.node.dns`): each pod has its
own address, 127.N.x.y on this machine's loopback (status.podIP says so), and its processes bind it
(the runners give `npu-runtime serve`, `route` and `fetch` the pod's address as their host) on the
ports its containers declare, so two pods listen on 8000 side by side. Names resolve only as the
cluster DNS would answer them: each pod's processes run in a mount namespace of their own
(`npu_sandbox.node.isolation`) where /etc/hosts is the pod's, holding its own name and the
cluster's records (Services, and a headless Service's pods by hostname.subdomain), rewritten in
place each round that they change; any other name fails to resolve. Nothing rewrites a name in
the args or env: a pod's `$(LWS_LEADER_ADDRESS)` resolves here exactly when it would on a cluster.
What differs: one network namespace for all (a pod can reach any other's address and this
machine's 127.0.0.1, where the API runs; there is no NetworkPolicy and no kube-proxy: a ClusterIP
Service's name resolves to its ready pods' addresses, see `dns`), and a process that can only
listen on all addresses (the operator's `npu-operator run`) gets its declared ports mapped to free
ones (`LocalPod.map_port`; the Pod object's containerPorts then say where they are).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import aiohttp
from npu_operator.kube.names import CONTAINER_NAME
from npu_operator.kube.objects import utc_now
from npu_runtime.contract import parse_serve_args, serve_argv
from npu_runtime.routing.router import parse_route_args, route_argv

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.controllers import disaggregated, lws, workloads
from npu_sandbox.controllers.manager import KINDS, ControllerManager
from npu_sandbox.controllers.workloads import JSON, Snapshot
from npu_sandbox.node import dns, isolation
from npu_sandbox.node.isolation import PodNamespace
from npu_sandbox.node.network import LOCAL_IP, PodNetwork
from npu_sandbox.node.network import free_port as free_port  # where tests and scripts import it from

PR_SET_PDEATHSIG = 1
logger = logging.getLogger(__name__)

# This machine's pods share its cores, as containers do on a node without a CPU manager policy.
# vLLM's CPU build binds each engine's worker to the cores it does not keep for its engine core
# process (vllm/utils/ompmultiprocessing.py `_get_autobind_cpu_ids`, VLLM_CPU_OMP_THREADS_BIND=auto):
# core 0 of two, for every engine at once. A third engine then started in 4 minutes beside two
# serving ones (66 s unbound); the pod's own env may still ask for a binding.
SHARED_CORES_ENV: Final = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the sandbox dies, however it dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[tuple[str, Path]]:
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


_VARIABLE: Final = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command, args and env values: `$$` is a literal `$`, an
    unknown name stays as written (k8s.io/kubernetes third_party/forked/golang/expansion)."""

    def one(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _VARIABLE.sub(one, text)


# --- how a container runs here --------------------------------------------------------------------


class NotYet(Exception):
    """The container cannot start in this round (e.g. its leader is not running yet); try the next."""


class Runner(Protocol):
    """Decides how one container runs on this machine."""

    def accepts(self, container: Mapping[str, Any]) -> bool: ...

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        """The command line, from the container's command and args ($(VAR) expanded, paths mapped).
        May raise NotYet."""
        ...


def _args(container: Mapping[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


@runtime_checkable
class EnvironmentRunner(Runner, Protocol):
    """A runner that also rewrites the container's environment (e.g. ports it takes from env, mapped)."""

    def environment(self, pod: LocalPod, container: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]: ...


class ServeRunner:
    """`npu-runtime serve`: its own flags rewritten through the serve contract's parser and writer:
    the pod's address as its host (where a pod's own network would have 0.0.0.0), a termination log
    here. Ports and the leader's address stay as written: the pod's DNS resolves the address."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return _args(container)[:2] == ["npu-runtime", "serve"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        options = parse_serve_args(args[2:])
        changed = dataclasses.replace(options, host=pod.ip, termination_log=str(pod.termination_log))
        return [*args[:2], *serve_argv(changed)]


class FetchRunner:
    """`npu-runtime fetch` (the init container): its status port on the pod's address, a termination log here."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return _args(container)[:2] == ["npu-runtime", "fetch"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        host = ["--status-host", pod.ip] if "--status-port" in args else []
        return [*args[:2], "--termination-message-path", str(pod.init_termination_log), *host, *args[2:]]


class RouteRunner:
    """`npu-runtime route` (a disaggregated resource's router): the pod's address as its host. Its role
    Service URLs (`http://<service>.<namespace>.svc:<port>`) stay: the pod's DNS answers each
    Service's ready pods, as kube-proxy would reach them, and follows them as they change."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return _args(container)[:2] == ["npu-runtime", "route"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        options = parse_route_args(args[2:])
        return [*args[:2], *route_argv(dataclasses.replace(options, host=pod.ip))]


class ProcessRunner:
    """Anything else: the command and args as they are (an executable found next to this Python or on PATH)."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return bool(_args(container))

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        return args


DEFAULT_RUNNERS: Final[tuple[Runner, ...]] = (ServeRunner(), FetchRunner(), RouteRunner(), ProcessRunner())


# --- one pod ------------------------------------------------------------------------------------


class LocalPod:
    """One Pod object, running as local processes: its init containers, then its main container."""

    def __init__(self, kubelet: Kubelet, pod: JSON) -> None:
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
        # status.startTime (when the kubelet took the pod on) and when Ready last flipped, as a kubelet
        # reports them: the operator reads a replica's startup time from the two.
        self.start_time = ""
        self._ready_condition: tuple[str, str] = ("", "")  # (status, lastTransitionTime)
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
        self.init_statuses: list[dict[str, Any]] = []
        self._started = asyncio.Event()
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
        env: dict[str, str] = {}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(str(var["value"]), env)
            elif (path := var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")) in fields:
                env[var["name"]] = fields[path]
        return env

    def runner(self, container: Mapping[str, Any]) -> Runner:
        runner = next((r for r in self.kubelet.runners if r.accepts(container)), None)
        if runner is None:
            raise NotYet(f"no runner on this machine accepts container {container['name']}")
        return runner

    def command(self, container: Mapping[str, Any], env: Mapping[str, str], volumes: Mapping[str, Path]) -> list[str]:
        args = [expand(arg, env) for arg in _args(container)]
        args = map_paths(args, mounts(container, volumes))
        return self.runner(container).command(self, container, args)

    async def service_account(self) -> dict[str, str]:
        """The pod's ServiceAccount token, as a kubelet projects it (a TokenRequest), given to the process
        as a kubeconfig (KUBECONFIG): a process here cannot read /var/run/secrets/kubernetes.io/serviceaccount.
        None without automountServiceAccountToken, or for the `default` account the sandbox does not create."""
        if self.spec.get("automountServiceAccountToken") is False:
            return {}
        account = self.spec.get("serviceAccountName") or "default"
        try:
            token = await self.cluster.create_token(self.namespace, account)
        except ApiRejected as exc:
            if exc.status == 404 and account == "default":
                return {}
            raise NotYet(f"no token for ServiceAccount {self.namespace}/{account}: {exc}") from exc
        directory = self.directory / "serviceaccount"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(token, encoding="utf-8")
        (directory / "namespace").write_text(self.namespace, encoding="utf-8")
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(json.dumps(self.cluster.kubeconfig_document(token)), encoding="utf-8")
        return {"KUBECONFIG": str(kubeconfig)}

    async def start(self) -> None:
        """Run the pod (its address and any mapped port said in the Pod object first); NotYet leaves nothing behind."""
        await self.project_config_maps()
        self.volumes = volumes = self.volume_paths()
        env = {**self.kubelet.environ, **self.environment(self.container)}
        if isinstance(runner := self.runner(self.container), EnvironmentRunner):
            env = runner.environment(self, self.container, env)
        env |= await self.service_account()
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
        await self._set_status(phase="Pending", ready=False, state={"waiting": {"reason": "ContainerCreating"}})
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

    async def project_config_maps(self) -> None:
        """Each configMap volume's keys as files in the pod's directory for it, as a kubelet projects
        them before the containers start; an optional ConfigMap that does not exist is an empty
        directory, a required one waits (NotYet). Projected once: a container here never restarts."""
        for volume in self.spec.get("volumes", []):
            if "configMap" not in volume:
                continue
            source = volume["configMap"]
            found = await self.cluster.get("v1", "configmaps", self.namespace, source["name"])
            if found is None and not source.get("optional"):
                raise NotYet(f"ConfigMap {self.namespace}/{source['name']} does not exist")
            directory = self.directory / volume["name"]
            directory.mkdir(parents=True, exist_ok=True)
            for key, value in ((found or {}).get("data") or {}).items():
                (directory / key).write_text(value, encoding="utf-8")

    def volume_paths(self) -> dict[str, Path]:
        """Each pod volume's directory on this machine: hostPath as it is, a claim under the kubelet's
        volumes/ (shared by every pod that mounts it), an emptyDir (or a configMap's files) per pod."""
        paths: dict[str, Path] = {}
        for volume in self.spec.get("volumes", []):
            if "hostPath" in volume:
                paths[volume["name"]] = Path(volume["hostPath"]["path"])
                continue
            if "persistentVolumeClaim" in volume:
                path = self.workdir.parent / "volumes" / volume["persistentVolumeClaim"]["claimName"]
            else:
                path = self.directory / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            paths[volume["name"]] = path
        return paths

    async def _exec(self, args: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
        executable = shutil.which(args[0], path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        if executable is None:
            raise FileNotFoundError(f"{args[0]} is not installed next to {sys.executable}")
        names = self.names
        names.prepare()

        def in_the_child() -> None:  # between fork and exec: the pod's namespaces, then die with the sandbox
            names.enter()
            die_with_parent()

        with self.log_path.open("ab") as log:
            return await asyncio.create_subprocess_exec(
                executable,
                *args[1:],
                env=env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=in_the_child,
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
        now = utc_now()
        self.start_time = self.start_time or now
        if self._ready_condition[0] != flag:
            self._ready_condition = (flag, now)
        transition = self._ready_condition[1]
        container_status = {
            "name": self.container["name"],
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
                    "podIP": self.ip,
                    "podIPs": [{"ip": self.ip}],
                    "hostIP": LOCAL_IP,
                    "startTime": self.start_time,
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.start_time},
                        {"type": "ContainersReady", "status": flag, "lastTransitionTime": transition},
                        {"type": "Ready", "status": flag, "lastTransitionTime": transition},
                    ],
                    "containerStatuses": [container_status],
                    **({"initContainerStatuses": self.init_statuses} if self.init_statuses else {}),
                }
            },
            subresource="status",
        )

    async def fail_to_start(self, message: str) -> None:
        """The container could not be started here: the pod says so and stays down (no retry)."""
        self.exited.set()
        with contextlib.suppress(ApiRejected):
            await self._set_status(
                phase="Pending", ready=False, state={"waiting": {"reason": "RunContainerError", "message": message}}
            )

    def readiness_url(self) -> str | None:
        """The readiness probe's URL on this machine (httpGet, its port by name or number); None: no probe."""
        probe = self.container.get("readinessProbe", {}).get("httpGet")
        if probe is None:
            return None
        port = probe.get("port")
        local = self.ports.get(port) if isinstance(port, str) else port
        return f"http://{self.ip}:{local}{probe.get('path', '/')}"

    async def _probe_until_exit(self) -> None:
        """The readiness probe, until the process exits; then the container's last state."""
        assert self.process is not None
        url = self.readiness_url()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            ready = False
            while self.process.returncode is None:
                if url is None:
                    now_ready = True
                else:
                    try:
                        async with session.get(url) as response:
                            now_ready = response.status == 200
                    except (aiohttp.ClientError, TimeoutError, OSError):
                        now_ready = False
                if now_ready != ready and not self._stopping:
                    ready = now_ready
                    with contextlib.suppress(ApiRejected):  # deleted meanwhile
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
        if not self._stopping:
            with contextlib.suppress(Exception):  # the pod may be gone already
                await self._set_status(
                    phase="Running",
                    ready=False,
                    restarts=1,
                    state={
                        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}
                    },
                    last_state={"terminated": terminated},
                )
        self.exited.set()

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM, the grace period (the pod's), then SIGKILL for the whole process group."""
        self._stopping = True
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30)) if grace is None else grace
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
        return process.returncode if process is not None else None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


# --- the node ----------------------------------------------------------------------------------


class Kubelet:
    """Runs the pods of a namespace on this machine: one loop that matches processes to Pod objects.

    `workload` (optional) names the Deployment, LeaderWorkerSet or DisaggregatedSet whose pods
    `start_pods` waits for; the loop itself runs every pod in the namespace. `network`: the pods'
    addresses and DNS, the cluster's by default (`PodNetwork.of`), which every kubelet of the same
    cluster shares.
    """

    def __init__(
        self,
        cluster: ApiClient,
        namespace: str,
        workload: str | None = None,
        *,
        workdir: Path,
        environ: dict[str, str] | None = None,
        runners: Sequence[Runner] = DEFAULT_RUNNERS,
        interval: float = 0.5,
        network: PodNetwork | None = None,
    ) -> None:
        self.cluster = cluster
        self.network = network if network is not None else PodNetwork.of(cluster)
        self.namespace = namespace
        self.workload = workload
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.environ = {**SHARED_CORES_ENV, **(environ or {})}
        self.runners = list(runners)
        self.interval = interval
        self.running: dict[str, LocalPod] = {}  # by pod uid
        self.stopped: list[LocalPod] = []
        self.snapshot = Snapshot(namespace, {})
        self._stops: set[asyncio.Task[int | None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    @property
    def pods(self) -> list[LocalPod]:
        """The pods running here (or exited and not yet deleted), oldest first."""
        return list(self.running.values())

    async def sync(self) -> None:
        """One round: read the namespace (the pods, and the Services and workloads they belong to), then
        match the processes to the Pod objects, then bring each pod's hosts file up to date."""
        self.snapshot = await workloads.read_snapshot(self.cluster, self.namespace, KINDS)
        self.network.publish(self.namespace, self.snapshot.of("services"), self.snapshot.of("pods"))
        await self._sync_pods(self.snapshot.of("pods"))
        cluster_dns = self.network.dns()
        for pod in self.pods:
            pod.write_names(cluster_dns)
        self._synced.set()

    async def _sync_pods(self, pods: list[JSON]) -> None:
        live = {pod["metadata"]["uid"]: pod for pod in pods if not pod["metadata"].get("deletionTimestamp")}
        for uid in [uid for uid in self.running if uid not in live]:
            local = self.running.pop(uid)
            self.stopped.append(local)
            task = asyncio.create_task(local.stop(), name=f"kubelet stop {local.name}")
            self._stops.add(task)
            task.add_done_callback(self._stops.discard)
        # Leaders before workers, then oldest first: a worker starts once its leader runs.
        order = sorted(
            live.values(),
            key=lambda p: (
                p["metadata"].get("labels", {}).get(lws.WORKER_INDEX_LABEL, ""),
                p["metadata"].get("creationTimestamp", ""),
            ),
        )
        for pod in order:
            uid = pod["metadata"]["uid"]
            if uid in self.running or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            local = LocalPod(self, pod)
            try:
                await local.start()
            except NotYet as exc:
                logger.info("pod %s waits: %s", local.name, exc)
                continue
            except ApiRejected:
                continue  # deleted meanwhile
            except Exception as exc:
                logger.warning("pod %s cannot start: %s", local.name, exc)
                await local.fail_to_start(f"{type(exc).__name__}: {exc}")
            self.running[uid] = local

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
            except (aiohttp.ClientError, ApiRejected) as exc:  # the API went away or refused: the next round
                logger.warning("kubelet round failed: %s", exc)
            except Exception:  # a kubelet outlives its bugs: logged, then the next round
                logger.exception("kubelet round failed")
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        """Start the reconcile loop (once); return after its first round. IsolationUnavailable, naming
        what is missing, when this machine cannot give pods their own name files."""
        await asyncio.to_thread(isolation.check)  # once per process (cached), before any loop: no await below
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="kubelet")
        await self._synced.wait()

    async def start_pods(self, within: float = 60.0) -> list[LocalPod]:
        """Start the loop and wait until `workload` has as many pods running here as it asks for."""
        if self.workload is None:
            raise ValueError("start_pods needs the kubelet's workload")
        await self.start()
        workload = self.workload

        async def started() -> list[LocalPod] | None:
            deployment = self.snapshot.named("deployments", workload)
            group = self.snapshot.named(lws.PLURAL, workload)
            roles = self.snapshot.named(disaggregated.PLURAL, workload)
            if roles is not None:  # the roles' engines; the Deployment is its router, which waits for them
                specs = [lws.defaulted({"spec": role["spec"]})["spec"] for role in roles["spec"]["roles"]]
                wanted = sum(int(spec["replicas"]) * int(spec["leaderWorkerTemplate"]["size"]) for spec in specs)
                found = [p for p in self.pods if p.labels.get(disaggregated.SET_NAME_LABEL) == workload]
            elif deployment is not None:
                wanted = int(deployment["spec"].get("replicas", 1))
                found = [p for p in self.pods if self.owner_chain(p).get("deployments") == workload]
            elif group is not None:
                spec = lws.defaulted(group)["spec"]
                wanted = int(spec["replicas"]) * int(spec["leaderWorkerTemplate"]["size"])
                found = [p for p in self.pods if p.labels.get(lws.NAME_LABEL) == workload]
            else:
                return None
            return found if len(found) >= wanted else None

        pods: list[LocalPod] = await self.cluster.wait_for(
            started, within=within, interval=0.2, what=f"pods of {workload}"
        )
        return pods

    def owner_chain(self, pod: LocalPod) -> dict[str, str]:
        """Plural -> name of the workload objects above the pod, through controller references."""
        by_uid = {
            obj["metadata"]["uid"]: (plural, obj)
            for plural in ("replicasets", "deployments", "statefulsets")
            for obj in self.snapshot.of(plural)
        }
        chain: dict[str, str] = {}
        uid = pod.controller_uid
        while uid in by_uid:
            plural, obj = by_uid[uid]
            chain[plural] = obj["metadata"]["name"]
            uid = workloads.controller_uid(obj)
        return chain

    async def follow(self, until: asyncio.Event) -> None:
        """Keep the loop running until `until` is set."""
        await self.start()
        await until.wait()

    async def stop(self) -> list[int | None]:
        """Stop the loop, then every pod's processes (the Pod objects stay: the API may be gone)."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        pods = self.pods
        self.stopped.extend(pods)
        self.running.clear()
        codes = [await pod.stop() for pod in pods]
        if self._stops:
            await asyncio.gather(*self._stops, return_exceptions=True)
        return codes


class LocalKubelet(Kubelet):
    """The sandbox's node: a `Kubelet`, with its namespace's `ControllerManager` started and stopped beside it.

    In a cluster the controllers run in kube-controller-manager, apart from every node; here one
    object starts both loops (as k3s runs both in one process), so that whoever runs a kubelet gets
    the Deployments, StatefulSets and LeaderWorkerSets of its namespace turned into pods. Each loop
    reads the API on its own; the manager's rounds follow the kubelet's `interval` as set at `start`.
    """

    def __init__(
        self,
        cluster: ApiClient,
        namespace: str,
        workload: str | None = None,
        *,
        workdir: Path,
        environ: dict[str, str] | None = None,
        runners: Sequence[Runner] = DEFAULT_RUNNERS,
        interval: float = 0.5,
        network: PodNetwork | None = None,
    ) -> None:
        super().__init__(
            cluster,
            namespace,
            workload,
            workdir=workdir,
            environ=environ,
            runners=runners,
            interval=interval,
            network=network,
        )
        self.controllers = ControllerManager(cluster, namespace, interval=interval)

    async def start(self) -> None:
        """Start the controllers' loop, then the kubelet's (once each); return after the first round of both."""
        self.controllers.interval = self.interval
        await self.controllers.start()
        await super().start()

    async def stop(self) -> list[int | None]:
        """Stop the controllers' loop, then the kubelet's and every pod's processes."""
        await self.controllers.stop()
        return await super().stop()

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
probe: an HTTP GET on the mapped port), init container statuses, and on exit the container's
termination message, with restartCount 1 and CrashLoopBackOff (a real kubelet restarts the
container with back-off; here it stays down and says why, which is also what LeaderWorkerSet's
RecreateGroupOnPodRestart reacts to).

How a container runs here is pluggable: the first of the kubelet's `runners` that accepts the
container turns it into a command line (`ServeRunner` for `npu-runtime serve`, `FetchRunner` for
`npu-runtime fetch`, `ProcessRunner` for anything else; tests add their own). Before a runner
sees them, the args get Kubernetes' `$(VAR)` expansion from the container's env, volume paths are
rewritten to where the volumes lie on this machine (hostPath as is, a claim under volumes/, an
emptyDir per pod, a configMap's keys as files per pod, projected when the pod starts).

The only liberty: each pod has its own IP in a cluster; here every pod is 127.0.0.1, its
container ports are mapped to free local ports (and the Pod object's containerPorts say so,
where the operator reads them), and a pod's DNS name (`<hostname>.<subdomain>.<namespace>`, as
LeaderWorkerSet's LWS_LEADER_ADDRESS names the leader) resolves to 127.0.0.1. A multi-node
replica's worker is pointed at its leader's mapped API and data-parallel RPC ports.
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
import socket
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

PR_SET_PDEATHSIG = 1
LOCAL_IP: Final = "127.0.0.1"
RPC_PORT: Final = "data-parallel-rpc"  # the name of a multi-node leader's extra mapped port
logger = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOCAL_IP, 0))
        port: int = sock.getsockname()[1]
        return port


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


def resolve(value: str, namespace: str) -> str:
    """A pod's DNS name (`host.subdomain.namespace[.svc[.cluster.local]]`) is this machine here."""
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    pattern = rf"{label}\.{label}\.{re.escape(namespace)}(\.svc(\.cluster\.local)?)?"
    return LOCAL_IP if re.fullmatch(pattern, value) else value


# --- how a container runs here --------------------------------------------------------------------


class NotYet(Exception):
    """The container cannot start in this round (e.g. its leader is not running yet); try the next."""


class Runner(Protocol):
    """Decides how one container runs on this machine."""

    def accepts(self, container: Mapping[str, Any]) -> bool: ...

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        """The command line, from the container's command and args ($(VAR) expanded, paths mapped; pod
        DNS names not yet resolved, see `resolve`). May raise NotYet."""
        ...


def _args(container: Mapping[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


@runtime_checkable
class EnvironmentRunner(Runner, Protocol):
    """A runner that also rewrites the container's environment (e.g. ports it takes from env)."""

    def environment(self, pod: LocalPod, container: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]: ...


class ServeRunner:
    """`npu-runtime serve`: its own flags rewritten through the serve contract's parser and writer:
    the mapped ports, a termination log here; a multi-node worker gets its leader's mapped ports."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return _args(container)[:2] == ["npu-runtime", "serve"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        options = parse_serve_args(args[2:])
        changes: dict[str, Any] = {
            "port": pod.ports["http"],
            "metrics_port": pod.ports["metrics"],
            "termination_log": str(pod.termination_log),
        }
        if options.plan.nodes > 1 and options.data_parallel_address:
            leader = pod.kubelet.pod_at(options.data_parallel_address, pod.namespace) if options.node_rank else pod
            if leader is None or not leader.ports:
                raise NotYet(f"its leader {options.data_parallel_address} is not running yet")
            changes["data_parallel_address"] = LOCAL_IP
            changes["data_parallel_rpc_port"] = leader.port(RPC_PORT)
            if options.node_rank:  # a headless worker serves no API: its --port is where the leader's is
                changes["port"] = leader.ports["http"]
        return [*args[:2], *serve_argv(dataclasses.replace(options, **changes))]


class FetchRunner:
    """`npu-runtime fetch` (the init container): its status on the pod's metrics port, a termination log here."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return _args(container)[:2] == ["npu-runtime", "fetch"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        if "--status-port" in args:  # the pod's metrics port, where the operator reads /status
            args[args.index("--status-port") + 1] = str(pod.ports["metrics"])
        return [*args[:2], "--termination-message-path", str(pod.init_termination_log), *args[2:]]


class RouteRunner:
    """`npu-runtime route` (a disaggregated resource's router): its ports mapped, and each Service URL
    (`http://<service>.<namespace>.svc:<port>`) replaced by the mapped URLs of the running pods the
    Service selects, as kube-proxy would reach them; until each role has one, it waits. The URLs are
    fixed when the router starts: a role pod started later is not added (a cluster's Service is)."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return _args(container)[:2] == ["npu-runtime", "route"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        options = parse_route_args(args[2:])
        roles = {
            role: tuple(url for service in urls for url in self.endpoints(pod, service))
            for role, urls in (("prefill", options.prefill), ("decode", options.decode))
        }
        for role, urls in roles.items():
            if not urls:
                raise NotYet(f"no {role} pod of {getattr(options, role)} is running yet")
        changed = dataclasses.replace(
            options,
            prefill=roles["prefill"],
            decode=roles["decode"],
            port=pod.ports["http"],
            metrics_port=pod.ports["metrics"],
        )
        return [*args[:2], *route_argv(changed)]

    def endpoints(self, pod: LocalPod, url: str) -> list[str]:
        match = re.fullmatch(rf"http://([a-z0-9-]+)\.{re.escape(pod.namespace)}\.svc(?:\.cluster\.local)?:(\d+)", url)
        if match is None:
            return [url]
        service = pod.kubelet.snapshot.named("services", match[1])
        if service is None:
            return []
        port = next((p for p in service["spec"].get("ports", []) if str(p.get("port")) == match[2]), None)
        target = str((port or {}).get("targetPort", "http"))
        selector = service["spec"].get("selector") or {}
        return [
            f"http://{LOCAL_IP}:{found.ports[target]}"
            for found in pod.kubelet.pods
            if found.namespace == pod.namespace
            and found.ready.is_set()
            and target in found.ports
            and all(found.labels.get(key) == value for key, value in selector.items())
        ]


class ProcessRunner:
    """Anything else: the command and args as they are (an executable found next to this Python or on PATH)."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return bool(_args(container))

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        return [resolve(arg, pod.namespace) for arg in args]


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
        self.workdir = kubelet.workdir
        self.container: JSON = next(
            (c for c in self.spec["containers"] if c["name"] == CONTAINER_NAME), self.spec["containers"][0]
        )
        self.ports: dict[str, int] = {}
        self.started_at = ""
        # status.startTime (when the kubelet took the pod on) and when Ready last flipped, as a kubelet
        # reports them: the operator reads a replica's startup time from the two.
        self.start_time = ""
        self._ready_condition: tuple[str, str] = ("", "")  # (status, lastTransitionTime)
        self.process: asyncio.subprocess.Process | None = None
        stem = f"{self.name}-{self.uid[:8]}"
        self.directory = self.workdir / stem  # the pod's own files: its emptyDirs, configMaps, token
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
        return f"http://{LOCAL_IP}:{self.ports['metrics']}"

    @property
    def api_url(self) -> str:
        return f"http://{LOCAL_IP}:{self.ports['http']}"

    def port(self, name: str) -> int:
        """The local port mapped to `name` (allocated on first use)."""
        return self.ports.setdefault(name, free_port())

    def environment(self, container: Mapping[str, Any]) -> dict[str, str]:
        """The container's env as written: values (with `$(VAR)` expansion) and the downward API's
        pod fields; the process gets it with pod DNS names resolved (`resolve`)."""
        fields = {"status.podIP": LOCAL_IP, "metadata.name": self.name, "metadata.namespace": self.namespace}
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
        """Map the ports (and say so in the Pod object), then run the pod; NotYet leaves nothing behind."""
        for port in self.container.get("ports", []):
            if port.get("name"):
                self.port(port["name"])
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
            resolved = {key: resolve(value, self.namespace) for key, value in init_env.items()}
            inits.append((init["name"], self.command(init, init_env, volumes), resolved))
        containers = [dict(c) for c in self.spec["containers"]]
        for container in containers:
            if container["name"] == self.container["name"]:
                container["ports"] = [
                    {**p, "containerPort": self.ports.get(p.get("name", ""), p["containerPort"])}
                    for p in container.get("ports", [])
                ]
        await self.cluster.patch("v1", "pods", self.namespace, self.name, {"spec": {"containers": containers}})
        await self._set_status(phase="Pending", ready=False, state={"waiting": {"reason": "ContainerCreating"}})
        local_env = {**os.environ, **{key: resolve(value, self.namespace) for key, value in env.items()}}
        self._watch = asyncio.create_task(self._run(inits, args, local_env), name=f"kubelet {self.name}")
        if not inits:  # the server's process exists when start() returns
            await self._started.wait()
            if self._watch.done() and (error := self._watch.exception()) is not None:
                raise error

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
                    "podIP": LOCAL_IP,
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
        return f"http://{LOCAL_IP}:{local}{probe.get('path', '/')}"

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
    `start_pods` waits for; the loop itself runs every pod in the namespace.
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
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.workload = workload
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.environ = environ or {}
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

    def pod_at(self, address: str, namespace: str) -> LocalPod | None:
        """The running pod a DNS name (`hostname.subdomain.namespace...`) names; None when none runs."""
        host = address.split(".", 1)[0]
        found = [
            p for p in self.running.values() if p.namespace == namespace and p.spec.get("hostname", p.name) == host
        ]
        return found[-1] if found else None

    async def sync(self) -> None:
        """One round: read the namespace (the pods, and the Services and workloads they belong to), then
        match the processes to the Pod objects."""
        self.snapshot = await workloads.read_snapshot(self.cluster, self.namespace, KINDS)
        await self._sync_pods(self.snapshot.of("pods"))
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
        """Start the reconcile loop (once); return after its first round."""
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
    ) -> None:
        super().__init__(
            cluster, namespace, workload, workdir=workdir, environ=environ, runners=runners, interval=interval
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

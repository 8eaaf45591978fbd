"""How a container runs here: the runners that turn `npu-runtime serve`, `fetch`, `route` and any
other container into a command line for this machine (the `Runner` protocol is the pod's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from npu_runtime.contract import parse_serve_args, serve_argv
from npu_runtime.routing.options import parse_route_args, route_argv

from npu_sandbox.node.container import container_args
from npu_sandbox.node.pod import LocalPod, Runner


class ServeRunner:
    """`npu-runtime serve`: its own flags rewritten through the serve contract's parser and writer:
    the pod's address as its host (where a pod's own network would have 0.0.0.0), a termination log
    here. Ports and the leader's address stay as written: the pod's DNS resolves the address."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return container_args(container)[:2] == ["npu-runtime", "serve"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        options = parse_serve_args(args[2:])
        changed = dataclasses.replace(options, host=pod.ip, termination_log=str(pod.termination_log))
        return [*args[:2], *serve_argv(changed)]


class FetchRunner:
    """`npu-runtime fetch` (the init container): its status port on the pod's address, a termination log here."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return container_args(container)[:2] == ["npu-runtime", "fetch"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        host = ["--status-host", pod.ip] if "--status-port" in args else []
        return [*args[:2], "--termination-message-path", str(pod.init_termination_log), *host, *args[2:]]


class RouteRunner:
    """`npu-runtime route` (a disaggregated resource's router): the pod's address as its host. Its role
    Service URLs (`http://<service>.<namespace>.svc:<port>`) stay: the pod's DNS answers each
    Service's ready pods, as kube-proxy would reach them, and follows them as they change."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return container_args(container)[:2] == ["npu-runtime", "route"]

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        options = parse_route_args(args[2:])
        return [*args[:2], *route_argv(dataclasses.replace(options, host=pod.ip))]


class ProcessRunner:
    """Anything else: the command and args as they are (an executable found next to this Python or on PATH)."""

    def accepts(self, container: Mapping[str, Any]) -> bool:
        return bool(container_args(container))

    def command(self, pod: LocalPod, container: Mapping[str, Any], args: list[str]) -> list[str]:
        return args


DEFAULT_RUNNERS: Final[tuple[Runner, ...]] = (ServeRunner(), FetchRunner(), RouteRunner(), ProcessRunner())

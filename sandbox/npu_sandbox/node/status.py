"""What the kubelet reports of one pod: the status it patches (address, phase, conditions, container
statuses), a container's terminated state, and the readiness probe that decides Ready."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from npu_operator.kube.objects import utc_now

from npu_sandbox.cluster.client import ApiClient
from npu_sandbox.node.network import LOCAL_IP


class StatusReporter:
    """Patches one pod's status subresource as a kubelet does, for its main container `container`."""

    def __init__(self, cluster: ApiClient, namespace: str, name: str, ip: str, container: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.ip = ip
        self.container = container
        # status.startTime (when the kubelet took the pod on) and when Ready last flipped, as a kubelet
        # reports them: the operator reads a replica's startup time from the two.
        self.start_time = ""
        self._ready_condition: tuple[str, str] = ("", "")  # (status, lastTransitionTime)
        self.init_statuses: list[dict[str, Any]] = []

    async def report(
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
            "name": self.container,
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


def terminated(code: int | None, termination_log: Path) -> dict[str, Any]:
    """A container's terminated state: its exit code, and the termination message it left in `termination_log`."""
    message = termination_log.read_text(encoding="utf-8") if termination_log.exists() else ""
    return {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": message}


def readiness_url(container: Mapping[str, Any], ports: Mapping[str, int], ip: str) -> str | None:
    """The readiness probe's URL on this machine (httpGet, its port by name or number, `ports` by name
    where the container listens on `ip`); None: no probe."""
    probe = container.get("readinessProbe", {}).get("httpGet")
    if probe is None:
        return None
    port = probe.get("port")
    local = ports.get(port) if isinstance(port, str) else port
    return f"http://{ip}:{local}{probe.get('path', '/')}"


async def probe(session: aiohttp.ClientSession, url: str | None) -> bool:
    """One readiness probe: ready when it answers 200, or when there is no probe (`url` None)."""
    if url is None:
        return True
    try:
        async with session.get(url) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False

"""Reading the runtimes' `/status` from the pods: bounded, short, and gentle with broken pods.

One collector serves the whole operator: a semaphore bounds the reads in flight across every
NPUInference, each read has a short timeout, a pod is read at most once per poll interval, and a
pod that does not answer is retried with exponential backoff while its last good report is kept.
Fresh, not sticky: a pod whose state changed (phase, Ready, a container restart: `transition_mark`)
is read at once, whatever its backoff, and a report read before the pod's last transition is
handed on as stale (`PodReport.stale`), never as the pod's current state.
A pod whose last read failed is read through a pool of its own (a quarter of the slots), so
hung pods never hold the slots of healthy ones; the HTTP connection pool is as large as the bound.
Pod IPs and ports come from the Pod objects (the container port named `metrics`).

What a pod answers is untrusted: redirects are never followed, the body is cut at MAX_BODY_BYTES
(a longer one makes the pod unreachable, with the reason logged), the whole read, body included,
has one deadline, and the JSON is parsed into a checked `RuntimeReport` (`reports`). Which
pods are read at all is the caller's decision: only pods the resource's own workloads own
(`kube.ownership.owned_pods`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import aiohttp

from npu_operator.api.config import backoff_seconds
from npu_operator.kube.names import CONTAINER_NAME, METRICS_PORT
from npu_operator.kube.objects import condition
from npu_operator.kube.ownership import rank_of
from npu_operator.status.findings import PodReport
from npu_operator.status.reports import RuntimeReport, parse_report

# A runtime's /status is a few KiB; this leaves room for many captures and still bounds memory.
MAX_BODY_BYTES: Final = 256 * 1024

logger = logging.getLogger(__name__)


class Unreadable(Exception):
    """Why a pod's /status could not be taken: the message says it in words."""


Mark = tuple[Any, ...]


@dataclasses.dataclass
class _Entry:
    address: str
    mark: Mark  # the pod's transition mark as last seen
    report: RuntimeReport | None = None
    report_mark: Mark | None = None  # the pod's mark when `report` was read
    reachable: bool = True
    failures: int = 0
    next_read: float = 0.0
    problem: str = ""

    @property
    def stale(self) -> bool:
        """The report was read before the pod's last transition: not what the pod is now."""
        return self.report is not None and self.report_mark != self.mark


def transition_mark(pod: Mapping[str, Any]) -> Mark:
    """What changes when a pod transitions: its phase, its Ready condition, its containers' restarts."""
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    restarts = sum(int(entry.get("restartCount") or 0) for entry in statuses if isinstance(entry, Mapping))
    return (status.get("phase"), condition(pod, "Ready").get("status"), restarts)


def runtime_address(pod: Mapping[str, Any]) -> str | None:
    """`ip:port` of the pod's runtime status server, or None when the pod has no IP (yet/any more)."""
    status, meta = pod.get("status", {}), pod.get("metadata", {})
    ip = status.get("podIP")
    if not ip or meta.get("deletionTimestamp") or status.get("phase") not in ("Running", "Pending"):
        return None
    port = METRICS_PORT
    for container in pod.get("spec", {}).get("containers", []):
        if container.get("name") == CONTAINER_NAME:
            for entry in container.get("ports", []):
                if entry.get("name") == "metrics":
                    port = int(entry.get("containerPort", METRICS_PORT))
    return f"{ip}:{port}"


class ReportCollector:
    def __init__(
        self,
        *,
        concurrency: int,
        timeout: float,
        poll_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._concurrency = concurrency
        self._seconds = timeout
        self._healthy = asyncio.Semaphore(concurrency)
        self._suspect = asyncio.Semaphore(self._suspect_slots)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._poll = poll_seconds
        self._clock = clock
        self._entries: dict[str, dict[str, _Entry]] = {}  # owner uid -> pod uid -> entry
        self._session: aiohttp.ClientSession | None = None
        self.reads = 0  # for tests and the operator's own accounting

    @property
    def _suspect_slots(self) -> int:
        return max(1, self._concurrency // 4)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def forget(self, owner: str) -> None:
        self._entries.pop(owner, None)

    async def collect(self, owner: str, pods: Sequence[Mapping[str, Any]]) -> list[PodReport]:
        """One report per pod that has an address: fresh when due (at once when the pod changed),
        else the last one read, marked stale when the pod changed since."""
        entries = self._entries.setdefault(owner, {})
        current: dict[str, tuple[Mapping[str, Any], str]] = {}
        for pod in pods:
            address = runtime_address(pod)
            if address is not None:
                current[pod["metadata"]["uid"]] = (pod, address)
        for uid in set(entries) - set(current):
            del entries[uid]  # the pod is gone: its reports go with it
        for uid, (pod, address) in current.items():
            mark = transition_mark(pod)
            entry = entries.get(uid)
            if entry is None or entry.address != address:
                entries[uid] = _Entry(address, mark)
            elif entry.mark != mark:
                entry.mark, entry.next_read = mark, 0.0  # read at once, not after its backoff
        now = self._clock()
        due = [(pod, entries[uid]) for uid, (pod, _) in current.items() if entries[uid].next_read <= now]
        await asyncio.gather(*(self._read(pod["metadata"]["name"], entry) for pod, entry in due))
        return [
            PodReport(
                pod=pod["metadata"]["name"],
                report=entries[uid].report,
                reachable=entries[uid].reachable,
                stale=entries[uid].stale,
                rank=rank_of(pod),
            )
            for uid, (pod, _) in sorted(current.items(), key=lambda item: str(item[1][0]["metadata"]["name"]))
        ]

    async def _read(self, pod: str, entry: _Entry) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._concurrency + self._suspect_slots)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        mark = entry.mark  # the pod as it was when the read began
        async with self._suspect if entry.failures else self._healthy:
            self.reads += 1
            try:
                async with asyncio.timeout(self._seconds):
                    document = await self._fetch(f"http://{entry.address}/status")
            except (TimeoutError, aiohttp.ClientError, OSError, Unreadable) as exc:
                problem = str(exc) or f"{type(exc).__name__} after {self._seconds:g} s"
                if problem != entry.problem:
                    logger.warning("pod %s: /status at %s not taken: %s", pod, entry.address, problem)
                entry.failures += 1
                entry.reachable, entry.problem = False, problem
                entry.next_read = self._clock() + backoff_seconds(self._poll, entry.failures)
                return
        entry.report, entry.reachable, entry.failures, entry.problem = parse_report(document), True, 0, ""
        entry.report_mark = mark
        entry.next_read = self._clock() + self._poll

    async def _fetch(self, url: str) -> Any:
        """The JSON value at `url`: no redirects, at most MAX_BODY_BYTES, any JSON value."""
        assert self._session is not None
        async with self._session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                raise Unreadable(f"answered HTTP {response.status}, not 200 (redirects are not followed)")
            if (response.content_length or 0) > MAX_BODY_BYTES:
                raise Unreadable(f"body of {response.content_length} bytes, over the {MAX_BODY_BYTES} limit")
            body = bytearray()
            while chunk := await response.content.read(MAX_BODY_BYTES + 1 - len(body)):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise Unreadable(f"body over the {MAX_BODY_BYTES} byte limit")
        try:
            document = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise Unreadable(f"not JSON: {type(exc).__name__}") from None
        if not isinstance(document, dict):
            raise Unreadable(f"a JSON {type(document).__name__}, not an object")
        return document

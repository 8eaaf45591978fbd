"""Fault injection: the real operator, over HTTP, against the emulator and pods that misbehave.

The API side is `FaultyEmulator` (the sandbox's emulator plus injected answers, in-stream watch
errors, cut streams and compaction); the pod side is `FakeRuntimes`, HTTP servers standing in
for the runtimes' `/status`. Each test asserts what the operator must do: converge, stay within
memory and request-rate bounds, create no duplicate children, never freeze the status, post one
Event per burst. The figures the tests measure are printed (run with `-s` to see them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, cast

import aiohttp
import aiohttp.web
import kopf
import pytest
from kmock._internal import enums, rendering
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_operator.controller.worker import describe
from npu_operator.kube.client import NPU_INFERENCES, ApiError, KubeClient
from npu_operator.kube.objects import condition
from npu_sandbox.apiserver.emulator import KubeEmulator
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.controllers.workloads import replica_set_owner

from tests.examples import SANDBOX_HOST_PATHS, example

NS = "faults"
CONFIG = OperatorConfig(
    resync_seconds=1.0,
    status_poll_seconds=1.0,
    status_timeout_seconds=1.0,
    metrics_port=0,
    health_port=0,
    allowed_host_paths=SANDBOX_HOST_PATHS,
)
CUT: dict[str, Any] = {"type": "_CUT"}  # put on a bus: every open watch stream of it ends
Rule = Callable[[rendering.Request], aiohttp.web.StreamResponse | None]


class FaultyEmulator(KubeEmulator):
    """The emulator, plus: answers injected by rules, cut watch streams, and a request log."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.rules: list[Rule] = []
        self.log: list[tuple[float, str, str, bool]] = []  # (when, method, path, is a watch)
        self.cut_watches = False
        self.gone = 0  # 410 Gone answers to watches from a compacted resourceVersion

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        watch = request.action == enums.action.WATCH
        self.log.append((time.monotonic(), request.method.value, request.url.path, watch))
        for rule in self.rules:
            if (answer := rule(request)) is not None:
                return answer
        return await super()._handle(request)

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        if self.cut_watches:
            yield b""
            return
        # aclosing: a stream left half-read would be finalized later by the garbage collector,
        # in whatever code runs then (here: an import that pytest compiles), and break it.
        inner = cast(AsyncGenerator[rendering.Payload, None], super()._serve_watch(request))
        async with contextlib.aclosing(inner) as stream:
            async for item in stream:
                if isinstance(item, dict) and item.get("type") == CUT["type"]:
                    return
                yield item

    def _catch_up(self, objects: list[tuple[bool, dict[str, Any]]], since: str) -> list[dict[str, Any]]:
        events = super()._catch_up(objects, since)
        self.gone += sum(1 for event in events if event["type"] == "ERROR")
        return events

    async def broadcast(self, event: dict[str, Any]) -> None:
        """Into every open watch stream (of every resource)."""
        for bus in list(self._buses.values()):
            await bus.put(event)

    def watches_between(self, start: float, end: float) -> int:
        return sum(1 for when, _, _, watch in self.log if watch and start <= when < end)

    def requests_between(self, start: float, end: float) -> int:
        return sum(1 for when, *_ in self.log if start <= when < end)


def reject(method: str, path_part: str, status: int, reason: str, message: str) -> Rule:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message}

    def rule(request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        if request.method.value == method and path_part in request.url.path:
            return aiohttp.web.json_response({**body, "code": status}, status=status)
        return None

    return rule


class FakeRuntimes:
    """HTTP servers standing in for pods' runtimes: what `/status` answers is set per port."""

    def __init__(self) -> None:
        self.answers: dict[int, Callable[[aiohttp.web.Request], Any]] = {}
        self.hits: dict[int, int] = {}
        self._runner: aiohttp.web.AppRunner | None = None

    async def start(self, count: int) -> list[int]:
        app = aiohttp.web.Application()
        app.router.add_get("/status", self._status)
        app.router.add_get("/elsewhere", self._status)
        self._runner = aiohttp.web.AppRunner(app)
        await self._runner.setup()
        ports = []
        for _ in range(count):
            site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        return ports

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _status(self, request: aiohttp.web.Request) -> Any:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        self.hits[port] = self.hits.get(port, 0) + 1
        return await self.answers[port](request)


def report(mode: str = "NONE", **extra: Any) -> Callable[[aiohttp.web.Request], Any]:
    document = {"schema": 1, "state": "ready", "requested_mode": "FULL_DECODE_ONLY", "effective_mode": mode, **extra}

    async def answer(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text=json.dumps(document), content_type="application/json")

    return answer


async def endless(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
    response = aiohttp.web.StreamResponse()
    await response.prepare(request)
    await response.write(b'{"effective_mode": "NONE", "padding": "')
    chunk = b"x" * 65536
    try:
        while True:
            await response.write(chunk)
    except (ConnectionError, RuntimeError):
        return response


def redirect_to(port: int) -> Callable[[aiohttp.web.Request], Any]:
    async def answer(_: aiohttp.web.Request) -> aiohttp.web.Response:
        raise aiohttp.web.HTTPFound(f"http://127.0.0.1:{port}/elsewhere")

    return answer


# --- fixtures and helpers ---------------------------------------------------------------------------


@pytest.fixture
async def faulty() -> AsyncIterator[tuple[LocalCluster, FaultyEmulator]]:
    emulator = FaultyEmulator()
    emulator.serve_pod_monitors()
    async with LocalCluster(emulator=emulator) as cluster:
        await cluster.start_operator(CONFIG)
        try:
            yield cluster, emulator
        finally:
            emulator.rules.clear()
            emulator.cut_watches = False
            await cluster.stop_operator()  # raises if the operator died


@pytest.fixture
async def runtimes() -> AsyncIterator[FakeRuntimes]:
    fake = FakeRuntimes()
    yield fake
    await fake.close()


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    document = example("sandbox-cpu.yaml")
    document["metadata"] = {"name": name, "namespace": NS}
    document["spec"].update(spec)
    return document


async def resource(cluster: LocalCluster, name: str) -> dict[str, Any]:
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, name)
    assert obj is not None
    return obj


async def wait_for_status(
    cluster: LocalCluster, name: str, check: Callable[[dict[str, Any]], bool], within: float = 30, what: str = ""
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        obj = await resource(cluster, name)
        return obj if check(obj) else None

    found: dict[str, Any] = await cluster.wait_for(probe, within=within, what=what or name)
    return found


async def deployment(cluster: LocalCluster, name: str, within: float = 30) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        return await cluster.get("apps/v1", "deployments", NS, name)

    found: dict[str, Any] = await cluster.wait_for(probe, within=within, what=f"Deployment {name}")
    return found


async def events(cluster: LocalCluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in await cluster.list_objects("v1", "events", NS)
        if e.get("involvedObject", {}).get("name") == name and e.get("reason") == reason
    ]


async def add_pod(cluster: LocalCluster, name: str, pod: str, port: int, owner: dict[str, Any] | None) -> None:
    """A ready pod whose runtime answers on 127.0.0.1:`port`; `owner` None: labels only."""
    template = (await deployment(cluster, name))["spec"]["template"]
    spec = json.loads(json.dumps(template["spec"]))
    spec["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port}]
    meta: dict[str, Any] = {"name": pod, "namespace": NS, "labels": template["metadata"]["labels"]}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    await cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, "pods")
    ready = [{"type": "Ready", "status": "True"}]
    status = {"phase": "Running", "podIP": "127.0.0.1", "conditions": ready}
    await cluster.patch("v1", "pods", NS, pod, {"status": status}, subresource="status")


async def owner_of(cluster: LocalCluster, name: str) -> dict[str, Any]:
    """The owner reference of a pod of the resource's Deployment (its ReplicaSet made when missing)."""
    await deployment(cluster, name)
    return await replica_set_owner(cluster, NS, name)


async def ready_deployment(cluster: LocalCluster, name: str) -> None:
    found = await deployment(cluster, name)
    await cluster.report_deployment(NS, name, found["metadata"]["generation"], 1, 1)


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def phase(obj: dict[str, Any]) -> str:
    return str(obj.get("status", {}).get("phase", ""))


# --- what pods say ----------------------------------------------------------------------------------

CPU_DOWNGRADE = {"from_mode": "FULL_DECODE_ONLY", "to_mode": "NONE", "reason": "CpuHasNoGraphs", "stage": "plan"}
HOSTILE = report(
    "PIECEWISE",
    failure={"reason": "GraphCaptureOutOfMemory", "message": "intruder text"},
    downgrades=[{**CPU_DOWNGRADE, "reason": f"Intruder{i}", "message": "x" * 4000} for i in range(250)],
)


async def test_pods_the_resource_does_not_own_are_never_read(
    faulty: tuple[LocalCluster, FaultyEmulator], runtimes: FakeRuntimes
) -> None:
    """Labels can be copied: an intruder pod with the resource's labels degraded it, with its text."""
    cluster, _ = faulty
    good, intruder, forged = await runtimes.start(3)
    runtimes.answers |= {good: report(downgrades=[CPU_DOWNGRADE]), intruder: HOSTILE, forged: HOSTILE}
    await cluster.apply_npu_inference(manifest("victim"))
    await add_pod(cluster, "victim", "victim-a", good, await owner_of(cluster, "victim"))
    await add_pod(cluster, "victim", "intruder", intruder, None)
    # A real ReplicaSet that is not ours (an owner reference to a uid that does not exist would be
    # garbage-collected, as by the API server's collector).
    other = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "x", "namespace": NS}, "spec": {}}
    other_uid = (await cluster.create(other, "replicasets"))["metadata"]["uid"]
    foreign = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": other_uid, "controller": True}
    await add_pod(cluster, "victim", "forged", forged, foreign)
    await ready_deployment(cluster, "victim")
    obj = await wait_for_status(cluster, "victim", lambda o: phase(o) == "Ready", what="Ready")
    await asyncio.sleep(2.5)  # more polls: the intruders must still not be read
    obj = await resource(cluster, "victim")
    assert phase(obj) == "Ready" and condition(obj, "Degraded")["status"] == "False"
    graph = obj["status"]["graph"]
    assert graph["reportingPods"] == 1 and [d["reason"] for d in graph["downgrades"]] == ["CpuHasNoGraphs"]
    assert runtimes.hits.get(intruder, 0) == 0 and runtimes.hits.get(forged, 0) == 0
    assert await events(cluster, "victim", "GraphCaptureFailed") == []


async def test_a_burst_of_250_downgrades_is_one_event_and_a_small_status(
    faulty: tuple[LocalCluster, FaultyEmulator], runtimes: FakeRuntimes
) -> None:
    """Before: 251 Warning Events in 24 s, 250 downgrades (about 1 MB) until status PATCHes got 413."""
    cluster, _ = faulty
    (port,) = await runtimes.start(1)
    burst = [{**CPU_DOWNGRADE, "reason": f"Reason{i}", "message": "y" * 100} for i in range(250)]
    runtimes.answers[port] = report(downgrades=burst)
    await cluster.apply_npu_inference(manifest("burst"))
    await add_pod(cluster, "burst", "burst-a", port, await owner_of(cluster, "burst"))
    await ready_deployment(cluster, "burst")
    await wait_for_status(cluster, "burst", lambda o: bool(o.get("status", {}).get("graph", {}).get("downgrades")))
    await asyncio.sleep(4)  # four more resyncs and polls
    posted = await events(cluster, "burst", "GraphModeDowngraded")
    status_bytes = len(json.dumps((await resource(cluster, "burst"))["status"]).encode())
    print(f"\nEvents posted for a burst of 250 downgrades: {len(posted)}; status: {status_bytes} bytes")
    assert len(posted) == 1 and "more GraphModeDowngraded events" in posted[0]["message"]
    assert status_bytes < 20 * 1024


async def test_wrong_types_in_a_report_do_not_freeze_the_status(
    faulty: tuple[LocalCluster, FaultyEmulator], runtimes: FakeRuntimes
) -> None:
    """Before: every reconcile raised; the Deployment was 1/1 ready, the resource stuck at Starting."""
    cluster, _ = faulty
    (port,) = await runtimes.start(1)
    runtimes.answers[port] = report(
        replay={"mode": "FULL"},
        plan=[1, 2],
        captures=[{"mode": "FULL", "size": "big"}],
        downgrades="xyz",
        eager_fallbacks={"a": "b"},
        decode_steps=float("inf"),
    )
    await cluster.apply_npu_inference(manifest("confused"))
    await add_pod(cluster, "confused", "confused-a", port, await owner_of(cluster, "confused"))
    await ready_deployment(cluster, "confused")
    obj = await wait_for_status(cluster, "confused", lambda o: phase(o) == "Ready", what="Ready")
    assert obj["status"]["graph"]["effectiveMode"] == "NONE"


async def test_hostile_status_endpoints_cost_no_memory_and_are_not_followed(
    faulty: tuple[LocalCluster, FaultyEmulator], runtimes: FakeRuntimes
) -> None:
    """Before: an endless /status took the operator from 64 MB to 1.9 GB in 24 s; a 302 was followed."""
    cluster, _ = faulty
    stream, redirecting, target = await runtimes.start(3)
    runtimes.answers |= {stream: endless, redirecting: redirect_to(target), target: report("SSRF")}
    await cluster.apply_npu_inference(manifest("hostile"))
    owner = await owner_of(cluster, "hostile")
    await add_pod(cluster, "hostile", "hostile-stream", stream, owner)
    await add_pod(cluster, "hostile", "hostile-redirect", redirecting, owner)
    await ready_deployment(cluster, "hostile")
    baseline = peak = rss_bytes()
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        peak = max(peak, rss_bytes())
        await asyncio.sleep(0.05)
    obj = await resource(cluster, "hostile")
    print(f"\npeak RSS with a never-ending /status: {peak / 2**20:.0f} MiB (+{(peak - baseline) / 2**20:.0f} MiB)")
    assert obj["status"]["graph"].get("unreachablePods") == 2
    assert obj["status"]["graph"].get("effectiveMode") != "SSRF" and runtimes.hits.get(target, 0) == 0
    assert runtimes.hits[stream] >= 2  # read again and again (with backoff), never kept
    assert peak - baseline < 100 * 2**20


# --- what the API server does -----------------------------------------------------------------------


async def test_a_refused_deployment_is_degraded_child_rejected_once(
    faulty: tuple[LocalCluster, FaultyEmulator],
) -> None:
    """Before: a permanent 403 left no phase, no condition, no Event; only a traceback in the log."""
    cluster, emulator = faulty
    quota = 'deployments.apps "quota" is forbidden: exceeded quota: npu-quota, requested: huawei.com/Ascend910=1'
    # Children are created by server-side apply: a PATCH of the named object.
    emulator.rules.append(reject("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/quota", 403, "Forbidden", quota))
    await cluster.apply_npu_inference(manifest("quota"))
    obj = await wait_for_status(
        cluster, "quota", lambda o: condition(o, "Degraded").get("reason") == "ChildRejected", what="ChildRejected"
    )
    assert "exceeded quota: npu-quota" in condition(obj, "Degraded")["message"]
    assert phase(obj) == "Degraded"
    await asyncio.sleep(3)  # three more resyncs, three more refused writes
    assert len(await events(cluster, "quota", "ChildRejected")) == 1
    emulator.rules.clear()  # the quota is raised
    await deployment(cluster, "quota")
    await wait_for_status(cluster, "quota", lambda o: condition(o, "Degraded").get("status") == "False")


async def test_a_forbidden_pod_monitor_api_blocks_no_resource(faulty: tuple[LocalCluster, FaultyEmulator]) -> None:
    """Before: a 403 on the PodMonitor API blocked every resource, even those that want no PodMonitor."""
    cluster, emulator = faulty
    denied = "podmonitors.monitoring.coreos.com is forbidden: User cannot list resource"
    # RBAC refuses the podmonitors resource (list, watch, get, writes); discovery stays readable,
    # as the system:discovery role grants it to every authenticated user.
    for method in ("GET", "POST", "PATCH", "DELETE"):
        emulator.rules.append(reject(method, "/podmonitors", 403, "Forbidden", denied))
    await cluster.apply_npu_inference(manifest("plain"))
    await cluster.apply_npu_inference(manifest("monitored", metrics={"podMonitor": {"enabled": True}}))
    await deployment(cluster, "plain")
    await deployment(cluster, "monitored")
    await ready_deployment(cluster, "monitored")
    obj = await wait_for_status(cluster, "monitored", lambda o: "PodMonitor not managed" in json.dumps(o.get("status")))
    assert condition(obj, "Degraded")["status"] == "False"


async def test_an_error_event_in_a_watch_stream_does_not_stop_the_operator(
    faulty: tuple[LocalCluster, FaultyEmulator],
) -> None:
    """Before: one in-stream ERROR (code 500) ended the operator ("multitasker has failed")."""
    cluster, emulator = faulty
    await cluster.apply_npu_inference(manifest("before"))
    await deployment(cluster, "before")
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500}
    await emulator.broadcast({"type": "ERROR", "object": {**status, "reason": "InternalError", "message": "etcd"}})
    await asyncio.sleep(0.5)
    await cluster.apply_npu_inference(manifest("after"))
    await deployment(cluster, "after", within=15)
    deployments = await cluster.list_objects("apps/v1", "deployments", NS)
    assert sorted(d["metadata"]["name"] for d in deployments) == ["after", "before"]  # no duplicates


async def test_cut_watch_streams_reconnect_at_a_bounded_rate(faulty: tuple[LocalCluster, FaultyEmulator]) -> None:
    """Before: with every stream cut, the operator reconnected with no pause: 475 requests in 10 s."""
    cluster, emulator = faulty
    await cluster.apply_npu_inference(manifest("steady"))
    await deployment(cluster, "steady")
    emulator.cut_watches = True
    start = time.monotonic()
    await emulator.broadcast(CUT)
    await asyncio.sleep(10)
    end = time.monotonic()
    emulator.cut_watches = False
    watches = emulator.watches_between(start, end) / (end - start)
    requests = emulator.requests_between(start, end) / (end - start)
    paths = len({path for when, _, path, watch in emulator.log if watch and start <= when < end})
    print(f"\nwhile every watch is cut: {watches:.1f} watch requests/s over {paths} watched paths,")
    print(f"{requests:.1f} requests/s in all")
    assert watches / paths <= 0.8  # backoff from 0.5 s, doubling: about 5 reconnects per path in 10 s
    await cluster.apply_npu_inference(manifest("later"))
    await deployment(cluster, "later", within=60)


async def test_410_gone_relists_and_converges(faulty: tuple[LocalCluster, FaultyEmulator]) -> None:
    cluster, emulator = faulty
    await cluster.apply_npu_inference(manifest("old"))
    await deployment(cluster, "old")
    await asyncio.sleep(1.5)  # the worker writes: the watch's resourceVersion falls behind
    emulator.compacted_before = emulator._last_version + 1  # every version the operator has seen
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bump", "namespace": NS}}
    await cluster.create(service, "services")  # a fresh list is past the compaction
    start = time.monotonic()
    await emulator.broadcast(CUT)  # the operator re-watches from a compacted version: 410 Gone
    await asyncio.sleep(5)
    gone = sum(1 for when, _, _, watch in emulator.log if watch and when >= start)
    await cluster.apply_npu_inference(manifest("new"))
    await deployment(cluster, "new", within=45)
    print(f"\n410 Gone: {emulator.gone} answered, {gone} watch requests in 5 s")
    # Each watched resource (one 410 each): the watch that got the 410, then, after a re-list, one
    # healthy watch; one more for a watch that was just being re-opened when the streams were cut.
    assert emulator.gone >= 1 and gone <= 2 * emulator.gone + 1


# --- the emulator's watch and the client's errors -----------------------------------------------------


async def test_the_emulator_watch_continues_from_a_resource_version_and_times_out() -> None:
    async with LocalCluster() as cluster, aiohttp.ClientSession() as session:
        path = f"{cluster.url}/api/v1/namespaces/{NS}/services"
        async with session.get(path) as answer:
            version = (await answer.json())["metadata"]["resourceVersion"]
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "late", "namespace": NS}}
        created = await cluster.create(service, "services")  # between the list and the watch
        started = time.monotonic()
        params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "1"}
        async with session.get(path, params=params) as answer:
            lines = [json.loads(line) for line in (await answer.text()).splitlines() if line.strip()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "late")]
        assert time.monotonic() - started < 3
        since = int(created["metadata"]["resourceVersion"])
        cluster.emulator.compacted_before = since + 1
        async with session.get(path, params={**params, "resourceVersion": str(since)}) as answer:
            (gone,) = [json.loads(line) for line in (await answer.text()).splitlines() if line.strip()]
        assert (gone["type"], gone["object"]["code"]) == ("ERROR", 410)


async def test_a_request_that_times_out_names_itself() -> None:
    """Before: `reconcile failed (1 in a row): ` with an empty message."""
    assert describe(TimeoutError()) == "TimeoutError (no message)"

    async def hang(_: aiohttp.web.Request) -> aiohttp.web.Response:
        await asyncio.sleep(1)
        return aiohttp.web.Response()

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", hang)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = KubeClient(lambda: kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"), timeout=0.3)
    try:
        with pytest.raises(ApiError) as caught:
            await client.get(NPU_INFERENCES, NS, "x")
    finally:
        await client.close()
        await runner.cleanup()
    assert caught.value.status == 0 and caught.value.transient  # no answer: retried with backoff
    assert describe(caught.value).startswith(
        "ApiError: 0 TimeoutError: GET /apis/inference.npu.dev/v1alpha1/namespaces/faults/"
    )

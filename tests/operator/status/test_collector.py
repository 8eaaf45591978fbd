"""The report collector against a real HTTP server: concurrency bound, poll interval, backoff, gone pods."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest
from npu_operator.status.collector import ReportCollector, runtime_address


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Runtimes:
    """One HTTP server standing in for many pods' runtimes: /status answers per port."""

    def __init__(self) -> None:
        self.behaviour: dict[int, str] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.hits: dict[int, int] = {}
        self.sites: dict[int, aiohttp.web.TCPSite] = {}
        self.redirect_to = 0
        self.streamed = 0

    async def _stream(self, request: aiohttp.web.Request, mode: str) -> aiohttp.web.StreamResponse:
        """A body that never ends, ends after 50 MB, or comes a few bytes at a time, forever."""
        response = aiohttp.web.StreamResponse()
        await response.prepare(request)
        chunk = b" " * (1 if mode == "drip" else 64 * 1024)
        await response.write(b'{"effective_mode": "FULL", "padding": "')
        sent = 0
        try:
            while mode != "huge" or sent < 50 * 2**20:
                await response.write(chunk)
                sent += len(chunk)
                self.streamed += len(chunk)
                if mode == "drip":
                    await asyncio.sleep(0.01)
            await response.write(b'"}')
        except (ConnectionError, RuntimeError):
            pass  # the reader hung up, as it should
        return response

    async def status(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        self.hits[port] = self.hits.get(port, 0) + 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            mode = self.behaviour.get(port, "ok")
            if mode == "error":
                return aiohttp.web.Response(status=500)
            if mode == "hang":
                await asyncio.sleep(5)
            if mode == "garbage":
                return aiohttp.web.Response(text="[1, 2]")
            if mode == "redirect":
                raise aiohttp.web.HTTPFound(f"http://127.0.0.1:{self.redirect_to}/status")
            if mode in ("endless", "drip", "huge"):
                return await self._stream(request, mode)
            if mode == "nested":
                return aiohttp.web.Response(text="[" * 100_000 + "]" * 100_000)
            return aiohttp.web.json_response({"schema": 1, "effective_mode": "NONE", "port": port})
        finally:
            self.in_flight -= 1


@pytest.fixture
async def runtimes() -> AsyncIterator[tuple[Runtimes, list[int]]]:
    fake = Runtimes()
    app = aiohttp.web.Application()
    app.router.add_get("/status", fake.status)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    ports = []
    for _ in range(6):
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        fake.sites[port] = site
        ports.append(port)
    yield fake, ports
    await runner.cleanup()


def pod(name: str, port: int, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "runtime", "ports": [{"name": "metrics", "containerPort": port}]}]},
        "status": {"podIP": "127.0.0.1", "phase": "Running", **status},
    }


def test_address_comes_from_the_pod() -> None:
    assert runtime_address(pod("a", 9999)) == "127.0.0.1:9999"
    assert runtime_address({"metadata": {}, "status": {"phase": "Running"}}) is None
    assert runtime_address({**pod("a", 1), "metadata": {"deletionTimestamp": "x"}}) is None
    assert runtime_address({"metadata": {}, "spec": {}, "status": {"podIP": "10.0.0.1", "phase": "Running"}}) == (
        "10.0.0.1:9090"
    )


async def test_reads_are_bounded_operator_wide(runtimes: tuple[Runtimes, list[int]]) -> None:
    fake, ports = runtimes
    collector = ReportCollector(concurrency=2, timeout=2, poll_seconds=10)
    try:
        await asyncio.gather(
            collector.collect("owner-1", [pod(f"a{i}", port) for i, port in enumerate(ports[:3])]),
            collector.collect("owner-2", [pod(f"b{i}", port) for i, port in enumerate(ports[3:])]),
        )
    finally:
        await collector.close()
    assert collector.reads == 6
    assert fake.most_in_flight == 2


async def test_a_pod_is_read_once_per_poll_interval(runtimes: tuple[Runtimes, list[int]]) -> None:
    fake, ports = runtimes
    clock = Clock()
    collector = ReportCollector(concurrency=4, timeout=2, poll_seconds=10, clock=clock)
    try:
        pods = [pod("a", ports[0])]
        first = await collector.collect("o", pods)
        clock.now = 5
        second = await collector.collect("o", pods)
        clock.now = 11
        await collector.collect("o", pods)
    finally:
        await collector.close()
    assert first == second
    assert first[0].report is not None and first[0].report.effective_mode == "NONE"
    assert fake.hits[ports[0]] == 2


async def test_a_failing_pod_backs_off_and_keeps_its_last_report(runtimes: tuple[Runtimes, list[int]]) -> None:
    fake, ports = runtimes
    clock = Clock()
    collector = ReportCollector(concurrency=4, timeout=0.5, poll_seconds=10, clock=clock)
    pods = [pod("a", ports[0])]
    try:
        await collector.collect("o", pods)
        fake.behaviour[ports[0]] = "error"
        for now in (10, 15, 20, 25, 30, 39, 41):  # backoff after failures: 10 s, then 20 s
            clock.now = now
            (latest,) = await collector.collect("o", pods)
        assert fake.hits[ports[0]] == 4  # at 0, 10 (fails), 20 (fails), 41 (fails)
        assert latest.reachable is False
        assert latest.report is not None and latest.report.effective_mode == "NONE"
        fake.behaviour[ports[0]] = "hang"
        clock.now = 200
        (hung,) = await collector.collect("o", pods)
        assert hung.reachable is False
        fake.behaviour[ports[0]] = "garbage"
        clock.now = 1000
        (garbage,) = await collector.collect("o", pods)
        assert garbage.reachable is False
    finally:
        await collector.close()


async def test_pods_that_are_gone_are_forgotten(runtimes: tuple[Runtimes, list[int]]) -> None:
    _, ports = runtimes
    collector = ReportCollector(concurrency=4, timeout=2, poll_seconds=10)
    try:
        assert len(await collector.collect("o", [pod("a", ports[0]), pod("b", ports[1])])) == 2
        assert [r.pod for r in await collector.collect("o", [pod("b", ports[1])])] == ["b"]
        assert await collector.collect("o", [pod("c", ports[2], phase="Succeeded")]) == []
    finally:
        await collector.close()


@pytest.mark.parametrize("mode", ["endless", "huge", "drip", "nested", "redirect"])
async def test_what_a_hostile_pod_answers_is_not_taken(runtimes: tuple[Runtimes, list[int]], mode: str) -> None:
    fake, ports = runtimes
    fake.behaviour[ports[0]] = mode
    fake.redirect_to = ports[1]  # answers a good report: a followed redirect would be read as ports[0]'s
    collector = ReportCollector(concurrency=4, timeout=1.0, poll_seconds=10)
    started = asyncio.get_running_loop().time()
    try:
        (taken,) = await collector.collect("o", [pod("a", ports[0])])
    finally:
        await collector.close()
    assert taken.reachable is False and taken.report is None
    assert asyncio.get_running_loop().time() - started < 2.5  # one deadline for the whole read
    assert fake.hits.get(ports[1], 0) == 0
    assert fake.streamed < 16 * 2**20  # cut near the cap (plus socket buffers), not at the pod's end


async def test_hung_pods_do_not_hold_the_reads_of_healthy_ones(runtimes: tuple[Runtimes, list[int]]) -> None:
    fake, ports = runtimes
    clock = Clock()
    collector = ReportCollector(concurrency=4, timeout=0.5, poll_seconds=10, clock=clock)
    hung = [pod(f"h{i}", port) for i, port in enumerate(ports[:4])]
    healthy = [pod("ok", ports[4])]
    for port in ports[:4]:
        fake.behaviour[port] = "hang"
    try:
        await collector.collect("hung", hung)  # the first hang costs a timeout; then they are suspects
        clock.now = 100

        async def timed_healthy_read() -> float:
            started = asyncio.get_running_loop().time()
            (report,) = await collector.collect("healthy", healthy)
            assert report.reachable
            return asyncio.get_running_loop().time() - started

        _, healthy_seconds = await asyncio.gather(collector.collect("hung", hung), timed_healthy_read())
    finally:
        await collector.close()
    assert healthy_seconds < 0.4  # not behind the hung pods' 0.5 s timeouts
    assert fake.hits[ports[4]] == 1


def ready(value: bool) -> list[dict[str, str]]:
    return [{"type": "Ready", "status": "True" if value else "False"}]


async def test_a_pod_that_turns_ready_is_read_at_once_not_after_its_backoff(
    runtimes: tuple[Runtimes, list[int]],
) -> None:
    fake, ports = runtimes
    clock = Clock()
    collector = ReportCollector(concurrency=4, timeout=0.5, poll_seconds=10, clock=clock)
    try:
        await collector.collect("o", [pod("a", ports[0], conditions=ready(False))])
        fake.behaviour[ports[0]] = "error"
        clock.now = 10
        await collector.collect("o", [pod("a", ports[0], conditions=ready(False))])  # fails: back off 20 s
        assert fake.hits[ports[0]] == 2
        fake.behaviour[ports[0]] = "ok"
        clock.now = 11
        (now_ready,) = await collector.collect("o", [pod("a", ports[0], conditions=ready(True))])
        assert fake.hits[ports[0]] == 3  # read at once, 19 s before its backoff allowed
        assert now_ready.reachable and not now_ready.stale
        clock.now = 12
        restarted = pod("a", ports[0], conditions=ready(True), containerStatuses=[{"restartCount": 1}])
        await collector.collect("o", [restarted])
        assert fake.hits[ports[0]] == 4  # a container restart is a transition too
    finally:
        await collector.close()


async def test_a_report_older_than_the_pods_last_transition_is_stale(runtimes: tuple[Runtimes, list[int]]) -> None:
    """Seen on a busy machine: the pod turned Ready, its /status read timed out, the old report stuck."""
    fake, ports = runtimes
    clock = Clock()
    collector = ReportCollector(concurrency=4, timeout=0.5, poll_seconds=10, clock=clock)
    try:
        (loading,) = await collector.collect("o", [pod("a", ports[0], conditions=ready(False))])
        assert loading.report is not None and loading.current is not None
        fake.behaviour[ports[0]] = "hang"
        clock.now = 1
        (turned,) = await collector.collect("o", [pod("a", ports[0], conditions=ready(True))])
        assert (turned.reachable, turned.stale, turned.current) == (False, True, None)
        assert turned.report is loading.report  # kept, but only as what the pod said before
        fake.behaviour[ports[0]] = "ok"
        clock.now = 30
        (fresh,) = await collector.collect("o", [pod("a", ports[0], conditions=ready(True))])
        assert (fresh.reachable, fresh.stale) == (True, False) and fresh.current is not None
    finally:
        await collector.close()


async def test_a_leader_worker_set_pod_carries_its_rank(runtimes: tuple[Runtimes, list[int]]) -> None:
    _, ports = runtimes
    worker = pod("r1-3-1", ports[0])
    worker["metadata"]["labels"] = {
        "leaderworkerset.sigs.k8s.io/group-index": "3",
        "leaderworkerset.sigs.k8s.io/worker-index": "1",
    }
    collector = ReportCollector(concurrency=4, timeout=2, poll_seconds=10)
    try:
        (ranked, plain) = await collector.collect("o", [worker, pod("s", ports[1])])
    finally:
        await collector.close()
    assert (ranked.rank, plain.rank) == ((3, 1), None)

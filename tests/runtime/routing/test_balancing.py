"""Which engine gets a call: the least loaded for its speed; a retry always another engine; a failed
engine taken out, probed, and back in; names resolved to their addresses, each one engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.runtime.routing.conftest import (
    FakeEngine,
    StoppedEngine,
    closed_port_url,
    completion,
    eventually,
)


async def test_a_slow_and_a_fast_decode_engine_the_fast_one_gets_more(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    fast, slow = engines["decode"], engines["decode2"]

    def taking(seconds: float) -> Callable[[dict[str, Any]], Any]:
        async def answer(body: dict[str, Any]) -> web.Response:
            await asyncio.sleep(seconds)
            return completion(body, "x", tokens=16)

        return answer

    fast.behaviour, slow.behaviour = taking(0.05), taking(0.5)
    route = await make_router(prefill=(engines["prefill"].url,), decode=(slow.url, fast.url))

    async def client() -> None:
        for _ in range(6):
            status, _ = await route.post({"prompt": "p" * 200, "max_tokens": 16})
            assert status == 200

    await asyncio.gather(*(client() for _ in range(6)))
    assert len(fast.received) + len(slow.received) == 36
    # Round robin would split them 18/18; by load and speed the fast engine takes most.
    assert len(fast.received) >= 2 * len(slow.received), (len(fast.received), len(slow.received))
    assert await route.sample("npu_router_engine_requests_total", engine=fast.url) == len(fast.received)


async def test_equal_engines_share_the_work(engines: dict[str, FakeEngine], make_router: Callable[..., Any]) -> None:
    async def answer(body: dict[str, Any]) -> web.Response:
        await asyncio.sleep(0.1)
        return completion(body, "x")

    async def prefill(body: dict[str, Any]) -> web.Response:
        await asyncio.sleep(0.1)
        return engines["prefill"].answer(body)  # type: ignore[no-any-return]

    engines["decode"].behaviour = engines["decode2"].behaviour = answer
    engines["prefill"].behaviour = engines["prefill2"].behaviour = prefill
    route = await make_router(
        prefill=(engines["prefill"].url, engines["prefill2"].url),
        decode=(engines["decode"].url, engines["decode2"].url),
    )
    results = await asyncio.gather(*(route.post({"prompt": "x", "max_tokens": 8}) for _ in range(12)))
    assert all(status == 200 for status, _ in results)
    # Each lands where the least is outstanding: about half each (not exactly, on a busy machine).
    for name in ("prefill", "prefill2", "decode", "decode2"):
        assert 3 <= len(engines[name].received) <= 9, {name: len(e.received) for name, e in engines.items()}


async def test_with_one_of_two_decode_engines_dead_every_request_is_answered(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    dead = closed_port_url()
    route = await make_router(prefill=(engines["prefill"].url,), decode=(dead, engines["decode2"].url), retries=1)
    # Many at once: with one shared rotation a retry could land on the dead engine again.
    results = await asyncio.gather(*(route.post({"prompt": "x"}) for _ in range(16)))
    assert [status for status, _ in results] == [200] * 16, results
    assert len(engines["decode2"].received) == 16
    assert await route.sample("npu_router_engine_out", engine=dead) == 1
    assert await route.sample("npu_router_backend_errors_total", role="decode", reason="unreachable") >= 1


async def test_a_retry_never_goes_back_to_the_engine_that_failed(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    for name in ("prefill", "prefill2"):
        engines[name].behaviour = lambda body: web.Response(status=503, text="starting")
    route = await make_router(
        prefill=(engines["prefill"].url, engines["prefill2"].url), decode=(engines["decode"].url,), retries=5
    )
    status, answer = await route.post({"prompt": "x"})
    assert status == 502 and answer["error"]["type"] == "prefill_http_503"
    # Five retries allowed, two engines: each tried once, then the client is answered.
    assert len(engines["prefill"].received) == len(engines["prefill2"].received) == 1


async def test_a_decode_retry_after_the_engine_saw_the_request_prefills_again(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    engines["decode"].behaviour = lambda body: web.Response(status=503, text="starting")
    route = await make_router(prefill=(engines["prefill"].url,), decode=(engines["decode"].url, engines["decode2"].url))
    status, answer = await route.post({"prompt": "x"})
    assert status == 200, answer
    assert len(engines["decode"].received) == len(engines["decode2"].received) == 1
    # The first decode engine may have pulled (and so freed) the KV: the retry has a fresh one.
    assert len(engines["prefill"].received) == 2


async def test_a_decode_engine_that_cannot_be_reached_is_retried_with_the_same_kv(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    route = await make_router(prefill=(engines["prefill"].url,), decode=(closed_port_url(), engines["decode2"].url))
    status, _ = await route.post({"prompt": "x"})
    assert status == 200
    assert len(engines["prefill"].received) == 1, "it never got the request: its KV is still there"


async def test_a_failed_engine_is_taken_out_probed_and_back_in(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    flaky, steady = engines["decode"], engines["decode2"]
    flaky.healthy = False
    flaky.behaviour = lambda body: web.Response(status=503, text="restarting")
    route = await make_router(prefill=(engines["prefill"].url,), decode=(flaky.url, steady.url), eject_seconds=0.3)
    status, _ = await route.post({"prompt": "x"})
    assert status == 200
    assert len(flaky.received) == 1 and await route.sample("npu_router_engine_out", engine=flaky.url) == 1
    for _ in range(6):  # while it is out, nothing goes to it
        assert (await route.post({"prompt": "x"}))[0] == 200
    assert len(flaky.received) == 1
    assert await route.sample("npu_router_engine_ejections_total", engine=flaky.url) == 1
    # Its /health fails: the probes keep it out. Once it answers, it is back and chosen again.
    flaky.healthy = True
    flaky.behaviour = flaky.answer

    async def back_in() -> bool:
        return bool(await route.sample("npu_router_engine_out", engine=flaky.url) == 0)

    await eventually(back_in)

    async def chosen_again() -> bool:
        assert (await route.post({"prompt": "x"}))[0] == 200
        return len(flaky.received) > 1

    await eventually(chosen_again)


async def test_when_every_engine_is_out_the_best_is_still_tried(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    engine = engines["decode"]
    engine.behaviour = lambda body: web.Response(status=503)
    route = await make_router(prefill=(engines["prefill"].url,), decode=(engine.url,), eject_seconds=30)
    assert (await route.post({"prompt": "x"}))[0] == 502
    engine.behaviour = engine.answer  # back, before its probe is due
    status, _ = await route.post({"prompt": "x"})
    assert status == 200, "ejections alone never refuse a request"
    assert await route.sample("npu_router_engine_out", engine=engine.url) == 0


async def test_a_hung_engine_is_taken_out_and_the_call_goes_elsewhere(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    stopped = StoppedEngine()
    try:
        route = await make_router(
            prefill=(engines["prefill"].url,),
            decode=(stopped.url, engines["decode2"].url),
            connect_timeout=1.0,
            idle_timeout=1.0,
        )
        status, _ = await asyncio.wait_for(route.post({"prompt": "x"}), timeout=20)
        assert status == 200
        assert await route.sample("npu_router_engine_out", engine=stopped.url) == 1
        assert await route.sample("npu_router_backend_errors_total", role="decode", reason="no_progress") == 1
    finally:
        stopped.close()


async def test_a_name_is_resolved_to_its_addresses_each_one_engine(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    port = engines["decode"].url.rsplit(":", 1)[1]
    route = await make_router(prefill=(engines["prefill"].url,), decode=(f"http://localhost:{port}",))
    urls = [engine.url for engine in route.router.pools["decode"].engines]
    assert engines["decode"].url in urls, urls  # 127.0.0.1, and ::1 where localhost has it
    status, _ = await route.post({"prompt": "x"})
    assert status == 200 and len(engines["decode"].received) == 1

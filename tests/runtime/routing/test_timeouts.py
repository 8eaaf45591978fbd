"""Timeouts bound progress, never a generation: a healthy answer longer than every timeout passes,
a hung engine is given up within them. The bounds asserted are generous (a loaded 2-core machine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from tests.runtime.routing.conftest import FakeEngine, StoppedEngine, completion, eventually, streamer

SHORT = {"connect_timeout": 2.0, "first_byte_timeout": 1.0, "idle_timeout": 1.0}


async def test_a_healthy_stream_longer_than_every_timeout_is_never_cut(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    engine = engines["decode"]
    pieces = [f"t{index} " for index in range(16)]
    engine.behaviour = lambda body: streamer(body, pieces, gap=0.25)  # 3.75 s, each chunk 0.25 s apart
    route = await make_router(prefill=(engines["prefill"].url,), decode=(engine.url,), **SHORT)
    started = time.monotonic()
    status, text = await route.post({"prompt": "x", "stream": True, "max_tokens": 16})
    assert status == 200
    assert time.monotonic() - started > 3.0, "longer than every timeout together"
    assert all(piece in text for piece in pieces) and text.endswith("data: [DONE]\n\n")
    assert "error" not in text


async def test_a_healthy_non_streamed_generation_longer_than_every_timeout_is_never_cut(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    async def generate(body: dict[str, Any]) -> web.Response:
        await asyncio.sleep(3.5)  # its /health answers all along
        return completion(body, "a long answer")

    engine = engines["decode"]
    engine.behaviour = generate
    route = await make_router(prefill=(engines["prefill"].url,), decode=(engine.url,), **SHORT)
    status, answer = await route.post({"prompt": "x"})
    assert status == 200 and answer["choices"][0]["text"] == "a long answer"
    assert await route.sample("npu_router_backend_errors_total", role="decode") == 0


async def test_a_stream_that_stops_mid_way_ends_within_the_idle_timeout(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    engine = engines["decode"]
    engine.behaviour = lambda body: streamer(body, ["a", "b", "c"], stall_after=1)
    options = {"connect_timeout": 1.0, "first_byte_timeout": 60.0, "idle_timeout": 1.0}
    route = await make_router(prefill=(engines["prefill"].url,), decode=(engine.url,), **options)
    started = time.monotonic()
    status, text = await asyncio.wait_for(route.post({"prompt": "x", "stream": True}), timeout=30)
    took = time.monotonic() - started
    assert status == 200 and text.startswith("data: ")
    assert '"type":"decode_interrupted"' in text and "--idle-timeout" in text
    assert took < 15, took
    assert await route.sample("npu_router_engine_out", engine=engine.url) == 1


async def test_a_stopped_engine_is_given_up_within_the_idle_and_connect_timeouts(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    stopped = StoppedEngine()
    try:
        options = {"connect_timeout": 1.0, "first_byte_timeout": 600.0, "idle_timeout": 1.0, "retries": 0}
        for role in (
            "prefill",
            "decode",
        ):  # prefill's answer, a non-streamed decode: neither has a first-byte bound here
            urls = {"prefill": (engines["prefill"].url,), "decode": (engines["decode"].url,), role: (stopped.url,)}
            route = await make_router(**urls, **options)
            started = time.monotonic()
            status, answer = await asyncio.wait_for(route.post({"prompt": "x"}), timeout=30)
            assert status == 504 and answer["error"]["type"] == f"{role}_no_progress", answer
            assert time.monotonic() - started < 15
    finally:
        stopped.close()


async def test_an_answer_that_does_not_start_in_time_is_a_504(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    async def slow(body: dict[str, Any]) -> web.Response:
        await asyncio.sleep(30)
        return web.json_response({})

    engines["prefill"].behaviour = slow
    route = await make_router(
        prefill=(engines["prefill"].url,), decode=(engines["decode"].url,), first_byte_timeout=1.0, retries=0
    )
    started = time.monotonic()
    status, answer = await route.post({"prompt": "x"})
    assert status == 504 and answer["error"]["type"] == "prefill_timeout"
    assert "--first-byte-timeout" in answer["error"]["message"]
    assert time.monotonic() - started < 15


async def test_a_client_that_goes_away_is_not_an_engine_error(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    engine = engines["decode"]
    engine.behaviour = lambda body: streamer(body, [f"t{index}" for index in range(100)], gap=0.1)
    route = await make_router(prefill=(engines["prefill"].url,), decode=(engine.url,))
    async with aiohttp.ClientSession() as session:
        response = await session.post(route.url + "/v1/completions", json={"prompt": "x", "stream": True})
        assert response.status == 200
        await response.content.readany()
        response.close()  # the client hangs up mid-stream

    async def settled() -> bool:
        return bool(await route.sample("npu_router_requests_total", code="499") == 1)

    await eventually(settled)
    assert await route.sample("npu_router_backend_errors_total", role="decode") == 0
    assert await route.sample("npu_router_engine_out", engine=engine.url) == 0
    assert await route.sample("npu_router_engine_in_flight", engine=engine.url) == 0
    # The router hung up on the engine too: vLLM aborts a request whose client is gone.
    await eventually(lambda: engine.gone)

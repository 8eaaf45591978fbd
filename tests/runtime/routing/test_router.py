"""The prefill/decode router against fake engines (small aiohttp servers on free ports).

The fakes answer as vLLM's OpenAI server does for a P/D pair: the prefill engine returns its
`kv_transfer_params` (Mooncake's shape), the decode engine generates from them. What is checked:
the two-step flow and what each engine receives, streaming, errors of either role mapped to clear
HTTP errors, timeouts, and a decode engine that restarts (answers 503, drops the connection, or is
gone) being retried on the other one or answered with an error: never a hung request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from npu_runtime.routing.router import (
    PREFILL_KV_PARAMS,
    Router,
    RouterOptions,
    build_apps,
    parse_route_args,
    route_argv,
)

KV_PARAMS = {"do_remote_prefill": True, "remote_engine_id": "p-0_dp0", "remote_host": "10.0.0.1", "remote_port": 30000}


class FakeEngine:
    """One engine: records what it got, answers with `behaviour(request_body)`."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.received: list[dict[str, Any]] = []
        self.behaviour: Callable[[dict[str, Any]], Any] = self.answer
        self.url = ""
        self._runner: web.AppRunner | None = None

    def answer(self, body: dict[str, Any]) -> web.StreamResponse:
        if self.role == "prefill":
            return web.json_response({"choices": [{"text": "x"}], "kv_transfer_params": KV_PARAMS})
        return web.json_response({"choices": [{"text": f"decoded by {self.url}"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        result = self.behaviour(body)
        if asyncio.iscoroutine(result):
            result = await result
        if callable(result):  # a streaming handler
            result = await result(request)
        assert isinstance(result, web.StreamResponse)
        return result

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/health", _ok)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, FakeEngine]]:
    found = {name: FakeEngine(name.rstrip("0123456789")) for name in ("prefill", "decode", "decode2")}
    for engine in found.values():
        await engine.start()
    yield found
    for engine in found.values():
        await engine.stop()


class RouterUnderTest:
    def __init__(self, router: Router, url: str, metrics_url: str) -> None:
        self.router, self.url, self.metrics_url = router, url, metrics_url

    async def post(self, body: Any, path: str = "/v1/completions") -> tuple[int, Any]:
        limit = aiohttp.ClientTimeout(total=10)
        url = self.url + path
        async with aiohttp.ClientSession(timeout=limit) as session, session.post(url, json=body) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


async def start_router(options: RouterOptions) -> tuple[RouterUnderTest, Callable[[], Any]]:
    router = Router(options)
    await router.start()
    api, ops = build_apps(router)
    runners = [web.AppRunner(api, shutdown_timeout=0.1), web.AppRunner(ops, shutdown_timeout=0.1)]
    urls = []
    for runner in runners:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]

    async def stop() -> None:
        for runner in runners:
            await runner.cleanup()
        await router.close()

    return RouterUnderTest(router, urls[0], urls[1]), stop


@pytest.fixture
async def route(engines: dict[str, FakeEngine]) -> AsyncIterator[RouterUnderTest]:
    options = RouterOptions(
        prefill=(engines["prefill"].url,), decode=(engines["decode"].url, engines["decode2"].url), timeout=2.0
    )
    under_test, stop = await start_router(options)
    yield under_test
    await stop()


async def test_a_completion_is_prefilled_with_one_token_then_decoded_with_the_returned_kv_params(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    body = {"model": "m", "prompt": "hello", "max_tokens": 20, "stream": False, "stream_options": {"x": 1}}
    status, answer = await route.post(body)
    assert status == 200, answer
    assert answer["choices"][0]["text"] == f"decoded by {engines['decode'].url}"
    [prefill] = engines["prefill"].received
    assert prefill["max_tokens"] == 1 and prefill["min_tokens"] == 1 and prefill["stream"] is False
    assert prefill["kv_transfer_params"] == PREFILL_KV_PARAMS and "stream_options" not in prefill
    assert prefill["prompt"] == "hello"
    [decode] = engines["decode"].received
    assert decode == {**body, "kv_transfer_params": KV_PARAMS}, "decode gets the client's request plus the KV location"


async def test_chat_completions_cap_max_completion_tokens_on_prefill(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 50}
    status, _ = await route.post(body, path="/v1/chat/completions")
    assert status == 200
    assert engines["prefill"].received[0]["max_completion_tokens"] == 1
    assert engines["decode"].received[0]["max_completion_tokens"] == 50


async def test_decode_engines_take_turns(engines: dict[str, FakeEngine], route: RouterUnderTest) -> None:
    for _ in range(4):
        assert (await route.post({"prompt": "a"}))[0] == 200
    assert len(engines["decode"].received) == len(engines["decode2"].received) == 2


async def test_a_stream_is_passed_through_chunk_by_chunk(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/event-stream"
        await response.prepare(request)
        for token in ("a", "b", "c"):
            await response.write(f"data: {json.dumps({'choices': [{'text': token}]})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    engines["decode"].behaviour = lambda body: stream
    status, text = await route.post({"prompt": "x", "stream": True})
    assert status == 200
    assert text.count("data: ") == 4 and text.endswith("data: [DONE]\n\n")
    assert engines["prefill"].received[0]["stream"] is False


async def test_an_invalid_body_is_a_400(route: RouterUnderTest) -> None:
    status, answer = await route.post([1, 2])
    assert status == 400 and answer["error"]["type"] == "invalid_request"


async def test_a_prefill_client_error_is_passed_through_as_the_engine_wrote_it(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    message = {"error": {"message": "This model's maximum context length is 4096 tokens", "code": 400}}
    engines["prefill"].behaviour = lambda body: web.json_response(message, status=400)
    status, answer = await route.post({"prompt": "x" * 10})
    assert (status, answer) == (400, message)
    assert engines["decode"].received == [] and engines["decode2"].received == []


async def test_a_failing_prefill_role_is_a_502_naming_it(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    engines["prefill"].behaviour = lambda body: web.Response(status=500, text="boom")
    status, answer = await route.post({"prompt": "x"})
    assert status == 502
    assert answer["error"]["type"] == "prefill_http_500" and "prefill engine" in answer["error"]["message"]
    assert len(engines["prefill"].received) == 3, "retried (--retries 2) before giving up"


async def test_a_prefill_that_does_not_answer_in_time_is_a_504(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    async def slow(body: dict[str, Any]) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    engines["prefill"].behaviour = slow
    route.router.options = RouterOptions(**{**route.router.options.__dict__, "retries": 0})
    status, answer = await route.post({"prompt": "x"})
    assert status == 504 and answer["error"]["type"] == "prefill_timeout"


async def test_a_decode_client_error_is_passed_through(engines: dict[str, FakeEngine], route: RouterUnderTest) -> None:
    engines["decode"].behaviour = lambda body: web.json_response({"error": {"message": "bad"}}, status=422)
    status, answer = await route.post({"prompt": "x"})
    assert (status, answer) == (422, {"error": {"message": "bad"}})


async def test_a_restarting_decode_engine_is_retried_on_the_other(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    engines["decode"].behaviour = lambda body: web.Response(status=503, text="starting")
    status, answer = await route.post({"prompt": "x"})
    assert status == 200 and answer["choices"][0]["text"] == f"decoded by {engines['decode2'].url}"
    assert engines["decode2"].received[0]["kv_transfer_params"] == KV_PARAMS, "the retry carries the KV location"


async def test_a_decode_pod_gone_mid_flight_is_retried_never_hung(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    async def die(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()  # the pod is killed while the request is in it: no answer at all
        return web.Response()

    engines["decode"].behaviour = lambda body: die
    status, answer = await asyncio.wait_for(route.post({"prompt": "x"}), timeout=10)
    assert status == 200 and answer["choices"][0]["text"] == f"decoded by {engines['decode2'].url}"
    await engines["decode"].stop()  # and is gone while it restarts: every next request still gets an answer
    for _ in range(3):
        status, _ = await asyncio.wait_for(route.post({"prompt": "y"}), timeout=10)
        assert status == 200


async def test_all_decode_engines_gone_is_a_502_not_a_hang(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    await engines["decode"].stop()
    await engines["decode2"].stop()
    status, answer = await asyncio.wait_for(route.post({"prompt": "x"}), timeout=10)
    assert status == 502 and answer["error"]["type"] == "decode_unreachable"


async def test_a_stream_cut_after_its_first_byte_ends_with_an_error_event(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/event-stream"
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        assert request.transport is not None
        request.transport.close()  # the decode pod dies mid-stream
        return response

    engines["decode"].behaviour = lambda body: cut
    status, text = await asyncio.wait_for(route.post({"prompt": "x", "stream": True}), timeout=10)
    assert status == 200
    assert text.startswith('data: {"choices"') and "decode_interrupted" in text


async def test_metrics_and_readiness(engines: dict[str, FakeEngine], route: RouterUnderTest) -> None:
    await route.post({"prompt": "x"})
    engines["prefill"].behaviour = lambda body: web.Response(status=500)
    await route.post({"prompt": "x"})
    async with aiohttp.ClientSession() as session:
        async with session.get(route.metrics_url + "/metrics") as response:
            text = await response.text()
        async with session.get(route.metrics_url + "/readyz") as response:
            assert response.status == 200 and await response.json() == {"prefill": True, "decode": True}
    assert 'npu_router_requests_total{code="200",endpoint="/v1/completions"} 1.0' in text
    assert 'npu_router_requests_total{code="502",endpoint="/v1/completions"} 1.0' in text
    assert 'npu_router_backend_errors_total{reason="http_500",role="prefill"} 3.0' in text
    assert 'npu_router_retries_total{role="prefill"} 2.0' in text
    await engines["prefill"].stop()
    async with aiohttp.ClientSession() as session, session.get(route.metrics_url + "/readyz") as response:
        assert response.status == 503 and (await response.json())["prefill"] is False


def test_the_route_arguments_parse_back() -> None:
    decode = ("http://d:8000", "http://e:8000")
    options = RouterOptions(prefill=("http://p:8000",), decode=decode, timeout=30, retries=1)
    assert parse_route_args(route_argv(options)) == options
    elsewhere = RouterOptions(
        prefill=("http://p:8000",), decode=decode, host="127.0.0.1", connect_timeout=2.5, timeout=30, retries=1
    )
    argv = route_argv(elsewhere)
    assert parse_route_args(argv) == elsewhere
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--connect-timeout") + 1] == "2.5"
    assert "--host" not in route_argv(options) and "--connect-timeout" not in route_argv(options)  # defaults


def test_the_router_s_series_are_the_specs_in_metrics() -> None:
    from npu_runtime import metrics
    from npu_runtime.routing.router import Metrics

    collected = {family.name: family for family in Metrics().registry.collect()}
    for spec in metrics.ROUTER_METRICS:
        family = collected.pop(spec.family_name)
        assert (family.type, family.documentation) == (spec.kind, spec.help)
    assert not collected

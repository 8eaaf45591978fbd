"""The prefill/decode router against fake engines: the two-step flow, what each engine receives,
streaming, engine errors passed on as the engine wrote them, the command-line contract, metrics.

Load balancing and failures are in test_balancing.py, timeouts in test_timeouts.py, the trust rules
and limits in test_trust.py, the OpenAI SDK through the router in test_openai_sdk.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from npu_runtime.routing.options import RouterOptions, parse_route_args, route_argv
from npu_runtime.routing.router import PREFILL_KV_PARAMS

from tests.runtime.routing.conftest import KV_PARAMS, FakeEngine, RouterUnderTest, streamer


async def test_a_completion_is_prefilled_with_one_token_then_decoded_with_the_returned_kv_params(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    body = {"model": "m", "prompt": "hello", "max_tokens": 20, "stream": False, "stream_options": {"x": 1}}
    status, answer = await route.post(body)
    assert status == 200, answer
    assert answer["choices"][0]["text"].startswith("decoded by ")
    [prefill] = engines["prefill"].received
    assert prefill["max_tokens"] == 1 and prefill["min_tokens"] == 1 and prefill["stream"] is False
    assert prefill["kv_transfer_params"] == PREFILL_KV_PARAMS and "stream_options" not in prefill
    assert prefill["prompt"] == "hello"
    [decode] = engines["decode"].received + engines["decode2"].received
    assert decode == {**body, "kv_transfer_params": KV_PARAMS}, "decode gets the client's request plus the KV location"


async def test_chat_completions_cap_max_completion_tokens_on_prefill(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 50}
    status, _ = await route.post(body, path="/v1/chat/completions")
    assert status == 200
    assert engines["prefill"].received[0]["max_completion_tokens"] == 1
    [decode] = engines["decode"].received + engines["decode2"].received
    assert decode["max_completion_tokens"] == 50


async def test_a_stream_is_passed_through_chunk_by_chunk(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    for name in ("decode", "decode2"):
        engines[name].behaviour = lambda body: streamer(body, ["a", "b", "c"])
    status, text = await route.post({"prompt": "x", "stream": True})
    assert status == 200
    assert text.count("data: ") == 4 and text.endswith("data: [DONE]\n\n")
    assert engines["prefill"].received[0]["stream"] is False


async def test_an_invalid_body_is_a_400(route: RouterUnderTest) -> None:
    status, answer = await route.post([1, 2])
    assert status == 400 and answer["error"]["type"] == "invalid_request"
    status, answer = await route.post(data=b"{not json")
    assert status == 400 and answer["error"]["type"] == "invalid_request"


async def test_json_nested_too_deeply_for_python_is_a_400_not_a_traceback(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    status, answer = await route.post(data=b"[" * 100_000 + b"]" * 100_000)
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request" and "deep" in answer["error"]["message"]
    status, answer = await route.post(data=b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400, answer
    assert engines["prefill"].received == []


async def test_a_prefill_client_error_is_passed_through_as_the_engine_wrote_it(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    message = {"error": {"message": "This model's maximum context length is 4096 tokens", "code": 400}}
    engines["prefill"].behaviour = lambda body: web.json_response(message, status=400)
    status, answer = await route.post({"prompt": "x" * 10})
    assert (status, answer) == (400, message)
    assert engines["decode"].received == [] and engines["decode2"].received == []


async def test_an_engine_500_goes_back_with_its_own_text_and_is_not_retried(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    error = {"error": {"message": "EngineCore hit an internal error: index out of range", "code": 500}}
    engines["prefill"].behaviour = lambda body: web.json_response(error, status=500)
    status, answer = await route.post({"prompt": "x"})
    assert (status, answer) == (500, error)
    assert len(engines["prefill"].received) == 1, "a 500 would fail again: not retried"
    assert await route.sample("npu_router_engine_out", role="prefill") == 0, "an answer, not a failed engine"
    # Plain text (a proxy's or a crash page) keeps its text, as JSON: never the engine's content type.
    engines["prefill"].behaviour = lambda body: web.Response(status=500, text="Internal Server Error: boom")
    async with aiohttp.ClientSession() as session, session.post(route.url + "/v1/completions", json={}) as response:
        assert response.status == 500 and response.content_type == "application/json"
        answer = await response.json()
    assert "Internal Server Error: boom" in answer["error"]["message"]
    assert answer["error"]["type"] == "prefill_http_500"


async def test_an_engine_error_page_never_keeps_its_content_type(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    page = "<html><script>alert(1)</script></html>"
    for name in ("decode", "decode2"):
        engines[name].behaviour = lambda body: web.Response(status=404, text=page, content_type="text/html")
    async with aiohttp.ClientSession() as session, session.post(route.url + "/v1/completions", json={}) as response:
        assert response.status == 404 and response.content_type == "application/json"
        answer = await response.json()
    assert answer["error"]["message"].endswith(page) and answer["error"]["type"] == "decode_http_404"


async def test_a_decode_client_error_is_passed_through(engines: dict[str, FakeEngine], route: RouterUnderTest) -> None:
    for name in ("decode", "decode2"):
        engines[name].behaviour = lambda body: web.json_response({"error": {"message": "bad"}}, status=422)
    status, answer = await route.post({"prompt": "x"})
    assert (status, answer) == (422, {"error": {"message": "bad"}})


async def test_a_non_streamed_answer_cut_mid_way_is_seen_as_cut(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/json"
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b'{"choices": [{"text": "a')
        await asyncio.sleep(0.2)
        assert request.transport is not None
        request.transport.close()
        return response

    for name in ("decode", "decode2"):
        engines[name].behaviour = lambda body: cut
    async with aiohttp.ClientSession() as session, session.post(route.url + "/v1/completions", json={}) as response:
        assert response.status == 200
        try:
            await asyncio.wait_for(response.read(), timeout=10)
        except aiohttp.ClientPayloadError:
            pass
        else:
            raise AssertionError("a cut answer must not read as a whole one")


async def test_models_come_from_a_decode_engine(route: RouterUnderTest) -> None:
    async with aiohttp.ClientSession() as session, session.get(route.url + "/v1/models") as response:
        assert response.status == 200 and (await response.json())["data"][0]["id"] == "m"


async def test_metrics_and_readiness_are_on_the_ops_port_only(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    await route.post({"prompt": "x"})
    engines["prefill"].behaviour = lambda body: web.Response(status=503)
    status, answer = await route.post({"prompt": "x"})
    assert status == 502 and answer["error"]["type"] == "prefill_http_503"
    text = await route.metrics()
    assert 'npu_router_requests_total{code="200",endpoint="/v1/completions"} 1.0' in text
    assert 'npu_router_requests_total{code="502",endpoint="/v1/completions"} 1.0' in text
    assert 'npu_router_backend_errors_total{reason="http_503",role="prefill"} 1.0' in text
    assert f'npu_router_engine_requests_total{{engine="{engines["prefill"].url}",role="prefill"}} 2.0' in text
    assert f'npu_router_engine_out{{engine="{engines["prefill"].url}",role="prefill"}} 1.0' in text
    assert "npu_router_in_flight 0.0" in text
    async with aiohttp.ClientSession() as session:
        async with session.get(route.metrics_url + "/readyz") as response:
            assert response.status == 200 and await response.json() == {"prefill": True, "decode": True}
        async with session.get(route.url + "/metrics") as response:
            assert response.status == 404, "the client port serves no metrics"
        async with session.get(route.url + "/health") as response:
            assert response.status == 200
    await engines["prefill"].stop()
    async with aiohttp.ClientSession() as session, session.get(route.metrics_url + "/readyz") as response:
        assert response.status == 503 and (await response.json())["prefill"] is False


def test_the_route_arguments_parse_back() -> None:
    decode = ("http://d:8000", "http://e:8000")
    options = RouterOptions(prefill=("http://p:8000",), decode=decode, first_byte_timeout=30, retries=1)
    assert parse_route_args(route_argv(options)) == options
    everything: dict[str, Any] = {
        "host": "127.0.0.1",
        "connect_timeout": 2.5,
        "idle_timeout": 20.0,
        "eject_seconds": 1.5,
        "resolve_seconds": 0.0,
        "max_in_flight": 64,
        "max_request_bytes": 1000,
        "max_buffered_bytes": 5000,
        "kv_host_networks": ("10.0.0.0/8", "fd00::/8"),
    }
    elsewhere = RouterOptions(prefill=("http://p:8000",), decode=decode, first_byte_timeout=30, retries=1, **everything)
    argv = route_argv(elsewhere)
    assert parse_route_args(argv) == elsewhere
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--connect-timeout") + 1] == "2.5"
    defaults = route_argv(options)
    assert [arg for arg in defaults if arg.startswith("--")] == [
        "--prefill", "--decode", "--decode", "--port", "--metrics-port", "--first-byte-timeout", "--retries"
    ]  # fmt: skip
    # The old name still parses, for a Deployment rendered before --first-byte-timeout.
    old = parse_route_args(["--prefill", "http://p", "--decode", "http://d", "--timeout", "45"])
    assert old.first_byte_timeout == 45


def test_the_router_s_series_are_the_specs_in_metrics() -> None:
    from npu_runtime import metrics
    from npu_runtime.routing.router import Router

    router = Router(RouterOptions(prefill=("http://127.0.0.1:1",), decode=("http://127.0.0.1:2",)))
    collected = {family.name: family for family in router.metrics.registry.collect()}
    for spec in metrics.ROUTER_METRICS:
        family = collected.pop(spec.family_name)
        assert (family.type, family.documentation) == (spec.kind, spec.help)
    assert not collected


async def test_a_connection_the_engine_closed_as_the_call_began_is_tried_once_more_on_a_new_one(
    engines: dict[str, FakeEngine], make_router: Any
) -> None:
    """One decode engine that drops the connection of its first call without answering (as vLLM's
    API server drops a kept-alive connection whose idle time ran out): the call is made again on a new
    connection to the same engine, and the client never sees it."""
    decode = engines["decode"]
    dropped: list[int] = []

    def drop_first(body: dict[str, Any]) -> Any:
        if dropped:
            return decode.answer(body)
        dropped.append(1)

        async def close(request: web.Request) -> web.StreamResponse:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("dropped")

        return close

    decode.behaviour = drop_first
    route = await make_router(prefill=(engines["prefill"].url,), decode=(decode.url,), connect_timeout=2.0)
    status, answer = await route.post({"model": "m", "prompt": "hello", "max_tokens": 4})
    assert status == 200, answer
    assert len(decode.received) == 2 and dropped == [1]
    assert await route.sample("npu_router_backend_errors_total", role="decode") == 0

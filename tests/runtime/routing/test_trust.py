"""The router's trust rules (docs/security.md, "The P/D router"): the KV parameters decode gets come
from prefill only and are checked; no redirect is followed; bodies and requests in flight are bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from npu_runtime.routing import trust
from npu_runtime.routing.router import PREFILL_KV_PARAMS

from tests.runtime.routing.conftest import KV_PARAMS, FakeEngine, RouterUnderTest, completion, eventually

FORGED_HOST = "169.254.169.254"


def allow_only(*hosts: str) -> trust.AddressCheck:
    return lambda host: host in hosts


# --- kv_transfer_params ----------------------------------------------------------------------------


async def test_a_client_s_kv_transfer_params_never_reach_an_engine(
    engines: dict[str, FakeEngine], route: RouterUnderTest
) -> None:
    # ExampleConnector and the Mooncake connectors answer without kv_transfer_params in some cases:
    # decode must then get none, not the client's.
    engines["prefill"].behaviour = lambda body: web.json_response({"choices": [{"text": "x"}]})
    forged = {**KV_PARAMS, "remote_host": FORGED_HOST, "remote_port": 80}
    status, _ = await route.post({"prompt": "x", "kv_transfer_params": forged})
    assert status == 200
    assert engines["prefill"].received[0]["kv_transfer_params"] == PREFILL_KV_PARAMS
    [decode] = engines["decode"].received + engines["decode2"].received
    assert "kv_transfer_params" not in decode


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"remote_host": FORGED_HOST}, "kv_params_foreign_host"),
        ({"remote_host": "metadata.google.internal"}, "kv_params_foreign_host"),
        ({"remote_multi_nodes_meta_mapping": {"0": {"host": FORGED_HOST, "engine_id": "e"}}}, "kv_params_foreign_host"),
        ({"remote_port": 0}, "kv_params_invalid"),
        ({"remote_block_ids": [[1, "2"]]}, "kv_params_invalid"),
        ({"remote_engine_id": "x" * 1000}, "kv_params_invalid"),
        ({"callback_url": "http://10.0.0.1/"}, "kv_params_unknown_key"),
    ],
)
async def test_prefill_kv_params_that_fail_a_check_are_not_passed_to_decode(
    engines: dict[str, FakeEngine], route: RouterUnderTest, change: dict[str, Any], reason: str
) -> None:
    params = {**KV_PARAMS, **change}
    engines["prefill"].behaviour = lambda body: web.json_response(
        {"choices": [{"text": "x"}], "kv_transfer_params": params}
    )
    status, _ = await route.post({"prompt": "x"})
    assert status == 200, "decode computes the prompt itself"
    [decode] = engines["decode"].received + engines["decode2"].received
    assert "kv_transfer_params" not in decode
    assert await route.sample("npu_router_backend_errors_total", role="prefill", reason=reason) == 1


async def test_kv_params_naming_a_trusted_network_pass(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    params = {**KV_PARAMS, "remote_host": "10.1.2.3", "remote_multi_nodes_meta_mapping": {"1": {"host": "10.1.2.4"}}}
    engines["prefill"].behaviour = lambda body: web.json_response(
        {"choices": [{"text": "x"}], "kv_transfer_params": params}
    )
    route = await make_router(
        prefill=(engines["prefill"].url,), decode=(engines["decode"].url,), kv_host_networks=("10.0.0.0/8",)
    )
    assert (await route.post({"prompt": "x"}))[0] == 200
    assert engines["decode"].received[0]["kv_transfer_params"] == params


def test_the_kv_params_checks() -> None:
    local = allow_only("127.0.0.1")
    assert trust.check_kv_params(None, local) is None and trust.check_kv_params({}, local) is None
    assert trust.check_kv_params(KV_PARAMS, local) == KV_PARAMS
    assert trust.check_kv_params({**KV_PARAMS, "remote_block_ids": [1, 2]}, local)
    for bad in ([1], {**KV_PARAMS, "do_remote_decode": True}, {**KV_PARAMS, "remote_port": True}):
        with pytest.raises(trust.Refused):
            trust.check_kv_params(bad, local)
    without = {key: value for key, value in KV_PARAMS.items() if key != "remote_host"}
    with pytest.raises(trust.Refused, match="lacks"):
        trust.check_kv_params(without, local)
    too_many = {**KV_PARAMS, "remote_block_ids": [list(range(1 << 10))] * ((1 << 10) + 1)}
    with pytest.raises(trust.Refused, match="remote_block_ids"):
        trust.check_kv_params(too_many, local)
    names = trust.address_check(frozenset, ())
    assert not names("localhost") and not names("127.0.0.1")


# --- redirects -------------------------------------------------------------------------------------


@pytest.fixture
async def internal() -> AsyncIterator[FakeEngine]:
    """A service the router must never be made to call."""
    engine = FakeEngine("decode")
    await engine.start()
    yield engine
    await engine.stop()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_no_engine_redirect_is_followed(
    engines: dict[str, FakeEngine], route: RouterUnderTest, internal: FakeEngine, status: int
) -> None:
    def redirect(body: dict[str, Any]) -> web.Response:
        return web.Response(status=status, headers={"Location": internal.url + "/v1/completions"})

    engines["prefill"].behaviour = redirect
    answer_status, answer = await route.post({"prompt": "secret prompt"})
    assert answer_status == 502 and answer["error"]["type"] == "prefill_redirect"
    engines["prefill"].behaviour = engines["prefill"].answer
    for name in ("decode", "decode2"):
        engines[name].behaviour = redirect
    answer_status, answer = await route.post({"prompt": "secret prompt"})
    assert answer_status == 502 and answer["error"]["type"] == "decode_redirect"
    assert internal.received == []


# --- limits ----------------------------------------------------------------------------------------


async def test_a_request_body_over_its_limit_is_a_413(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    route = await make_router(
        prefill=(engines["prefill"].url,), decode=(engines["decode"].url,), max_request_bytes=10_000
    )
    status, answer = await route.post({"prompt": "x" * 20_000})
    assert status == 413 and answer["error"]["type"] == "request_too_large"

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted while it is read
        yield b'{"prompt": "'
        for _ in range(30):
            yield b"x" * 1000
        yield b'"}'

    status, answer = await route.post(data=chunked())
    assert status == 413
    assert engines["prefill"].received == []
    assert route.router.budget.used == 0


async def test_bodies_held_at_once_are_bounded_503_beyond(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    release = asyncio.Event()

    async def held(body: dict[str, Any]) -> web.Response:
        await release.wait()
        return completion(body, "x")

    engines["decode"].behaviour = held
    route = await make_router(
        prefill=(engines["prefill"].url,),
        decode=(engines["decode"].url,),
        max_request_bytes=80_000,
        max_buffered_bytes=100_000,
    )
    first = asyncio.ensure_future(route.post({"prompt": "x" * 70_000}))
    await eventually(lambda: len(engines["decode"].received) == 1)
    assert route.router.budget.used >= 70_000
    status, answer = await route.post({"prompt": "y" * 70_000})
    assert status == 503 and answer["error"]["type"] == "router_full"
    small = asyncio.ensure_future(route.post({"prompt": "small"}))
    await eventually(lambda: len(engines["decode"].received) == 2)
    release.set()
    assert (await first)[0] == 200 and (await small)[0] == 200
    assert route.router.budget.used == 0


async def test_requests_over_max_in_flight_get_503(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    release = asyncio.Event()

    async def held(body: dict[str, Any]) -> web.Response:
        await release.wait()
        return completion(body, "x")

    engines["decode"].behaviour = held
    route = await make_router(prefill=(engines["prefill"].url,), decode=(engines["decode"].url,), max_in_flight=2)
    waiting = [asyncio.ensure_future(route.post({"prompt": "x"})) for _ in range(2)]
    await eventually(lambda: len(engines["decode"].received) == 2)
    async with aiohttp.ClientSession() as session, session.post(route.url + "/v1/completions", json={}) as response:
        assert response.status == 503 and response.headers["Retry-After"] == "1"
        assert (await response.json())["error"]["type"] == "router_full"
    release.set()
    assert [status for status, _ in await asyncio.gather(*waiting)] == [200, 200]
    assert (await route.post({"prompt": "x"}))[0] == 200


async def test_a_prefill_answer_over_its_limit_is_a_502(engines: dict[str, FakeEngine], route: RouterUnderTest) -> None:
    huge = {"choices": [{"text": "x" * (2 * trust.MAX_PREFILL_ANSWER_BYTES)}], "kv_transfer_params": KV_PARAMS}
    engines["prefill"].behaviour = lambda body: web.json_response(huge)
    status, answer = await route.post({"prompt": "x"})
    assert status == 502 and answer["error"]["type"] == "prefill_answer_too_large"
    assert route.router.budget.used == 0


async def test_an_engine_error_body_is_bounded(engines: dict[str, FakeEngine], route: RouterUnderTest) -> None:
    for name in ("decode", "decode2"):
        engines[name].behaviour = lambda body: web.Response(status=400, text="e" * (4 * trust.MAX_ERROR_BYTES))
    status, answer = await route.post({"prompt": "x"})
    assert status == 400
    message = answer["error"]["message"]
    assert message.endswith("[...]") and len(message) < 2 * trust.MAX_ERROR_TEXT

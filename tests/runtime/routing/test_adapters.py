"""LoRA adapters through the router: a request for an adapter goes only to the engines that list it in
/v1/models, on both roles; a model no engine serves is vLLM's own 404; an engine that unloaded an
adapter is dropped for it and the call retried on another holder.

The fake engines answer /v1/models and the 404 with vLLM 0.31's own protocol classes
(vllm/entrypoints/serve/engine/protocol.py ModelList, ModelCard; create_error_response), so the
shapes the router reads are the real ones.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import pytest
from aiohttp import web
from npu_runtime.routing import lora, trust
from npu_runtime.routing.engines import Listing, Pool
from npu_runtime.routing.errors import Answer
from npu_runtime.routing.router import Router
from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList, ModelPermission
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

from tests.runtime.routing.conftest import FakeEngine, RouterUnderTest, eventually

BASE = "m"
ONCE = 3600.0  # --resolve-seconds: the engines are asked once, at start, in the tests that need a fixed view


def vllm_not_found(model: str) -> dict[str, Any]:
    """vLLM's answer to a model it does not serve (serving.py `_check_model`)."""
    error = create_error_response(
        message=f"The model `{model}` does not exist.",
        err_type="NotFoundError",
        status_code=HTTPStatus.NOT_FOUND,
        param="model",
    )
    return error.model_dump()


class LoraEngine(FakeEngine):
    """A fake engine serving the base model and the adapters in `adapters` (changed as a test goes)."""

    def __init__(self, role: str, adapters: set[str]) -> None:
        super().__init__(role)
        self.adapters = adapters

    async def models(self, _: web.Request) -> web.Response:
        cards = [ModelCard(id=BASE, root="/models/m", permission=[ModelPermission()])]
        cards += [ModelCard(id=name, root=f"/adapters/{name}", parent=BASE) for name in sorted(self.adapters)]
        return web.json_response(ModelList(data=cards).model_dump())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body.get("model")
        if model not in (None, BASE) and model not in self.adapters:
            self.received.append(body)
            return web.json_response(vllm_not_found(model), status=404)
        return await super().completions(request)

    def models_seen(self) -> list[Any]:
        return [body.get("model") for body in self.received]


@pytest.fixture
async def lora_engines() -> Any:
    found: dict[str, LoraEngine] = {}
    for name in ("prefill", "prefill2", "decode", "decode2"):
        found[name] = LoraEngine(name.rstrip("2"), set())
        await found[name].start()
    yield found
    for engine in found.values():
        await engine.stop()


async def router_for(make_router: Any, engines: dict[str, LoraEngine], **options: Any) -> RouterUnderTest:
    """A router over the four engines, once it has asked every one what it serves."""
    route: RouterUnderTest = await make_router(
        prefill=(engines["prefill"].url, engines["prefill2"].url),
        decode=(engines["decode"].url, engines["decode2"].url),
        connect_timeout=2.0,
        first_byte_timeout=5.0,
        idle_timeout=5.0,
        **options,
    )
    await eventually(lambda: all(engine.listing is not None for engine in all_engines(route.router)))
    return route


def all_engines(router: Router) -> list[Any]:
    return [engine for pool in router.pools.values() for engine in pool.engines]


async def ask(route: RouterUnderTest, model: str, times: int = 1) -> list[tuple[int, Any]]:
    return [await route.post({"model": model, "prompt": "hi", "max_tokens": 4}) for _ in range(times)]


async def test_a_request_for_an_adapter_goes_only_to_the_engines_that_list_it(
    lora_engines: dict[str, LoraEngine], make_router: Any
) -> None:
    for name, adapters in (("prefill", {"sql"}), ("decode", {"sql"}), ("prefill2", {"chat"}), ("decode2", {"chat"})):
        lora_engines[name].adapters = adapters
    route = await router_for(make_router, lora_engines)
    assert all(status == 200 for status, _ in await ask(route, "sql", 4))
    assert all(status == 200 for status, _ in await ask(route, "chat", 4))
    assert lora_engines["prefill"].models_seen() == lora_engines["decode"].models_seen() == ["sql"] * 4
    assert lora_engines["prefill2"].models_seen() == lora_engines["decode2"].models_seen() == ["chat"] * 4
    assert await route.sample("npu_router_adapter_requests_total", adapter="sql") == 4
    assert all(status == 200 for status, _ in await ask(route, BASE, 4)), "the base model: any engine"
    assert await route.sample("npu_router_adapter_requests_total", adapter=BASE) == 0


async def test_with_pd_both_the_prefill_and_the_decode_engine_hold_the_adapter(
    lora_engines: dict[str, LoraEngine], make_router: Any
) -> None:
    lora_engines["prefill"].adapters = {"sql"}
    lora_engines["decode2"].adapters = {"sql"}
    lora_engines["decode"].adapters = {"chat"}  # a decode engine without it: never chosen for it
    route = await router_for(make_router, lora_engines)
    assert all(status == 200 for status, _ in await ask(route, "sql", 4))
    assert lora_engines["prefill"].models_seen() == lora_engines["decode2"].models_seen() == ["sql"] * 4
    assert lora_engines["prefill2"].received == lora_engines["decode"].received == []
    # "chat" is on a decode engine but no prefill engine: no pair can answer it.
    [(status, answer)] = await ask(route, "chat")
    assert (status, answer) == (404, vllm_not_found("chat"))
    assert lora_engines["decode"].received == []


async def test_a_model_no_engine_serves_is_vllms_404_and_reaches_no_engine(
    lora_engines: dict[str, LoraEngine], make_router: Any
) -> None:
    lora_engines["prefill"].adapters = lora_engines["decode"].adapters = {"sql"}
    route = await router_for(make_router, lora_engines)
    [(status, answer)] = await ask(route, "sql-typo")
    assert (status, answer) == (404, vllm_not_found("sql-typo")), "vLLM's own shape, naming the model"
    assert not any(engine.received for engine in lora_engines.values())
    assert await route.sample("npu_router_adapter_requests_total", adapter="sql-typo") == 0


async def test_without_adapters_every_model_name_is_passed_on_as_before(
    lora_engines: dict[str, LoraEngine], make_router: Any
) -> None:
    route = await router_for(make_router, lora_engines)
    [(status, answer)] = await ask(route, "other")
    assert (status, answer) == (404, vllm_not_found("other")), "the engine's own 404, passed through"
    assert [len(lora_engines[name].received) for name in ("prefill", "prefill2")] in ([1, 0], [0, 1])


async def test_an_engine_that_unloaded_an_adapter_is_dropped_for_it_and_the_call_retried(
    lora_engines: dict[str, LoraEngine], make_router: Any
) -> None:
    for name in ("prefill", "decode", "decode2"):
        lora_engines[name].adapters = {"sql"}
    route = await router_for(make_router, lora_engines, resolve_seconds=ONCE)
    lora_engines["decode"].adapters = set()  # unloaded; the router has not asked again
    results = await ask(route, "sql", 4)
    assert [status for status, _ in results] == [200] * 4
    assert lora_engines["decode"].models_seen() == ["sql"], "asked once, answered 404, never again"
    assert lora_engines["decode2"].models_seen() == ["sql"] * 4
    assert lora_engines["prefill"].models_seen() == ["sql"] * 4, "the KV of the first prefill is reused"
    assert await route.sample("npu_router_backend_errors_total", role="decode", reason="adapter_missing") == 1
    assert await route.sample("npu_router_retries_total", role="decode") == 1
    # The last holder unloads it too: the client gets vLLM's 404, no 502.
    lora_engines["decode2"].adapters = set()
    [(status, answer)] = await ask(route, "sql")
    assert (status, answer) == (404, vllm_not_found("sql"))
    [(status, answer)] = await ask(route, "sql")
    assert (status, answer) == (404, vllm_not_found("sql")), "no holder left: answered by the router"
    assert lora_engines["decode2"].models_seen() == ["sql"] * 5


async def test_a_prefill_engine_that_unloaded_an_adapter_is_retried_on_another(
    lora_engines: dict[str, LoraEngine], make_router: Any
) -> None:
    for name in ("prefill", "prefill2", "decode"):
        lora_engines[name].adapters = {"sql"}
    route = await router_for(make_router, lora_engines, resolve_seconds=ONCE)
    lora_engines["prefill"].adapters = set()
    assert [status for status, _ in await ask(route, "sql", 3)] == [200] * 3
    assert lora_engines["prefill"].models_seen() == ["sql"]
    assert lora_engines["prefill2"].models_seen() == ["sql"] * 3


async def test_an_engine_back_from_an_ejection_is_asked_what_it_holds_before_it_gets_an_adapter(
    lora_engines: dict[str, LoraEngine], make_router: Any
) -> None:
    for name in ("prefill", "decode", "decode2"):
        lora_engines[name].adapters = {"sql"}
    route = await router_for(make_router, lora_engines, resolve_seconds=ONCE, eject_seconds=0.2)
    pool = route.router.pools["decode"]
    engine = next(engine for engine in pool.engines if engine.url == lora_engines["decode"].url)
    lora_engines["decode"].adapters = {"chat"}  # restarted with other adapters while out
    pool.eject(engine, "a test")
    await eventually(lambda: not engine.out_until)
    assert engine.listing == Listing(frozenset({BASE}), frozenset({"chat"}))
    assert all(status == 200 for status, _ in await ask(route, "sql", 3))
    assert lora_engines["decode"].received == []


def test_an_engine_not_asked_yet_gets_no_adapter_request_but_the_base_model() -> None:
    """A plain pool of engines, as the choice sees it: one asked (holding "sql"), one not asked yet."""
    pool = Pool("decode", ("http://10.0.0.1:8000", "http://10.0.0.2:8000"), batched=True)
    asked, new = pool.engines
    asked.listing = Listing(frozenset({BASE}), frozenset({"sql"}))
    assert {pool.pick(1.0, adapter="sql") for _ in range(4)} == {asked}
    assert {pool.pick(1.0) for _ in range(4)} == {asked, new}
    assert pool.pick(1.0, exclude={asked}, adapter="sql") is None
    assert lora.adapter_for("sql", [pool]) == "sql"
    assert lora.adapter_for(BASE, [pool]) is None
    with pytest.raises(Answer) as raised:
        lora.adapter_for("chat", [pool])
    assert raised.value.status == 404
    asked.listing = Listing(frozenset({BASE}), frozenset())
    assert lora.adapter_for("chat", [pool]) is None, "no engine lists adapters: any model name goes anywhere"


@pytest.mark.parametrize(
    ("answer", "listing"),
    [
        (
            ModelList(data=[ModelCard(id=BASE, root="/m"), ModelCard(id="a1", root="/a1", parent=BASE)]).model_dump(),
            Listing(frozenset({BASE}), frozenset({"a1"})),
        ),
        (ModelList(data=[ModelCard(id=BASE), ModelCard(id="alias")]).model_dump(), Listing(frozenset({BASE, "alias"}))),
        ({"object": "list", "data": [{"id": 3}, "x", {"id": "a", "parent": BASE}]}, Listing(adapters=frozenset({"a"}))),
        ({"data": "not a list"}, None),
        ([1, 2], None),
    ],
)
def test_an_engines_model_list_is_read_as_vllm_writes_it(answer: Any, listing: Listing | None) -> None:
    assert lora.parse_listing(trust.dump_json(answer)) == listing


def test_only_vllms_404_for_that_adapter_says_it_is_missing() -> None:
    def says(status: int, body: Any, adapter: str = "sql") -> bool:
        return lora.says_missing(Answer(status, trust.dump_json(body)), adapter)

    assert says(404, vllm_not_found("sql"))
    assert not says(404, vllm_not_found("sql2")), "another model's 404"
    assert not says(400, vllm_not_found("sql"))
    assert not says(404, {"detail": "Not Found"}), "a 404 that is not vLLM's (a wrong path)"
    assert trust.parse_json(lora.unknown_model("sql").body) == vllm_not_found("sql")

"""Fake engines and a router under test, on free ports of 127.0.0.1.

The fakes answer as vLLM's OpenAI server does for a P/D pair: the prefill engine returns its
`kv_transfer_params` (Mooncake's shape, its own address as `remote_host`), the decode engine
generates from them, streamed or not, in the OpenAI wire format (the SDK parses it).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from npu_runtime.routing.options import RouterOptions
from npu_runtime.routing.router import Router
from npu_runtime.routing.serve import app_runners

# Mooncake's request_finished shape (vllm-ascend v0.23.0), pointing at the fake prefill engine.
KV_PARAMS: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "p-0_dp0",
    "remote_request_id": "cmpl-1",
    "remote_host": "127.0.0.1",
    "remote_port": 30000,
    "remote_ptp_size": 1,
    "last_token_id": 42,
    "remote_multi_nodes_meta_mapping": {},
    "num_prompt_blocks": 1,
    "remote_block_size": 128,
}

Behaviour = Callable[[dict[str, Any]], Any]


def completion(body: dict[str, Any], text: str, tokens: int = 3) -> web.Response:
    """A non-streamed answer in the OpenAI shape of `body`'s endpoint (chat or completion)."""
    usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}
    if "messages" in body:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [choice],
                "usage": usage,
            }
        )
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    return web.json_response(
        {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}
    )


def event(body: dict[str, Any], piece: str, finish: str | None = None) -> bytes:
    if "messages" in body:
        chunk: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": finish}],
        }
    else:
        chunk = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": piece, "finish_reason": finish, "logprobs": None}],
        }
    return f"data: {json.dumps(chunk)}\n\n".encode()


def streamer(
    body: dict[str, Any],
    pieces: list[str],
    gap: float = 0.0,
    cut_after: int | None = None,
    stall_after: int | None = None,
) -> Callable[[web.Request], Any]:
    """A streaming handler: one SSE event per piece, `gap` seconds apart; optionally the connection
    closed (`cut_after` events) or silent for good (`stall_after` events); usage when asked."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/event-stream"
        await response.prepare(request)
        for index, piece in enumerate(pieces):
            if index == cut_after:
                await asyncio.sleep(0.2)  # what was sent arrives first; then the pod dies
                assert request.transport is not None
                request.transport.close()
                return response
            if index == stall_after:
                await asyncio.sleep(3600)
            if gap and index:
                await asyncio.sleep(gap)
            last = index == len(pieces) - 1
            await response.write(event(body, piece, "length" if last else None))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 5, "completion_tokens": len(pieces), "total_tokens": 5 + len(pieces)}
            chunk = {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [],
                "usage": usage,
            }
            if "messages" in body:
                chunk["object"] = "chat.completion.chunk"
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    return handler


def fake_tokens(text: str) -> list[int]:
    """The fake engines' tokenizer: one token per word, the same id for the same word."""
    return [sum(word.encode()) % 50_000 + 1 for word in text.split()]


def chat_text(messages: list[dict[str, Any]]) -> str:
    """The fake engines' chat template."""
    return " ".join(f"<{message['role']}> {message['content']}" for message in messages)


class FakeEngine:
    """One engine: records what it got, answers with `behaviour(request_body)`; /tokenize with
    `fake_tokens` (its requests in `tokenized`)."""

    def __init__(self, role: str, host: str = "127.0.0.1") -> None:
        self.role = role
        self.host = host
        self.tokenized: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.behaviour: Behaviour = self.answer
        self.healthy = True
        self.gone: list[str] = []  # requests whose client (the router) went away mid-answer
        self.url = ""
        self._runner: web.AppRunner | None = None

    def answer(self, body: dict[str, Any]) -> Any:
        if self.role == "prefill":
            return web.json_response({"choices": [{"text": "x"}], "kv_transfer_params": KV_PARAMS})
        if body.get("stream"):
            return streamer(body, ["decoded ", "by ", self.url])
        return completion(body, f"decoded by {self.url}")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        try:
            result = self.behaviour(body)
            if asyncio.iscoroutine(result):
                result = await result
            if callable(result):  # a streaming handler
                result = await result(request)
        except (asyncio.CancelledError, ConnectionError):
            self.gone.append(request.headers.get("X-Request-Id", ""))
            raise
        assert isinstance(result, web.StreamResponse)
        return result

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok") if self.healthy else web.Response(status=503)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.tokenized.append(body)
        text = chat_text(body["messages"]) if "messages" in body else body["prompt"]
        tokens = fake_tokens(text)
        return web.json_response({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class StoppedEngine:
    """An engine whose process is stopped (SIGSTOP, a hung node): the kernel still accepts its
    connections, nothing ever answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class RouterUnderTest:
    def __init__(self, router: Router, url: str, metrics_url: str) -> None:
        self.router, self.url, self.metrics_url = router, url, metrics_url

    async def post(
        self, body: Any = None, path: str = "/v1/completions", *, data: Any = None, seconds: float = 30
    ) -> tuple[int, Any]:
        limit = aiohttp.ClientTimeout(total=seconds)
        url = self.url + path
        kwargs: dict[str, Any] = {"data": data} if data is not None else {"json": body}
        async with aiohttp.ClientSession(timeout=limit) as session, session.post(url, **kwargs) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as session, session.get(self.metrics_url + "/metrics") as response:
            return await response.text()

    async def sample(self, name: str, **labels: str) -> float:
        """One series' value from /metrics (0 when absent)."""
        text = await self.metrics()
        for line in text.splitlines():
            match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
            if match is None:
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', match[1] or ""))
            if all(found.get(key) == value for key, value in labels.items()):
                return float(match[2])
        return 0.0


async def start_router(options: RouterOptions) -> tuple[RouterUnderTest, Callable[[], Any]]:
    router = Router(options)
    await router.start()
    runners = app_runners(router)
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
async def engines() -> AsyncIterator[dict[str, FakeEngine]]:
    found = {name: FakeEngine(name.rstrip("0123456789")) for name in ("prefill", "prefill2", "decode", "decode2")}
    for engine in found.values():
        await engine.start()
    yield found
    for engine in found.values():
        await engine.stop()


@pytest.fixture
async def route(engines: dict[str, FakeEngine]) -> AsyncIterator[RouterUnderTest]:
    """One prefill engine, two decode engines, short timeouts."""
    options = RouterOptions(
        prefill=(engines["prefill"].url,),
        decode=(engines["decode"].url, engines["decode2"].url),
        first_byte_timeout=2.0,
        idle_timeout=2.0,
        connect_timeout=2.0,
    )
    under_test, stop = await start_router(options)
    yield under_test
    await stop()


@pytest.fixture
async def make_router() -> AsyncIterator[Callable[..., Any]]:
    """A router with the options given; stopped at the end of the test."""
    stops: list[Callable[[], Any]] = []

    async def make(**options: Any) -> RouterUnderTest:
        under_test, stop = await start_router(RouterOptions(**options))
        stops.append(stop)
        return under_test

    yield make
    for stop in stops:
        await stop()


async def eventually(check: Callable[[], Any], seconds: float = 10.0) -> None:
    """Wait until `check()` is true (or returns an awaitable of true), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.05)

"""The OpenAI SDK through the router: completions, chat, streaming with usage, and the errors a
client must see as errors (an engine's 500 with its text, a stream cut mid-way)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from tests.runtime.routing.conftest import FakeEngine, RouterUnderTest, streamer

openai = pytest.importorskip("openai")


@pytest.fixture
async def client(route: RouterUnderTest) -> AsyncIterator[Any]:
    sdk = openai.AsyncOpenAI(base_url=route.url + "/v1", api_key="test", max_retries=0, timeout=30)
    yield sdk
    await sdk.close()


async def test_completions_and_chat(engines: dict[str, FakeEngine], client: Any) -> None:
    completion = await client.completions.create(model="m", prompt="hello", max_tokens=3)
    assert completion.choices[0].text.startswith("decoded by ") and completion.usage.completion_tokens == 3
    chat = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.choices[0].message.content.startswith("decoded by ") and chat.usage.total_tokens == 8
    assert [body["max_tokens"] for body in engines["prefill"].received] == [1, 1]


async def test_streams_with_usage(client: Any) -> None:
    stream = await client.completions.create(
        model="m", prompt="hello", max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices).startswith("decoded by ")
    assert chunks[-1].usage.completion_tokens == 3
    chat = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = [chunk async for chunk in chat]
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices).startswith("decoded by ")
    assert pieces[-1].usage.completion_tokens == 3


async def test_an_engine_500_raises_with_the_engine_s_message(engines: dict[str, FakeEngine], client: Any) -> None:
    error = {"error": {"message": "the engine's own reason", "type": "InternalServerError", "code": 500}}
    engines["prefill"].behaviour = lambda body: web.json_response(error, status=500)
    with pytest.raises(openai.InternalServerError, match="the engine's own reason"):
        await client.completions.create(model="m", prompt="hello", max_tokens=3)


async def test_a_stream_cut_mid_way_raises(engines: dict[str, FakeEngine], client: Any) -> None:
    for name in ("decode", "decode2"):
        engines[name].behaviour = lambda body: streamer(body, ["a", "b", "c", "d"], cut_after=2)
    stream = await client.completions.create(model="m", prompt="hello", max_tokens=4, stream=True)
    seen: list[str] = []

    async def read() -> None:
        async for chunk in stream:
            seen.append(chunk.choices[0].text)

    with pytest.raises(openai.APIError, match="failed mid-answer"):
        await read()
    assert seen == ["a", "b"]

"""Relaying a decode engine's answer to the client as it comes: the answer opened with the
engine's status and type, each chunk passed on within `--idle-timeout` of the last (its tokens
counted down from the request's work), and an answer cut mid-way ended so that the client sees
the cut: a stream with an SSE error event, any other answer by closing the connection early.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from npu_runtime.routing import trust
from npu_runtime.routing.engines import Engine, Ticket
from npu_runtime.routing.errors import ClientGone, Failure

if TYPE_CHECKING:
    from aiohttp import ClientResponse, web


async def open_answer(request: web.Request, answer: ClientResponse, events: bool) -> web.StreamResponse:
    """The client's answer, started with the engine's status and content type."""
    from aiohttp import web

    client = web.StreamResponse(status=answer.status)
    client.content_type = answer.content_type
    if not events and answer.content_length is not None:
        client.content_length = answer.content_length  # so that a cut answer is seen as one
    try:
        await client.prepare(request)
    except ConnectionError:
        raise ClientGone(client) from None
    return client


async def pass_through(
    engine: Engine,
    ticket: Ticket,
    answer: ClientResponse,
    client: web.StreamResponse,
    first: bytes,
    events: bool,
    idle: float,
) -> int:
    """The rest of the engine's answer to the client, each chunk within `idle` seconds of the last
    (--idle-timeout); returns the tokens seen (SSE events, or a non-streamed answer's
    completion_tokens). A `Failure` here is not yet counted against `engine`."""
    import aiohttp

    loop = asyncio.get_running_loop()
    content = answer.content
    seen = 0
    tail = b""
    chunk = first
    try:
        async with asyncio.timeout(None) as deadline:
            while chunk:
                if events:
                    count = chunk.count(b"data:")
                    seen += count
                    ticket.progress(count)
                else:
                    tail = (tail + chunk)[-256:]
                try:
                    await client.write(chunk)
                except ConnectionError:
                    raise ClientGone(client) from None
                deadline.reschedule(loop.time() + idle)
                chunk = await content.readany()
                deadline.reschedule(None)
    except TimeoutError:
        message = f"at {engine.url} sent nothing for {idle:g} s (--idle-timeout)"
        raise Failure("decode", 504, "no_progress", message, retry=False, eject=True) from None
    except aiohttp.ClientError as exc:
        message = f"at {engine.url} failed mid-answer: {exc}"
        raise Failure("decode", 502, "interrupted", message, retry=False, eject=True) from None
    try:
        await client.write_eof()
    except ConnectionError:
        raise ClientGone(client) from None
    return seen if events else completion_tokens(tail)


async def end_cut_answer(client: web.StreamResponse, message: str, events: bool) -> None:
    """End an answer whose engine failed mid-way: a stream with an SSE error event (the OpenAI SDK
    raises it); any other answer by closing the connection before its declared length."""
    with contextlib.suppress(Exception):
        if events:
            event = trust.dump_json({"error": {"message": message, "type": "decode_interrupted"}})
            await client.write(b"data: " + event + b"\n\n")
            await client.write_eof()
        else:
            client.force_close()


def completion_tokens(tail: bytes) -> int:
    """`usage.completion_tokens` from the end of a non-streamed answer (0 when it is not there)."""
    at = tail.rfind(b'"completion_tokens":')
    if at < 0:
        return 0
    digits = tail[at + 20 :].lstrip()[:12]
    end = 0
    while end < len(digits) and digits[end : end + 1].isdigit():
        end += 1
    return int(digits[:end]) if end else 0

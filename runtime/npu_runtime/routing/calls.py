"""One call to an engine, each wait bounded by progress: the POST, its answer's start, its first
chunk, a whole non-streamed answer, an error status, whether the engine is alive (/health), what
it serves (/v1/models: its base model and LoRA adapters, lora.py), and a prompt's token ids
(/tokenize, for the cache-aware choice, choice.py).

Timeouts bound progress, never a generation: connecting (`--connect-timeout`), the start of an
answer (`--first-byte-timeout`: prefill's answer, a stream's first chunk), the silence between two
chunks of a stream (`--idle-timeout`, streaming.py). A non-streamed decode answer starts only when
it is done, so there the router checks that the engine is alive instead: after each
`--idle-timeout` of silence its `/health` must answer 200 within `--connect-timeout` (so it does
while waiting for any answer to start). Redirects are never followed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final, TypeVar

from npu_runtime.routing import lora, trust
from npu_runtime.routing.engines import Engine, Listing
from npu_runtime.routing.errors import Answer, Failure, router_full
from npu_runtime.routing.options import RouterOptions

if TYPE_CHECKING:
    from aiohttp import ClientResponse, ClientSession

# Statuses that mean "this engine cannot answer now" (a restarting pod, a proxy in the way): another
# engine may. Every other error status is the engine's answer to this request, passed on.
RETRIED_STATUSES: Final = frozenset({502, 503, 504})
# Kept-alive connections to an engine are dropped after this idle time, before vLLM's API server drops
# them itself (uvicorn's timeout_keep_alive, VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default: vllm/envs.py),
# so that a call seldom starts on a connection the engine is closing (`start` retries that one once).
KEEPALIVE_SECONDS: Final = 4.0
MAX_TOKENIZE_BYTES: Final = 64 << 20  # a /tokenize answer: ids of a prompt of --max-request-bytes

T = TypeVar("T")


class EngineCalls:
    """The calls to all engines, on one aiohttp client session (`open` first)."""

    def __init__(self, options: RouterOptions) -> None:
        self.options = options
        self._session: ClientSession | None = None

    async def open(self) -> None:
        import aiohttp

        # No total limit on a call: the flow bounds each wait itself. No connection limit: the
        # engines' own queues decide how much they take. No proxy from the environment.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.options.connect_timeout)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=False, trust_env=False
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> ClientSession:
        assert self._session is not None, "EngineCalls.open() first"
        return self._session

    async def whole(
        self, engine: Engine, path: str, payload: bytes, headers: dict[str, str], held: trust.Held
    ) -> bytes:
        """A whole non-streamed answer from `engine`, bounded, held in the router's byte budget."""
        answer = await self.start(engine, path, payload, headers, self.options.first_byte_timeout)
        try:
            await self.check_status(engine, answer)
            read = trust.read_bounded(answer.content, trust.MAX_PREFILL_ANSWER_BYTES, held)
            return await self.progress(engine, read, self.options.idle_timeout, "--idle-timeout")
        except trust.TooLarge:
            message = f"at {engine.url} answered with more than {trust.MAX_PREFILL_ANSWER_BYTES} bytes"
            raise Failure(engine.role, 502, "answer_too_large", message, retry=False, eject=False) from None
        except trust.Full:
            raise router_full(held.budget) from None
        finally:
            answer.close()

    async def first_chunk(self, engine: Engine, answer: ClientResponse, limit: float | None) -> bytes:
        """The first bytes of an answer whose headers came; the client has none yet, so a failure
        here is one another engine may not have."""
        import aiohttp

        try:
            return await self.progress(engine, answer.content.readany(), limit, "--first-byte-timeout")
        except aiohttp.ClientError as exc:
            message = f"at {engine.url} failed before its answer's first byte: {exc}"
            raise Failure("decode", 502, "interrupted", message, retry=True, eject=True) from None

    async def start(
        self, engine: Engine, path: str, payload: bytes, headers: dict[str, str], first_byte: float | None
    ) -> ClientResponse:
        """POST `payload` and wait until the answer starts: a failure to connect, no answer within
        `first_byte` seconds (None: no bound) or a dead engine is a `Failure`."""
        import aiohttp

        try:
            try:
                return await self._post(engine, path, payload, headers, first_byte)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, _connect_errors()):
                    raise
                # A kept-alive connection the engine closed as the call began (its keep-alive ran out,
                # or it dropped idle ones): the request was not taken; once more, on a new connection.
                return await self._post(engine, path, payload, headers, first_byte)
        except _connect_errors() as exc:  # it never got the request
            message = f"at {engine.url} could not be reached: {exc}"
            raise Failure(engine.role, 502, "unreachable", message, retry=True, eject=True, reached=False) from None
        except aiohttp.ClientError as exc:
            message = f"at {engine.url} failed before answering: {exc}"
            raise Failure(engine.role, 502, "unreachable", message, retry=True, eject=True) from None

    async def _post(
        self, engine: Engine, path: str, payload: bytes, headers: dict[str, str], first_byte: float | None
    ) -> ClientResponse:
        post = self.session.post(engine.url + path, data=payload, headers=headers, allow_redirects=False)
        return await self.progress(engine, post, first_byte, "--first-byte-timeout")

    async def progress(self, engine: Engine, step: Coroutine[Any, Any, T], limit: float | None, flag: str) -> T:
        """`step` (a wait for bytes from `engine`), given up after `limit` seconds (None: never; `flag`
        names the bound) or when, after each `--idle-timeout` of silence, its /health does not answer."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(step)
        deadline = None if limit is None else loop.time() + limit
        try:
            while True:
                wait = self.options.idle_timeout
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                done, _ = await asyncio.wait((task,), timeout=max(0.0, wait))
                if done:
                    return task.result()
                if deadline is not None and loop.time() >= deadline:
                    message = f"at {engine.url} did not answer within {limit:g} s ({flag})"
                    raise Failure(engine.role, 504, "timeout", message, retry=True, eject=True, reached=True)
                if not await self.alive(engine):
                    message = f"at {engine.url} went silent and its /health does not answer"
                    raise Failure(engine.role, 504, "no_progress", message, retry=True, eject=True, reached=True)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def check_status(self, engine: Engine, answer: ClientResponse) -> None:
        """Nothing for a success; a `Failure` for a status another engine may not give; else the
        engine's own error as an `Answer`."""
        status = answer.status
        if status < 300:
            return
        if status < 400:
            message = f"at {engine.url} answered {status} (a redirect; not followed)"
            raise Failure(engine.role, 502, "redirect", message, retry=False, eject=False)
        if status in RETRIED_STATUSES:
            message = f"at {engine.url} answered {status}"
            raise Failure(engine.role, 502, f"http_{status}", message, retry=True, eject=True)
        try:
            read = answer.content.read(trust.MAX_ERROR_BYTES + 1)
            data = await self.progress(engine, read, self.options.idle_timeout, "--idle-timeout")
        except Failure:
            data = b""
        truncated = len(data) > trust.MAX_ERROR_BYTES
        raise Answer(status, trust.engine_error(engine.role, status, data[: trust.MAX_ERROR_BYTES], truncated))

    async def alive(self, engine: Engine, seconds: float | None = None) -> bool:
        """Whether `engine`'s /health answers 200 within `seconds` (--connect-timeout)."""
        import aiohttp

        limit = aiohttp.ClientTimeout(total=seconds or self.options.connect_timeout)
        try:
            async with self.session.get(engine.url + "/health", timeout=limit, allow_redirects=False) as answer:
                return answer.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def get(self, engine: Engine, path: str, seconds: float, limit: int) -> tuple[int, bytes]:
        """`engine`'s answer to a GET of `path`: its status and body (at most `limit` bytes, else
        `trust.TooLarge`), all within `seconds` (else TimeoutError); aiohttp's errors pass."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=seconds)
        async with self.session.get(engine.url + path, timeout=timeout, allow_redirects=False) as answer:
            return answer.status, await trust.read_bounded(answer.content, limit)

    async def listing(self, engine: Engine) -> Listing | None:
        """What `engine`'s /v1/models lists now, asked within --connect-timeout; None without an answer."""
        import aiohttp

        try:
            status, data = await self.get(engine, "/v1/models", self.options.connect_timeout, lora.MAX_MODELS_BYTES)
        except (aiohttp.ClientError, TimeoutError, trust.TooLarge):
            return None
        return lora.parse_listing(data) if status == 200 else None

    async def tokens(self, engine: Engine, payload: Any, headers: dict[str, str]) -> list[int] | None:
        """vLLM's /tokenize of `payload` on `engine` (vllm/entrypoints/serve/tokenize/api_router.py
        `tokenize`: {"tokens": [...]}), within --connect-timeout, with the client's `headers`; None
        without an answer."""
        import aiohttp

        try:
            data = trust.dump_json(payload)
            timeout = aiohttp.ClientTimeout(total=self.options.connect_timeout)
            post = self.session.post(
                engine.url + "/tokenize", data=data, headers=headers, timeout=timeout, allow_redirects=False
            )
            async with post as answer:
                if answer.status != 200:
                    return None
                found = trust.parse_json(await trust.read_bounded(answer.content, MAX_TOKENIZE_BYTES))
        except (aiohttp.ClientError, TimeoutError, trust.TooLarge, ValueError):
            return None
        tokens = found.get("tokens") if isinstance(found, dict) else None
        if not isinstance(tokens, list) or not all(type(token) is int for token in tokens):
            return None
        return tokens


def _connect_errors() -> tuple[type[Exception], ...]:
    """What aiohttp raises when it could not connect (refused, unreachable, or past sock_connect)."""
    import aiohttp

    timeout = getattr(aiohttp, "ConnectionTimeoutError", None)  # aiohttp 3.10+; before, a ServerTimeoutError
    return (aiohttp.ClientConnectorError, timeout) if timeout is not None else (aiohttp.ClientConnectorError,)

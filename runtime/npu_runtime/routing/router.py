"""`npu-runtime route`: the router in front of a prefill/decode pair of engines.

    npu-runtime route --prefill URL [--prefill URL ...] --decode URL [--decode URL ...]
        [--port 8000] [--metrics-port 9090] [--connect-timeout 5] [--first-byte-timeout 600]
        [--idle-timeout 60] [--retries 2] [--eject-seconds 2] [--resolve-seconds 5]
        [--max-in-flight 1024] [--max-request-bytes 8388608] [--max-buffered-bytes 134217728]
        [--kv-host-network CIDR ...]

Each OpenAI completion or chat completion goes twice, as vllm-ascend's proxy examples send it
(examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py, v0.23.0:
`build_prefill_request`, then `assign_instances` and the decode stream) and vLLM's own P/D proxy
(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py):

1. to a prefill engine, with `max_tokens` 1, no streaming and `kv_transfer_params`
   `{"do_remote_decode": true, ...}`: the engine computes the prompt's KV cache, keeps it for the
   decode engine and answers with the `kv_transfer_params` that locate it (Mooncake's
   `request_finished`: remote host, port, engine id, block ids);
2. to a decode engine, the client's request plus those `kv_transfer_params` once checked
   (`trust.check_kv_params`; a client's own are always dropped): the engine pulls the KV and
   generates; its answer (streamed or not) goes back to the client as it comes.

Which engine: the one with the least outstanding work for its speed (`engines.Pool.pick`); each
URL's name is resolved to its addresses, each one engine. Failures: an engine that cannot be
connected to, answers 502/503/504 before its first byte, or makes no progress is taken out for a
while and the call goes to a different engine of its role (at most `--retries` times; a decode
retry after the engine may have seen the request prefills again, since its KV may be gone); then
the client gets 502 (the role failed), 503 (it has no engine) or 504 (no progress), the role
named. An engine's own 4xx and 500 go back with their text. A stream cut after its first byte ends
with an SSE error event; a non-streamed answer cut mid-way ends the connection early.

Timeouts bound progress, never a generation: connecting (`--connect-timeout`), the start of an
answer (`--first-byte-timeout`: prefill's answer, a stream's first chunk), the silence between two
chunks of a stream (`--idle-timeout`). A non-streamed decode answer starts only when it is done,
so there the router checks that the engine is alive instead: after each `--idle-timeout` of
silence its `/health` must answer 200 within `--connect-timeout` (so it does while waiting for any
answer to start).

Limits: at most `--max-in-flight` requests (503 beyond), bodies of `--max-request-bytes` (413),
`--max-buffered-bytes` held for all of them together (503); engine answers are bounded in
`trust`. Redirects are never followed.

Metrics on --metrics-port (/metrics, with /healthz and /readyz; the client port has none):
`npu_router_requests_total` {endpoint, code}, `npu_router_request_seconds` {endpoint},
`npu_router_backend_seconds` {role}, `npu_router_backend_errors_total` {role, reason},
`npu_router_retries_total` {role}, `npu_router_in_flight`, and per engine {role, engine}
`npu_router_engine_in_flight`, `_work`, `_seconds_per_unit`, `_requests_total`, `_out`,
`_ejections_total`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from npu_runtime.contract import DEFAULT_METRICS_PORT, DEFAULT_PORT
from npu_runtime.routing import trust
from npu_runtime.routing.engines import (
    DEFAULT_EJECT_SECONDS,
    DEFAULT_RESOLVE_SECONDS,
    Engine,
    EngineCollector,
    Pool,
    Ticket,
)

if TYPE_CHECKING:
    from aiohttp import ClientResponse, ClientSession, web
    from prometheus_client import CollectorRegistry

LOG = logging.getLogger("npu_runtime.router")
ROLES: Final = ("prefill", "decode")
ENDPOINTS: Final = ("/v1/completions", "/v1/chat/completions")
# vllm-ascend's build_prefill_request: what the prefill engine is asked to do with the KV.
PREFILL_KV_PARAMS: Final = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Statuses that mean "this engine cannot answer now" (a restarting pod, a proxy in the way): another
# engine may. Every other error status is the engine's answer to this request, passed on.
RETRIED_STATUSES: Final = frozenset({502, 503, 504})
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_FIRST_BYTE_TIMEOUT: Final = 600.0
DEFAULT_IDLE_TIMEOUT: Final = 60.0
DEFAULT_RETRIES: Final = 2
DEFAULT_MAX_IN_FLIGHT: Final = 1024
DEFAULT_MAX_REQUEST_BYTES: Final = 8 << 20
DEFAULT_MAX_BUFFERED_BYTES: Final = 128 << 20
RETRY_DELAY: Final = 0.05
CLIENT_GONE: Final = 499  # nginx's code for "the client closed the request"; never sent
# How the router counts work (engines.py): a prompt token is a unit on prefill; on decode an
# output token is one, and each DECODE_PROMPT_TOKENS of prompt one more (the KV it pulls and attends to).
BYTES_PER_TOKEN: Final = 4
DECODE_PROMPT_TOKENS: Final = 64
PREFILL_OVERHEAD_TOKENS: Final = 16
DEFAULT_OUTPUT_TOKENS: Final = 256  # a request without max_tokens, until outputs are seen
MAX_MODELS_BYTES: Final = 1 << 20
READY_SECONDS: Final = 2.0  # /readyz asks each engine's /health; the kubelet's probe waits 5 s

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RouterOptions:
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    retries: int = DEFAULT_RETRIES
    eject_seconds: float = DEFAULT_EJECT_SECONDS
    resolve_seconds: float = DEFAULT_RESOLVE_SECONDS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    kv_host_networks: tuple[str, ...] = ()


class Failure(Exception):
    """A call to an engine that failed; what the client gets if no other engine answers.

    `retry`: another engine of the role may succeed. `eject`: the engine is taken out.
    `reached`: the engine may have seen the request (a decode retry then prefills again).
    """

    def __init__(
        self, role: str, status: int, reason: str, message: str, *, retry: bool, eject: bool, reached: bool = True
    ) -> None:
        super().__init__(f"{role} engine {message}")
        self.role, self.status, self.reason = role, status, reason
        self.retry, self.eject, self.reached = retry, eject, reached


class Answer(Exception):
    """An engine's own error answer (4xx, 500, ...): passed to the client as JSON."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"engine answered {status}")
        self.status, self.body = status, body


class Reply(Exception):
    """The router's own answer to the client (a bad request, the router full)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers


class ClientGone(Exception):
    """The client closed its connection: not an engine's failure. `response`: the answer it had started."""

    def __init__(self, response: web.StreamResponse | None = None) -> None:
        super().__init__("the client went away")
        self.response = response


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill engine's request: one token, no stream, the KV kept for a remote decode."""
    payload = {key: value for key, value in body.items() if key != "stream_options"}
    payload["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)  # the client's own never reach an engine
    payload["stream"] = False
    payload["max_tokens"] = 1
    payload["min_tokens"] = 1
    if "max_completion_tokens" in payload:
        payload["max_completion_tokens"] = 1
    return payload


def decode_request(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """The decode engine's request: the client's, with the prefill engine's (checked) KV location only."""
    payload = {key: value for key, value in body.items() if key != "kv_transfer_params"}
    if kv_transfer_params:
        payload["kv_transfer_params"] = kv_transfer_params
    return payload


class Metrics:
    """The router's own series, in a registry of their own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        from npu_runtime import metrics

        self.registry: CollectorRegistry = CollectorRegistry()

        def counter(spec: metrics.MetricSpec) -> Counter:
            return Counter(spec.family_name, spec.help, spec.labels, registry=self.registry)

        def histogram(spec: metrics.MetricSpec) -> Histogram:
            buckets = metrics.ROUTER_SECONDS_BUCKETS
            return Histogram(spec.family_name, spec.help, spec.labels, buckets=buckets, registry=self.registry)

        self.requests = counter(metrics.ROUTER_REQUESTS)
        self.request_seconds = histogram(metrics.ROUTER_REQUEST_SECONDS)
        self.backend_seconds = histogram(metrics.ROUTER_BACKEND_SECONDS)
        self.backend_errors = counter(metrics.ROUTER_BACKEND_ERRORS)
        self.retries = counter(metrics.ROUTER_RETRIES)


class Router:
    """The request flow; one aiohttp client session for all engines."""

    def __init__(self, options: RouterOptions, metrics: Metrics | None = None) -> None:
        if not options.prefill or not options.decode:
            raise ValueError("the router needs at least one prefill and one decode engine")
        self.options = options
        self.metrics = metrics or Metrics()
        self.pools = {
            role: Pool(
                role,
                getattr(options, role),
                batched=role == "decode",
                eject_seconds=options.eject_seconds,
                probe=self.alive,
            )
            for role in ROLES
        }
        networks = tuple(ipaddress.ip_network(network, strict=False) for network in options.kv_host_networks)
        self.kv_host_allowed = trust.address_check(self.pools["prefill"].addresses, networks)
        self.budget = trust.ByteBudget(options.max_buffered_bytes)
        self.in_flight = 0
        self.typical_output_tokens = float(DEFAULT_OUTPUT_TOKENS)
        self.metrics.registry.register(EngineCollector(tuple(self.pools.values()), lambda: self.in_flight))
        self._session: ClientSession | None = None
        self._resolver: asyncio.Task[None] | None = None
        self._warned: dict[str, float] = {}

    async def start(self) -> None:
        import aiohttp

        # No total limit on a call: the flow bounds each wait itself. No connection limit: the
        # engines' own queues decide how much they take. No proxy from the environment.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.options.connect_timeout)
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0), auto_decompress=False, trust_env=False
        )
        for pool in self.pools.values():
            await pool.resolve()
        if any(_has_names(pool) for pool in self.pools.values()) and self.options.resolve_seconds > 0:
            self._resolver = asyncio.ensure_future(self._resolve_forever())

    async def close(self) -> None:
        if self._resolver is not None:
            self._resolver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resolver
            self._resolver = None
        for pool in self.pools.values():
            pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.resolve_seconds)
            for pool in self.pools.values():
                await pool.resolve()

    @property
    def session(self) -> ClientSession:
        assert self._session is not None, "Router.start() first"
        return self._session

    # --- a client's request ---------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        endpoint = request.path
        started = time.monotonic()
        status = 500
        if self.in_flight >= self.options.max_in_flight:
            self.metrics.requests.labels(endpoint, "503").inc()
            message = f"the router is answering {self.in_flight} requests, its limit (--max-in-flight)"
            return _error(503, "router_full", message, {"Retry-After": "1"})
        self.in_flight += 1
        held = trust.Held(self.budget)
        try:
            response = await self._answer(request, endpoint, held)
            status = response.status
            return response
        except Reply as exc:
            status = exc.status
            return _error(exc.status, exc.kind, str(exc), exc.headers)
        except Answer as exc:
            status = exc.status
            return _json(exc.status, exc.body)
        except Failure as exc:
            status = exc.status
            return _error(exc.status, f"{exc.role}_{exc.reason}", str(exc))
        except ClientGone as exc:
            status = CLIENT_GONE
            return exc.response or _error(CLIENT_GONE, "client_gone", str(exc))
        except asyncio.CancelledError:  # the client went away (aiohttp's handler_cancellation)
            status = CLIENT_GONE
            raise
        finally:
            self.in_flight -= 1
            held.release()
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.request_seconds.labels(endpoint).observe(time.monotonic() - started)

    async def _answer(self, request: web.Request, endpoint: str, held: trust.Held) -> web.StreamResponse:
        data = await self._client_body(request, held)
        try:
            body = trust.parse_json(data)
        except ValueError as exc:
            raise Reply(400, "invalid_request", f"the request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise Reply(400, "invalid_request", "the request body must be a JSON object")
        try:
            prefill_payload = trust.dump_json(prefill_request(body))
        except ValueError as exc:
            raise Reply(400, "invalid_request", f"the request body cannot be passed on: {exc}") from None
        headers = _forwarded_headers(request)
        prompt_tokens = len(data) / BYTES_PER_TOKEN
        output_tokens = self._output_tokens(body)
        decode_work = output_tokens + prompt_tokens / DECODE_PROMPT_TOKENS
        stream = body.get("stream") is True
        decode_tried: set[Engine] = set()
        retries = 0
        last: Failure | None = None
        request_id = headers["X-Request-Id"]
        pairs = 0
        while True:  # a prefill, then decode attempts with its KV; a new prefill when that KV may be gone
            pairs += 1
            if pairs > 1:  # a new pair: the engines must not take it for the one whose KV is held
                headers = {**headers, "X-Request-Id": f"{request_id}-{pairs}"}
            prefill_work = prompt_tokens + PREFILL_OVERHEAD_TOKENS
            kv_params = await self._prefill(endpoint, prefill_payload, headers, prefill_work, held)
            decode_payload = trust.dump_json(decode_request(body, kv_params))
            while True:
                engine = self.pools["decode"].pick(decode_work, decode_tried)
                if engine is None:
                    raise last or _no_engine("decode")
                decode_tried.add(engine)
                try:
                    work = (output_tokens, prompt_tokens / DECODE_PROMPT_TOKENS)
                    return await self._decode(request, engine, endpoint, decode_payload, headers, work, stream)
                except Failure as failure:
                    last = failure
                    if not failure.retry or retries >= self.options.retries:
                        raise
                retries += 1
                self.metrics.retries.labels("decode").inc()
                await asyncio.sleep(RETRY_DELAY)
                if last.reached:
                    break

    async def _client_body(self, request: web.Request, held: trust.Held) -> bytes:
        limit = self.options.max_request_bytes
        declared = request.content_length
        if declared is not None and declared > limit:
            message = f"the request body is over {limit} bytes (--max-request-bytes)"
            raise Reply(413, "request_too_large", message)
        try:
            return await trust.read_bounded(request.content, limit, held)
        except trust.TooLarge:
            message = f"the request body is over {limit} bytes (--max-request-bytes)"
            raise Reply(413, "request_too_large", message) from None
        except trust.Full:
            raise self._full() from None
        except ConnectionError:
            raise ClientGone() from None

    def _full(self) -> Reply:
        message = f"the router holds {self.budget.used} bytes of requests, its limit (--max-buffered-bytes)"
        return Reply(503, "router_full", message, {"Retry-After": "1"})

    def _output_tokens(self, body: dict[str, Any]) -> float:
        limit = trust.finite_number(body.get("max_tokens")) or trust.finite_number(body.get("max_completion_tokens"))
        choices = trust.finite_number(body.get("n")) or 1.0
        return (limit or self.typical_output_tokens) * max(1.0, min(choices, 128.0))

    # --- step 1: prefill -------------------------------------------------------------------------

    async def _prefill(
        self, path: str, payload: bytes, headers: dict[str, str], work: float, held: trust.Held
    ) -> dict[str, Any] | None:
        """The KV cache computed on a prefill engine; its kv_transfer_params once checked (None if none)."""
        pool = self.pools["prefill"]
        tried: set[Engine] = set()
        last: Failure | None = None
        for attempt in range(self.options.retries + 1):
            engine = pool.pick(work, tried)
            if engine is None:
                break
            if attempt:
                self.metrics.retries.labels("prefill").inc()
                await asyncio.sleep(RETRY_DELAY)
            tried.add(engine)
            started = time.monotonic()
            ticket = pool.begin(engine, work)
            done: float | None = None
            try:
                data = await self._whole(engine, path, payload, headers, held)
                done = work
            except Failure as failure:
                self._failed(engine, failure)
                if not failure.retry:
                    raise
                last = failure
                continue
            finally:
                ticket.end(done)
            pool.answered(engine)
            self.metrics.backend_seconds.labels("prefill").observe(time.monotonic() - started)
            return self._kv_params(engine, data)
        raise last or _no_engine("prefill")

    def _kv_params(self, engine: Engine, data: bytes) -> dict[str, Any] | None:
        try:
            answer = trust.parse_json(data)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.metrics.backend_errors.labels("prefill", "invalid_answer").inc()
            message = f"at {engine.url} answered with something that is not a JSON object"
            raise Failure("prefill", 502, "invalid_answer", message, retry=False, eject=False)
        try:
            return trust.check_kv_params(answer.get("kv_transfer_params"), self.kv_host_allowed)
        except trust.Refused as refused:
            # Not passed on: decode then computes the prompt itself. The prefill engine frees the
            # KV it kept once its connector's timeout passes (docs/disaggregation.md).
            self.metrics.backend_errors.labels("prefill", refused.reason).inc()
            self._warn(refused.reason, f"prefill engine {engine.url}: {refused}; decode computes the prompt itself")
            return None

    async def _whole(
        self, engine: Engine, path: str, payload: bytes, headers: dict[str, str], held: trust.Held
    ) -> bytes:
        """A whole non-streamed answer from `engine`, bounded, held in the router's byte budget."""
        answer = await self._start(engine, path, payload, headers, self.options.first_byte_timeout)
        try:
            await self._check_status(engine, answer)
            read = trust.read_bounded(answer.content, trust.MAX_PREFILL_ANSWER_BYTES, held)
            return await self._progress(engine, read, self.options.idle_timeout, "--idle-timeout")
        except trust.TooLarge:
            message = f"at {engine.url} answered with more than {trust.MAX_PREFILL_ANSWER_BYTES} bytes"
            raise Failure(engine.role, 502, "answer_too_large", message, retry=False, eject=False) from None
        except trust.Full:
            raise self._full() from None
        finally:
            answer.close()

    # --- step 2: decode --------------------------------------------------------------------------

    async def _decode(
        self,
        request: web.Request,
        engine: Engine,
        path: str,
        payload: bytes,
        headers: dict[str, str],
        work: tuple[float, float],
        stream: bool,
    ) -> web.StreamResponse:
        """The client's answer from `engine`, passed through as it comes. `work`: (output, prompt) units."""
        from aiohttp import web

        pool = self.pools["decode"]
        output, prompt = work
        ticket = pool.begin(engine, output + prompt)
        started = time.monotonic()
        done: float | None = None
        client: web.StreamResponse | None = None
        answer: ClientResponse | None = None
        events = False
        try:
            # A non-streamed answer starts when it is done: no first-byte bound, /health checked instead.
            first_byte = self.options.first_byte_timeout if stream else None
            answer = await self._guarded(engine, self._start(engine, path, payload, headers, first_byte))
            await self._guarded(engine, self._check_status(engine, answer))
            events = answer.content_type == "text/event-stream"
            left = None if first_byte is None else max(0.0, first_byte - (time.monotonic() - started))
            first = await self._guarded(engine, self._first_chunk(engine, answer, left))
            self.metrics.backend_seconds.labels("decode").observe(time.monotonic() - started)
            client = web.StreamResponse(status=answer.status)
            client.content_type = answer.content_type
            if not events and answer.content_length is not None:
                client.content_length = answer.content_length  # so that a cut answer is seen as one
            try:
                await client.prepare(request)
            except ConnectionError:
                raise ClientGone(client) from None
            tokens = await self._pass_through(engine, ticket, answer, client, first, events)
            if not events and not tokens:
                tokens = int(output)
            self.typical_output_tokens += 0.05 * (tokens - self.typical_output_tokens)
            done = tokens + prompt
            pool.answered(engine)
            return client
        except Failure as failure:
            if client is None:
                raise
            # The client has bytes already: no retry; end the answer so that the client sees the cut.
            self._warn("decode_cut", f"{failure} after the answer started; ending it")
            await _end_cut_answer(client, str(failure), events)
            return client
        finally:
            if answer is not None:
                answer.close()
            ticket.end(done)

    async def _first_chunk(self, engine: Engine, answer: ClientResponse, limit: float | None) -> bytes:
        """The first bytes of an answer whose headers came; the client has none yet, so a failure
        here is one another engine may not have."""
        import aiohttp

        try:
            return await self._progress(engine, answer.content.readany(), limit, "--first-byte-timeout")
        except aiohttp.ClientError as exc:
            message = f"at {engine.url} failed before its answer's first byte: {exc}"
            raise Failure("decode", 502, "interrupted", message, retry=True, eject=True) from None

    async def _guarded(self, engine: Engine, step: Awaitable[T]) -> T:
        """`step`, with a failure counted against `engine` before it is raised."""
        try:
            return await step
        except Failure as failure:
            self._failed(engine, failure)
            raise

    async def _pass_through(
        self,
        engine: Engine,
        ticket: Ticket,
        answer: ClientResponse,
        client: web.StreamResponse,
        first: bytes,
        events: bool,
    ) -> int:
        """The rest of the engine's answer to the client, each chunk within --idle-timeout of the
        last; returns the tokens seen (SSE events, or a non-streamed answer's completion_tokens)."""
        import aiohttp

        loop = asyncio.get_running_loop()
        content = answer.content
        idle = self.options.idle_timeout
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
            failure = Failure("decode", 504, "no_progress", message, retry=False, eject=True)
            self._failed(engine, failure)
            raise failure from None
        except aiohttp.ClientError as exc:
            message = f"at {engine.url} failed mid-answer: {exc}"
            failure = Failure("decode", 502, "interrupted", message, retry=False, eject=True)
            self._failed(engine, failure)
            raise failure from None
        try:
            await client.write_eof()
        except ConnectionError:
            raise ClientGone(client) from None
        return seen if events else _completion_tokens(tail)

    # --- engine calls ----------------------------------------------------------------------------

    async def _start(
        self, engine: Engine, path: str, payload: bytes, headers: dict[str, str], first_byte: float | None
    ) -> ClientResponse:
        """POST `payload` and wait until the answer starts: a failure to connect, no answer within
        `first_byte` seconds (None: no bound) or a dead engine is a `Failure`."""
        import aiohttp

        post = self.session.post(engine.url + path, data=payload, headers=headers, allow_redirects=False)
        try:
            return await self._progress(engine, post, first_byte, "--first-byte-timeout")
        except _connect_errors() as exc:  # it never got the request
            message = f"at {engine.url} could not be reached: {exc}"
            raise Failure(engine.role, 502, "unreachable", message, retry=True, eject=True, reached=False) from None
        except aiohttp.ClientError as exc:
            message = f"at {engine.url} failed before answering: {exc}"
            raise Failure(engine.role, 502, "unreachable", message, retry=True, eject=True) from None

    async def _progress(self, engine: Engine, step: Coroutine[Any, Any, T], limit: float | None, flag: str) -> T:
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

    async def _check_status(self, engine: Engine, answer: ClientResponse) -> None:
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
            data = await self._progress(engine, read, self.options.idle_timeout, "--idle-timeout")
        except Failure:
            data = b""
        truncated = len(data) > trust.MAX_ERROR_BYTES
        raise Answer(status, trust.engine_error(engine.role, status, data[: trust.MAX_ERROR_BYTES], truncated))

    def _failed(self, engine: Engine, failure: Failure) -> None:
        self.metrics.backend_errors.labels(failure.role, failure.reason).inc()
        if failure.eject:
            self.pools[engine.role].eject(engine, str(failure))
        else:
            LOG.warning("%s", failure)

    async def alive(self, engine: Engine, seconds: float | None = None) -> bool:
        """Whether `engine`'s /health answers 200 within `seconds` (--connect-timeout)."""
        import aiohttp

        limit = aiohttp.ClientTimeout(total=seconds or self.options.connect_timeout)
        try:
            async with self.session.get(engine.url + "/health", timeout=limit, allow_redirects=False) as answer:
                return answer.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _warn(self, key: str, message: str) -> None:
        """A warning, at most once a minute per kind (a flood of refused parameters stays readable)."""
        now = time.monotonic()
        if now - self._warned.get(key, -3600.0) >= 60:
            self._warned[key] = now
            LOG.warning("%s", message)

    # --- other endpoints -------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.StreamResponse:
        """/v1/models from a decode engine (both roles serve the same model)."""
        import aiohttp

        engine = self.pools["decode"].pick(0.0)
        if engine is None:
            failure = _no_engine("decode")
            return _error(failure.status, f"decode_{failure.reason}", str(failure))
        limit = aiohttp.ClientTimeout(total=self.options.connect_timeout + self.options.idle_timeout)
        try:
            async with self.session.get(engine.url + "/v1/models", timeout=limit, allow_redirects=False) as answer:
                data = await trust.read_bounded(answer.content, MAX_MODELS_BYTES)
                if answer.status != 200:
                    status = 502 if answer.status < 400 else answer.status
                    return _json(status, trust.engine_error("decode", answer.status, data, False))
        except (aiohttp.ClientError, TimeoutError, trust.TooLarge) as exc:
            return _error(502, "decode_unreachable", f"decode engine at {engine.url} did not answer /v1/models: {exc}")
        return _json(200, data)

    async def ready(self) -> dict[str, bool]:
        """Whether each role has an engine whose /health answers (all asked at once, within 2 s)."""
        result: dict[str, bool] = {}
        for role, pool in self.pools.items():
            answers = await asyncio.gather(*(self.alive(engine, READY_SECONDS) for engine in pool.engines))
            result[role] = any(answers)
        return result


def _connect_errors() -> tuple[type[Exception], ...]:
    """What aiohttp raises when it could not connect (refused, unreachable, or past sock_connect)."""
    import aiohttp

    timeout = getattr(aiohttp, "ConnectionTimeoutError", None)  # aiohttp 3.10+; before, a ServerTimeoutError
    return (aiohttp.ClientConnectorError, timeout) if timeout is not None else (aiohttp.ClientConnectorError,)


def _has_names(pool: Pool) -> bool:
    from npu_runtime.routing.engines import _literal_address

    return any(_literal_address(url) is None for url in pool.urls)


def _no_engine(role: str) -> Failure:
    return Failure(role, 503, "unavailable", "has no engine to send to", retry=False, eject=False)


def _completion_tokens(tail: bytes) -> int:
    """`usage.completion_tokens` from the end of a non-streamed answer (0 when it is not there)."""
    at = tail.rfind(b'"completion_tokens":')
    if at < 0:
        return 0
    digits = tail[at + 20 :].lstrip()[:12]
    end = 0
    while end < len(digits) and digits[end : end + 1].isdigit():
        end += 1
    return int(digits[:end]) if end else 0


def _forwarded_headers(request: web.Request) -> dict[str, str]:
    """The client's authorization, and one request id for both engines (vLLM logs it)."""
    headers = {"X-Request-Id": request.headers.get("X-Request-Id") or str(uuid.uuid4())}
    if "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    headers["Content-Type"] = "application/json"
    return headers


def _json(status: int, body: bytes) -> web.Response:
    from aiohttp import web

    return web.Response(status=status, body=body, content_type="application/json")


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    from aiohttp import web

    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers)


async def _end_cut_answer(client: web.StreamResponse, message: str, events: bool) -> None:
    """End an answer whose engine failed mid-way: a stream with an SSE error event (the OpenAI SDK
    raises it); any other answer by closing the connection before its declared length."""
    with contextlib.suppress(Exception):
        if events:
            event = trust.dump_json({"error": {"message": message, "type": "decode_interrupted"}})
            await client.write(b"data: " + event + b"\n\n")
            await client.write_eof()
        else:
            client.force_close()


def build_apps(router: Router) -> tuple[web.Application, web.Application]:
    """The API app (client requests) and the ops app (/metrics, /healthz, /readyz; metrics only here)."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    api = web.Application(client_max_size=router.options.max_request_bytes)
    for path in ENDPOINTS:
        api.router.add_post(path, router.handle)
    api.router.add_get("/v1/models", router.models)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    api.router.add_get("/health", health)

    async def metrics(_: web.Request) -> web.Response:
        registry: CollectorRegistry = router.metrics.registry
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def readyz(_: web.Request) -> web.Response:
        roles = await router.ready()
        return web.json_response(roles, status=200 if all(roles.values()) else 503)

    ops = web.Application()
    ops.router.add_get("/metrics", metrics)
    ops.router.add_get("/healthz", health)
    ops.router.add_get("/readyz", readyz)
    return api, ops


def app_runners(router: Router) -> tuple[web.AppRunner, web.AppRunner]:
    """Runners for `build_apps`' two apps. A client that goes away cancels its request's handler
    (aiohttp's handler_cancellation), which closes the engine's connection: vLLM then aborts it."""
    from aiohttp import web

    api, ops = build_apps(router)
    return (
        web.AppRunner(api, access_log=None, handler_cancellation=True, shutdown_timeout=1.0),
        web.AppRunner(ops, access_log=None, shutdown_timeout=1.0),
    )


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0: {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _not_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text}")
    return value


def _network(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def route_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-runtime route", description="Send each completion to a prefill engine, then to a decode engine."
    )
    engines = parser.add_argument_group("engines")
    engines.add_argument(
        "--prefill", action="append", required=True, help="a prefill engine's base URL (repeatable; a name is resolved)"
    )
    engines.add_argument(
        "--decode", action="append", required=True, help="a decode engine's base URL (repeatable; a name is resolved)"
    )
    engines.add_argument(
        "--resolve-seconds",
        type=_not_negative,
        default=DEFAULT_RESOLVE_SECONDS,
        help="look the URLs' names up again this often, each address one engine (0: once)",
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    progress = parser.add_argument_group("progress (no bound on a generation that makes progress)")
    progress.add_argument(
        "--connect-timeout",
        type=_positive(float),
        default=DEFAULT_CONNECT_TIMEOUT,
        help="seconds to connect to an engine, and for its /health to answer",
    )
    progress.add_argument(
        "--first-byte-timeout",
        "--timeout",
        dest="first_byte_timeout",
        type=_positive(float),
        default=DEFAULT_FIRST_BYTE_TIMEOUT,
        help="seconds until an engine's answer starts: prefill's answer, a stream's first chunk (--timeout: old name)",
    )
    progress.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=DEFAULT_IDLE_TIMEOUT,
        help="seconds a stream may be silent; while an answer has not started, /health is checked this often",
    )
    failures = parser.add_argument_group("failures")
    failures.add_argument(
        "--retries", type=int, default=DEFAULT_RETRIES, help="retries of a call, each on a different engine of its role"
    )
    failures.add_argument(
        "--eject-seconds",
        type=_positive(float),
        default=DEFAULT_EJECT_SECONDS,
        help="how long a failed engine is out before its /health is probed (doubling in a row, at most 60 s)",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-in-flight", type=_positive(int), default=DEFAULT_MAX_IN_FLIGHT, help="requests at once (503 beyond)"
    )
    limits.add_argument(
        "--max-request-bytes",
        type=_positive(int),
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="one request body (413 beyond)",
    )
    limits.add_argument(
        "--max-buffered-bytes",
        type=_positive(int),
        default=DEFAULT_MAX_BUFFERED_BYTES,
        help="request bodies and prefill answers held at once (503 beyond)",
    )
    parser.add_argument(
        "--kv-host-network",
        dest="kv_host_networks",
        action="append",
        type=_network,
        default=[],
        help="a network whose hosts prefill's KV parameters may name besides the prefill engines (repeatable)",
    )
    return parser


def route_argv(options: RouterOptions) -> list[str]:
    """The `route` arguments (without `npu-runtime route`) that parse back to `options`: the engines,
    ports, first-byte timeout and retries always, anything else when it is not the default."""
    argv: list[str] = []
    for role in ROLES:
        for url in options.prefill if role == "prefill" else options.decode:
            argv += [f"--{role}", url]
    argv += ["--port", str(options.port), "--metrics-port", str(options.metrics_port)]
    argv += ["--first-byte-timeout", f"{options.first_byte_timeout:g}", "--retries", str(options.retries)]
    defaults = RouterOptions(prefill=options.prefill, decode=options.decode)
    for field in dataclasses.fields(RouterOptions):
        if field.name in ("prefill", "decode", "port", "metrics_port", "first_byte_timeout", "retries"):
            continue
        value = getattr(options, field.name)
        if value == getattr(defaults, field.name):
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.name == "kv_host_networks":
            for network in value:
                argv += ["--kv-host-network", network]
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def parse_route_args(argv: Sequence[str]) -> RouterOptions:
    args = route_parser().parse_args(list(argv))
    return RouterOptions(
        prefill=tuple(args.prefill),
        decode=tuple(args.decode),
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        connect_timeout=args.connect_timeout,
        first_byte_timeout=args.first_byte_timeout,
        idle_timeout=args.idle_timeout,
        retries=args.retries,
        eject_seconds=args.eject_seconds,
        resolve_seconds=args.resolve_seconds,
        max_in_flight=args.max_in_flight,
        max_request_bytes=args.max_request_bytes,
        max_buffered_bytes=args.max_buffered_bytes,
        kv_host_networks=tuple(args.kv_host_networks),
    )


async def serve_router(options: RouterOptions, stop: asyncio.Event) -> None:
    """Run the router until `stop` is set."""
    from aiohttp import web

    router = Router(options)
    await router.start()
    runners = app_runners(router)
    try:
        for runner, port in zip(runners, (options.port, options.metrics_port), strict=True):
            await runner.setup()
            await web.TCPSite(runner, options.host, port).start()
        LOG.info("routing on :%d (prefill %s, decode %s)", options.port, options.prefill, options.decode)
        await stop.wait()
    finally:
        for runner in runners:
            await runner.cleanup()
        await router.close()


def route_command(argv: Sequence[str]) -> int:
    options = parse_route_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve_router(options, stop)

    # uvloop where the image has it (vLLM's images do): the same loop vLLM's own server runs on.
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    return 0

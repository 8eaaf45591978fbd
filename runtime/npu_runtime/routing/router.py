"""The router's handling of a client's request: each completion to a prefill engine, then a decode one.

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

Which engine: the one with the least outstanding work for its speed (choice.py, `engines.Pool.pick`);
each URL's name is resolved to its addresses, each one engine. With `--cache-aware`, the prefill
engine is the one where the prompt takes least time counting the prefix it holds as done
(choice.py; the prompt's tokens from a prefill engine's /tokenize first, calls.py `tokens`; what
each engine holds from its own KV events, kv_events.py, else from the prompts sent to it,
prefix.py), within `--cache-load-factor` of the least loaded; decode stays by load. Failures: an engine that cannot be
connected to, answers 502/503/504 before its first byte, or makes no progress is taken out for a
while and the call goes to a different engine of its role (at most `--retries` times; a decode
retry after the engine may have seen the request prefills again, since its KV may be gone); then
the client gets 502 (the role failed), 503 (it has no engine) or 504 (no progress), the role
named. An engine's own 4xx and 500 go back with their text. A stream cut after its first byte ends
with an SSE error event; a non-streamed answer cut mid-way ends the connection early (streaming.py).
Each wait on an engine is bounded by its progress (calls.py).

LoRA adapters (lora.py): a request for an adapter goes only to the engines of each role whose
/v1/models lists it (asked at start, every `--resolve-seconds` and when an engine is probed back
in); one that no engine of a role holds is answered vLLM's 404 here; an engine that answers vLLM's
404 for an adapter it was thought to hold holds it no more, and the call goes to another holder (a
retry; the engine's 404 for the client when none is left).

Limits: at most `--max-in-flight` requests (503 beyond), bodies of `--max-request-bytes` (413),
`--max-buffered-bytes` held for all of them together (503); engine answers are bounded in
`trust`. The command line is options.py; the apps and the command, serve.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from npu_runtime.routing import lora, streaming, trust
from npu_runtime.routing.calls import EngineCalls
from npu_runtime.routing.choice import EngineChoice, Work, role_pools, tokenize_payload
from npu_runtime.routing.engines import Engine, EngineCollector, Pool, _literal_address
from npu_runtime.routing.errors import Answer, ClientGone, Failure, Reply, no_engine, router_full
from npu_runtime.routing.kv_events import KvEventStreams
from npu_runtime.routing.options import RouterOptions
from npu_runtime.routing.prefix import EngineCache
from npu_runtime.routing.series import Metrics

if TYPE_CHECKING:
    from aiohttp import ClientResponse, web

LOG = logging.getLogger("npu_runtime.router")
# vllm-ascend's build_prefill_request: what the prefill engine is asked to do with the KV.
PREFILL_KV_PARAMS: Final = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
RETRY_DELAY: Final = 0.05
CLIENT_GONE: Final = 499  # nginx's code for "the client closed the request"; never sent
READY_SECONDS: Final = 2.0  # /readyz asks each engine's /health; the kubelet's probe waits 5 s

T = TypeVar("T")


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


class Router:
    """The request flow: the engines' pools, the choice among them, the calls to them."""

    def __init__(self, options: RouterOptions, metrics: Metrics | None = None) -> None:
        if not options.prefill or not options.decode:
            raise ValueError("the router needs at least one prefill and one decode engine")
        self.options = options
        self.metrics = metrics or Metrics()
        self.calls = EngineCalls(options)
        self.pools = role_pools(options, self._probe)
        self.choice = EngineChoice(self.pools, options)
        self.kv_streams: KvEventStreams | None = None
        if options.cache_aware:
            self.kv_streams = KvEventStreams(
                options.kv_events_port,
                options.kv_replay_port,
                options.kv_events_ranks,
                options.connect_timeout,
                self.choice.cache_for,
                self._streams_changed,
            )
        self._stream_urls: set[str] = set()  # the engines with a series of their streams
        networks = tuple(ipaddress.ip_network(network, strict=False) for network in options.kv_host_networks)
        self.kv_host_allowed = trust.address_check(self.pools["prefill"].addresses, networks)
        self.budget = trust.ByteBudget(options.max_buffered_bytes)
        self.in_flight = 0
        self.metrics.registry.register(EngineCollector(tuple(self.pools.values()), lambda: self.in_flight))
        self._refresher: asyncio.Task[None] | None = None
        self._warned: dict[str, float] = {}

    async def start(self) -> None:
        await self.calls.open()
        for pool in self.pools.values():
            await pool.resolve()
        self._follow_engines()
        self._refresher = asyncio.ensure_future(self._refresh_forever())

    def _follow_engines(self) -> None:
        """The KV event streams of the prefill engines there are now (--cache-aware)."""
        if self.kv_streams is not None:
            prefill = self.pools["prefill"]
            self.kv_streams.follow(prefill.engines)
            self.choice.forget_gone()
            gone = self._stream_urls - {engine.url for engine in prefill.known()}
            for url in gone:
                self.metrics.kv_event_streams.remove(url)
            self._stream_urls -= gone

    def _streams_changed(self, engine: Engine, cache: EngineCache) -> None:
        self.metrics.kv_event_streams.labels(engine.url).set(cache.streams)
        self._stream_urls.add(engine.url)

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        if self.kv_streams is not None:
            await self.kv_streams.close()
        for pool in self.pools.values():
            pool.close()
        await self.calls.close()

    async def _refresh_forever(self) -> None:
        """Each engine's /v1/models asked now, then every --resolve-seconds after the URLs' names are
        looked up again (0: once, at start)."""
        names = any(_has_names(pool) for pool in self.pools.values())
        while True:
            await self._ask_listings()
            if self.options.resolve_seconds <= 0:
                return
            await asyncio.sleep(self.options.resolve_seconds)
            if names:
                for pool in self.pools.values():
                    await pool.resolve()
                self._follow_engines()

    async def _ask_listings(self) -> None:
        """What every engine serves now (its base model and adapters), all asked at once."""
        engines = [engine for pool in self.pools.values() for engine in pool.engines]
        listings = await asyncio.gather(*(self.calls.listing(engine) for engine in engines))
        for engine, listing in zip(engines, listings, strict=True):
            engine.listing = listing

    async def _probe(self, engine: Engine) -> bool:
        """Whether an engine taken out is back (its /health answers); if so, what it serves is asked
        first, since a restarted engine may hold other adapters."""
        if not await self.calls.alive(engine):
            return False
        engine.listing = await self.calls.listing(engine)
        return True

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
            if exc.body is not None:
                return _json(exc.status, exc.body)
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
        work = self.choice.work(data, body)
        if self.choice.cache_aware:
            work = await self._with_tokens(work, body, headers)
        if work.adapter is not None:
            self.metrics.adapter_requests.labels(work.adapter).inc()
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
            kv_params = await self._prefill(endpoint, prefill_payload, headers, work, held)
            decode_payload = trust.dump_json(decode_request(body, kv_params))
            while True:
                engine = self.choice.pick("decode", work, decode_tried)
                if engine is None:
                    raise self._none_left("decode", work, last)
                decode_tried.add(engine)
                try:
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

    async def _with_tokens(self, work: Work, body: dict[str, Any], headers: dict[str, str]) -> Work:
        """`work` with its prompt's token ids, from the request itself or a prefill engine's /tokenize
        (one call, within --connect-timeout); as it was when there is no answer."""
        payload = tokenize_payload(body)
        if isinstance(payload, list):
            return self.choice.with_tokens(work, payload, body)
        engine = self.pools["prefill"].pick(0.0, (), work.adapter)
        if payload is None or engine is None:
            return work
        tokens = await self.calls.tokens(engine, payload, headers)
        if tokens is None:
            self._warn("no_tokens", f"prefill engine {engine.url} did not tokenize a prompt; chosen by load")
            return work
        return self.choice.with_tokens(work, tokens, body)

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
            raise router_full(self.budget) from None
        except ConnectionError:
            raise ClientGone() from None

    # --- step 1: prefill -------------------------------------------------------------------------

    async def _prefill(
        self, path: str, payload: bytes, headers: dict[str, str], work: Work, held: trust.Held
    ) -> dict[str, Any] | None:
        """The KV cache computed on a prefill engine; its kv_transfer_params once checked (None if none)."""
        pool = self.pools["prefill"]
        tried: set[Engine] = set()
        last: Failure | None = None
        for attempt in range(self.options.retries + 1):
            engine, saved, reason = self.choice.pick_prefill(work, tried)
            if engine is not None and self.choice.cache_aware:
                self._count_choice(engine, saved, reason)
                self.choice.sent(engine, work)
            if engine is None:
                break
            if attempt:
                self.metrics.retries.labels("prefill").inc()
                await asyncio.sleep(RETRY_DELAY)
            tried.add(engine)
            started = time.monotonic()
            units = work.prefill - saved  # what it computes: the prefix it holds is not done again
            ticket = pool.begin(engine, units)
            done: float | None = None
            try:
                data = await self._held_adapter(engine, work, self.calls.whole(engine, path, payload, headers, held))
                done = units
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
        raise self._none_left("prefill", work, last)

    def _count_choice(self, engine: Engine, saved: float, reason: str) -> None:
        self.metrics.choice_reasons.labels("prefill", reason).inc()
        if saved > 0:
            self.metrics.prefix_hits.labels("prefill", engine.url).inc()
            self.metrics.prefix_tokens_saved.labels("prefill", engine.url).inc(saved)

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

    # --- step 2: decode --------------------------------------------------------------------------

    async def _decode(
        self,
        request: web.Request,
        engine: Engine,
        path: str,
        payload: bytes,
        headers: dict[str, str],
        work: Work,
        stream: bool,
    ) -> web.StreamResponse:
        """The client's answer from `engine`, passed through as it comes (streaming.py)."""
        pool = self.pools["decode"]
        ticket = pool.begin(engine, work.decode)
        started = time.monotonic()
        done: float | None = None
        client: web.StreamResponse | None = None
        answer: ClientResponse | None = None
        events = False
        try:
            # A non-streamed answer starts when it is done: no first-byte bound, /health checked instead.
            first_byte = self.options.first_byte_timeout if stream else None
            answer = await self._guarded(engine, self.calls.start(engine, path, payload, headers, first_byte))
            await self._guarded(engine, self._held_adapter(engine, work, self.calls.check_status(engine, answer)))
            events = answer.content_type == "text/event-stream"
            left = None if first_byte is None else max(0.0, first_byte - (time.monotonic() - started))
            first = await self._guarded(engine, self.calls.first_chunk(engine, answer, left))
            self.metrics.backend_seconds.labels("decode").observe(time.monotonic() - started)
            client = await streaming.open_answer(request, answer, events)
            idle = self.options.idle_timeout
            relayed = streaming.pass_through(engine, ticket, answer, client, first, events, idle)
            tokens = await self._guarded(engine, relayed)
            if not events and not tokens:
                tokens = int(work.output_tokens)
            self.choice.output_seen(tokens)
            done = tokens + work.decode_prompt
            pool.answered(engine)
            return client
        except Failure as failure:
            if client is None:
                raise
            # The client has bytes already: no retry; end the answer so that the client sees the cut.
            self._warn("decode_cut", f"{failure} after the answer started; ending it")
            await streaming.end_cut_answer(client, str(failure), events)
            return client
        finally:
            if answer is not None:
                answer.close()
            ticket.end(done)

    async def _guarded(self, engine: Engine, step: Awaitable[T]) -> T:
        """`step`, with a failure counted against `engine` before it is raised."""
        try:
            return await step
        except Failure as failure:
            self._failed(engine, failure)
            raise

    async def _held_adapter(self, engine: Engine, work: Work, step: Awaitable[T]) -> T:
        """`step`, where vLLM's 404 for `work`'s adapter means `engine` holds it no more: a `Failure`
        another holder may not have (retried; the engine's 404 for the client if none answers)."""
        try:
            return await step
        except Answer as answer:
            adapter = work.adapter
            if adapter is None or not lora.says_missing(answer, adapter):
                raise
            engine.listing = lora.forget(engine.listing, adapter)
            message = f"at {engine.url} does not hold the adapter {adapter!r} any more"
            raise Failure(
                engine.role,
                answer.status,
                "adapter_missing",
                message,
                retry=True,
                eject=False,
                reached=False,
                body=answer.body,
            ) from None

    def _none_left(self, role: str, work: Work, last: Failure | None) -> Exception:
        """What the client gets when `role` has no engine left to try: vLLM's 404 when none holds the
        request's adapter any more, else the last failure (or 503)."""
        if work.adapter is not None and not self.choice.holders(role, work):
            return lora.unknown_model(work.adapter)
        return last or no_engine(role)

    def _failed(self, engine: Engine, failure: Failure) -> None:
        self.metrics.backend_errors.labels(failure.role, failure.reason).inc()
        if failure.eject:
            self.pools[engine.role].eject(engine, str(failure))
        else:
            LOG.warning("%s", failure)

    def _warn(self, key: str, message: str) -> None:
        """A warning, at most once a minute per kind (a flood of refused parameters stays readable)."""
        now = time.monotonic()
        if now - self._warned.get(key, -3600.0) >= 60:
            self._warned[key] = now
            LOG.warning("%s", message)

    # --- other endpoints -------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.StreamResponse:
        """/v1/models from a decode engine (both roles serve the same model; the adapters, those that
        engine holds now)."""
        import aiohttp

        engine = self.pools["decode"].pick(0.0)
        if engine is None:
            failure = no_engine("decode")
            return _error(failure.status, f"decode_{failure.reason}", str(failure))
        seconds = self.options.connect_timeout + self.options.idle_timeout
        try:
            status, data = await self.calls.get(engine, "/v1/models", seconds, lora.MAX_MODELS_BYTES)
        except (aiohttp.ClientError, TimeoutError, trust.TooLarge) as exc:
            return _error(502, "decode_unreachable", f"decode engine at {engine.url} did not answer /v1/models: {exc}")
        if status != 200:
            return _json(502 if status < 400 else status, trust.engine_error("decode", status, data, False))
        return _json(200, data)

    async def ready(self) -> dict[str, bool]:
        """Whether each role has an engine whose /health answers (all asked at once, within 2 s)."""
        result: dict[str, bool] = {}
        for role, pool in self.pools.items():
            answers = await asyncio.gather(*(self.calls.alive(engine, READY_SECONDS) for engine in pool.engines))
            result[role] = any(answers)
        return result


def _has_names(pool: Pool) -> bool:
    return any(_literal_address(url) is None for url in pool.urls)


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

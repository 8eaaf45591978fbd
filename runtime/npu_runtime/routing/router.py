"""`npu-runtime route`: the router in front of a prefill/decode pair of engines.

    npu-runtime route --prefill URL [--prefill URL ...] --decode URL [--decode URL ...]
        [--port 8000] [--metrics-port 9090] [--timeout 600] [--connect-timeout 5] [--retries 2]

Each OpenAI completion or chat completion goes twice, as vllm-ascend's proxy examples send it
(examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py, v0.23.0:
`build_prefill_request`, then `assign_instances` and the decode stream) and vLLM's own P/D proxy
(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py):

1. to a prefill engine, with `max_tokens` 1, no streaming and `kv_transfer_params`
   `{"do_remote_decode": true, ...}`: the engine computes the prompt's KV cache, keeps it for the
   decode engine and answers with the `kv_transfer_params` that locate it (Mooncake's
   `request_finished`: remote host, port, engine id, block ids);
2. to a decode engine, the client's request unchanged plus those `kv_transfer_params`: the engine
   pulls the KV and generates; its answer (streamed or not) goes back to the client.

Nothing is lost silently: a backend that cannot be reached, or answers 502/503/504 before the
client has a byte (a pod restarting), is retried on the next engine of its role, at most
`--retries` times; then the client gets 502 (the role failed) or 504 (it timed out), with a
message naming the role. An engine's own 4xx (a prompt too long, an unknown model) goes back as
the engine wrote it. A stream cut after its first byte ends with an SSE error event. Every call
to a backend has a deadline (`--timeout`), so no request hangs.

Metrics (on --metrics-port, /metrics, with /healthz and /readyz): `npu_router_requests_total`
{endpoint, code}, `npu_router_request_seconds` {endpoint}, `npu_router_backend_seconds` {role},
`npu_router_backend_errors_total` {role, reason}, `npu_router_retries_total` {role}.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import logging
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from npu_runtime.contract import DEFAULT_METRICS_PORT, DEFAULT_PORT

if TYPE_CHECKING:
    from aiohttp import ClientSession, web
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
# Statuses that mean "this engine cannot answer now" (a restarting pod, a full queue): retried.
RETRIED_STATUSES: Final = frozenset({502, 503, 504})
DEFAULT_TIMEOUT: Final = 600.0
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_RETRIES: Final = 2
RETRY_DELAY: Final = 0.2


@dataclasses.dataclass(frozen=True)
class RouterOptions:
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    retries: int = DEFAULT_RETRIES


class BackendError(Exception):
    """A role could not answer: the HTTP status the client gets and why."""

    def __init__(self, role: str, status: int, reason: str, message: str) -> None:
        super().__init__(f"{role} engine {message}")
        self.role = role
        self.status = status
        self.reason = reason


class EngineAnswer(Exception):
    """An engine answered with a client error (4xx): passed to the client as written."""

    def __init__(self, role: str, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"{role} engine answered {status}")
        self.role = role
        self.status = status
        self.body = body
        self.content_type = content_type


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill engine's request: one token, no stream, the KV kept for a remote decode."""
    payload = {key: value for key, value in body.items() if key != "stream_options"}
    payload["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    payload["stream"] = False
    payload["max_tokens"] = 1
    payload["min_tokens"] = 1
    if "max_completion_tokens" in payload:
        payload["max_completion_tokens"] = 1
    return payload


def decode_request(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The decode engine's request: the client's, with the prefill engine's KV location."""
    payload = dict(body)
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
    """The request flow; one aiohttp client session for all backends."""

    def __init__(self, options: RouterOptions, metrics: Metrics | None = None) -> None:
        if not options.prefill or not options.decode:
            raise ValueError("the router needs at least one prefill and one decode engine")
        self.options = options
        self.metrics = metrics or Metrics()
        self._next = {role: itertools.cycle(range(len(self._urls(role)))) for role in ROLES}
        self._session: ClientSession | None = None

    def _urls(self, role: str) -> tuple[str, ...]:
        return self.options.prefill if role == "prefill" else self.options.decode

    def pick(self, role: str) -> str:
        return self._urls(role)[next(self._next[role])].rstrip("/")

    async def start(self) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.options.timeout, sock_connect=self.options.connect_timeout)
        # No connection limit: the engines' own queues decide how much they take.
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> ClientSession:
        assert self._session is not None, "Router.start() first"
        return self._session

    async def prefill(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """Step 1: the KV cache computed on a prefill engine; returns its kv_transfer_params."""
        started = time.monotonic()
        answer = await self._call("prefill", path, prefill_request(body), headers)
        self.metrics.backend_seconds.labels("prefill").observe(time.monotonic() - started)
        try:
            return json.loads(answer).get("kv_transfer_params")
        except (ValueError, AttributeError):
            self.metrics.backend_errors.labels("prefill", "invalid_answer").inc()
            raise BackendError("prefill", 502, "invalid_answer", "answered with something that is not JSON") from None

    async def _call(self, role: str, path: str, payload: dict[str, Any], headers: dict[str, str]) -> bytes:
        """A whole (non-streamed) answer from an engine of `role`, retried on the next one."""
        import aiohttp

        last: BackendError | None = None
        for attempt in range(self.options.retries + 1):
            if attempt:
                self.metrics.retries.labels(role).inc()
                await asyncio.sleep(RETRY_DELAY * attempt)
            url = self.pick(role) + path
            try:
                async with self.session.post(url, json=payload, headers=headers) as response:
                    data = await response.read()
                    if response.status < 400:
                        return data
                    if response.status not in RETRIED_STATUSES and response.status < 500:
                        raise EngineAnswer(role, response.status, data, response.content_type)
                    last = _failed_status(role, url, response.status)
            except TimeoutError:
                last = self._timed_out(role, url)
            except aiohttp.ClientError as exc:
                last = BackendError(role, 502, "unreachable", f"at {url} could not be reached: {exc}")
            self.metrics.backend_errors.labels(role, last.reason).inc()
            LOG.warning("%s (attempt %d of %d)", last, attempt + 1, self.options.retries + 1)
        assert last is not None
        raise last

    async def handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        endpoint = request.path
        started = time.monotonic()
        status = 500
        try:
            try:
                body = await request.json()
            except ValueError:
                body = None
            if not isinstance(body, dict):
                status = 400
                return _error(400, "invalid_request", "the request body must be a JSON object")
            headers = _forwarded_headers(request)
            kv_params = await self.prefill(endpoint, body, headers)
            response = await self.decode(request, endpoint, decode_request(body, kv_params), headers)
            status = response.status
            return response
        except EngineAnswer as exc:
            status = exc.status
            return web.Response(status=exc.status, body=exc.body, content_type=exc.content_type or "application/json")
        except BackendError as exc:
            status = exc.status
            return _error(exc.status, f"{exc.role}_{exc.reason}", str(exc))
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.request_seconds.labels(endpoint).observe(time.monotonic() - started)

    async def decode(
        self, request: web.Request, path: str, payload: dict[str, Any], headers: dict[str, str]
    ) -> web.StreamResponse:
        """Step 2: the client's answer from a decode engine, streamed through as it comes."""
        import aiohttp
        from aiohttp import web

        last: BackendError | None = None
        for attempt in range(self.options.retries + 1):
            if attempt:
                self.metrics.retries.labels("decode").inc()
                await asyncio.sleep(RETRY_DELAY * attempt)
            url = self.pick("decode") + path
            started = time.monotonic()
            client: web.StreamResponse | None = None
            try:
                async with self.session.post(url, json=payload, headers=headers) as answer:
                    if answer.status >= 400:
                        data = await answer.read()
                        if answer.status not in RETRIED_STATUSES and answer.status < 500:
                            raise EngineAnswer("decode", answer.status, data, answer.content_type)
                        last = _failed_status("decode", url, answer.status)
                    else:
                        first = await answer.content.readany()
                        self.metrics.backend_seconds.labels("decode").observe(time.monotonic() - started)
                        client = web.StreamResponse(status=answer.status)
                        client.content_type = answer.content_type
                        await client.prepare(request)
                        await client.write(first)
                        async for chunk in answer.content.iter_any():
                            await client.write(chunk)
                        await client.write_eof()
                        return client
            except TimeoutError:
                last = self._timed_out("decode", url)
            except aiohttp.ClientError as exc:
                last = BackendError("decode", 502, "unreachable", f"at {url} failed: {exc}")
            self.metrics.backend_errors.labels("decode", last.reason).inc()
            if client is not None:  # the client has bytes already: end the answer, say why
                LOG.warning("%s after the answer started; ending it", last)
                await _end_cut_answer(client, str(last))
                return client
            LOG.warning("%s (attempt %d of %d)", last, attempt + 1, self.options.retries + 1)
        assert last is not None
        raise last

    async def models(self, request: web.Request) -> web.StreamResponse:
        """/v1/models from a decode engine (both roles serve the same model)."""
        from aiohttp import web

        try:
            data = await self._get("decode", "/v1/models")
        except BackendError as exc:
            return _error(exc.status, f"decode_{exc.reason}", str(exc))
        return web.Response(body=data, content_type="application/json")

    def _timed_out(self, role: str, url: str) -> BackendError:
        return BackendError(role, 504, "timeout", f"at {url} did not answer within {self.options.timeout:g} s")

    async def _get(self, role: str, path: str, seconds: float | None = None) -> bytes:
        import aiohttp

        url = self.pick(role) + path
        try:
            limit = aiohttp.ClientTimeout(total=seconds) if seconds else None
            async with self.session.get(url, timeout=limit) as answer:
                data = await answer.read()
                if answer.status >= 400:
                    raise _failed_status(role, url, answer.status)
                return data
        except TimeoutError:
            raise BackendError(role, 504, "timeout", f"at {url} did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise BackendError(role, 502, "unreachable", f"at {url} could not be reached: {exc}") from None

    async def ready(self) -> dict[str, bool]:
        """Whether each role has an engine whose /health answers."""
        result: dict[str, bool] = {}
        for role in ROLES:
            result[role] = False
            for _ in self._urls(role):
                try:
                    await self._get(role, "/health", seconds=2.0)
                except BackendError:
                    continue
                result[role] = True
                break
        return result


def _failed_status(role: str, url: str, status: int) -> BackendError:
    return BackendError(role, 502, f"http_{status}", f"at {url} answered {status}")


def _forwarded_headers(request: web.Request) -> dict[str, str]:
    """The client's authorization, and one request id for both engines (vLLM logs it)."""
    headers = {"X-Request-Id": request.headers.get("X-Request-Id") or str(uuid.uuid4())}
    if "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    return headers


def _error(status: int, kind: str, message: str) -> web.Response:
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


async def _end_cut_answer(client: web.StreamResponse, message: str) -> None:
    """End an answer whose engine failed mid-way: an SSE error event for a stream, then EOF."""
    import contextlib

    with contextlib.suppress(Exception):
        if client.content_type == "text/event-stream":
            event = json.dumps({"error": {"message": message, "type": "decode_interrupted"}})
            await client.write(f"data: {event}\n\n".encode())
        await client.write_eof()


def build_apps(router: Router) -> tuple[web.Application, web.Application]:
    """The API app (client requests) and the metrics app (/metrics, /healthz, /readyz)."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    api = web.Application(client_max_size=64 << 20)
    for path in ENDPOINTS:
        api.router.add_post(path, router.handle)
    api.router.add_get("/v1/models", router.models)

    async def metrics(_: web.Request) -> web.Response:
        registry: CollectorRegistry = router.metrics.registry
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    api.router.add_get("/health", health)
    api.router.add_get("/metrics", metrics)  # also here: a PodMonitor scrapes both ports of the resource's pods

    async def readyz(_: web.Request) -> web.Response:
        roles = await router.ready()
        return web.json_response(roles, status=200 if all(roles.values()) else 503)

    ops = web.Application()
    ops.router.add_get("/metrics", metrics)
    ops.router.add_get("/healthz", health)
    ops.router.add_get("/readyz", readyz)
    return api, ops


def route_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-runtime route", description="Send each completion to a prefill engine, then to a decode engine."
    )
    parser.add_argument("--prefill", action="append", required=True, help="a prefill engine's base URL (repeatable)")
    parser.add_argument("--decode", action="append", required=True, help="a decode engine's base URL (repeatable)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds one engine call may take")
    parser.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT)
    parser.add_argument("--retries", type=int, default=DEFAULT_RETRIES, help="retries on another engine of a role")
    return parser


def route_argv(options: RouterOptions) -> list[str]:
    """The `route` arguments (without `npu-runtime route`) that parse back to `options`."""
    argv: list[str] = []
    for role in ROLES:
        for url in options.prefill if role == "prefill" else options.decode:
            argv += [f"--{role}", url]
    argv += ["--port", str(options.port), "--metrics-port", str(options.metrics_port)]
    argv += ["--timeout", f"{options.timeout:g}", "--retries", str(options.retries)]
    if options.host != RouterOptions.host:
        argv += ["--host", options.host]
    if options.connect_timeout != DEFAULT_CONNECT_TIMEOUT:
        argv += ["--connect-timeout", repr(options.connect_timeout)]
    return argv


def parse_route_args(argv: Sequence[str]) -> RouterOptions:
    args = route_parser().parse_args(list(argv))
    return RouterOptions(
        prefill=tuple(args.prefill),
        decode=tuple(args.decode),
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        timeout=args.timeout,
        connect_timeout=args.connect_timeout,
        retries=args.retries,
    )


async def serve_router(options: RouterOptions, stop: asyncio.Event) -> None:
    """Run the router until `stop` is set."""
    from aiohttp import web

    router = Router(options)
    await router.start()
    api, ops = build_apps(router)
    runners = [web.AppRunner(api, access_log=None), web.AppRunner(ops, access_log=None)]
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

    asyncio.run(main())
    return 0

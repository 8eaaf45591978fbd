"""`npu-runtime route`: the router's two apps, served until SIGTERM or SIGINT.

The API app (--port) takes the clients' completions and chat completions (`Router.handle`),
/v1/models and /health. The ops app (--metrics-port) has /metrics (series.py and the engines'
series), /healthz and /readyz (each role has an engine whose /health answers); the client port
has no metrics.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from npu_runtime.routing.options import RouterOptions, parse_route_args
from npu_runtime.routing.router import Router

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

LOG = logging.getLogger("npu_runtime.router")
ENDPOINTS: Final = ("/v1/completions", "/v1/chat/completions")


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

"""Surviving the API server: bounded watch reconnects, and an operator that restarts instead of exiting.

Two gaps in kopf 1.45's watching (kopf/_cogs/clients/watching.py), closed with kopf's own public
extension points rather than patches:

- A watch stream that the server ends (a proxy cutting idle streams, an API server restarting,
  every stream dropped at once) is reopened at once, with no pause: `continuous_watch` loops
  without sleeping, and `settings.watching.reconnect_backoff` applies only after a re-list. The
  login handler therefore hands kopf its own aiohttp session (`kopf.AiohttpSession`, kopf's
  documented way to bring a session) with `WatchThrottle` as client middleware: a watch request
  that follows a short-lived stream on the same path waits, with exponential backoff and jitter.
- An ERROR event inside a watch stream other than 410 Gone (a Status with code 500) raises
  `WatchingError`, which ends `kopf.operator()` for every resource. `run_supervised` runs the
  operator again (a fresh re-list of everything) after an exponential, jittered pause, until it is
  asked to stop. 410 Gone itself is handled by kopf: re-list, then watch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import random
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

import aiohttp
import kopf

from npu_operator.api.config import OperatorConfig, jittered
from npu_operator.kube.informer import HEALTHY_STREAM_SECONDS, retry_seconds

logger = logging.getLogger(__name__)

# Restarts of the whole operator after a fatal watch error.
FIRST_RESTART_DELAY: Final = 1.0
MAX_RESTART_DELAY: Final = 60.0
STABLE_RUN_SECONDS: Final = 300.0  # a run this long resets the restart backoff

Handler = Callable[[aiohttp.ClientRequest], Awaitable[aiohttp.ClientResponse]]


class WatchThrottle:
    """aiohttp client middleware: per watched path, reconnects after short streams back off."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._clock, self._rng = clock, rng
        self._last: dict[str, tuple[float, int]] = {}  # path -> (when the last watch started, strikes)

    def delay(self, path: str) -> float:
        """How long the next watch of `path` must wait; records that it starts after that."""
        now = self._clock()
        last = self._last.get(path)
        strikes = 0 if last is None or now - last[0] >= HEALTHY_STREAM_SECONDS else last[1] + 1
        # The same backoff as our own informers' (kube.informer).
        wait = 0.0 if strikes == 0 else retry_seconds(strikes, self._rng)
        self._last[path] = (now + wait, strikes)
        return wait

    async def __call__(self, request: aiohttp.ClientRequest, handler: Handler) -> aiohttp.ClientResponse:
        if request.method == "GET" and request.url.query.get("watch") in ("true", "1"):
            wait = self.delay(request.url.path)
            if wait:
                logger.debug("watch of %s ended early; reconnecting in %.1f s", request.url.path, wait)
                await asyncio.sleep(wait)
        return await handler(request)


class _SessionClosedByUs:
    """The session as kopf sees it, with `close()` left to `run_supervised`.

    kopf closes the sessions of its credentials when it stops, while a peering keep-alive that is
    being cancelled may still PATCH through them; with a closed session that PATCH waits for new
    credentials that no one will log in for any more, and `kopf.operator()` never returns (seen
    after a fatal watch error). The real session is closed once `kopf.operator()` has returned.
    """

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def close(self) -> None:
        """Left to `run_supervised`."""


_SESSIONS: list[aiohttp.ClientSession] = []  # made by the login handler, closed by run_supervised


def throttled_context(info: kopf.ConnectionInfo) -> kopf.AiohttpSession:
    """kopf's credentials as its own aiohttp session would use them, plus the watch throttle."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ssl_context = info.as_ssl_context() if info.server.startswith("https") else False
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=ssl_context),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        middlewares=(WatchThrottle(),),
    )
    _SESSIONS.append(session)
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
        aiohttp_session=cast(aiohttp.ClientSession, _SessionClosedByUs(session)),
    )


async def _close_sessions() -> None:
    while _SESSIONS:
        await _SESSIONS.pop().close()


async def _operator_once(**kwargs: Any) -> None:
    try:
        await kopf.operator(**kwargs)
    finally:
        await _close_sessions()
        # The failed run's abandoned streams (async generators) are finalized now, in this loop,
        # not by a later garbage collection in whatever thread runs then.
        gc.collect()
        await asyncio.sleep(0)


async def run_supervised(
    config: OperatorConfig,
    registry: Callable[[OperatorConfig], kopf.OperatorRegistry],
    *,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
    liveness_endpoint: str | None = None,
    standalone: bool | None = None,
    rng: Callable[[], float] = random.random,
) -> int:
    """`kopf.operator()` until it stops cleanly (a signal, the stop flag); restarted after a failure.
    `registry(config)` makes the handlers of each run (`handlers.registry`)."""
    if standalone is not None:
        config = dataclasses.replace(config, standalone=standalone)
    failures = 0
    while True:
        started = time.monotonic()
        try:
            await _operator_once(
                clusterwide=not config.namespaces,
                namespaces=list(config.namespaces),
                standalone=config.standalone,
                registry=registry(config),
                memo=kopf.Memo(config=config),
                stop_flag=stop_flag,
                ready_flag=ready_flag,
                liveness_endpoint=liveness_endpoint,
            )
            return 0
        except Exception as exc:
            if stop_flag is not None and stop_flag.is_set():
                return 0
            failures = 1 if time.monotonic() - started >= STABLE_RUN_SECONDS else failures + 1
            wait = jittered(FIRST_RESTART_DELAY * 2 ** (failures - 1), MAX_RESTART_DELAY, rng)
            detail = str(exc) or type(exc).__name__
            logger.error(f"the operator failed ({type(exc).__name__}: {detail}); restart {failures} in {wait:.1f} s")
        if stop_flag is None:
            await asyncio.sleep(wait)
        elif await asyncio.to_thread(stop_flag.wait, wait):
            return 0

"""The router's engines: which ones a role has, how loaded and how fast each is, which are out.

Where the engines come from: each `--prefill`/`--decode` URL. An `http://` URL whose host is a
name is resolved (every A/AAAA record) when the router starts and every `--resolve-seconds`; each
address is one engine. A headless Service's name resolves to its ready pods, so each pod is an
engine the router chooses by load and takes out when it fails; a ClusterIP Service's name resolves
to its one virtual address, which the router then sees as one engine (kube-proxy spreads the
connections). An address that drops out of the records is no longer chosen; its requests in
flight finish.

How one is chosen (`Pool.pick`): the engine where the request adds least time. Work is counted as
vllm-ascend's proxy counts it (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py,
v0.23.0: `calculate_prefill_score`, `calculate_decode_score`, `SharedProxyScheduler._priority`:
the prompt's length for both roles, held until the request ends), plus what it leaves out: a
decode request's expected output tokens (`max_tokens` x `n`, counted down as its stream goes),
the requests in flight, and each engine's own speed, measured on the requests it finished (a
moving average):

- prefill (`queued`: a step takes a budget of prompt tokens, in order): the time to get through
  the work in flight and this request's, `(work + w) x t`, `t` the engine's seconds per token;
- decode (`batched`: a step gives each running request a token): the request's own time with one
  more in the batch, plus what it adds to the others', `w x a x (1 + (b + 1) / K) + work x a / K`,
  `b` the requests in flight, `a` the engine's seconds per token alone (measured, and scaled from
  the batch it ran in), `K` = `BATCH_KNEE` (a decode step is taken to double every K requests: a
  memory-bound step grows little with its batch). A slower engine gets work only when the faster
  one's batch has grown enough to make up for it; one that queues past its capacity measures slower.

Equal engines get equal shares; ties go round the engines in turn. An engine never measured, or
not for a minute while idle, is taken to be as fast as the role's average, so that one request
tries it again. A request for a LoRA adapter is chosen among the engines that hold it only
(`Engine.listing`, lora.py).

Which are out (`Pool.eject`): an engine that cannot be connected to, answers 502/503/504 before
its first byte, or makes no progress within the router's timeouts is taken out for
`--eject-seconds`, doubled for each further ejection in a row up to `MAX_EJECT_SECONDS`. When its
time is up the router probes its `/health` (not a client's request): 200 puts it back, anything
else takes it out again for twice as long. An answered request resets the doubling. When every
engine of a role is out the router still tries the one that looks best, so that ejections alone
never refuse a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

LOG = logging.getLogger("npu_runtime.router")

DEFAULT_EJECT_SECONDS: Final = 2.0
MAX_EJECT_SECONDS: Final = 60.0
DEFAULT_RESOLVE_SECONDS: Final = 5.0
# An engine's speed is a moving average over its finished requests; one not measured for this long
# counts as average again, so that a slow engine that got faster is tried and seen.
SPEED_WEIGHT: Final = 0.25
SPEED_STALE_SECONDS: Final = 60.0
BATCH_KNEE: Final = 64.0


@dataclasses.dataclass(frozen=True)
class Listing:
    """What an engine's /v1/models lists: its base model's names and the LoRA adapters it holds (lora.py)."""

    bases: frozenset[str] = frozenset()
    adapters: frozenset[str] = frozenset()


@dataclasses.dataclass(eq=False)
class Engine:
    """One engine of a role, at one address."""

    role: str
    url: str  # the base URL requests go to: http://10.1.2.3:8000
    address: str  # the address alone, as the engine's own KV parameters name it: 10.1.2.3
    listed: bool = True  # among the addresses its URL resolves to now
    in_flight: int = 0
    work: float = 0.0  # units of work in flight (see the module's doc)
    seconds_per_unit: float = 0.0  # t (queued) or a (batched); 0: never measured
    measured_at: float = 0.0
    area: float = 0.0  # the integral of in_flight over time, for the batch a request ran in
    changed: float = 0.0
    chosen: int = 0  # requests sent to it, retries included
    ejections: int = 0
    failures: int = 0  # ejections in a row, for the backoff
    out_until: float = 0.0  # monotonic time it is out until; 0: in
    probe: asyncio.Task[None] | None = None
    listing: Listing | None = None  # its /v1/models when last asked; None: not asked, or no answer

    def holds(self, adapter: str) -> bool:
        """Whether its /v1/models, when last asked, listed `adapter` (not asked: it holds none)."""
        return self.listing is not None and adapter in self.listing.adapters

    def out(self, now: float) -> bool:
        return self.out_until > now

    def _count(self, now: float, change: int) -> None:
        self.area += self.in_flight * (now - self.changed)
        self.changed = now
        self.in_flight += change

    def speed(self, now: float) -> float:
        """Its measured speed; 0 when it has none to go by (never measured, or idle and stale)."""
        if self.seconds_per_unit <= 0:
            return 0.0
        if now - self.measured_at > SPEED_STALE_SECONDS and self.in_flight == 0:
            return 0.0
        return self.seconds_per_unit


class Ticket:
    """One call's share of an engine's load, from `Pool.begin` to `end`."""

    __slots__ = ("ahead", "area", "batched", "engine", "remaining", "started", "work")

    def __init__(self, engine: Engine, work: float, batched: bool) -> None:
        self.engine, self.work, self.remaining, self.batched = engine, work, work, batched
        self.started = now = time.monotonic()
        engine._count(now, +1)
        self.area = engine.area
        engine.work += work
        engine.chosen += 1
        self.ahead = engine.work  # what a queued engine gets through before this one is done

    def progress(self, units: float) -> None:
        """Work done so far (a stream's tokens): the engine's outstanding work goes down with it."""
        done = min(units, self.remaining)
        self.remaining -= done
        self.engine.work -= done

    def end(self, units_done: float | None = None) -> None:
        """The call is over. With `units_done`, it finished: the engine's speed is measured on it."""
        engine = self.engine
        now = time.monotonic()
        engine._count(now, -1)
        engine.work = max(0.0, engine.work - self.remaining)
        self.remaining = 0.0
        elapsed = now - self.started
        if units_done is not None and units_done > 0 and elapsed > 0:
            if self.batched:  # seconds per token alone: scaled down from the batch it ran in
                batch = max(1.0, (engine.area - self.area) / elapsed)
                sample = elapsed / units_done / (1 + batch / BATCH_KNEE)
            else:  # seconds per unit of the work it had to get through
                sample = elapsed / max(units_done, self.ahead)
            if engine.seconds_per_unit <= 0 or now - engine.measured_at > SPEED_STALE_SECONDS:
                engine.seconds_per_unit = sample
            else:
                engine.seconds_per_unit += SPEED_WEIGHT * (sample - engine.seconds_per_unit)
            engine.measured_at = now


Probe = Callable[[Engine], Awaitable[bool]]


class Pool:
    """A role's engines: resolved from its URLs, chosen by load, taken out and probed back in."""

    def __init__(
        self,
        role: str,
        urls: Collection[str],
        *,
        batched: bool = False,
        eject_seconds: float = DEFAULT_EJECT_SECONDS,
        probe: Probe | None = None,
    ) -> None:
        self.role = role
        self.batched = batched
        self.urls = tuple(url.rstrip("/") for url in urls)
        self.eject_seconds = eject_seconds
        self._probe = probe
        self._by_url: dict[str, Engine] = {}
        self._listed: list[Engine] = []
        self._turn = 0
        self._resolved: dict[str, tuple[str, ...]] = {}
        for url in self.urls:  # an address needs no lookup; a name is listed once resolved
            if (address := _literal_address(url)) is not None:
                self._resolved[url] = (url,)
                self._add(url, address)
        self._relist()

    # --- which engines there are ---------------------------------------------------------------

    @property
    def engines(self) -> list[Engine]:
        """The engines the role has now (listed), in a stable order."""
        return list(self._listed)

    def known(self) -> Iterator[Engine]:
        """Every engine with state: listed, or unlisted with requests still in flight."""
        return iter(self._by_url.values())

    def addresses(self) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        """The addresses of the role's engines now (for the KV parameters' host check)."""
        found = set()
        for engine in self._listed:
            with contextlib.suppress(ValueError):
                found.add(ipaddress.ip_address(engine.address))
        return frozenset(found)

    async def resolve(self) -> None:
        """Look up each URL's host name; each address it has is one engine."""
        loop = asyncio.get_running_loop()
        for url in self.urls:
            if _literal_address(url) is not None:
                continue
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:  # https keeps its name, for the certificate
                self._resolved[url] = (url,)
                self._add(url, parts.hostname or url)
                continue
            port = parts.port or 80
            try:
                infos = await loop.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                if url not in self._resolved:
                    LOG.warning("%s engines at %s: cannot resolve %s yet (%s)", self.role, url, parts.hostname, exc)
                continue  # keep the last addresses it had
            urls = []
            for _family, _type, _proto, _name, sockaddr in infos:
                address = str(sockaddr[0])
                host = f"[{address}]" if ":" in address else address
                engine_url = f"http://{host}:{port}{parts.path}".rstrip("/")
                if engine_url not in urls:
                    urls.append(engine_url)
                    self._add(engine_url, address)
            if tuple(urls) != self._resolved.get(url):
                LOG.info("%s engines at %s: %s", self.role, url, ", ".join(urls) or "none")
            self._resolved[url] = tuple(urls)
        self._relist()

    def _add(self, url: str, address: str) -> None:
        if url not in self._by_url:
            self._by_url[url] = Engine(self.role, url, address)

    def _relist(self) -> None:
        listed = {engine_url for urls in self._resolved.values() for engine_url in urls}
        for url, engine in list(self._by_url.items()):
            engine.listed = url in listed
            if not engine.listed and engine.in_flight == 0:
                if engine.probe is not None:
                    engine.probe.cancel()
                del self._by_url[url]
        self._listed = [engine for engine in self._by_url.values() if engine.listed]

    # --- choosing ------------------------------------------------------------------------------

    def pick(self, work: float, exclude: Collection[Engine] = (), adapter: str | None = None) -> Engine | None:
        """The engine where `work` adds least time, not among `exclude` and, for an `adapter`, one that
        holds it; None when there is none."""
        return self.pick_cached(work, {}, 1.0, exclude, adapter)[0]

    def pick_cached(
        self,
        work: float,
        saved: Mapping[Engine, float],
        load_factor: float,
        exclude: Collection[Engine] = (),
        adapter: str | None = None,
    ) -> tuple[Engine | None, float, str]:
        """`pick`, where each engine computes only what it does not hold (`saved[engine]` units), with
        the choice's reason (see choice.py): the engine, the units it saves, and "cache", "load",
        "new_prefix" or "overloaded".

        `t x (work_e + w - s_e)`, with `s_e` counted only while the engine's own load cost
        `t x (work_e + w)` is at most `load_factor` times the least load cost of the candidates, and
        its calls in flight at most `load_factor` times the fewest plus one (a cached prompt is little
        work, yet each takes the engine's steps): affinity never sends a request to an engine more
        than `load_factor` times as busy. With nothing `saved`, the choice by load alone."""
        now = time.monotonic()
        engines = self._listed
        count = len(engines)
        if not count:
            return None, 0.0, "load"
        average = self._average_speed(now)
        speeds = {
            engine: engine.speed(now) or average
            for engine in engines
            if engine not in exclude and (adapter is None or engine.holds(adapter))
        }
        cost = {engine: self._cost(engine, work, speed) for engine, speed in speeds.items()}
        eligible = self._affinity_bound(cost, load_factor, now) if saved else None
        best: Engine | None = None
        best_key = (True, 0.0)
        best_saved = 0.0
        refused = False
        start = self._turn % count
        self._turn += 1
        for index in range(count):
            engine = engines[(start + index) % count]
            if engine not in cost:
                continue
            holds = min(saved.get(engine, 0.0), work)
            counted = holds if holds > 0 and eligible is not None and eligible(engine) else 0.0
            refused = refused or (holds > 0 and not counted)
            key = (engine.out(now), cost[engine] - speeds[engine] * counted)
            if best is None or key < best_key:
                best, best_key, best_saved = engine, key, counted
        if best_saved > 0:
            reason = "cache"
        elif refused:
            reason = "overloaded"
        elif any(saved.get(engine, 0.0) > 0 for engine in cost):
            reason = "load"
        else:
            reason = "new_prefix"
        return best, best_saved, reason

    def _cost(self, engine: Engine, work: float, speed: float) -> float:
        """The time `work` adds on `engine` (the batched knee for a decode pool, see the module's doc)."""
        if self.batched:
            return speed * (work * (1 + (engine.in_flight + 1) / BATCH_KNEE) + engine.work / BATCH_KNEE)
        return speed * (engine.work + work)

    @staticmethod
    def _affinity_bound(cost: Mapping[Engine, float], load_factor: float, now: float) -> Callable[[Engine], bool]:
        """Whether an engine is near enough the least busy of `cost`'s (those not out, if any) for
        the prefix it holds to count: its cost and its calls in flight within `load_factor`."""
        ready = [engine for engine in cost if not engine.out(now)] or list(cost)
        least = min((cost[engine] for engine in ready), default=0.0)
        fewest = min((engine.in_flight for engine in ready), default=0)
        return lambda engine: cost[engine] <= load_factor * least and engine.in_flight <= load_factor * fewest + 1

    def _average_speed(self, now: float) -> float:
        measured = [speed for engine in self._listed if (speed := engine.speed(now))]
        return sum(measured) / len(measured) if measured else 1.0

    def begin(self, engine: Engine, work: float) -> Ticket:
        return Ticket(engine, work, self.batched)

    # --- taking out and back in ----------------------------------------------------------------

    def answered(self, engine: Engine) -> None:
        """The engine answered a request: it is in, and its next ejection starts from the shortest."""
        engine.failures = 0
        if engine.out_until:
            engine.out_until = 0.0
            if engine.probe is not None:
                engine.probe.cancel()
                engine.probe = None

    def eject(self, engine: Engine, why: str) -> None:
        """Take `engine` out for the backoff period, then probe it (once; a probe in flight stays)."""
        now = time.monotonic()
        if engine.out(now):
            return  # out already (several requests saw it fail at once)
        seconds = min(self.eject_seconds * 2**engine.failures, MAX_EJECT_SECONDS)
        engine.failures += 1
        engine.ejections += 1
        engine.out_until = now + seconds
        LOG.warning("%s engine %s out for %g s: %s", self.role, engine.url, seconds, why)
        if self._probe is not None and engine.probe is None:
            engine.probe = asyncio.ensure_future(self._probe_when_due(engine))

    async def _probe_when_due(self, engine: Engine) -> None:
        assert self._probe is not None
        try:
            while engine.listed and engine.out_until:
                await asyncio.sleep(max(0.0, engine.out_until - time.monotonic()))
                if not engine.out_until or not engine.listed:
                    break
                if await self._probe(engine):
                    LOG.info("%s engine %s answers /health again: back in", self.role, engine.url)
                    engine.out_until = 0.0
                    break
                seconds = min(self.eject_seconds * 2**engine.failures, MAX_EJECT_SECONDS)
                engine.failures += 1
                engine.out_until = time.monotonic() + seconds
        finally:
            if engine.probe is asyncio.current_task():
                engine.probe = None

    def close(self) -> None:
        for engine in self._by_url.values():
            if engine.probe is not None:
                engine.probe.cancel()
                engine.probe = None


def _literal_address(url: str) -> str | None:
    """The URL's host when it is an IP address (no lookup needed), else None."""
    host = urlsplit(url).hostname or ""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


class EngineCollector:
    """The engines' state as Prometheus series at scrape time (nothing is counted per request)."""

    def __init__(self, pools: Collection[Pool], in_flight: Callable[[], int]) -> None:
        self.pools = pools
        self.in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from npu_runtime import metrics

        def family(spec: metrics.MetricSpec) -> GaugeMetricFamily | CounterMetricFamily:
            kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            return kind(spec.family_name, spec.help, labels=list(spec.labels))

        requests = family(metrics.ROUTER_IN_FLIGHT)
        requests.add_metric([], self.in_flight())
        in_flight = family(metrics.ROUTER_ENGINE_IN_FLIGHT)
        work = family(metrics.ROUTER_ENGINE_WORK)
        speed = family(metrics.ROUTER_ENGINE_SECONDS_PER_UNIT)
        chosen = family(metrics.ROUTER_ENGINE_REQUESTS)
        out = family(metrics.ROUTER_ENGINE_OUT)
        ejections = family(metrics.ROUTER_ENGINE_EJECTIONS)
        now = time.monotonic()
        for pool in self.pools:
            for engine in pool.known():
                labels = [pool.role, engine.url]
                in_flight.add_metric(labels, engine.in_flight)
                work.add_metric(labels, engine.work)
                speed.add_metric(labels, engine.seconds_per_unit)
                chosen.add_metric(labels, engine.chosen)
                out.add_metric(labels, 1 if engine.out(now) else 0)
                ejections.add_metric(labels, engine.ejections)
        yield from (requests, in_flight, work, speed, chosen, out, ejections)

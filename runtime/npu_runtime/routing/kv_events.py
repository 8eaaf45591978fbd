"""The prefill engines' own KV events, read into each engine's exact index (prefix.py).

vLLM publishes them with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'` (vllm/distributed/kv_events.py
`ZmqEventPublisher`, v0.31): on its PUB socket each `KVEventBatch` (msgpack: ts, events,
data_parallel_rank) as three frames, topic, sequence number (8 bytes big-endian, from 0 when the
engine starts) and payload (`_publisher_thread`); its ROUTER replay socket answers a DEALER's
[empty, start seq] with every buffered batch from that seq as [empty, topic, seq, payload], then
[empty, empty, -1, empty] (`_service_replay`). Data parallel rank r binds both ports plus r
(`offset_endpoint_port`).

One stream per prefill engine address and rank (`--kv-events-ranks`): SUB to
tcp://ADDRESS:--kv-events-port+r, an asyncio task (zmq.asyncio), started and stopped with the
router (`Router.start`, `close`) and with the pool's addresses as they are resolved again
(`KvEventStreams.follow`). Its sequence is followed:

- a connection starts the rank's index afresh from what the engine's replay endpoint still holds
  (a router that starts, or reconnects, after the engine: `Stream.connected`, or at the first
  batch, `Stream._caught_up`); what the buffer no longer holds is unknown (the index under-counts,
  and for `APPROXIMATE_TTL_SECONDS` the approximate index adds to it, prefix.py `EngineCache`);
- a gap (a batch dropped at a high-water mark) is asked of the replay endpoint from the first seq
  missing, within --connect-timeout; when replay cannot fill it (no --kv-replay-port, no answer, the
  batches gone from its buffer), the index is cleared and rebuilt from the next batches;
- a seq that goes backwards is a restarted engine: cleared, and started afresh;
- a lost connection (ZMQ's monitor: disconnected, or no heartbeat for `HEARTBEAT_TIMEOUT_MS`) is an
  engine that may have restarted: cleared, and the rank is not live until batches come again; the
  engine's approximate index is used meanwhile.

Nothing here fails a request: without pyzmq or msgspec (vLLM's dependencies, imported only here and
only when streams start) the router logs it once and chooses by the prompts sent and load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Final

from npu_runtime.routing.engines import Engine
from npu_runtime.routing.prefix import EngineCache

if TYPE_CHECKING:
    import zmq.asyncio

LOG = logging.getLogger("npu_runtime.router")
HEARTBEAT_MS: Final = 2000
HEARTBEAT_TIMEOUT_MS: Final = 6000
RECONNECT_MS: Final = 500
MAX_REPLAY_BATCHES: Final = 10_000  # vLLM's default buffer_steps
END_SEQ: Final = -1


def _modules() -> tuple[Any, Any] | None:
    """zmq (with zmq.asyncio) and msgspec, or None when either is missing."""
    try:
        import msgspec
        import zmq
        import zmq.asyncio
    except ImportError:
        return None
    return zmq, msgspec


def endpoint(address: str, port: int) -> str:
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


class Stream:
    """One engine rank's event stream into its exact index."""

    def __init__(self, streams: KvEventStreams, engine: Engine, rank: int, cache: EngineCache) -> None:
        self.streams, self.engine, self.rank, self.cache = streams, engine, rank, cache
        self.index = cache.ranks[rank]
        self.last: int | None = None  # the last seq applied; None: no batch on this connection yet
        self.skip_upto: int | None = None  # batches replayed already, skipped when they come again
        self.task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"{self.engine.url} rank {self.rank}"

    def _live(self, live: bool) -> None:
        if self.cache.live[self.rank] != live:
            self.cache.live[self.rank] = live
            self.streams.changed(self.engine, self.cache)

    def _restart(self, why: str) -> None:
        """The index is cleared: it holds what the next batches store (younger than the TTL: with the
        approximate index beside it)."""
        if len(self.index):
            LOG.info("KV events of %s: %s; its index is cleared", self.name, why)
        self.index.clear()
        self.cache.rebuilt_at[self.rank] = time.monotonic()

    def lost(self) -> None:
        if self.last is not None:
            self._restart("connection lost")
        self.last = self.skip_upto = None
        self._live(False)

    async def connected(self) -> None:
        """The connection is up: a stream not begun starts from what the engine's replay buffer holds,
        so a router that starts (or reconnects) after the engine knows the blocks it stored before
        any new batch comes; nothing buffered (a fresh engine, no replay port): the first batch begins."""
        if self.last is not None:
            return
        batches = await self.streams.replay(self.engine.address, self.rank, 0)
        if not batches:
            return
        self._restart("a new stream")
        for _, payload in batches:
            self._apply(payload)
        self.last = self.skip_upto = batches[-1][0]
        self._live(True)

    async def batch(self, seq: int, payload: bytes) -> None:
        if self.last is None:
            self._restart("a new stream")
            if seq > 0:
                await self._caught_up(seq)
        elif seq <= self.last:
            if self.skip_upto is not None and seq <= self.skip_upto:
                return  # replayed already
            self._restart(f"seq {seq} after {self.last} (the engine restarted)")
        elif seq > self.last + 1:
            start = self.last + 1
            if not await self._replayed(start, seq):
                self._restart(f"batches {start} to {seq - 1} lost and not replayed")
            elif seq <= (self.last or 0):
                return  # the replay held it
            elif seq != (self.last or 0) + 1:
                self._restart(f"batches up to {seq - 1} lost")
        self.skip_upto = None
        self._apply(payload)
        self.last = seq
        self._live(True)

    def _apply(self, payload: bytes) -> None:
        try:
            batch = self.streams.decode(payload)
            events = batch[1] if isinstance(batch, list) and len(batch) >= 2 else None
            if not isinstance(events, list):
                raise ValueError("not a KVEventBatch")
        except ValueError as exc:
            LOG.warning("KV events of %s: a batch that cannot be read (%s)", self.name, exc)
            self._restart("an unreadable batch")
            return
        self.index.apply(events)

    async def _caught_up(self, seq: int) -> None:
        """A stream joined after the engine started (the router started or reconnected later): the
        batches before `seq` its replay endpoint still holds are applied first, oldest first. What its
        buffer no longer holds stays unknown (blocks chained from it are not indexed: an under-count)."""
        for replayed, payload in await self.streams.replay(self.engine.address, self.rank, 0) or []:
            if replayed >= seq:
                break
            self._apply(payload)

    async def _replayed(self, start: int, seq: int) -> bool:
        """Whether the replay endpoint gave every batch from `start` (applied); False when it cannot."""
        batches = await self.streams.replay(self.engine.address, self.rank, start)
        if not batches or batches[0][0] != start:
            return False
        for replayed, payload in batches:
            if replayed != (self.last or 0) + 1:
                break
            self._apply(payload)
            self.last = self.skip_upto = replayed
        return True


class KvEventStreams:
    """Every prefill engine's event streams, following the pool's engines."""

    def __init__(
        self,
        port: int,
        replay_port: int,
        ranks: int,
        replay_seconds: float,
        cache_for: Callable[[Engine], EngineCache],
        changed: Callable[[Engine, EngineCache], None],
    ) -> None:
        self.port, self.replay_port, self.ranks, self.replay_seconds = port, replay_port, ranks, replay_seconds
        self.cache_for = cache_for
        self.changed = changed
        self._streams: dict[tuple[str, int], Stream] = {}
        self._context: zmq.asyncio.Context | None = None
        self._modules = _modules() if port else None
        self._warned = False
        self._decoder: Any = None

    def decode(self, payload: bytes) -> Any:
        assert self._modules is not None
        _, msgspec = self._modules
        if self._decoder is None:
            self._decoder = msgspec.msgpack.Decoder()
        try:
            return self._decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise ValueError(str(exc)) from None

    def follow(self, engines: Collection[Engine]) -> None:
        """Streams for each of `engines` (the prefill pool's now); those of engines gone stop."""
        if not self.port:
            return
        if self._modules is None:
            if not self._warned:
                self._warned = True
                LOG.error(
                    "--cache-aware: pyzmq or msgspec is not installed, so no KV events are read; the prefill"
                    " engine is chosen by the prompts sent to each and by load"
                )
            return
        wanted = {(engine.url, rank): engine for engine in engines for rank in range(self.ranks)}
        for key in list(self._streams):
            if key not in wanted:
                self._stop(self._streams.pop(key))
        for key, engine in wanted.items():
            if key not in self._streams:
                stream = self._streams[key] = Stream(self, engine, key[1], self.cache_for(engine))
                stream.task = asyncio.ensure_future(self._run(stream))

    def _stop(self, stream: Stream) -> None:
        if stream.task is not None:
            stream.task.cancel()
        stream.lost()

    async def close(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            self._stop(stream)
        for stream in streams:
            if stream.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await stream.task
        if self._context is not None:
            self._context.term()
            self._context = None

    def _socket(self, kind: int, address: str) -> Any:
        assert self._modules is not None
        zmq, _ = self._modules
        if self._context is None:
            self._context = zmq.asyncio.Context()
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        if ":" in address:
            sock.setsockopt(zmq.IPV6, 1)
        return sock

    async def _run(self, stream: Stream) -> None:
        assert self._modules is not None
        zmq, _ = self._modules
        from zmq.utils.monitor import parse_monitor_message

        address = stream.engine.address
        sub = self._socket(zmq.SUB, address)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(endpoint(address, self.port + stream.rank))
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    message = parse_monitor_message(await monitor.recv_multipart())
                    if message.get("event") == zmq.EVENT_DISCONNECTED:
                        stream.lost()
                    elif message.get("event") == zmq.EVENT_CONNECTED:
                        await stream.connected()
                if sub in ready:
                    frames = await sub.recv_multipart()
                    if len(frames) == 3 and len(frames[1]) == 8:
                        await stream.batch(int.from_bytes(frames[1], "big", signed=True), frames[2])
        except asyncio.CancelledError:
            raise
        except Exception:  # never a request's failure: the rank is not live, the approximate index serves
            LOG.exception("KV events of %s: the stream stopped", stream.name)
            stream.lost()
        finally:
            with contextlib.suppress(Exception):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def replay(self, address: str, rank: int, start: int) -> list[tuple[int, bytes]] | None:
        """The batches from `start` the engine rank's replay endpoint still holds (None: no answer
        within --connect-timeout, or no --kv-replay-port)."""
        if not self.replay_port or self._modules is None:
            return None
        zmq, _ = self._modules
        dealer = self._socket(zmq.DEALER, address)
        dealer.connect(endpoint(address, self.replay_port + rank))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.replay_seconds
        batches: list[tuple[int, bytes]] = []
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while len(batches) <= MAX_REPLAY_BATCHES:
                left = deadline - loop.time()
                if left <= 0 or not await dealer.poll(left * 1000):
                    return None
                frames = await dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    continue
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == END_SEQ:
                    return batches
                batches.append((seq, frames[3]))
            return None
        finally:
            dealer.close(linger=0)

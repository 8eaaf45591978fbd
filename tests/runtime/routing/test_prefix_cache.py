"""The cache-aware choice of the prefill engine: the exact index from vLLM's own KV event classes, the
approximate fallback, their bounds, the event stream's sequence (gaps, replay, restarts), the
load-affinity bound, no hot-spotting, and a router reading a real vLLM `ZmqEventPublisher`."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
from aiohttp import web
from npu_runtime.kv_events import bind_address
from npu_runtime.routing import kv_events
from npu_runtime.routing.choice import tokenize_payload
from npu_runtime.routing.engines import Engine, Pool
from npu_runtime.routing.options import RouterOptions, parse_route_args, route_argv
from npu_runtime.routing.prefix import (
    APPROXIMATE_BLOCK_TOKENS,
    EXACT_BYTES_PER_BLOCK,
    ApproximateIndex,
    EngineCache,
    ExactIndex,
    Prompt,
)

from tests.runtime.routing.conftest import FakeEngine, chat_text, eventually, fake_tokens

kv = pytest.importorskip("vllm.distributed.kv_events")
BlockStored, BlockRemoved, AllBlocksCleared = kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared
ENCODER = msgspec.msgpack.Encoder()


def stored(tokens: list[int], hashes: list[Any], parent: Any = None, size: int = 4, **fields: Any) -> Any:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=size,
        lora_id=None,
        medium="GPU",
        lora_name=fields.pop("lora_name", None),
        **fields,
    )


def wire(*events: Any) -> bytes:
    """A batch as vLLM's publisher encodes it."""
    return ENCODER.encode(kv.KVEventBatch(ts=time.time(), events=list(events)))


def apply(index: ExactIndex, *events: Any) -> None:
    index.apply(msgspec.msgpack.decode(wire(*events))[1])


TOKENS = list(range(100, 112))  # three blocks of 4


def test_stored_blocks_are_matched_by_the_router_s_own_keys() -> None:
    index = ExactIndex()
    apply(index, stored(TOKENS[:8], [b"h1" * 16, b"h2" * 16]), stored(TOKENS[8:], [b"h3" * 16], parent=b"h2" * 16))
    assert index.block_size == 4
    assert index.held_blocks(Prompt([*TOKENS, 7], None, None).keys(4)) == 3
    assert index.held_blocks(Prompt([*TOKENS[:6], 1, 2, 3, 4, 5, 6], None, None).keys(4)) == 1
    assert index.held_blocks(Prompt(TOKENS, "adapter", None).keys(4)) == 0  # another adapter's chain
    assert index.held_blocks(Prompt(TOKENS, None, "salt").keys(4)) == 0
    # vLLM always computes the last token: a whole hit saves all but one.
    assert Prompt(TOKENS, None, None).cached_tokens(3, 4) == 11


def test_removed_and_cleared_blocks_are_gone() -> None:
    index = ExactIndex()
    apply(index, stored(TOKENS, [1, 2, 3]))  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: int hashes
    keys = Prompt(TOKENS, None, None).keys(4)
    apply(index, BlockRemoved(block_hashes=[2], medium="GPU"))
    assert index.held_blocks(keys) == 1
    apply(index, BlockRemoved(block_hashes=[1], medium="CPU"))  # another tier: not the GPU's block
    assert index.held_blocks(keys) == 1
    apply(index, AllBlocksCleared())
    assert index.held_blocks(keys) == 0 and len(index) == 0


def test_lora_salt_and_extra_keys_in_the_chain() -> None:
    index = ExactIndex()
    # vLLM's untagged extra keys: the LoRA name on each block, the cache salt on the first.
    apply(index, stored(TOKENS[:8], [1, 2], lora_name="sql", extra_keys=[("sql", "s1"), ("sql",)]))
    assert index.held_blocks(Prompt(TOKENS, "sql", "s1").keys(4)) == 2
    assert index.held_blocks(Prompt(TOKENS, "sql", None).keys(4)) == 0
    # A multimodal block cannot be matched from token ids: not indexed, nor its children.
    apply(index, stored(TOKENS[:4], [9], extra_keys=[(("image-hash", 0),)]), stored(TOKENS[4:8], [10], parent=9))
    assert index.held_blocks(Prompt(TOKENS, None, None).keys(4)) == 0
    # A parent the router never saw (it started later): skipped, not guessed.
    apply(index, stored(TOKENS[4:8], [11], parent=12345))
    assert len(index) == 2


def test_the_exact_index_is_bounded_oldest_dropped() -> None:
    index = ExactIndex(max_blocks=100)
    tokens = list(range(4000))
    apply(index, stored(tokens, [i.to_bytes(32, "big") for i in range(1000)]))
    assert len(index) == 100
    keys = Prompt(tokens, None, None).keys(4)
    assert keys[-1] in index and keys[0] not in index
    # The bytes per block the module documents, measured with sha256-sized hashes.
    big = ExactIndex(max_blocks=20_000)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    apply(big, stored(list(range(80_000)), [(i + 7).to_bytes(32, "big") for i in range(20_000)]))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(big) == 20_000
    assert used / 20_000 < EXACT_BYTES_PER_BLOCK, used / 20_000


def test_the_approximate_index_expires_and_is_bounded() -> None:
    approximate = ApproximateIndex(max_blocks=10, ttl_seconds=60)
    first = Prompt(list(range(64)), None, None).keys(APPROXIMATE_BLOCK_TOKENS)  # 4 blocks
    approximate.sent(first, now=0)
    assert approximate.held_blocks(first, now=59) == 4
    assert approximate.held_blocks(first, now=61) == 0 and len(approximate) == 0
    approximate.sent(first, now=100)
    second = Prompt(list(range(1000, 1160)), None, None).keys(APPROXIMATE_BLOCK_TOKENS)  # 10 blocks
    approximate.sent(second, now=101)
    assert len(approximate) == 10
    assert approximate.held_blocks(first, now=102) == 0  # least recently sent dropped
    assert approximate.held_blocks(second, now=102) == 10


def test_an_engine_without_live_events_uses_the_prompts_sent() -> None:
    cache = EngineCache()
    prompt = Prompt(list(range(100)), None, None)
    cache.sent(prompt, time.monotonic())
    assert cache.cached_tokens(prompt, time.monotonic()) == 96
    cache.live[0] = True  # a live stream whose index is old: its events alone count
    cache.rebuilt_at[0] = time.monotonic() - 3600
    assert cache.cached_tokens(prompt, time.monotonic()) == 0


# --- the stream's sequence ------------------------------------------------------------------------


class Replays(kv_events.KvEventStreams):
    def __init__(self, batches: list[tuple[int, bytes]] | None) -> None:
        super().__init__(1, 1, 1, 1.0, lambda engine: EngineCache(), lambda engine, cache: None)
        self.batches = batches
        self.asked: list[int] = []

    async def replay(self, address: str, rank: int, start: int) -> list[tuple[int, bytes]] | None:
        self.asked.append(start)
        return None if self.batches is None else [batch for batch in self.batches if batch[0] >= start]


def one_block(n: int) -> bytes:
    return wire(stored([n, n, n, n], [n]))


def held(cache: EngineCache, n: int) -> bool:
    return cache.ranks[0].held_blocks(Prompt([n] * 4, None, None).keys(4)) == 1


async def test_a_gap_is_replayed() -> None:
    streams = Replays([(seq, one_block(seq)) for seq in range(5)])
    cache = EngineCache()
    stream = kv_events.Stream(streams, Engine("prefill", "http://e", "127.0.0.1"), 0, cache)
    await stream.batch(0, one_block(0))
    await stream.batch(3, one_block(3))  # 1 and 2 dropped on the way
    assert streams.asked == [1]
    assert all(held(cache, n) for n in range(4)) and cache.live[0]
    await stream.batch(2, one_block(2))  # late copies of replayed batches: skipped, not a restart
    await stream.batch(4, one_block(4))
    assert all(held(cache, n) for n in range(5))


async def test_a_gap_that_cannot_be_replayed_clears_the_index() -> None:
    streams = Replays([(seq, one_block(seq)) for seq in range(3, 5)])  # 1 and 2 gone from the buffer
    cache = EngineCache()
    stream = kv_events.Stream(streams, Engine("prefill", "http://e", "127.0.0.1"), 0, cache)
    await stream.batch(0, one_block(0))
    await stream.batch(3, one_block(3))
    assert not held(cache, 0) and held(cache, 3)  # cleared, rebuilt from what came after


async def test_a_seq_going_backwards_is_a_restarted_engine() -> None:
    streams = Replays(None)
    cache = EngineCache()
    stream = kv_events.Stream(streams, Engine("prefill", "http://e", "127.0.0.1"), 0, cache)
    for seq in range(3):
        await stream.batch(seq, one_block(seq))
    await stream.batch(0, one_block(50))
    assert not held(cache, 1) and held(cache, 50) and not streams.asked
    stream.lost()
    assert not cache.live[0] and len(cache.ranks[0]) == 0


# --- the choice -----------------------------------------------------------------------------------


def two_engines() -> tuple[Pool, Engine, Engine]:
    pool = Pool("prefill", ("http://127.0.0.1:1", "http://127.0.0.1:2"))
    first, second = pool.engines
    return pool, first, second


def test_affinity_is_bounded_by_the_load_factor() -> None:
    pool, slow, fast = two_engines()
    now = time.monotonic()
    slow.seconds_per_unit, fast.seconds_per_unit = 10.0, 1.0
    slow.measured_at = fast.measured_at = now
    # The slow engine holds 1000 of 1016 units: 160 s there against 1016 s on the fast one, but it is
    # ten times as loaded as the fast one for this request.
    engine, saved, reason = pool.pick_cached(1016.0, {slow: 1000.0}, load_factor=20.0)
    assert (engine, saved, reason) == (slow, 1000.0, "cache")
    engine, saved, reason = pool.pick_cached(1016.0, {slow: 1000.0}, load_factor=2.0)
    assert (engine, saved, reason) == (fast, 0.0, "overloaded")


def test_reasons_new_prefix_and_load() -> None:
    pool, first, second = two_engines()
    assert pool.pick_cached(100.0, {}, 2.0)[2] == "new_prefix"
    first.work = 80.0  # holds 50 of the prompt but has 80 to do first: within the bound, yet slower
    engine, _, reason = pool.pick_cached(100.0, {first: 50.0}, 2.0)
    assert (engine, reason) == (second, "load")


def test_tokenize_payload_carries_what_changes_the_tokens() -> None:
    chat: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function"}],
    }
    chat |= {"add_generation_prompt": False, "chat_template_kwargs": {"x": 1}, "max_tokens": 5, "stream": True}
    assert tokenize_payload(chat) == {
        "model": "m",
        "messages": chat["messages"],
        "tools": chat["tools"],
        "add_generation_prompt": False,
        "chat_template_kwargs": {"x": 1},
    }
    assert tokenize_payload({"prompt": "a b", "add_special_tokens": False}) == {
        "prompt": "a b",
        "add_special_tokens": False,
    }
    assert tokenize_payload({"prompt": [[1, 2, 3]]}) == [1, 2, 3]
    assert tokenize_payload({"prompt": ["a", "b"]}) is None


def test_the_options_round_trip() -> None:
    options = RouterOptions(
        prefill=("http://p",),
        decode=("http://d",),
        cache_aware=True,
        kv_events_port=6000,
        kv_replay_port=0,
        kv_events_ranks=2,
        cache_load_factor=1.5,
        prefix_max_blocks=1000,
    )
    assert parse_route_args(route_argv(options)) == options
    assert "--cache-aware" not in route_argv(RouterOptions(prefill=("http://p",), decode=("http://d",)))


# --- through the router ---------------------------------------------------------------------------


def slow_prefill(engine: FakeEngine, seconds: float) -> Callable[[dict[str, Any]], Any]:
    async def answer(body: dict[str, Any]) -> web.Response:
        await asyncio.sleep(seconds)
        return engine.answer(body)  # type: ignore[no-any-return]

    return answer


async def test_without_events_a_shared_prefix_follows_the_prompts_sent_and_does_not_hot_spot(
    engines: dict[str, FakeEngine], make_router: Callable[..., Any]
) -> None:
    first, second = engines["prefill"], engines["prefill2"]
    route = await make_router(
        prefill=(first.url, second.url), decode=(engines["decode"].url,), cache_aware=True, kv_events_port=0
    )
    shared = " ".join(f"w{i}" for i in range(400))
    for turn in range(4):  # one at a time: each goes where the last one went (round robin would alternate)
        status, _ = await route.post({"prompt": f"{shared} turn {turn}", "max_tokens": 2})
        assert status == 200
    counts = sorted((len(first.received), len(second.received)))
    assert counts == [0, 4], counts
    assert await route.sample("npu_router_choice_reasons_total", reason="cache") == 3
    assert await route.sample("npu_router_prefix_tokens_saved_total") >= 3 * 390
    # Many at once, all sharing the prefix: the holder's queue outweighs the prefix, the other engine
    # takes a share.
    first.behaviour, second.behaviour = slow_prefill(first, 0.3), slow_prefill(second, 0.3)
    results = await asyncio.gather(
        *(route.post({"prompt": f"{shared} at once {n}", "max_tokens": 2}) for n in range(12))
    )
    assert all(status == 200 for status, _ in results)
    assert min(len(first.received), len(second.received)) >= 4, (len(first.received), len(second.received))


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def vllm_publisher(host: str, port: int, replay: int) -> Any:
    """vLLM's own publisher on `host`'s address, as the runtime renders its endpoints (an engine each)."""
    where = bind_address(host)
    return kv.ZmqEventPublisher(0, endpoint=f"tcp://{where}:{port}", replay_endpoint=f"tcp://{where}:{replay}")


@pytest.fixture
def hosts() -> tuple[str, str]:
    return "127.0.0.1", "127.0.0.2"


async def test_the_second_turn_goes_where_the_engine_s_events_hold_its_prefix(
    make_router: Callable[..., Any], hosts: tuple[str, str]
) -> None:
    port, replay = free_port("127.0.0.1"), free_port("127.0.0.1")
    prefills = [FakeEngine("prefill", host) for host in hosts]
    decode = FakeEngine("decode")
    publishers = [vllm_publisher(host, port, replay) for host in hosts]
    for engine in (*prefills, decode):
        await engine.start()
    try:
        for engine, publisher in zip(prefills, publishers, strict=True):
            engine.behaviour = publishing(engine, publisher)
        route = await make_router(
            prefill=tuple(engine.url for engine in prefills),
            decode=(decode.url,),
            cache_aware=True,
            kv_events_port=port,
            kv_replay_port=replay,
            resolve_seconds=0.2,
        )
        caches = route.router.choice.caches
        # Events for a prompt the router never sent (another router's client): only the events know.
        other = [{"role": "user", "content": "tell me about " + " ".join(f"x{i}" for i in range(64))}]
        publishers[1].publish(kv.KVEventBatch(ts=time.time(), events=events_for(fake_tokens(chat_text(other)))))
        await eventually(lambda: len(caches[prefills[1].url].ranks[0]) > 0)
        assert await route.sample("npu_router_kv_event_streams", engine=prefills[1].url) == 1
        status, _ = await route.post({"messages": other, "max_tokens": 2}, "/v1/chat/completions")
        assert status == 200 and len(prefills[1].received) == 1 and not prefills[0].received

        # A conversation: its first turn wherever load sends it, its second where that one's events went.
        for conversation in range(3):
            talk = [{"role": "user", "content": f"conversation {conversation} " + "word " * 80}]
            status, _ = await route.post({"messages": talk, "max_tokens": 2}, "/v1/chat/completions")
            assert status == 200
            first = next(engine for engine in prefills if engine.received and engine.received[-1]["messages"] == talk)
            keys = Prompt(fake_tokens(chat_text(talk)), None, None).keys(4)
            index = caches[first.url].ranks[0]
            await eventually(lambda index=index, keys=keys: index.held_blocks(keys) >= 20)  # type: ignore[misc]
            talk += [{"role": "assistant", "content": "decoded"}, {"role": "user", "content": "and then?"}]
            before = {engine.url: len(engine.received) for engine in prefills}
            status, _ = await route.post({"messages": talk, "max_tokens": 2}, "/v1/chat/completions")
            assert status == 200
            assert len(first.received) == before[first.url] + 1, conversation
        assert await route.sample("npu_router_prefix_hits_total") >= 4

        # The publisher dies mid-run: every request is still answered; its stream is no longer live.
        async def keep_asking() -> list[int]:
            statuses = []
            for n in range(10):
                status, _ = await route.post({"prompt": f"after {n} " + "z " * 50, "max_tokens": 2})
                statuses.append(status)
            return statuses

        asking = asyncio.ensure_future(keep_asking())
        await asyncio.sleep(0.05)
        publishers[0].shutdown()
        assert await asking == [200] * 10
        await eventually(lambda: caches[prefills[0].url].live == [False])
        assert await route.sample("npu_router_kv_event_streams", engine=prefills[0].url) == 0
    finally:
        for publisher in publishers:
            publisher.shutdown()
        for engine in (*prefills, decode):
            await engine.stop()


def events_for(tokens: list[int], size: int = 4) -> list[Any]:
    full = len(tokens) // size * size
    return [stored(tokens[:full], [f"{tokens[:end]}".encode() for end in range(size, full + 1, size)], size=size)]


def publishing(engine: FakeEngine, publisher: Any) -> Callable[[dict[str, Any]], Any]:
    """A prefill engine that, like vLLM, publishes the blocks of each prompt it computed."""

    def answer(body: dict[str, Any]) -> Any:
        text = chat_text(body["messages"]) if "messages" in body else body["prompt"]
        with contextlib.suppress(RuntimeError):  # a publisher shut down: the engine still answers
            publisher.publish(kv.KVEventBatch(ts=time.time(), events=events_for(fake_tokens(text))))
        return engine.answer(body)

    return answer


@contextlib.asynccontextmanager
async def published(batches: int) -> AsyncIterator[kv_events.KvEventStreams]:
    """vLLM's publisher on 127.0.0.1 after it published `batches` batches of one block each (seq 0
    on, block n of tokens [n] * 4), and the router's streams for its ports."""
    port, replay = free_port("127.0.0.1"), free_port("127.0.0.1")
    events = vllm_publisher("127.0.0.1", port, replay)
    streams = kv_events.KvEventStreams(port, replay, 1, 2.0, lambda engine: EngineCache(), lambda e, c: None)
    try:
        for n in range(batches):
            events.publish(kv.KVEventBatch(ts=time.time(), events=[stored([n] * 4, [n])]))
        await asyncio.sleep(0.3)
        yield streams
    finally:
        events.shutdown()
        await streams.close()


def new_stream(streams: kv_events.KvEventStreams) -> tuple[kv_events.Stream, EngineCache]:
    """A stream of the publisher's engine that has heard nothing yet, and its engine's indexes."""
    cache = EngineCache()
    return kv_events.Stream(streams, Engine("prefill", "http://e", "127.0.0.1"), 0, cache), cache


async def test_replay_from_vllm_s_own_replay_endpoint() -> None:
    async with published(4) as streams:
        batches = await streams.replay("127.0.0.1", 0, 1)
        assert batches is not None and [seq for seq, _ in batches] == [1, 2, 3]
        stream, cache = new_stream(streams)
        await stream.batch(0, one_block(0))
        await stream.batch(3, batches[-1][1])
        assert all(held(cache, n) for n in range(4))


async def test_a_stream_that_joins_late_reads_what_the_replay_buffer_holds_first() -> None:
    """A router started after the engine: the blocks the engine stored before are asked of its replay
    endpoint, so a conversation begun before the router's restart still finds its engine."""
    async with published(3) as streams:
        stream, cache = new_stream(streams)
        await stream.batch(3, one_block(3))  # the first batch this subscriber hears
        assert all(held(cache, n) for n in range(4)), "batches 0 to 2 came from the replay buffer"
        silent = kv_events.KvEventStreams(streams.port, 0, 1, 2.0, lambda engine: EngineCache(), lambda e, c: None)
        stream, without = new_stream(silent)
        await stream.batch(3, one_block(3))
        assert [held(without, n) for n in range(4)] == [False, False, False, True], "no replay port: only what came"


async def test_a_connection_reads_the_replay_buffer_before_any_new_batch() -> None:
    """A router started after the engine, while the engine publishes nothing new (no traffic yet)."""
    async with published(3) as streams:
        stream, cache = new_stream(streams)
        await stream.connected()
        assert all(held(cache, n) for n in range(3)) and cache.live[0]
        await stream.batch(2, one_block(2))  # the same batch again, from the PUB socket: skipped
        await stream.batch(3, one_block(3))
        assert all(held(cache, n) for n in range(4))

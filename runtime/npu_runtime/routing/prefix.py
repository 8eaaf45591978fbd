"""What prefix of a prompt each prefill engine holds in its KV cache: the index and its scoring (no I/O).

Two indexes per engine, both keyed by the router's own chained block keys (`block_keys`):

- exact (`ExactIndex`), fed by the engine's KV events (kv_events.py; vLLM's
  vllm/distributed/kv_events.py `BlockStored`, `BlockRemoved`, `AllBlocksCleared`, published from
  vllm/v1/core/block_pool.py `BlockPool.cache_full_blocks`, `emit_cached_block_events`,
  `_emit_block_removed_events`, `reset_prefix_cache`). vLLM's own block hash
  (vllm/v1/core/kv_cache_utils.py `hash_block_tokens`: the hash of (parent hash, the block's token
  ids, its extra keys), the first parent `NONE_HASH` from a seed) cannot be recomputed here without
  the engine's seed and hash function, so the router hashes the `token_ids` a `BlockStored` carries
  itself, in chunks of its `block_size`, chained from the router key of its `parent_block_hash`
  (a map engine hash -> router key per engine resolves parents and removals). The chain's root is
  the request's LoRA adapter name and cache salt (`generate_block_hash_extra_keys`: the LoRA name
  on every block, the `cache_salt` on the first; published untagged in `extra_keys`,
  `to_event_extra_keys`). A block whose extra keys hold anything else (a multimodal item, prompt
  embeddings) cannot be matched from token ids, so it and its descendants are not indexed. Only
  the GPU tier (`medium` GPU or none) and the first KV cache group (`group_idx` 0 or none) count.
  A `BlockStored` whose parent the router does not know (it started after the engine, or dropped
  the parent at its bound) is skipped: the index only ever under-counts.
- approximate (`ApproximateIndex`), for an engine without a live event stream: the block keys of
  each prompt the router sent it, taken as cached until `APPROXIMATE_TTL_SECONDS` pass (the
  speculative indexer of llm-d's approximate prefix-cache scorer), at most
  `APPROXIMATE_MAX_BLOCKS` per engine, least recently used dropped first; keyed in chunks of
  `APPROXIMATE_BLOCK_TOKENS` tokens.

Memory: each index holds at most its bound of blocks (the exact one `--prefix-max-blocks` per
engine and DP rank, oldest stored or reused dropped first; the approximate one
`APPROXIMATE_MAX_BLOCKS`). An exact entry is one OrderedDict entry (router key -> engine hash) and
one dict entry (engine hash -> router key): about `EXACT_BYTES_PER_BLOCK` bytes with vLLM's
32-byte sha256 hashes (measured in tests/runtime/routing/test_prefix_cache.py), so the default
262,144 blocks are about 90 MB per engine at most; an approximate entry about
`APPROXIMATE_BYTES_PER_BLOCK`.

How much of a request an engine holds (`held_blocks`): the number of leading block keys of the
prompt it holds, in the engine's block size (learned from its `BlockStored` events).
"""

from __future__ import annotations

import array
import collections
import hashlib
import itertools
from collections.abc import Container, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final

DEFAULT_MAX_BLOCKS: Final = 1 << 18  # exact blocks per engine (and DP rank)
EXACT_BYTES_PER_BLOCK: Final = 350  # upper estimate, see the tests
APPROXIMATE_MAX_BLOCKS: Final = 1 << 16
APPROXIMATE_BYTES_PER_BLOCK: Final = 150
APPROXIMATE_TTL_SECONDS: Final = 120.0
APPROXIMATE_BLOCK_TOKENS: Final = 16
_MEDIA: Final = (None, "GPU")


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def root_key(lora_name: str | None, cache_salt: str | None) -> int:
    """The key the chain of a prompt starts from: its adapter and salt (both change vLLM's hash)."""
    return _digest(repr(("npu-router-root", lora_name or None, cache_salt or None)).encode())


def next_key(parent: int, tokens: Sequence[int]) -> int:
    """The key of a block of `tokens` after the block keyed `parent`."""
    return _digest(parent.to_bytes(8, "big") + array.array("q", tokens).tobytes())


def block_keys(tokens: Sequence[int], block_size: int, root: int) -> list[int]:
    """The keys of the full blocks of `tokens` (a partial last block is never cached)."""
    keys: list[int] = []
    parent = root
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = next_key(parent, tokens[start : start + block_size])
        keys.append(parent)
    return keys


def _leading(keys: Iterable[int], held: Container[int]) -> int:
    """How many of `keys` are in `held`, counted from the first until one is not."""
    return sum(1 for _ in itertools.takewhile(held.__contains__, keys))


def _plain(value: Any) -> Any:
    """msgpack's lists as tuples, so extra keys compare as vLLM published them."""
    return tuple(_plain(item) for item in value) if isinstance(value, list | tuple) else value


def _root_of(event: Mapping[str, Any]) -> int | None:
    """The root key of a `BlockStored` without a parent, from its lora name and first extra keys;
    None when those hold anything but a LoRA name and a cache salt (multimodal, embeddings)."""
    lora_name = event.get("lora_name")
    extra = event.get("extra_keys") or [None]
    keys = list(_plain(extra[0]) or ())
    if lora_name is not None and keys and keys[0] == lora_name:
        keys.pop(0)
    salt = keys.pop(0) if keys and isinstance(keys[0], str) else None
    return None if keys else root_key(lora_name, salt)


def _plain_extra(keys: Any, lora_name: Any) -> bool:
    """Whether one block's extra keys are its LoRA name at most (a block past the first)."""
    found = list(_plain(keys) or ())
    return not found or found == [lora_name]


class ExactIndex:
    """One engine's (one DP rank's) cached blocks as its KV events tell them."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.block_size = 0  # learned from BlockStored; 0: none seen
        self._blocks: collections.OrderedDict[int, Hashable] = collections.OrderedDict()  # key -> engine hash
        self._by_hash: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def apply(self, events: Iterable[Any]) -> None:
        """One batch's events (msgpack-decoded: maps with vLLM's tag in "type")."""
        for event in events:
            if not isinstance(event, Mapping):
                continue
            kind = event.get("type")
            if kind == "AllBlocksCleared":
                self.clear()
            elif event.get("medium") not in _MEDIA or event.get("group_idx") not in (None, 0):
                continue
            elif kind == "BlockStored":
                self.stored(event)
            elif kind == "BlockRemoved":
                for engine_hash in event.get("block_hashes") or ():
                    self._remove(_plain(engine_hash))

    def stored(self, event: Mapping[str, Any]) -> None:
        hashes = [_plain(engine_hash) for engine_hash in event.get("block_hashes") or ()]
        tokens = event.get("token_ids") or []
        size = event.get("block_size")
        if not hashes or not isinstance(size, int) or size <= 0 or len(tokens) < size * len(hashes):
            return
        extra = list(event.get("extra_keys") or [])
        extra += [None] * (len(hashes) - len(extra))
        lora_name = event.get("lora_name")
        parent_hash = _plain(event.get("parent_block_hash"))
        if parent_hash is None:
            parent: int | None = _root_of(event)
        else:
            parent = self._by_hash.get(parent_hash)
            if parent is not None and not _plain_extra(extra[0], lora_name):
                parent = None
        if parent is None:
            return  # unknown parent or keys the router cannot reproduce: the blocks are not indexed
        if len(hashes) * size == len(tokens):  # full blocks (a partial entry's size is its own)
            self.block_size = max(self.block_size, size)
        for index, engine_hash in enumerate(hashes):
            if index and not _plain_extra(extra[index], lora_name):
                return
            parent = next_key(parent, tokens[index * size : (index + 1) * size])
            self._add(parent, engine_hash)

    def _add(self, key: int, engine_hash: Hashable) -> None:
        old = self._blocks.pop(key, None)
        if old is not None and old != engine_hash:
            self._by_hash.pop(old, None)
        self._blocks[key] = engine_hash
        self._by_hash[engine_hash] = key
        while len(self._blocks) > self.max_blocks:
            _, dropped = self._blocks.popitem(last=False)
            self._by_hash.pop(dropped, None)

    def _remove(self, engine_hash: Hashable) -> None:
        key = self._by_hash.pop(engine_hash, None)
        if key is not None:
            self._blocks.pop(key, None)

    def clear(self) -> None:
        self._blocks.clear()
        self._by_hash.clear()

    def held_blocks(self, keys: Sequence[int]) -> int:
        """How many of `keys` (a prompt's, in this engine's block size) it holds, from the first."""
        return _leading(keys, self._blocks)


class ApproximateIndex:
    """The blocks of the prompts sent to one engine, taken as cached for a while."""

    def __init__(self, max_blocks: int = APPROXIMATE_MAX_BLOCKS, ttl_seconds: float = APPROXIMATE_TTL_SECONDS) -> None:
        self.max_blocks = max_blocks
        self.ttl_seconds = ttl_seconds
        self._until: collections.OrderedDict[int, float] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    def sent(self, keys: Sequence[int], now: float) -> None:
        """A prompt with `keys` went to the engine at `now`."""
        until = now + self.ttl_seconds
        for key in keys:
            self._until.pop(key, None)
            self._until[key] = until
        while len(self._until) > self.max_blocks:
            self._until.popitem(last=False)

    def held_blocks(self, keys: Sequence[int], now: float) -> int:
        """How many of `keys` it is taken to hold, from the first (expired ones are dropped)."""
        while self._until:  # the oldest first: expired entries go as they are met
            key, until = next(iter(self._until.items()))
            if until > now:
                break
            del self._until[key]
        return _leading(keys, self._until)

    def clear(self) -> None:
        self._until.clear()


class Prompt:
    """A request's prompt as the indexes see it: its tokens and chain root, keys per block size."""

    __slots__ = ("_keys", "root", "tokens")

    def __init__(self, tokens: Sequence[int], lora_name: str | None, cache_salt: str | None) -> None:
        self.tokens = tokens
        self.root = root_key(lora_name, cache_salt)
        self._keys: dict[int, list[int]] = {}

    def keys(self, block_size: int) -> list[int]:
        if block_size not in self._keys:
            self._keys[block_size] = block_keys(self.tokens, block_size, self.root)
        return self._keys[block_size]

    def cached_tokens(self, blocks: int, block_size: int) -> int:
        """The tokens `blocks` leading blocks save: vLLM computes the last prompt token anyway
        (vllm/v1/core/kv_cache_manager.py `get_computed_blocks`: at most len - 1 hit)."""
        return max(0, min(blocks * block_size, len(self.tokens) - 1))


class EngineCache:
    """One prefill engine's indexes: an exact one per DP rank (`live` while its event stream is), and
    the approximate one, used while no rank's stream is live, and beside a rank's exact index for
    `APPROXIMATE_TTL_SECONDS` after it was cleared (what the engine held before is not in it)."""

    def __init__(self, ranks: int = 1, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.ranks = [ExactIndex(max_blocks) for _ in range(max(1, ranks))]
        self.live = [False] * len(self.ranks)
        self.rebuilt_at = [0.0] * len(self.ranks)  # monotonic time each rank's index was last cleared
        self.approximate = ApproximateIndex()

    @property
    def streams(self) -> int:
        """Its event streams live now."""
        return sum(self.live)

    def cached_tokens(self, prompt: Prompt, now: float) -> int:
        """The prompt tokens it is taken to hold: the most any live rank's events show (vLLM's data
        parallel front end picks the rank itself), else what the approximate index remembers."""
        blocks = self.approximate.held_blocks(prompt.keys(APPROXIMATE_BLOCK_TOKENS), now)
        approximate = prompt.cached_tokens(blocks, APPROXIMATE_BLOCK_TOKENS)
        found: list[int] = []
        for index, up, rebuilt_at in zip(self.ranks, self.live, self.rebuilt_at, strict=True):
            if not up:
                continue
            held = index.held_blocks(prompt.keys(index.block_size)) if index.block_size else 0
            exact = prompt.cached_tokens(held, index.block_size)
            found.append(max(exact, approximate) if now - rebuilt_at < self.approximate.ttl_seconds else exact)
        return max(found) if found else approximate

    def sent(self, prompt: Prompt, now: float) -> None:
        """`prompt` was sent to it: the approximate index takes its blocks as cached."""
        self.approximate.sent(prompt.keys(APPROXIMATE_BLOCK_TOKENS), now)

"""Which engine of a role a request goes to: its work in the units each role's pool counts, and the
pool's pick (`engines.Pool.pick`: the least outstanding work for the engine's speed).

How the router counts work (engines.py): a prompt token is a unit on prefill; on decode an output
token is one, and each `DECODE_PROMPT_TOKENS` of prompt one more (the KV it pulls and attends to).
A request's output tokens are its `max_tokens` (or `max_completion_tokens`) times its `n`; one
without them counts the typical output, a moving average of the decode answers seen.

A request for a LoRA adapter goes only to engines that hold it, on each role (`Work.adapter`,
lora.py `adapter_for`).

Cache-aware choice of the prefill engine (`--cache-aware`; off, the choice is by load alone): the
prompt's token ids come from vLLM's own `/tokenize` on one prefill engine (`tokenize_payload`: the
fields that change the tokens, as vllm/entrypoints/serve/tokenize/protocol.py
`TokenizeCompletionRequest` and `TokenizeChatRequest` take them, v0.31; a completion whose prompt is
token ids needs no call), one extra call per request bounded by `--connect-timeout`; without an
answer the request is chosen by load (reason `no_tokens`). Each engine's held prefix `s_e`, in
tokens, is what its KV events show (prefix.py `ExactIndex`, kv_events.py) or, while it has no live
stream, what the prompts sent to it leave (`ApproximateIndex`). The engine chosen is the one where
the request's time is least (engines.py `Pool.pick_cached`):

    t_e x (work_e + w - s_e),   w = prompt tokens + PREFILL_OVERHEAD_TOKENS,

`s_e` counted only while the engine is within `F` = `--cache-load-factor` (default 2) of the least
busy engine: `t_e x (work_e + w) <= F x min over engines of the same`, and its calls in flight
`b_e <= F x min b + 1`. Affinity never sends a prompt to an engine more than F times as busy as the
least busy one; a prefix every request shares spreads over the engines once its holder has more
than one call in flight beyond F times the others' (a cached prompt is few tokens of work, yet each
takes the engine's steps), and then both hold it. The chosen engine's ticket counts `w - s_e` (the
work it does). Decode is chosen by load, as before.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final

from npu_runtime.routing import lora, trust
from npu_runtime.routing.engines import Engine, Pool
from npu_runtime.routing.options import ROLES, RouterOptions
from npu_runtime.routing.prefix import EngineCache, Prompt

BYTES_PER_TOKEN: Final = 4
DECODE_PROMPT_TOKENS: Final = 64
PREFILL_OVERHEAD_TOKENS: Final = 16
DEFAULT_OUTPUT_TOKENS: Final = 256  # a request without max_tokens, until outputs are seen
MAX_CHOICES: Final = 128.0
TYPICAL_OUTPUT_WEIGHT: Final = 0.05


def role_pools(options: RouterOptions, probe: Callable[[Engine], Awaitable[bool]]) -> dict[str, Pool]:
    """Each role's pool of engines, from its URLs; `probe` asks an ejected engine's /health."""
    return {
        role: Pool(
            role,
            getattr(options, role),
            batched=role == "decode",
            eject_seconds=options.eject_seconds,
            probe=probe,
        )
        for role in ROLES
    }


@dataclasses.dataclass(frozen=True)
class Work:
    """One request's work: its tokens, and what they are in each role's units."""

    prompt_tokens: float
    output_tokens: float
    adapter: str | None = None  # the LoRA adapter its engines must hold; None: any engine
    prompt: Prompt | None = dataclasses.field(default=None, compare=False)  # its tokens, when known

    @property
    def prefill(self) -> float:
        return self.prompt_tokens + PREFILL_OVERHEAD_TOKENS

    @property
    def decode_prompt(self) -> float:
        """The decode units of the prompt alone (done once the answer starts)."""
        return self.prompt_tokens / DECODE_PROMPT_TOKENS

    @property
    def decode(self) -> float:
        return self.output_tokens + self.decode_prompt

    def units(self, role: str) -> float:
        return self.prefill if role == "prefill" else self.decode


# The chat template's inputs (TokenizeChatRequest), passed on as the client sent them.
CHAT_TOKENIZE_FIELDS: Final = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "mm_processor_kwargs",
    "media_io_kwargs",
)


def tokenize_payload(body: Mapping[str, Any]) -> dict[str, Any] | list[int] | None:
    """What vLLM's /tokenize is asked for the prompt of `body` (a completion or a chat completion):
    the same prompt and template inputs, so that its tokens are the ones the completion sees; a
    completion's prompt that is token ids already is returned as they are; None for a prompt that is
    none of these (a batch of prompts, embeddings)."""
    model = body.get("model")
    payload: dict[str, Any] = {"model": model} if isinstance(model, str) else {}
    if "messages" in body:
        if not isinstance(body["messages"], list):
            return None
        payload["messages"] = body["messages"]
        payload.update({key: body[key] for key in CHAT_TOKENIZE_FIELDS if body.get(key) is not None})
        return payload
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(token) is int and token >= 0 for token in prompt):
        return list(prompt)
    if not isinstance(prompt, str):
        return None
    payload["prompt"] = prompt
    if isinstance(body.get("add_special_tokens"), bool):
        payload["add_special_tokens"] = body["add_special_tokens"]
    return payload


class EngineChoice:
    """Picks each call's engine from the role's pool, by the request's work."""

    def __init__(self, pools: Mapping[str, Pool], options: RouterOptions | None = None) -> None:
        self.pools = pools
        self.typical_output_tokens = float(DEFAULT_OUTPUT_TOKENS)
        self.cache_aware = options is not None and options.cache_aware
        self.load_factor = options.cache_load_factor if options is not None else 1.0
        self._ranks = options.kv_events_ranks if options is not None else 1
        self._max_blocks = options.prefix_max_blocks if options is not None else 1
        self.caches: dict[str, EngineCache] = {}  # per prefill engine URL

    # --- the cache-aware choice of the prefill engine -------------------------------------------

    def cache_for(self, engine: Engine) -> EngineCache:
        """The prefill engine's indexes (made when first needed)."""
        cache = self.caches.get(engine.url)
        if cache is None:
            cache = self.caches[engine.url] = EngineCache(self._ranks, self._max_blocks)
        return cache

    def forget_gone(self) -> None:
        """Drop the indexes of the prefill engines the pool no longer has."""
        known = {engine.url for engine in self.pools["prefill"].known()}
        for url in list(self.caches):
            if url not in known:
                del self.caches[url]

    def with_tokens(self, work: Work, tokens: list[int], body: Mapping[str, Any]) -> Work:
        """`work` counted from its prompt's token ids (not its bytes), keyed for the indexes."""
        salt = body.get("cache_salt")
        prompt = Prompt(tokens, work.adapter, salt if isinstance(salt, str) else None)
        return dataclasses.replace(work, prompt_tokens=float(len(tokens)), prompt=prompt)

    def pick_prefill(self, work: Work, exclude: Collection[Engine] = ()) -> tuple[Engine | None, float, str]:
        """The prefill engine for `work` by its time with the prefix each holds (see the module's
        doc): the engine, the units it saves, and the reason; by load alone while its tokens are
        unknown (or the router is not --cache-aware)."""
        pool = self.pools["prefill"]
        prompt = work.prompt
        if prompt is None:
            return pool.pick(work.prefill, exclude, work.adapter), 0.0, "no_tokens"
        now = time.monotonic()
        saved = {engine: float(self.cache_for(engine).cached_tokens(prompt, now)) for engine in pool.engines}
        return pool.pick_cached(work.prefill, saved, self.load_factor, exclude, work.adapter)

    def sent(self, engine: Engine, work: Work) -> None:
        """`work`'s prompt went to the prefill `engine` (the approximate index takes it as cached)."""
        if work.prompt is not None:
            self.cache_for(engine).sent(work.prompt, time.monotonic())

    def work(self, data: bytes, body: dict[str, Any]) -> Work:
        """The work of a request whose body is `data` (`body` parsed); vLLM's 404 (an `Answer`) for a
        model no engine serves, while some list adapters (`lora.adapter_for`)."""
        adapter = lora.adapter_for(body.get("model"), tuple(self.pools.values()))
        return Work(len(data) / BYTES_PER_TOKEN, self._output_tokens(body), adapter)

    def _output_tokens(self, body: dict[str, Any]) -> float:
        limit = trust.finite_number(body.get("max_tokens")) or trust.finite_number(body.get("max_completion_tokens"))
        choices = trust.finite_number(body.get("n")) or 1.0
        return (limit or self.typical_output_tokens) * max(1.0, min(choices, MAX_CHOICES))

    def pick(self, role: str, work: Work, exclude: Collection[Engine] = ()) -> Engine | None:
        """The engine of `role` for `work`, none of `exclude`, one holding its adapter if it has one
        (None: the role has no other)."""
        return self.pools[role].pick(work.units(role), exclude, work.adapter)

    def holders(self, role: str, work: Work) -> bool:
        """Whether `role` still has an engine for `work`'s adapter (always, for a request without one)."""
        adapter = work.adapter
        return adapter is None or any(engine.holds(adapter) for engine in self.pools[role].engines)

    def output_seen(self, tokens: int) -> None:
        """A decode answer's output tokens, for the typical output."""
        self.typical_output_tokens += TYPICAL_OUTPUT_WEIGHT * (tokens - self.typical_output_tokens)

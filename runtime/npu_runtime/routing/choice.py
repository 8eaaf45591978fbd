"""Which engine of a role a request goes to: its work in the units each role's pool counts, and the
pool's pick (`engines.Pool.pick`: the least outstanding work for the engine's speed).

How the router counts work (engines.py): a prompt token is a unit on prefill; on decode an output
token is one, and each `DECODE_PROMPT_TOKENS` of prompt one more (the KV it pulls and attends to).
A request's output tokens are its `max_tokens` (or `max_completion_tokens`) times its `n`; one
without them counts the typical output, a moving average of the decode answers seen.

A request for a LoRA adapter goes only to engines that hold it, on each role (`Work.adapter`,
lora.py `adapter_for`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final

from npu_runtime.routing import lora, trust
from npu_runtime.routing.engines import Engine, Pool
from npu_runtime.routing.options import ROLES, RouterOptions

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


class EngineChoice:
    """Picks each call's engine from the role's pool, by the request's work."""

    def __init__(self, pools: Mapping[str, Pool]) -> None:
        self.pools = pools
        self.typical_output_tokens = float(DEFAULT_OUTPUT_TOKENS)

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

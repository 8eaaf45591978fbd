"""LoRA adapters: which engines hold which, and which engines a request's model may go to.

vLLM serves a base model and the adapters loaded into it from one engine; each adapter is a model
name clients send. Its `/v1/models` lists the base model's names (`parent` null) and each adapter
loaded now (`parent` the base model, `root` its path; vllm/entrypoints/openai/models/serving.py
`OpenAIServingModels.show_available_models`, v0.31). Adapters come and go at runtime
(`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`), so the engines of one role may hold different
ones for a while. The router asks every engine's `/v1/models` when it starts and every
`--resolve-seconds` (`EngineCalls.listing`, bounded by `--connect-timeout`), and again when an
engine taken out is probed back in; an engine not asked yet, or whose answer failed, is trusted
with no adapter.

Which engines a request may go to (`adapter_for`): the base model's, a request without a model and
any model while no engine lists an adapter go anywhere, as before; an adapter only to the engines
that list it, on both roles; any other name, while adapters are listed, is answered 404 in vLLM's own
shape (`unknown_model`) and reaches no engine. An engine that answers a request for an adapter with
vLLM's 404 "does not exist" (`says_missing`) no longer holds it: the call is retried on another
holder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator
from typing import Any, Final

from npu_runtime.routing import trust
from npu_runtime.routing.engines import Listing, Pool
from npu_runtime.routing.errors import Answer

MAX_MODELS_BYTES: Final = 1 << 20
MAX_MODELS: Final = 4096  # entries of one /v1/models list kept (vLLM's --max-cpu-loras is far below)
NOT_FOUND: Final = 404


def parse_listing(data: bytes) -> Listing | None:
    """What an engine's /v1/models answer lists; None when it is not vLLM's model list."""
    try:
        answer = trust.parse_json(data)
    except ValueError:
        return None
    entries = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        return None
    bases: set[str] = set()
    adapters: set[str] = set()
    for entry in entries[:MAX_MODELS]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        (adapters if isinstance(entry.get("parent"), str) else bases).add(entry["id"])
    return Listing(frozenset(bases), frozenset(adapters - bases))


def _listings(pools: Collection[Pool]) -> Iterator[Listing]:
    for pool in pools:
        for engine in pool.engines:
            if engine.listing is not None:
                yield engine.listing


def adapter_for(model: Any, pools: Collection[Pool]) -> str | None:
    """The adapter a request for `model` must go to holders of, on every role in `pools`; None when any
    engine may answer it. Raises `unknown_model`'s 404 for a name that is neither a base model nor an
    adapter every role holds, while some engine lists adapters."""
    if not isinstance(model, str):
        return None
    listings = list(_listings(pools))
    if not any(listing.adapters for listing in listings):
        return None
    if any(model in listing.bases for listing in listings):
        return None
    if all(any(engine.holds(model) for engine in pool.engines) for pool in pools):
        return model
    raise unknown_model(model)


def unknown_model(model: str) -> Answer:
    """vLLM's own answer to a request for a model it does not serve (vllm/entrypoints/serve/engine/
    serving.py `_check_model`: an `ErrorResponse` of type NotFoundError, param "model", code 404)."""
    error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "param": "model"}
    return Answer(NOT_FOUND, trust.dump_json({"error": {**error, "code": NOT_FOUND}}))


def says_missing(answer: Answer, adapter: str) -> bool:
    """Whether an engine's error `answer` is vLLM's 404 for `adapter`: it does not hold it (any more)."""
    if answer.status != NOT_FOUND:
        return False
    try:
        body = trust.parse_json(answer.body)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return isinstance(message, str) and f"`{adapter}` does not exist" in message


def forget(listing: Listing | None, adapter: str) -> Listing | None:
    """`listing` without `adapter` (an engine that answered that it does not hold it)."""
    if listing is None:
        return None
    return dataclasses.replace(listing, adapters=listing.adapters - {adapter})

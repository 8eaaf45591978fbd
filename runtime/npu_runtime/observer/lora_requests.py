"""Requests per LoRA adapter (issue 47): vLLM's own request counters are labelled with the base model only.

Where (vLLM 0.31.0): `OutputProcessor.add_request(request, prompt, ...)` (vllm/v1/engine/output_processor.py)
is called by the frontend (`AsyncLLM.add_request`, vllm/v1/engine/async_llm.py, in the API server
process) once for every request it hands the engine core, after the request was accepted (its
sampling parameters and LoRA checked), with the `EngineCoreRequest` whose `lora_request.lora_name` is
the adapter the client named (`OpenAIServingModels` resolves the request's model to its LoRARequest;
the base model's requests carry None). A call for a request already in `request_states` is a
streaming input's next chunk (`_update_streaming_request_state`), not a new request: not counted. A
request with n > 1 is counted once per child, as vLLM's `vllm:request_success_total` counts it.

The count goes into the API server process's report (`lora_requests`), which `serve` sums over its
processes into `npu_lora_requests_total{adapter}`. The engine cores and workers never import the
output processor's frontend path, so nothing is counted twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from npu_runtime.observer import targets
from npu_runtime.observer.hooks import around
from npu_runtime.observer.patching import patch_target
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.targets import Binding


def adapter_of(processor: Any, request: Any) -> str | None:
    """The adapter a new request names; None for the base model or a streaming input's next chunk."""
    lora_request = getattr(request, "lora_request", None)
    if lora_request is None or request.request_id in processor.request_states:
        return None
    return str(lora_request.lora_name)


def lora_requests_wrapper(observer: Observer, original: Callable[..., Any], binding: Binding) -> Callable[..., Any]:
    hook = observer.hook(targets.LORA_REQUESTS_TARGET.hook)
    recorder = observer.recorder

    def before(processor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return adapter_of(processor, binding.get(args, kwargs, "request"))

    def after(processor: Any, args: tuple[Any, ...], kwargs: dict[str, Any], adapter: Any, result: Any) -> None:
        if adapter is not None:
            recorder.record_lora_request(str(adapter))

    return around(hook, original, before, after, require=targets.LORA_REQUESTS_TARGET.self_attributes)


def patch_output_processor(observer: Observer, module: ModuleType) -> None:
    """Hook `OutputProcessor.add_request` when `module` has it; unavailable otherwise."""
    target = targets.LORA_REQUESTS_TARGET
    cls = getattr(module, target.class_name, None)
    make = functools.partial(lora_requests_wrapper, observer)
    if cls is None or not patch_target(observer, cls, target, make):
        observer.unavailable(target.qualname)

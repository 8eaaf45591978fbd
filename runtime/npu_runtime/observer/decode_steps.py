"""Decode steps of the V1 model runners (vLLM's and vllm-ascend's): batch sizes and eager fallbacks.

- batch_dispatch: `_determine_batch_execution_and_padding`, decode steps, their batch sizes in
  tokens before padding, and eager fallbacks (uniform decode batches dispatched to no graph while
  graphs are on), with the reason (`eager_reason`, shared with model runner v2's graph manager).
- dummy_run: `_dummy_run`, marked while it runs so warmup, profiling and capture runs are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npu_runtime.observer.hooks import around
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.targets import Binding, Target


def _dummy_depth(observer: Observer) -> int:
    return int(getattr(observer.dummy, "depth", 0))


def dummy_run_wrapper(
    observer: Observer, original: Callable[..., Any], binding: Binding, target: Target
) -> Callable[..., Any]:
    """Warmup, profiling and capture runs are not decode steps: mark them while they run."""
    hook = observer.hook("dummy_run")
    state = observer.dummy

    def _dummy_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if hook.disabled:
            return original(self, *args, **kwargs)
        state.depth = getattr(state, "depth", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            state.depth -= 1

    return _dummy_run


def _graphs_enabled(runner: Any, none_mode: Any) -> bool:
    dispatcher = getattr(runner, "cudagraph_dispatcher", None)
    if dispatcher is not None and getattr(dispatcher, "keys_initialized", True):
        mode = getattr(dispatcher, "cudagraph_mode", None)
    else:
        mode = getattr(getattr(runner, "compilation_config", None), "cudagraph_mode", None)
    return mode is not None and mode != none_mode


def _max_capture_size(runner: Any) -> int | None:
    config = getattr(runner, "compilation_config", None)
    largest = getattr(config, "max_cudagraph_capture_size", None)
    if largest is None:
        sizes = getattr(config, "cudagraph_capture_sizes", None) or []
        largest = max(sizes) if sizes else None
    return int(largest) if largest is not None else None


def eager_reason(*, num_tokens: int, max_size: int | None, force_eager: bool = False, cascade: bool = False) -> str:
    """Why a decode step ran with no graph although graphs are on (CamelCase, a metric label)."""
    if force_eager:
        return "ForcedEager"
    if max_size is not None and num_tokens > max_size:
        return "BatchAboveMaxCaptureSize"
    if cascade:
        return "CascadeAttention"
    return "NoMatchingGraph"


def batch_dispatch_wrapper(
    observer: Observer, original: Callable[..., Any], binding: Binding, target: Target
) -> Callable[..., Any]:
    hook = observer.hook("batch_dispatch")
    recorder = observer.recorder

    def after(runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any, result: Any) -> None:
        if _dummy_depth(observer):
            return
        num_tokens = int(binding.get(args, kwargs, "num_tokens"))
        num_reqs = int(binding.get(args, kwargs, "num_reqs"))
        max_scheduled = int(binding.get(args, kwargs, "max_num_scheduled_tokens"))
        forced_uniform = binding.get(args, kwargs, "force_uniform_decode")
        query_len = int(getattr(runner, "uniform_decode_query_len", 1) or 1)
        if forced_uniform is not None:
            decode = bool(forced_uniform)
        else:
            decode = max_scheduled == query_len and num_tokens == query_len * num_reqs
        if not decode:
            return
        none_mode = observer.modes().NONE
        reason = None
        if _graphs_enabled(runner, none_mode) and result[0] == none_mode:
            reason = eager_reason(
                num_tokens=num_tokens,
                max_size=_max_capture_size(runner),
                force_eager=bool(binding.get(args, kwargs, "force_eager", False)),
                cascade=bool(binding.get(args, kwargs, "use_cascade_attn", False)),
            )
        recorder.record_decode_step(reason, num_tokens)

    return around(hook, original, None, after, outermost_only=True, require=target.self_attributes)

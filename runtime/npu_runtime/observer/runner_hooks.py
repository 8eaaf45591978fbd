"""The model runners' hooks (vLLM's V1 and V2 runners, vllm-ascend's NPU and 310P runners): phases and memory.

`patch_runner` puts every hook the table (`targets.for_class`) lists for a runner class on it: the
decode-step hooks (`decode_steps`) and, here, capture_model (phase capturing/captured, graph and
device memory), load_model (weights) and initialize_kv_cache (KV cache memory).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from npu_runtime.observer import targets
from npu_runtime.observer.decode_steps import batch_dispatch_wrapper, dummy_run_wrapper
from npu_runtime.observer.hooks import around
from npu_runtime.observer.patching import patch_target
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.targets import Binding, Target

MakeRunnerWrapper = Callable[[Observer, Callable[..., Any], Binding, Target], Callable[..., Any]]


def patch_runner(observer: Observer, module: ModuleType, *, class_name: str) -> None:
    cls = getattr(module, class_name, None)
    if cls is None:
        observer.unavailable(f"{module.__name__}.{class_name}")
        return
    makers: dict[str, MakeRunnerWrapper] = {
        "batch_dispatch": batch_dispatch_wrapper,
        "dummy_run": dummy_run_wrapper,
        "capture_model": capture_model_wrapper,
        "load_model": load_model_wrapper,
        "initialize_kv_cache": kv_cache_wrapper,
    }
    for target in targets.for_class(module.__name__, class_name):
        make = makers[target.hook]
        # Only methods the class defines itself: an inherited one is hooked on its base class.
        patch_target(observer, cls, target, functools.partial(_make_runner_wrapper, make, observer, target))
    observer.recorder.ensure_flusher()


def _make_runner_wrapper(
    make: MakeRunnerWrapper,
    observer: Observer,
    target: Target,
    original: Callable[..., Any],
    binding: Binding,
) -> Callable[..., Any]:
    return make(observer, original, binding, target)


def _device_label(runner: Any) -> str:
    device = getattr(runner, "device", None)
    return str(device) if device is not None else "unknown"


def capture_model_wrapper(
    observer: Observer, original: Callable[..., Any], binding: Binding, target: Target
) -> Callable[..., Any]:
    hook = observer.hook("capture_model")
    recorder = observer.recorder

    def before(runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not binding.get(args, kwargs, "profile_only", False):
            recorder.set_phase("capturing")

    def after(runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any, result: Any) -> None:
        if binding.get(args, kwargs, "profile_only", False):
            return
        graphs = int(result) if isinstance(result, int) and not isinstance(result, bool) else None
        if graphs is None:
            seen = [entry.get("memory_bytes") for entry in recorder.captures.values()]
            graphs = sum(value for value in seen if value is not None) if seen else None
        info = observer.memory_info()
        recorder.record_memory(
            _device_label(runner),
            graphs=graphs,
            free=info[0] if info is not None else None,
            total=info[1] if info is not None else None,
        )
        recorder.set_phase("captured")

    return around(hook, original, before, after, outermost_only=True, require=target.self_attributes)


def load_model_wrapper(
    observer: Observer, original: Callable[..., Any], binding: Binding, target: Target
) -> Callable[..., Any]:
    hook = observer.hook("load_model")
    recorder = observer.recorder

    def after(runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any, result: Any) -> None:
        weights = getattr(runner, "model_memory_usage", None)
        info = observer.memory_info()
        recorder.record_memory(
            _device_label(runner),
            weights=int(weights) if isinstance(weights, int | float) else None,
            total=info[1] if info is not None else None,
        )

    return around(hook, original, None, after, outermost_only=True, require=target.self_attributes)


def kv_cache_wrapper(
    observer: Observer, original: Callable[..., Any], binding: Binding, target: Target
) -> Callable[..., Any]:
    hook = observer.hook("initialize_kv_cache")
    recorder = observer.recorder

    def after(runner: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any, result: Any) -> None:
        if binding.get(args, kwargs, "is_profiling", False):
            return
        config = binding.get(args, kwargs, "kv_cache_config")
        tensors = getattr(config, "kv_cache_tensors", None) or []
        size = sum(int(getattr(tensor, "size", 0) or 0) for tensor in tensors)
        info = observer.memory_info()
        recorder.record_memory(
            _device_label(runner),
            kv_cache=size if tensors else None,
            free=info[0] if info is not None else None,
            total=info[1] if info is not None else None,
        )

    return around(hook, original, None, after, outermost_only=True, require=target.self_attributes)

"""Model runner v2's CudaGraphManager hooks (vLLM only; a release without it runs the V1 runner).

graph_manager_capture / graph_manager_replay / graph_manager_dispatch: its capture, run_fullgraph
and dispatch, for the model's manager only (`ModelCudaGraphManager` where the release has it), not
the drafters'.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from npu_runtime.observer import targets
from npu_runtime.observer.decode_steps import eager_reason
from npu_runtime.observer.hooks import around
from npu_runtime.observer.patching import MakeWrapper, patch_target
from npu_runtime.observer.process_observer import CaptureToken, Observer, mode_name
from npu_runtime.observer.recorder import Key
from npu_runtime.observer.targets import Binding


def patch_graph_manager(observer: Observer, module: ModuleType) -> None:
    base = getattr(module, "CudaGraphManager", None)
    if base is None:
        observer.unavailable(f"{module.__name__}.CudaGraphManager")
        return
    model_manager = getattr(module, "ModelCudaGraphManager", None) or base
    try:
        none_mode = observer.modes().NONE
    except Exception:
        observer.unavailable("CudaGraphManager (vllm.config.CUDAGraphMode)")
        return
    patches: dict[str, MakeWrapper] = {
        "capture": lambda original, binding: manager_capture_wrapper(observer, original, model_manager),
        "run_fullgraph": lambda original, binding: manager_replay_wrapper(observer, original, model_manager),
        "dispatch": lambda original, binding: manager_dispatch_wrapper(
            observer, original, model_manager, none_mode, binding
        ),
    }
    for target in targets.for_class(targets.GRAPH_MANAGER, "CudaGraphManager"):
        if not patch_target(observer, base, target, patches[target.method]):
            observer.unavailable(f"CudaGraphManager.{target.method}")
    observer.recorder.ensure_flusher()


def manager_capture_wrapper(
    observer: Observer, original: Callable[..., Any], model_manager: type
) -> Callable[..., Any]:
    """Wrap the forward-function factory: a capture spans from its warmup=False call to the next call."""
    hook = observer.hook("graph_manager_capture")

    def capture(self: Any, create_forward_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if hook.disabled or not isinstance(self, model_manager):
            return original(self, create_forward_fn, *args, **kwargs)
        open_capture: list[tuple[Key, CaptureToken]] = []

        def close() -> None:
            if open_capture:
                observer.end_capture(*open_capture.pop())

        def factory(desc: Any, *fargs: Any, **fkwargs: Any) -> Any:
            if not hook.disabled:
                try:
                    close()
                    warmup = fkwargs.get("warmup", fargs[0] if fargs else False)
                    if not warmup:
                        key = (str(mode_name(desc.cg_mode)), int(desc.num_tokens))
                        open_capture.append((key, observer.begin_capture()))
                except Exception:
                    hook.fail()
            return create_forward_fn(desc, *fargs, **fkwargs)

        result = original(self, factory, *args, **kwargs)
        try:
            close()
        except Exception:
            hook.fail()
        return result

    return capture


def manager_replay_wrapper(observer: Observer, original: Callable[..., Any], model_manager: type) -> Callable[..., Any]:
    hook = observer.hook("graph_manager_replay")

    def run_fullgraph(self: Any, desc: Any, *args: Any, **kwargs: Any) -> Any:
        if hook.disabled or not isinstance(self, model_manager):
            return original(self, desc, *args, **kwargs)
        try:
            key = (str(mode_name(desc.cg_mode)), int(desc.num_tokens))
            token = observer.begin_replay(key)
        except Exception:
            hook.fail()
            return original(self, desc, *args, **kwargs)
        result = original(self, desc, *args, **kwargs)
        try:
            observer.end_replay(key, token)
        except Exception:
            hook.fail()
        return result

    return run_fullgraph


def manager_dispatch_wrapper(
    observer: Observer, original: Callable[..., Any], model_manager: type, none_mode: Any, binding: Binding
) -> Callable[..., Any]:
    hook = observer.hook("graph_manager_dispatch")
    recorder = observer.recorder

    def after(manager: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any, result: Any) -> None:
        if not isinstance(manager, model_manager) or not getattr(manager, "_graphs_captured", False):
            return
        if binding.get(args, kwargs, "uniform_token_count") is None:
            return  # not a uniform decode batch
        reason = None
        num_tokens = int(binding.get(args, kwargs, "num_tokens"))
        if getattr(result, "cg_mode", none_mode) == none_mode:
            captured = getattr(manager, "captured_token_counts", None)
            sizes = captured() if callable(captured) else []
            reason = eager_reason(num_tokens=num_tokens, max_size=max(sizes) if sizes else None)
        recorder.record_decode_step(reason, num_tokens)

    target = targets.target("graph_manager_dispatch", targets.GRAPH_MANAGER, "CudaGraphManager", "dispatch")
    return around(hook, original, None, after, require=target.self_attributes)

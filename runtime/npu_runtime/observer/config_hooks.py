"""The configuration hooks (every release, vLLM's own classes): the graph mode the engine resolves.

- config_post_init (API server): VllmConfig.__post_init__, requested vs final cudagraph_mode, and
  why the platform or the config changed it.
- resolve_mode (workers): CompilationConfig.resolve_cudagraph_mode_and_sizes, the mode the worker
  really runs, and the attention backend's support level when it lowered it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from npu_runtime.contract import GraphMode
from npu_runtime.observer import targets
from npu_runtime.observer.hooks import around
from npu_runtime.observer.patching import patch_target
from npu_runtime.observer.process_observer import Observer, mode_name
from npu_runtime.observer.targets import Binding

_UNSET: Final = object()


def patch_config(observer: Observer, module: ModuleType) -> None:
    post_init = targets.target("config_post_init", targets.CONFIG, "VllmConfig", "__post_init__")
    vllm_config = getattr(module, "VllmConfig", None)
    if vllm_config is None or not patch_target(
        observer, vllm_config, post_init, lambda original, binding: config_post_init_wrapper(observer, original)
    ):
        observer.unavailable("VllmConfig.__post_init__")
    resolve = targets.target("resolve_mode", targets.CONFIG, "CompilationConfig", "resolve_cudagraph_mode_and_sizes")
    compilation = getattr(module, "CompilationConfig", None)
    if compilation is None or not patch_target(
        observer, compilation, resolve, lambda original, binding: resolve_mode_wrapper(observer, original, binding)
    ):
        observer.unavailable("CompilationConfig.resolve_cudagraph_mode_and_sizes")


def config_post_init_wrapper(observer: Observer, original: Callable[..., Any]) -> Callable[..., Any]:
    hook = observer.hook("config_post_init")
    recorder = observer.recorder

    def before(config: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return mode_name(getattr(getattr(config, "compilation_config", None), "cudagraph_mode", None))

    def after(config: Any, args: tuple[Any, ...], kwargs: dict[str, Any], requested: Any, result: Any) -> None:
        final = mode_name(getattr(getattr(config, "compilation_config", None), "cudagraph_mode", None))
        if final is None:
            return
        recorder.record_config_mode(requested or final, final)
        if requested is not None and requested != final:
            reason, message = config_downgrade_reason(config, requested, final)
            recorder.record_downgrade(requested, final, reason, message)

    target = targets.target("config_post_init", targets.CONFIG, "VllmConfig", "__post_init__")
    return around(hook, original, before, after, outermost_only=True, require=target.self_attributes)


def config_downgrade_reason(config: Any, requested: str, final: str, *, platform: Any = _UNSET) -> tuple[str, str]:
    """Why VllmConfig (with the platform's check_and_update_config) changed the mode, best known.

    `platform` is vLLM's current_platform unless given. Where the cause is one the planner knows,
    the reason is its rule's (npu_runtime.planner.modes.RULES; a test holds the two together).
    """
    change = f"cudagraph_mode {requested} -> {final}"
    model_config = getattr(config, "model_config", None)
    if getattr(model_config, "enforce_eager", False):
        return "EnforceEager", f"enforce_eager is set, so the engine runs without graphs ({change})"
    if platform is _UNSET:
        try:
            from vllm.platforms import current_platform

            platform = current_platform
        except Exception:
            platform = None
    platform_name = type(platform).__name__ if platform is not None else "unknown platform"
    device = getattr(platform, "device_type", None) or "unknown"
    supports = getattr(platform, "support_static_graph_mode", None)
    if callable(supports) and not supports():
        return (
            "CpuHasNoGraphs" if device == "cpu" else "PlatformWithoutStaticGraphs",
            f"vLLM's {device} platform ({platform_name}) has no static graph support; "
            f"the engine set {change} without logging it",
        )
    if getattr(model_config, "pooler_config", None) is not None:
        return "PoolingModelNoFullGraphs", f"pooling models do not support full graphs ({change})"
    if getattr(model_config, "is_encoder_decoder", False):
        reason = "EncoderDecoderPiecewiseOnly" if final == GraphMode.PIECEWISE else "EncoderDecoderFullDecodeOnly"
        return reason, f"encoder-decoder models are limited in graph mode ({change})"
    return (
        "PlatformConfig",
        f"the engine configuration ({platform_name}.check_and_update_config or VllmConfig) set {change}",
    )


def resolve_mode_wrapper(observer: Observer, original: Callable[..., Any], binding: Binding) -> Callable[..., Any]:
    hook = observer.hook("resolve_mode")
    recorder = observer.recorder

    def before(config: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return mode_name(getattr(config, "cudagraph_mode", None))

    def after(config: Any, args: tuple[Any, ...], kwargs: dict[str, Any], requested: Any, result: Any) -> None:
        final = mode_name(result) if result is not None else mode_name(getattr(config, "cudagraph_mode", None))
        if final is None:
            return
        recorder.record_resolved_mode(final)
        if requested is None or requested in (final, GraphMode.NONE):
            return
        support = binding.get(args, kwargs, "min_cg_support")
        backend = binding.get(args, kwargs, "min_cg_attn_backend")
        piecewise_available = binding.get(args, kwargs, "piecewise_capture_available", True)
        support_name = mode_name(support)
        change = f"cudagraph_mode {requested} -> {final}"
        if support_name is not None and support_name != "ALWAYS":
            reason = "AttentionBackendUnsupported"
            message = f"attention backend {backend} supports graphs {support_name} only; the engine set {change}"
        elif piecewise_available is False:
            reason = "PiecewiseCaptureUnavailable"
            message = f"the model offers no piecewise capture; the engine set {change}"
        else:
            reason = "EngineResolved"
            message = f"the engine set {change} while resolving graph support"
        recorder.record_downgrade(requested, final, reason, message)

    target = targets.target("resolve_mode", targets.CONFIG, "CompilationConfig", "resolve_cudagraph_mode_and_sizes")
    return around(hook, original, before, after, outermost_only=True, require=target.self_attributes)

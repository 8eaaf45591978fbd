"""The hooks on vLLM's and vllm-ascend's classes. Every module, class and method is feature-detected.

What each hook patches and reads is the table in `targets`: parameters are bound by name from the
target's signature when it is patched, and a hook whose parameters are missing or moved refuses to
install (listed as unavailable with the name, counted in npu_graph_instrumentation_errors_total);
attributes read on the hooked object are checked at its first call. The table is checked against
every release in `npu_runtime.engines.RELEASES` by tests/compat (docs/serve.md shows the matrix);
what a release lacks is simply not hooked and is listed as unavailable. Engine-stage reason codes
reuse the planner's (npu_runtime.planner.modes) where the cause is the same, so a dashboard can put the
predicted and the observed downgrade side by side.

Hooks (the name is the `hook` label of npu_graph_instrumentation_errors_total):

- config_post_init: VllmConfig.__post_init__ (API server). Requested vs final cudagraph_mode; a
  change is a downgrade at stage engine, with a reason derived from the config and platform.
- resolve_mode: CompilationConfig.resolve_cudagraph_mode_and_sizes (workers). The mode the worker
  really runs; a change is a downgrade with the attention backend and its support level.
- cuda_graph_wrapper / acl_graph_wrapper: vLLM's CUDAGraphWrapper.__call__ and vllm-ascend's
  ACLGraphWrapper.__call__. Capture memory and time per (mode, size); FULL replays counted and
  timed with device events.
- graph_manager_capture / graph_manager_replay / graph_manager_dispatch: model runner v2's
  CudaGraphManager.capture, run_fullgraph and dispatch (the model's manager, not drafters').
- batch_dispatch: V1 runners' _determine_batch_execution_and_padding. Decode steps, their batch
  sizes in tokens before padding (`batches`), and eager fallbacks (uniform decode batches
  dispatched to no graph while graphs are on).
- dummy_run: V1 runners' _dummy_run, so warmup, profiling and capture runs are not counted.
- capture_model: runners' capture_model. Phase capturing/captured, graph memory, device memory.
- load_model, initialize_kv_cache: weights and KV cache memory.
- dp_load_metrics: no patch; a collector in the API server's Prometheus registry that serves the
  npu_engine_* series, vLLM's per-rank load summed over the ranks (`dp_load`).
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, NamedTuple

from npu_runtime.contract import GraphMode
from npu_runtime.observer import dp_load, targets
from npu_runtime.observer.hooks import Hook, around, when_imported, wrap_method
from npu_runtime.observer.recorder import DeviceEvent, EventTimer, Key, Recorder
from npu_runtime.observer.targets import BindError, Binding, Target

_UNSET: Final = object()
CaptureToken = tuple[float, int | None]  # (perf_counter at the start, free device bytes then)
ReplayToken = tuple[DeviceEvent, DeviceEvent] | None  # the timer's event pair; None: not timed

RUNNER_CLASSES: Final = targets.RUNNER_CLASSES


class GraphWrapperClass(NamedTuple):
    """A static graph wrapper class the observer hooks, and the attributes its hook reads."""

    hook: str  # the hook's name: the `hook` label of npu_graph_instrumentation_errors_total
    module: str
    class_name: str
    entries_attr: str  # the wrapper's dict of entries by batch descriptor
    graph_attr: str  # an entry's graph, None until it is captured

    @property
    def target(self) -> Target:
        return targets.target(self.hook, self.module, self.class_name, "__call__")


CUDA_GRAPH_WRAPPER: Final = GraphWrapperClass(
    "cuda_graph_wrapper", "vllm.compilation.cuda_graph", "CUDAGraphWrapper", "concrete_cudagraph_entries", "cudagraph"
)
ACL_GRAPH_WRAPPER: Final = GraphWrapperClass(
    "acl_graph_wrapper", "vllm_ascend.compilation.acl_graph", "ACLGraphWrapper", "concrete_aclgraph_entries", "aclgraph"
)
GRAPH_WRAPPERS: Final = (CUDA_GRAPH_WRAPPER, ACL_GRAPH_WRAPPER)


def mode_name(mode: Any) -> str | None:
    """CUDAGraphMode.FULL_DECODE_ONLY / "FULL_DECODE_ONLY" -> "FULL_DECODE_ONLY"; None stays None."""
    if mode is None:
        return None
    name = getattr(mode, "name", None)
    return str(name) if name is not None else str(mode).rsplit(".", 1)[-1]


class Observer:
    """The hooks of one process: their state, the recorder, and lazily found device helpers."""

    def __init__(self, recorder: Recorder, *, sample_every: int = 1) -> None:
        self.recorder = recorder
        self.sample_every = sample_every
        self.hooks: dict[str, Hook] = {}
        self._device: Any = _UNSET
        self._timer_ready = False
        self._modes: Any = None
        self.dummy = threading.local()

    def modes(self) -> Any:
        """vLLM's CUDAGraphMode enum (imported at first use; a stand-in can be set in `_modes`)."""
        if self._modes is None:
            from vllm.config import CUDAGraphMode

            self._modes = CUDAGraphMode
        return self._modes

    def hook(self, name: str) -> Hook:
        hook = self.hooks.get(name)
        if hook is None:
            hook = self.hooks[name] = Hook(name, self.recorder.record_hook_error, self.unavailable)
        return hook

    def installed(self, what: str) -> None:
        if what not in self.recorder.hooks_installed:
            self.recorder.hooks_installed.append(what)

    def unavailable(self, what: str) -> None:
        if what not in self.recorder.hooks_unavailable:
            self.recorder.hooks_unavailable.append(what)

    def refuse(self, hook: str, what: str, reason: str) -> None:
        """A target the hook cannot bind: unavailable with the reason, one instrumentation error."""
        if f"{what}: {reason}" not in self.recorder.hooks_unavailable:
            self.unavailable(f"{what}: {reason}")
            self.recorder.record_hook_error(hook)

    # ----- device helpers (torch and the platform are imported here, at first use) -----

    def device_module(self) -> Any:
        """torch.cuda / torch.npu / ... for the current platform; None on CPU or when unknown."""
        if self._device is _UNSET:
            module = None
            try:
                import torch
                from vllm.platforms import current_platform

                kind = str(getattr(current_platform, "device_type", "") or "")
                if kind and kind != "cpu":
                    module = getattr(torch, kind, None)
                if module is not None and not callable(getattr(module, "mem_get_info", None)):
                    module = None
            except Exception:
                module = None
            self._device = module
        return self._device

    def memory_info(self) -> tuple[int, int] | None:
        """(free, total) bytes of the current device; host-side query, no synchronisation."""
        module = self.device_module()
        if module is None:
            return None
        free, total = module.mem_get_info()
        return int(free), int(total)

    def timer(self) -> EventTimer:
        if not self._timer_ready:
            self._timer_ready = True
            module = self.device_module()
            event = getattr(module, "Event", None) if module is not None else None
            if event is not None:
                self.recorder.timer = EventTimer(lambda: event(enable_timing=True), sample_every=self.sample_every)
        return self.recorder.timer

    # ----- capture and replay bookkeeping (both the graph wrappers and V2's graph manager) -----

    def begin_capture(self) -> CaptureToken:
        """Before a graph capture: the start time and free device memory (and the replay timer, made now)."""
        self.timer()
        info = self.memory_info()
        return time.perf_counter(), info[0] if info is not None else None

    def end_capture(self, key: Key, token: CaptureToken) -> None:
        """After it: record its time and the device memory it took (None where that is unknown)."""
        started, free_before = token
        seconds = time.perf_counter() - started
        info = self.memory_info()
        memory = None
        if free_before is not None and info is not None:
            memory = max(0, free_before - info[0])
        self.recorder.record_capture(key, memory, seconds)

    def begin_replay(self, key: Key) -> ReplayToken:
        """Before a full-graph replay (decode path): count it; the device events to stop, if it is timed."""
        recorder = self.recorder
        recorder.count_replay(key)
        if not self._timer_ready:
            self.timer()
        return recorder.timer.start()

    def end_replay(self, key: Key, token: ReplayToken) -> None:
        """After it: queue its events for the flush thread to read (no synchronisation)."""
        if token is not None:
            self.recorder.timer.stop(token, key)


# ----- installation -----


def install(observer: Observer) -> None:
    """Arrange every hook: now for modules already imported, on import for the others."""
    when_imported("vllm.config", functools.partial(patch_config, observer))
    for wrapper in GRAPH_WRAPPERS:
        when_imported(wrapper.module, functools.partial(patch_graph_wrapper, observer, wrapper=wrapper))
    for module_name, class_name in RUNNER_CLASSES:
        when_imported(module_name, functools.partial(patch_runner, observer, class_name=class_name))
    when_imported("vllm.v1.worker.gpu.cudagraph_utils", functools.partial(patch_graph_manager, observer))
    # Not a patch: a collector in vLLM's Prometheus registry, in the process that serves it (dp_load).
    when_imported(dp_load.LOGGERS_MODULE, functools.partial(dp_load.on_import, observer))


MakeWrapper = Callable[[Callable[..., Any], Binding], Callable[..., Any]]


def _patch(observer: Observer, cls: type, target: Target, make: MakeWrapper) -> bool:
    """Wrap `cls.<target.method>` if `cls` defines it; False when it does not (nothing to hook here).

    The parameters the hook reads are bound by name first: when one is missing or moved the hook
    refuses (unavailable with the reason, one instrumentation error) and the method stays as it is.
    """
    what = f"{cls.__module__}.{cls.__qualname__}.{target.method}"
    original = cls.__dict__.get(target.method)
    if original is None or not inspect.isfunction(original):
        return False
    try:
        binding = targets.bind(original, target.params)
    except BindError as exc:
        observer.refuse(target.hook, what, str(exc))
        return True
    if wrap_method(cls, target.method, lambda function: make(function, binding)):
        observer.installed(what)
    return True


# ----- configuration: the mode the engine resolves -----


def patch_config(observer: Observer, module: ModuleType) -> None:
    post_init = targets.target("config_post_init", targets.CONFIG, "VllmConfig", "__post_init__")
    vllm_config = getattr(module, "VllmConfig", None)
    if vllm_config is None or not _patch(
        observer, vllm_config, post_init, lambda original, binding: config_post_init_wrapper(observer, original)
    ):
        observer.unavailable("VllmConfig.__post_init__")
    resolve = targets.target("resolve_mode", targets.CONFIG, "CompilationConfig", "resolve_cudagraph_mode_and_sizes")
    compilation = getattr(module, "CompilationConfig", None)
    if compilation is None or not _patch(
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


# ----- the static graph wrappers: capture and replay -----


def patch_graph_wrapper(observer: Observer, module: ModuleType, wrapper: GraphWrapperClass) -> None:
    cls = getattr(module, wrapper.class_name, None)
    if cls is None:
        observer.unavailable(f"{module.__name__}.{wrapper.class_name}")
        return
    try:
        from vllm.forward_context import get_forward_context

        observer.modes()
    except Exception:
        observer.unavailable(f"{wrapper.class_name}.__call__ (vllm.forward_context)")
        return
    try:
        from vllm.forward_context import is_forward_context_available
    except Exception:
        is_forward_context_available = None  # type: ignore[assignment]
    if not hook_graph_wrapper(
        observer, cls, wrapper, get_context=get_forward_context, context_available=is_forward_context_available
    ):
        observer.unavailable(f"{wrapper.class_name}.__call__")


def hook_graph_wrapper(
    observer: Observer,
    cls: type,
    wrapper: GraphWrapperClass,
    *,
    get_context: Callable[[], Any],
    context_available: Callable[[], bool] | None = None,
) -> bool:
    """Hook `cls.__call__` for capture and replay; False when `cls` defines no `__call__` of its own.

    `cls` is `wrapper`'s class, or a stand-in of its shape (the tests, the hook benchmark, the
    device check): `runtime_mode`, the entries and graph attributes `wrapper` names, and a forward
    context from `get_context()` with `cudagraph_runtime_mode` and `batch_descriptor`. The modes
    are `observer.modes()` (vLLM's CUDAGraphMode). Idempotent, and listed as an installed hook.
    """
    modes = observer.modes()
    hook = observer.hook(wrapper.hook)
    target = wrapper.target
    return _patch(
        observer,
        cls,
        target,
        lambda original, binding: graph_call_wrapper(
            observer,
            hook,
            original,
            entries_attr=wrapper.entries_attr,
            graph_attr=wrapper.graph_attr,
            get_context=get_context,
            context_available=context_available,
            none_mode=modes.NONE,
            full_mode=modes.FULL,
            require=target.self_attributes,
        ),
    )


def graph_call_wrapper(
    observer: Observer,
    hook: Hook,
    original: Callable[..., Any],
    *,
    entries_attr: str,
    graph_attr: str,
    get_context: Callable[[], Any],
    context_available: Callable[[], bool] | None,
    none_mode: Any,
    full_mode: Any,
    require: tuple[str, ...] = (),
) -> Callable[..., Any]:
    """`__call__` of a static graph wrapper: capture when the entry has no graph yet, else replay.

    Decode path cost: a forward-context lookup, a dict lookup, two device event records and a
    deque append; no synchronisation. Piecewise replays (one per layer piece) are not timed.
    `require`: the wrapper's own attributes the hook reads, checked at the first call.
    """
    begin_capture, end_capture = observer.begin_capture, observer.end_capture
    begin_replay, end_replay = observer.begin_replay, observer.end_replay
    passthrough, capture, replay = 0, 1, 2
    unchecked = [bool(require)]

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if hook.disabled:
            return original(self, *args, **kwargs)
        if unchecked[0]:
            unchecked[0] = False
            missing = targets.missing_attributes(self, require)
            if missing:
                hook.refuse(f"{type(self).__name__} has no attribute {missing[0]}")
                return original(self, *args, **kwargs)
        action = passthrough
        key: Key = ("", 0)
        token: Any = None
        try:
            if context_available is None or context_available():
                context = get_context()
                mode = context.cudagraph_runtime_mode
                if mode != none_mode and mode == self.runtime_mode:
                    descriptor = context.batch_descriptor
                    entry = getattr(self, entries_attr).get(descriptor)
                    key = (mode.name, int(descriptor.num_tokens))
                    if entry is None or getattr(entry, graph_attr) is None:
                        action = capture
                        token = begin_capture()
                    elif mode == full_mode:
                        action = replay
                        token = begin_replay(key)
        except Exception:
            hook.fail()
            return original(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        if action == passthrough:
            return result
        try:
            if action == capture:
                end_capture(key, token)
            elif token is not None:  # a replay that is timed
                end_replay(key, token)
        except Exception:
            hook.fail()
        return result

    return __call__


# ----- the model runners: decode steps, eager fallbacks, phases, memory -----


def patch_runner(observer: Observer, module: ModuleType, *, class_name: str) -> None:
    cls = getattr(module, class_name, None)
    if cls is None:
        observer.unavailable(f"{module.__name__}.{class_name}")
        return
    makers: dict[str, Callable[[Observer, Callable[..., Any], Binding, Target], Callable[..., Any]]] = {
        "batch_dispatch": batch_dispatch_wrapper,
        "dummy_run": dummy_run_wrapper,
        "capture_model": capture_model_wrapper,
        "load_model": load_model_wrapper,
        "initialize_kv_cache": kv_cache_wrapper,
    }
    for target in targets.for_class(module.__name__, class_name):
        make = makers[target.hook]
        # Only methods the class defines itself: an inherited one is hooked on its base class.
        _patch(observer, cls, target, functools.partial(_make_runner_wrapper, make, observer, target))
    observer.recorder.ensure_flusher()


def _make_runner_wrapper(
    make: Callable[[Observer, Callable[..., Any], Binding, Target], Callable[..., Any]],
    observer: Observer,
    target: Target,
    original: Callable[..., Any],
    binding: Binding,
) -> Callable[..., Any]:
    return make(observer, original, binding, target)


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


# ----- model runner v2: CudaGraphManager -----


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
        if not _patch(observer, base, target, patches[target.method]):
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

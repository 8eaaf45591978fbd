"""The static graph wrappers' hooks: capture memory and time, FULL replays counted and timed.

One hook shape for two engines: vLLM's CUDAGraphWrapper (CUDA; the CPU build has the class but
captures nothing) and vllm-ascend's ACLGraphWrapper (NPU), which differ only in the names of their
entries and graph attributes (`GraphWrapperClass`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, NamedTuple

from npu_runtime.observer import targets
from npu_runtime.observer.hooks import Hook
from npu_runtime.observer.patching import patch_target
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.recorder import Key
from npu_runtime.observer.targets import Target


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
    return patch_target(
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

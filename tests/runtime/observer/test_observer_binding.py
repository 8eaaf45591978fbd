"""Hooks bind what they read by name, and refuse a target whose signature or attributes changed.

Every target in `npu_runtime.observer.targets.TARGETS` that reads a parameter by position is fed,
through the real patch function, a stand-in whose signature has one parameter inserted in front:
the hook must leave the method unpatched, list it as unavailable with the parameter's name, and
count one instrumentation error for its hook. The same stand-in without the insertion is patched
(the control), and hooks whose own attributes are missing refuse at their first call.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
from npu_runtime.observer import targets
from npu_runtime.observer.config_hooks import patch_config
from npu_runtime.observer.graph_manager import patch_graph_manager
from npu_runtime.observer.graph_wrappers import CUDA_GRAPH_WRAPPER, hook_graph_wrapper
from npu_runtime.observer.lora_requests import patch_output_processor
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.runner_hooks import patch_runner
from npu_runtime.observer.targets import Param, Target

from tests.runtime.observer.fakes import (
    Descriptor,
    FakeDevice,
    FakeGraphWrapper,
    Mode,
    get_context,
    make_observer,
    set_context,
)

INSERTED = "inserted_by_a_new_release"


def method_with(target: Target, *, insert: str | None = None, rename: str | None = None) -> Callable[..., Any]:
    """A method with the parameters `target` reads where it expects them (others filled in)."""
    positional = [
        f"other_{i}" for i in range(1 + max((p.index for p in target.params if p.index is not None), default=-1))
    ]
    keyword_only = []
    for param in target.params:
        name = f"{param.name}_renamed" if param.name == rename else param.name
        if param.index is None:
            keyword_only.append(f"{name}=None")
        else:
            positional[param.index] = name
    if insert is not None:
        positional.insert(0, insert)
    names = ", ".join(["self", *positional, *(["*", *keyword_only] if keyword_only else [])])
    namespace: dict[str, Any] = {}
    exec(f"def {target.method}({names}):\n    return 'original'\n", namespace)
    function: Callable[..., Any] = namespace[target.method]
    return function


def patch_site(target: Target, method: Callable[..., Any]) -> tuple[type, Callable[[Observer], None]]:
    """A class of the target's name holding `method`, and the real patch function that hooks it."""
    cls = type(target.class_name, (), {target.method: method, "__module__": target.module})
    module = types.ModuleType(target.module)
    setattr(module, target.class_name, cls)
    if target.module == targets.CONFIG:
        return cls, lambda observer: patch_config(observer, module)
    if target.module == targets.GRAPH_MANAGER:
        return cls, lambda observer: patch_graph_manager(observer, module)
    if target.module == targets.OUTPUT_PROCESSOR:
        return cls, lambda observer: patch_output_processor(observer, module)
    return cls, lambda observer: patch_runner(observer, module, class_name=target.class_name)


POSITIONAL = [t for t in targets.TARGETS if any(p.index is not None for p in t.params)]


def test_every_hook_that_reads_parameters_is_covered() -> None:
    hooks = {t.hook for t in POSITIONAL}
    assert hooks == {
        "resolve_mode",
        "batch_dispatch",
        "initialize_kv_cache",
        "graph_manager_capture",
        "graph_manager_replay",
        "graph_manager_dispatch",
        "lora_requests",
    }


@pytest.mark.parametrize("target", POSITIONAL, ids=lambda t: f"{t.hook}@{t.module}.{t.class_name}")
def test_an_inserted_parameter_makes_the_hook_refuse_and_report_it(target: Target) -> None:
    cls, patch = patch_site(target, method_with(target, insert=INSERTED))
    original = cls.__dict__[target.method]
    observer = make_observer(None)
    patch(observer)

    assert cls.__dict__[target.method] is original  # not patched: the hook never reads
    first = next(p for p in target.params if p.index is not None)
    assert first.index is not None
    reasons = [entry for entry in observer.recorder.hooks_unavailable if entry.endswith(")")]
    assert any(
        f"{target.class_name}.{target.method}: parameter {first.name} moved (position {first.index + 1}, "
        f"the hook expects {first.index})" in entry
        for entry in reasons
    ), observer.recorder.hooks_unavailable
    assert observer.recorder.errors == {target.hook: 1}
    assert observer.recorder.report()["hooks"]["installed"] == []


@pytest.mark.parametrize("target", POSITIONAL, ids=lambda t: f"{t.hook}@{t.module}.{t.class_name}")
def test_the_same_target_as_expected_is_patched(target: Target) -> None:
    cls, patch = patch_site(target, method_with(target))
    original = cls.__dict__[target.method]
    observer = make_observer(None)
    patch(observer)
    assert cls.__dict__[target.method] is not original
    assert cls.__dict__[target.method].__wrapped__ is original
    assert observer.recorder.errors == {}


@pytest.mark.parametrize("target", POSITIONAL, ids=lambda t: f"{t.hook}@{t.module}.{t.class_name}")
def test_a_renamed_required_parameter_is_reported_missing(target: Target) -> None:
    required = next(p for p in target.params if not p.optional)
    cls, patch = patch_site(target, method_with(target, rename=required.name))
    original = cls.__dict__[target.method]
    observer = make_observer(None)
    patch(observer)
    assert cls.__dict__[target.method] is original
    assert any(
        entry.endswith(f"{target.method}: parameter {required.name} missing")
        for entry in observer.recorder.hooks_unavailable
    ), observer.recorder.hooks_unavailable
    assert observer.recorder.errors == {target.hook: 1}


def test_parameters_are_read_by_name_wherever_the_caller_puts_them() -> None:
    target = Target("t", "m", "C", "f", params=(Param("a", 0), Param("b", 2), Param("c", None, optional=True)))

    def f(self: Any, a: int, x: int, b: int, *, c: int = 0) -> None: ...

    binding = targets.bind(f, target.params)
    assert binding.get((1, 2, 3), {}, "b") == 3
    assert binding.get((1,), {"b": 7, "c": 9}, "b") == 7
    assert binding.get((1,), {}, "c", "default") == "default"
    assert targets.check_parameters(["a", "x"], [], target.params) == "parameter b missing"
    assert targets.check_parameters(["a", "x", "y"], ["b"], target.params) == (
        "parameter b became keyword-only (the hook expects position 2)"
    )
    assert targets.check_parameters(["a", "x", "b"], [], target.params) is None  # optional c may be absent


def test_a_graph_wrapper_without_its_entries_refuses_at_first_call() -> None:
    class Wrapper(FakeGraphWrapper):
        __call__ = FakeGraphWrapper.__call__

    observer = make_observer(FakeDevice())
    assert hook_graph_wrapper(observer, Wrapper, CUDA_GRAPH_WRAPPER, get_context=get_context)
    wrapper = Wrapper(FakeDevice())
    del wrapper.concrete_cudagraph_entries
    set_context(Mode.FULL, 4)
    with pytest.raises(AttributeError):
        wrapper()  # the original's own failure, untouched; the hook had refused before reading
    assert observer.recorder.errors == {"cuda_graph_wrapper": 1}
    assert "cuda_graph_wrapper: Wrapper has no attribute concrete_cudagraph_entries" in (
        observer.recorder.hooks_unavailable
    )
    assert observer.recorder.captures == {}


def test_a_runner_without_its_compilation_config_refuses_at_first_call() -> None:
    target = targets.target("batch_dispatch", *targets.V1_RUNNER, "_determine_batch_execution_and_padding")
    cls, patch = patch_site(target, method_with(target))
    observer = make_observer(None)
    patch(observer)
    runner = cls()
    assert runner._determine_batch_execution_and_padding(1, 1, None, 1, False, None, False, True) == "original"
    assert observer.recorder.errors == {"batch_dispatch": 1}
    assert f"batch_dispatch: {target.class_name} has no attribute compilation_config" in (
        observer.recorder.hooks_unavailable
    )
    assert observer.recorder.decode_steps == 0


def test_an_attribute_missing_deeper_in_the_engine_is_reported_by_name() -> None:
    # The wrapper's own attributes are there; its entries lack the graph attribute the hook reads.
    class Wrapper:
        runtime_mode = Mode.FULL

        def __init__(self) -> None:
            self.concrete_cudagraph_entries = {Descriptor(4): object()}

        def __call__(self) -> str:
            return "ran"

    observer = make_observer(FakeDevice())
    assert hook_graph_wrapper(observer, Wrapper, CUDA_GRAPH_WRAPPER, get_context=get_context)
    set_context(Mode.FULL, 4)
    assert Wrapper()() == "ran"  # the engine's call is untouched
    assert observer.recorder.errors == {"cuda_graph_wrapper": 1}
    assert "cuda_graph_wrapper: 'object' object has no attribute 'cudagraph'" in observer.recorder.hooks_unavailable

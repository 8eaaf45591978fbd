"""The observer's hooks without a device: failure isolation, capture/replay/fallback logic, and the
real vLLM classes they patch (the config hooks run for real on the CPU build)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_runtime import reports
from npu_runtime.observer import targets
from npu_runtime.observer.config_hooks import config_downgrade_reason
from npu_runtime.observer.graph_manager import patch_graph_manager
from npu_runtime.observer.graph_wrappers import CUDA_GRAPH_WRAPPER, hook_graph_wrapper
from npu_runtime.observer.hooks import Hook, around, when_imported, wrap_method
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.recorder import Recorder
from npu_runtime.observer.runner_hooks import patch_runner

from tests.runtime.observer.fakes import (
    Descriptor,
    FakeDevice,
    FakeGraphWrapper,
    Mode,
    get_context,
    make_observer,
    set_context,
)

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the engine-cpu extra)")

# ----- the machinery: failures never reach the engine -----


class Engine:
    def step(self, value: int) -> int:
        return value * 2

    def crash(self) -> None:
        raise RuntimeError("the engine's own error")


def test_a_failing_hook_disables_itself_counts_and_leaves_the_call_alone() -> None:
    errors: list[str] = []
    hook = Hook("step", errors.append)
    calls: list[int] = []

    def before(engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append(args[0])
        raise ValueError("our bug")

    step = around(hook, Engine.step, before, None)
    assert step(Engine(), 3) == 6
    assert hook.disabled
    assert errors == ["step"]
    assert step(Engine(), 4) == 8
    assert calls == [3]  # disabled: before() is not called again
    assert errors == ["step"]  # counted once


def test_a_failure_after_the_call_keeps_the_result() -> None:
    errors: list[str] = []
    hook = Hook("step", errors.append)

    def after(engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any, result: Any) -> None:
        raise KeyError("our bug")

    assert around(hook, Engine.step, None, after)(Engine(), 5) == 10
    assert errors == ["step"]


def test_the_engines_own_exceptions_pass_through_untouched() -> None:
    errors: list[str] = []
    hook = Hook("crash", errors.append)
    wrapped = around(hook, Engine.crash, lambda *a: None, lambda *a: None)
    with pytest.raises(RuntimeError, match="the engine's own error"):
        wrapped(Engine())
    assert not hook.disabled
    assert errors == []


def test_outermost_only_counts_a_super_call_once() -> None:
    seen: list[str] = []

    class Base:
        def run(self) -> str:
            return "base"

    class Child(Base):
        def run(self) -> str:
            return "child+" + super().run()

    hook = Hook("run")
    for cls in (Base, Child):
        wrap_method(
            cls,
            "run",
            lambda original: around(hook, original, None, lambda s, a, k, c, r: seen.append(r), outermost_only=True),
        )
    assert Child().run() == "child+base"
    assert seen == ["child+base"]


def test_wrap_method_is_idempotent_and_skips_inherited_methods() -> None:
    class Base:
        def run(self) -> int:
            return 1

    class Child(Base):
        pass

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        return lambda self: original(self) + 1

    assert wrap_method(Base, "run", make)
    assert wrap_method(Base, "run", make)  # already ours: not wrapped twice
    assert Base().run() == 2
    assert not wrap_method(Child, "run", make)  # defined on Base, hooked there
    assert Base.run.__wrapped__(Base()) == 1  # type: ignore[attr-defined]


def test_when_imported_patches_a_module_at_its_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "late_module_for_hooks.py").write_text("class Runner:\n    def run(self):\n        return 'plain'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    when_imported("late_module_for_hooks", lambda module: seen.append(module.__name__))
    assert seen == []
    importlib.import_module("late_module_for_hooks")
    assert seen == ["late_module_for_hooks"]
    when_imported("late_module_for_hooks", lambda module: seen.append("again"))
    assert seen == ["late_module_for_hooks", "again"]  # already imported: at once
    monkeypatch.delitem(sys.modules, "late_module_for_hooks")


def test_a_failing_patch_callback_does_not_break_the_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "late_module_broken_patch.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def explode(module: Any) -> None:
        raise RuntimeError("patch failed")

    when_imported("late_module_broken_patch", explode)
    assert importlib.import_module("late_module_broken_patch").VALUE == 42
    monkeypatch.delitem(sys.modules, "late_module_broken_patch")


# ----- capture and replay around a graph wrapper -----


def hook_wrapper(observer: Observer, cls: type[FakeGraphWrapper]) -> None:
    """What production does to vLLM's CUDAGraphWrapper, to a stand-in of its shape."""
    assert hook_graph_wrapper(observer, cls, CUDA_GRAPH_WRAPPER, get_context=get_context)


@pytest.fixture
def wrapper_class() -> Iterator[type[FakeGraphWrapper]]:
    class Wrapper(FakeGraphWrapper):
        __call__ = FakeGraphWrapper.__call__

    yield Wrapper
    set_context(Mode.NONE)


def test_capture_records_memory_and_time_per_size(wrapper_class: type[FakeGraphWrapper]) -> None:
    device = FakeDevice()
    observer = make_observer(device)
    hook_wrapper(observer, wrapper_class)
    wrapper = wrapper_class(device, capture_bytes=3 << 20)
    for size in (4, 2, 1):
        set_context(Mode.FULL, size)
        assert wrapper() == "captured"
    report = observer.recorder.report()
    assert [(c["mode"], c["size"], c["memory_bytes"]) for c in report["captures"]] == [
        ("FULL", 1, 3 << 20),
        ("FULL", 2, 3 << 20),
        ("FULL", 4, 3 << 20),
    ]
    assert all(c["seconds"] >= 0 for c in report["captures"])


def test_replays_are_counted_and_timed_later_without_synchronising(wrapper_class: type[FakeGraphWrapper]) -> None:
    device = FakeDevice()
    observer = make_observer(device)
    hook_wrapper(observer, wrapper_class)
    wrapper = wrapper_class(device)
    set_context(Mode.FULL, 8)
    wrapper()  # capture
    device.completed = False  # the device is still busy: nothing can be read yet
    for _ in range(3):
        assert wrapper() == "replayed"
    assert observer.recorder.timer.pending == 3
    assert observer.recorder.report()["replay"][0]["timed"] == 0
    device.completed = True
    replay = observer.recorder.report()["replay"][0]
    assert (replay["mode"], replay["size"], replay["count"], replay["timed"]) == ("FULL", 8, 3, 3)
    assert replay["p50_seconds"] == pytest.approx(0.002)
    assert replay["sum_seconds"] == pytest.approx(0.006)
    assert device.syncs == 0


def test_eager_and_mismatched_modes_pass_through_unrecorded(wrapper_class: type[FakeGraphWrapper]) -> None:
    device = FakeDevice()
    observer = make_observer(device)
    hook_wrapper(observer, wrapper_class)
    wrapper = wrapper_class(device, runtime_mode=Mode.FULL)
    set_context(Mode.NONE, 8)
    assert wrapper() == "eager"
    set_context(Mode.PIECEWISE, 8)
    assert wrapper() == "eager"
    report = observer.recorder.report()
    assert report["captures"] == []
    assert report["replay"] == []


def test_piecewise_captures_add_up_per_size_and_piecewise_replays_are_not_timed(
    wrapper_class: type[FakeGraphWrapper],
) -> None:
    device = FakeDevice()
    observer = make_observer(device)
    hook_wrapper(observer, wrapper_class)
    pieces = [wrapper_class(device, runtime_mode=Mode.PIECEWISE, capture_bytes=1 << 20) for _ in range(3)]
    set_context(Mode.PIECEWISE, 16)
    for piece in pieces:
        piece()
    for piece in pieces:
        assert piece() == "replayed"
    report = observer.recorder.report()
    assert report["captures"] == [
        {"mode": "PIECEWISE", "size": 16, "memory_bytes": 3 << 20, "seconds": pytest.approx(0, abs=1), "graphs": 3}
    ]
    assert report["replay"] == []


def test_sampling_times_one_replay_in_n(wrapper_class: type[FakeGraphWrapper]) -> None:
    device = FakeDevice()
    observer = make_observer(device, sample_every=4)
    hook_wrapper(observer, wrapper_class)
    wrapper = wrapper_class(device)
    set_context(Mode.FULL, 2)
    wrapper()
    for _ in range(12):
        wrapper()
    replay = observer.recorder.report()["replay"][0]
    assert (replay["count"], replay["timed"]) == (12, 3)


def test_without_a_device_captures_have_no_memory_and_replays_no_time(wrapper_class: type[FakeGraphWrapper]) -> None:
    device = FakeDevice()
    observer = make_observer(None)  # CPU: no device module
    hook_wrapper(observer, wrapper_class)
    wrapper = wrapper_class(device)
    set_context(Mode.FULL, 2)
    wrapper()
    wrapper()
    report = observer.recorder.report()
    assert report["captures"][0]["memory_bytes"] is None
    assert report["replay"][0]["count"] == 1
    assert report["replay"][0]["timed"] == 0


def test_a_broken_device_query_disables_the_hook_not_the_engine(wrapper_class: type[FakeGraphWrapper]) -> None:
    device = FakeDevice()
    observer = make_observer(device)
    hook_wrapper(observer, wrapper_class)

    def broken() -> tuple[int, int]:
        raise RuntimeError("driver said no")

    device.mem_get_info = broken  # type: ignore[method-assign]
    wrapper = wrapper_class(device)
    set_context(Mode.FULL, 2)
    assert wrapper() == "captured"  # the engine got its result
    assert wrapper() == "replayed"
    report = observer.recorder.report()
    assert report["errors"] == {"cuda_graph_wrapper": 1}
    assert report["captures"] == []
    assert wrapper.calls == ["capture", "replay"]


# ----- the engine's downgrade reasons: the planner's where the cause is the same -----

# Causes the planner has no rule for: they can only be seen in the engine.
ENGINE_ONLY_REASONS = {"PlatformWithoutStaticGraphs", "PlatformConfig"}


class Platform:
    def __init__(self, device_type: str, static_graphs: bool) -> None:
        self.device_type = device_type
        self.static_graphs = static_graphs

    def support_static_graph_mode(self) -> bool:
        return self.static_graphs


def vllm_config(**model: Any) -> Any:
    return types.SimpleNamespace(model_config=types.SimpleNamespace(**model))


ENCODER_DECODER = vllm_config(is_encoder_decoder=True)


@pytest.mark.parametrize(
    ("config", "platform", "final", "reason"),
    [
        (vllm_config(enforce_eager=True), Platform("npu", True), "NONE", "EnforceEager"),
        (vllm_config(), Platform("cpu", False), "NONE", "CpuHasNoGraphs"),
        (vllm_config(), Platform("xpu", False), "NONE", "PlatformWithoutStaticGraphs"),
        (vllm_config(pooler_config=object()), Platform("npu", True), "PIECEWISE", "PoolingModelNoFullGraphs"),
        (ENCODER_DECODER, Platform("npu", True), "PIECEWISE", "EncoderDecoderPiecewiseOnly"),
        (ENCODER_DECODER, Platform("cuda", True), "FULL_DECODE_ONLY", "EncoderDecoderFullDecodeOnly"),
        (vllm_config(), Platform("npu", True), "PIECEWISE", "PlatformConfig"),
    ],
)
def test_config_downgrade_reasons_are_the_planners_where_the_cause_is_the_same(
    config: Any, platform: Platform, final: str, reason: str
) -> None:
    from npu_runtime.planner import modes

    found, message = config_downgrade_reason(config, "FULL_AND_PIECEWISE", final, platform=platform)
    assert found == reason
    assert f"FULL_AND_PIECEWISE -> {final}" in message
    planner = {rule.reason for rule in modes.RULES}
    if reason in ENGINE_ONLY_REASONS:
        assert reason not in planner, f"{reason} is a planner reason now: drop it from ENGINE_ONLY_REASONS"
    else:
        assert reason in planner, (
            f"{reason} is not a reason of npu_runtime.planner.modes.RULES: the codes drifted apart"
        )


# ----- decode steps and eager fallbacks (V1 runner) -----


class Dispatcher:
    def __init__(self, mode: Mode) -> None:
        self.cudagraph_mode = mode
        self.keys_initialized = True


class CompilationConfig:
    def __init__(self, sizes: list[int]) -> None:
        self.cudagraph_capture_sizes = sizes
        self.max_cudagraph_capture_size = max(sizes) if sizes else None
        self.cudagraph_mode = Mode.FULL


class Runner:
    """The slice of GPUModelRunner that the batch_dispatch and dummy_run hooks read."""

    uniform_decode_query_len = 1

    def __init__(self, mode: Mode, sizes: list[int]) -> None:
        self.cudagraph_dispatcher = Dispatcher(mode)
        self.compilation_config = CompilationConfig(sizes)
        self.sizes = sizes

    def _determine_batch_execution_and_padding(
        self,
        num_tokens: int,
        num_reqs: int,
        num_scheduled_tokens_np: Any,
        max_num_scheduled_tokens: int,
        use_cascade_attn: bool,
        allow_microbatching: bool = True,
        force_eager: bool = False,
        force_uniform_decode: bool | None = None,
    ) -> tuple[Mode, Descriptor, bool, None, None]:
        graphs = self.cudagraph_dispatcher.cudagraph_mode != Mode.NONE
        if graphs and not force_eager and num_tokens in self.sizes:
            return Mode.FULL, Descriptor(num_tokens), False, None, None
        return Mode.NONE, Descriptor(num_tokens), False, None, None

    def _dummy_run(self, num_tokens: int) -> None:
        self._determine_batch_execution_and_padding(num_tokens, num_tokens, None, 1, False)


def hooked_runner(observer: Observer) -> type[Runner]:
    """A runner class in a module of its own, hooked by the real patch function."""
    module = types.ModuleType("vllm.v1.worker.gpu_model_runner")  # the name the target table knows

    class GPUModelRunner(Runner):
        _determine_batch_execution_and_padding = Runner._determine_batch_execution_and_padding
        _dummy_run = Runner._dummy_run

    module.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    patch_runner(observer, module, class_name="GPUModelRunner")
    return GPUModelRunner


def test_an_attribute_lookup_that_raises_anything_counts_as_missing_and_never_escapes() -> None:
    # vLLM's CUDAGraphWrapper.__getattr__ recurses on a half-built instance (RecursionError, not
    # AttributeError): the first-call check runs inside the engine's call path and must not raise.
    class Recursing:
        present = 1

        def __getattr__(self, name: str) -> Any:
            return getattr(self, "also_" + name)

    assert targets.missing_attributes(Recursing(), ["present", "absent"]) == ["absent"]


def test_decode_steps_and_eager_fallbacks_with_reasons() -> None:
    observer = make_observer(None)
    runner = hooked_runner(observer)(Mode.FULL, [1, 2, 4, 8])
    runner._determine_batch_execution_and_padding(4, 4, None, 1, False)  # graph
    runner._determine_batch_execution_and_padding(16, 16, None, 1, False)  # above the largest size
    runner._determine_batch_execution_and_padding(3, 3, None, 1, False)  # no graph of size 3 (unpadded here)
    runner._determine_batch_execution_and_padding(2, 2, None, 1, False, force_eager=True)
    runner._determine_batch_execution_and_padding(40, 2, None, 20, False)  # prefill: not a decode step
    report = observer.recorder.report()
    assert report["decode_steps"] == 4
    assert report["eager_fallbacks"] == {"BatchAboveMaxCaptureSize": 1, "NoMatchingGraph": 1, "ForcedEager": 1}
    # Every decode step's batch size in tokens before padding (issue 37); the prefill is not one.
    assert report["decode_batches"]["counts"] == {"2": 1, "3": 1, "4": 1, "16": 1}


def test_warmup_and_capture_runs_are_not_decode_steps() -> None:
    observer = make_observer(None)
    runner = hooked_runner(observer)(Mode.FULL, [1, 2])
    runner._dummy_run(1)
    runner._dummy_run(64)
    assert observer.recorder.report()["decode_steps"] == 0


def test_with_graphs_off_decode_steps_count_and_nothing_is_a_fallback() -> None:
    observer = make_observer(None)
    runner = hooked_runner(observer)(Mode.NONE, [])
    for _ in range(5):
        runner._determine_batch_execution_and_padding(1, 1, None, 1, False)
    report = observer.recorder.report()
    assert report["decode_steps"] == 5
    assert report["eager_fallbacks"] == {}


# ----- model runner v2's graph manager -----


class BatchExecutionDescriptor:
    def __init__(self, cg_mode: Mode, num_tokens: int) -> None:
        self.cg_mode = cg_mode
        self.num_tokens = num_tokens


class CudaGraphManager:
    def __init__(self, device: FakeDevice, sizes: list[int]) -> None:
        self.device = device
        self.sizes = sizes
        self.graphs: dict[int, object] = {}
        self._graphs_captured = False

    def capture(self, create_forward_fn: Callable[..., Any], progress_bar_desc: str = "") -> None:
        for size in sorted(self.sizes, reverse=True):
            desc = BatchExecutionDescriptor(Mode.FULL, size)
            create_forward_fn(desc, warmup=True)(Mode.NONE)
            forward = create_forward_fn(desc, warmup=False)
            self.device.free -= size << 20  # the capture
            forward(Mode.NONE)
            self.graphs[size] = object()
        self._graphs_captured = True

    def captured_token_counts(self) -> list[int]:
        return sorted(self.graphs)

    def dispatch(
        self, num_reqs: int, num_tokens: int, uniform_token_count: int | None, num_active_loras: int
    ) -> BatchExecutionDescriptor:
        mode = Mode.FULL if uniform_token_count is not None and num_tokens in self.graphs else Mode.NONE
        return BatchExecutionDescriptor(mode, num_tokens)

    def run_fullgraph(self, desc: BatchExecutionDescriptor) -> str:
        self.device.now += 0.001
        return "replayed"


def test_graph_manager_v2_capture_replay_and_fallbacks() -> None:
    module = types.ModuleType("fake_cudagraph_utils")

    class Base(CudaGraphManager):
        pass

    class Model(Base):
        pass

    class Speculator(Base):
        pass

    for cls in (Base,):
        for attr in ("capture", "run_fullgraph", "dispatch"):
            setattr(cls, attr, getattr(CudaGraphManager, attr))
    module.CudaGraphManager = Base  # type: ignore[attr-defined]
    module.ModelCudaGraphManager = Model  # type: ignore[attr-defined]
    device = FakeDevice()
    observer = make_observer(device)
    patch_graph_manager(observer, module)

    manager = Model(device, [1, 2, 4])
    manager.capture(lambda desc, warmup: lambda mode: None)
    assert manager.run_fullgraph(BatchExecutionDescriptor(Mode.FULL, 2)) == "replayed"
    manager.dispatch(2, 2, 1, 0)  # graph
    manager.dispatch(8, 8, 1, 0)  # above the largest
    manager.dispatch(8, 30, None, 0)  # not uniform: not a decode step
    drafter = Speculator(device, [1])
    drafter.capture(lambda desc, warmup: lambda mode: None)
    drafter.run_fullgraph(BatchExecutionDescriptor(Mode.FULL, 1))

    report = observer.recorder.report()
    assert [(c["size"], c["memory_bytes"]) for c in report["captures"]] == [(1, 1 << 20), (2, 2 << 20), (4, 4 << 20)]
    assert [(r["size"], r["count"], r["timed"]) for r in report["replay"]] == [(2, 1, 1)]
    assert report["decode_steps"] == 2
    assert report["eager_fallbacks"] == {"BatchAboveMaxCaptureSize": 1}
    assert report["decode_batches"]["counts"] == {"2": 1, "8": 1}


# ----- the real vLLM classes (CPU build), in a child interpreter -----
# (so that this process never imports vLLM and torch: other tests check that probing does not)

REAL_VLLM_HOOKS = """
from vllm.compilation import cuda_graph
import vllm.config
from vllm.config import CompilationConfig, CUDAGraphMode, VllmConfig
from vllm.v1.attention.backend import AttentionCGSupport

from npu_runtime.observer.config_hooks import patch_config
from npu_runtime.observer.graph_manager import patch_graph_manager
from npu_runtime.observer.graph_wrappers import CUDA_GRAPH_WRAPPER, patch_graph_wrapper
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.recorder import Recorder
from npu_runtime.observer.runner_hooks import patch_runner

def observer():
    found = Observer(Recorder(None))
    found._device = None
    return found

# VllmConfig: the CPU platform turns FULL_DECODE_ONLY into NONE without a word.
seen = observer()
patch_config(seen, vllm.config)
config = VllmConfig(compilation_config=CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY))
assert config.compilation_config.cudagraph_mode.name == "NONE"
report = seen.recorder.report()
assert report["config_mode"] == {"requested": "FULL_DECODE_ONLY", "final": "NONE"}, report
[downgrade] = report["downgrades"]
assert (downgrade["reason"], downgrade["stage"]) == ("CpuHasNoGraphs", "engine"), downgrade
assert "cpu" in downgrade["message"]

# CompilationConfig.resolve_cudagraph_mode_and_sizes: an attention backend without graph support.
seen.recorder.downgrades.clear()
compilation = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
assert compilation.resolve_cudagraph_mode_and_sizes(AttentionCGSupport.NEVER, "TinyBackend").name == "NONE"
report = seen.recorder.report()
assert report["resolved_mode"] == "NONE"
[downgrade] = report["downgrades"]
assert downgrade["reason"] == "AttentionBackendUnsupported", downgrade
assert "TinyBackend" in downgrade["message"] and "NEVER" in downgrade["message"]

# CUDAGraphWrapper: hookable; outside a forward it runs the runnable untouched and unrecorded.
wrapped = observer()
patch_graph_wrapper(wrapped, cuda_graph, CUDA_GRAPH_WRAPPER)
wrapper = object.__new__(cuda_graph.CUDAGraphWrapper)
wrapper.runnable = lambda x: x + 1
# What CUDAGraphWrapper.__init__ sets (it needs a device graph pool, which the CPU build lacks).
wrapper.is_debugging_mode = False
wrapper.runtime_mode = CUDAGraphMode.FULL
wrapper.concrete_cudagraph_entries = {}
assert wrapper(41) == 42
assert wrapped.recorder.report()["errors"] == {}
assert any("CUDAGraphWrapper.__call__" in h for h in wrapped.recorder.hooks_installed)

# The V1 runner and the V2 graph manager of this vLLM have every method the hooks expect.
import vllm.v1.worker.gpu_model_runner as v1
import vllm.v1.worker.gpu.cudagraph_utils as v2
runner = observer()
patch_runner(runner, v1, class_name="GPUModelRunner")
patch_graph_manager(runner, v2)
expected = {"_determine_batch_execution_and_padding", "_dummy_run", "capture_model", "load_model",
            "initialize_kv_cache", "capture", "run_fullgraph", "dispatch"}
assert {h.rsplit(".", 1)[1] for h in runner.recorder.hooks_installed} == expected, runner.recorder.hooks_installed
assert runner.recorder.hooks_unavailable == []
print("ok")
"""


@needs_vllm
def test_the_real_vllm_classes_are_hooked_and_observed() -> None:
    result = run_python(REAL_VLLM_HOOKS, env={"PATH": "/usr/bin:/bin"})
    assert result.stdout.strip().endswith("ok"), result.stderr[-4000:]


# ----- register(): the plugin entry point -----


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=240
    )


def test_register_is_a_no_op_outside_npu_runtime_serve() -> None:
    result = run_python(
        """
        import sys
        from npu_runtime.observer import register, recorder
        register(); register()
        assert recorder() is None
        assert "vllm" not in sys.modules and "torch" not in sys.modules
        print("ok")
        """,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.strip() == "ok", result.stderr


@needs_vllm
def test_register_installs_lazily_and_reports(tmp_path: Path) -> None:
    result = run_python(
        """
        import sys
        from npu_runtime.observer import register, recorder
        register()
        assert "torch" not in sys.modules, "register() must not import torch"
        register()  # idempotent
        import vllm.config
        assert any("VllmConfig.__post_init__" in h for h in recorder().hooks_installed)
        assert "vllm.v1.worker.gpu_model_runner" not in sys.modules  # worker hooks wait for their import
        recorder().flush()
        print("ok")
        """,
        env={reports.ENV_DIR: str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    [report] = reports.read_reports(tmp_path)
    assert report["schema"] == reports.SCHEMA
    assert report["vllm_version"]
    assert json.dumps(report)  # plain JSON


def test_the_plugin_can_be_switched_off(tmp_path: Path) -> None:
    result = run_python(
        """
        from npu_runtime.observer import register, recorder
        register()
        print(recorder() is None)
        """,
        env={reports.ENV_DIR: str(tmp_path), reports.ENV_ENABLED: "0", "PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.strip() == "True", result.stderr


def test_recorder_survives_an_unwritable_directory(tmp_path: Path) -> None:
    recorder = Recorder(str(tmp_path / "missing" / "dir"))
    recorder.record_downgrade("FULL", "NONE", "X", "y")  # flushes; must not raise
    recorder.flush()

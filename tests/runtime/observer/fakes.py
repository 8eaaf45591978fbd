"""Stand-ins for what the observer's hooks touch on a device: memory info, timing events, a graph wrapper.

They mimic the attributes the hooks read from vLLM's CUDAGraphWrapper / vllm-ascend's
ACLGraphWrapper (runtime_mode, concrete_*_entries, entry.cudagraph) and from the forward context
(cudagraph_runtime_mode, batch_descriptor), so the hooks' capture/replay logic runs without a GPU.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.recorder import Recorder


class Mode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclasses.dataclass(frozen=True)
class Descriptor:
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


@dataclasses.dataclass
class Context:
    cudagraph_runtime_mode: Mode = Mode.NONE
    batch_descriptor: Descriptor | None = None


class FakeDevice:
    """torch.cuda-like: mem_get_info and Event; a capture takes `per_capture` bytes."""

    def __init__(self, total: int = 64 << 30, free: int = 40 << 30) -> None:
        self.total = total
        self.free = free
        self.now = 0.0  # device clock, seconds
        self.completed = True  # whether recorded events have completed
        self.syncs = 0
        device = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.at: float | None = None

            def record(self) -> None:
                self.at = device.now

            def query(self) -> bool:
                return device.completed

            def elapsed_time(self, end: Event) -> float:
                assert self.at is not None
                assert end.at is not None
                return (end.at - self.at) * 1000.0

        self.Event = Event

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, self.total

    def synchronize(self) -> None:
        self.syncs += 1


@dataclasses.dataclass
class Entry:
    batch_descriptor: Descriptor
    cudagraph: object | None = None


class FakeGraphWrapper:
    """The shape of CUDAGraphWrapper: capture on the first call per descriptor, replay afterwards."""

    context = Context()

    def __init__(self, device: FakeDevice, runtime_mode: Mode = Mode.FULL, capture_bytes: int = 1 << 20) -> None:
        self.device = device
        self.runtime_mode = runtime_mode
        self.capture_bytes = capture_bytes
        self.concrete_cudagraph_entries: dict[Descriptor, Entry] = {}
        self.calls: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        ctx = FakeGraphWrapper.context
        mode = ctx.cudagraph_runtime_mode
        if mode == Mode.NONE or mode != self.runtime_mode:
            self.calls.append("eager")
            return "eager"
        assert ctx.batch_descriptor is not None
        entry = self.concrete_cudagraph_entries.setdefault(ctx.batch_descriptor, Entry(ctx.batch_descriptor))
        if entry.cudagraph is None:
            self.device.free -= self.capture_bytes
            entry.cudagraph = object()
            self.calls.append("capture")
            return "captured"
        self.device.now += 0.002  # the replay's device time
        self.calls.append("replay")
        return "replayed"


def make_observer(device: FakeDevice | None, directory: str | None = None, sample_every: int = 1) -> Observer:
    observer = Observer(Recorder(directory), sample_every=sample_every)
    observer._device = device  # what device_module() would find on a GPU
    observer._modes = Mode  # vLLM's CUDAGraphMode, without importing vLLM (and torch) here
    return observer


def get_context() -> Context:
    return FakeGraphWrapper.context


def set_context(mode: Mode, tokens: int | None = None) -> None:
    FakeGraphWrapper.context = Context(mode, Descriptor(tokens) if tokens is not None else None)

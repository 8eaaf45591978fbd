"""The observer of one process: its hooks' state, the recorder, device helpers, and capture/replay bookkeeping.

Shared by every hook module (`config_hooks`, `graph_wrappers`, `runner_hooks`, `decode_steps`,
`graph_manager`); `vllm_hooks.install` makes one per process. Also names graph modes (`mode_name`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Final

from npu_runtime.observer.hooks import Hook
from npu_runtime.observer.recorder import DeviceEvent, EventTimer, Key, Recorder

_UNSET: Final = object()
CaptureToken = tuple[float, int | None]  # (perf_counter at the start, free device bytes then)
ReplayToken = tuple[DeviceEvent, DeviceEvent] | None  # the timer's event pair; None: not timed


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

#!/usr/bin/env python3
"""Host-side cost of the observer's hooks per call, in microseconds (no device needed).

Measures the graph wrapper's `__call__` with a cheap callable behind it, unhooked and hooked, on
the three paths it sees: a FULL replay (forward-context lookup, replay counted, two device events
recorded and queued), a passthrough (prefill or eager step: a lookup and a mode compare), and a
capture (two device-memory queries). Events here are Python stand-ins, so the figures are the
hook's own Python cost; torch.cuda.Event.record adds its own few microseconds on a real device
(tests/device/check_graph_observer.py measures that where a GPU is lent). Also the V1 runner's
per-step batch_dispatch hook (decode-step and fallback accounting).

    .venv/bin/python scripts/bench_replay_hook.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu_runtime.observer.graph_wrappers import CUDA_GRAPH_WRAPPER, hook_graph_wrapper
from npu_runtime.observer.process_observer import Observer

from tests.runtime.observer.fakes import (
    Descriptor,
    Entry,
    FakeDevice,
    FakeGraphWrapper,
    Mode,
    get_context,
    make_observer,
    set_context,
)


class CheapWrapper(FakeGraphWrapper):
    """CUDAGraphWrapper's shape with the cheapest possible body: the entry exists, replay is a no-op."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return None


def per_call_us(function: Callable[[], Any], calls: int, repeats: int = 5) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        timings.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(timings)


def hooked(observer: Observer, cls: type) -> type:
    class Hooked(cls):  # type: ignore[misc]
        __call__ = cls.__call__

    assert hook_graph_wrapper(observer, Hooked, CUDA_GRAPH_WRAPPER, get_context=get_context)
    return Hooked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    calls = args.calls

    device = FakeDevice()
    observer = make_observer(device)
    plain = CheapWrapper(device)
    wrapper = hooked(observer, CheapWrapper)(device)
    descriptor = Descriptor(8)
    for target in (plain, wrapper):
        target.concrete_cudagraph_entries[descriptor] = Entry(descriptor, cudagraph=object())

    rows = []
    set_context(Mode.FULL, 8)
    base = per_call_us(plain, calls)
    timer = observer.recorder.timer

    def replay() -> None:
        wrapper()
        if timer.pending > 512:  # what the flush thread does once a second
            timer.drain()

    rows.append(("replay (FULL, timed every call)", base, per_call_us(replay, calls)))
    sampled = make_observer(device, sample_every=16)
    sampled_wrapper = hooked(sampled, CheapWrapper)(device)
    sampled_wrapper.concrete_cudagraph_entries[descriptor] = Entry(descriptor, cudagraph=object())
    rows.append(("replay (FULL, timed 1 in 16)", base, per_call_us(sampled_wrapper, calls)))
    set_context(Mode.NONE, 8)
    rows.append(("passthrough (eager/prefill step)", per_call_us(plain, calls), per_call_us(wrapper, calls)))

    # a capture: two memory queries and a dict update per call (a fresh descriptor each time)
    capture_observer = make_observer(device)
    capturing = hooked(capture_observer, CheapWrapper)(device)
    set_context(Mode.FULL, 1)

    def capture() -> None:
        capturing.concrete_cudagraph_entries.clear()
        capturing()

    rows.append(("capture bookkeeping", per_call_us(plain, calls // 10), per_call_us(capture, calls // 10)))

    print(f"observer hook cost per call (median of 5 x {calls} calls, Python {sys.version.split()[0]})")
    print(f"{'path':<36}{'unhooked us':>14}{'hooked us':>12}{'added us':>11}")
    for name, before, after in rows:
        print(f"{name:<36}{before:>14.3f}{after:>12.3f}{after - before:>11.3f}")
    set_context(Mode.NONE)


if __name__ == "__main__":
    main()

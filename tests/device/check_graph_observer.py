#!/usr/bin/env python3
"""Device check for a lent GPU: the observer's capture/replay hook around real CUDA graphs.

Not collected by pytest (the name does not start with test_): run it by hand where a GPU is
lent, from the repository root, with a CUDA build of torch:

    PYTHONPATH=runtime:. python tests/device/check_graph_observer.py [--json OUT.json]

What it does: a small decoder step (RMSNorm, attention over a static KV cache, MLP; several
layers) is wrapped in a stand-in with CUDAGraphWrapper's shape (runtime_mode,
concrete_cudagraph_entries, entry.cudagraph, a forward context giving the runtime mode and the
batch descriptor), captured with torch.cuda.graph at several batch sizes and replayed, and the
real hook is put around it as production does (`npu_runtime.observer.graph_wrappers.hook_graph_wrapper`
with CUDA_GRAPH_WRAPPER), with torch.cuda as the device module and torch.cuda.Event as the timer. It checks:

1. every size's capture is recorded, with device memory > 0 (each graph has its own pool) and a
   capture time;
2. every replay is counted and timed (device events read after completion), with latencies
   close to an independent event measurement of the same replays;
3. the hook adds no synchronisation: no torch.cuda/Stream/Event synchronize call is made while
   the hooked replays are issued, and the host time to issue a replay stays far below the
   replay's device time (a synchronising hook would make it at least as long);
4. the host-side cost the hook adds per replay, in microseconds, with real CUDA events.

Exit status 0 when every check passes, 1 otherwise, 77 when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SIZES = (64, 32, 16, 8, 4, 2, 1)
REPLAYS = 200
HIDDEN = 2048
LAYERS = 8
CONTEXT = 512  # cached tokens each decode step attends to


@dataclasses.dataclass(frozen=True)
class Descriptor:
    num_tokens: int


@dataclasses.dataclass
class ForwardContext:
    cudagraph_runtime_mode: Any
    batch_descriptor: Descriptor | None


@dataclasses.dataclass
class Entry:
    batch_descriptor: Descriptor
    cudagraph: Any = None
    output: Any = None


CONTEXT_NOW = ForwardContext(None, None)


def get_forward_context() -> ForwardContext:
    return CONTEXT_NOW


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 77

    from npu_runtime.observer.graph_wrappers import CUDA_GRAPH_WRAPPER, hook_graph_wrapper
    from npu_runtime.observer.process_observer import Observer
    from npu_runtime.observer.recorder import Recorder

    @dataclasses.dataclass(frozen=True)
    class RuntimeMode:
        name: str

    class Mode:
        """vLLM's CUDAGraphMode, as far as the hook reads it."""

        NONE = RuntimeMode("NONE")
        FULL = RuntimeMode("FULL")

    none_mode, full_mode = Mode.NONE, Mode.FULL
    device = torch.device("cuda")
    torch.manual_seed(0)
    dtype = torch.bfloat16

    class Layer(torch.nn.Module):
        keys: torch.Tensor
        values: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
            self.out = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
            self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN, bias=False)
            self.register_buffer("keys", torch.randn(max(SIZES), CONTEXT, HIDDEN) * 0.02)
            self.register_buffer("values", torch.randn(max(SIZES), CONTEXT, HIDDEN) * 0.02)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch = x.shape[0]
            h = torch.nn.functional.rms_norm(x, (HIDDEN,))
            q, _, _ = self.qkv(h).chunk(3, dim=-1)
            scores = torch.einsum("bh,bth->bt", q, self.keys[:batch]) / HIDDEN**0.5
            attn = torch.einsum("bt,bth->bh", scores.softmax(-1), self.values[:batch])
            x = x + self.out(attn)
            h = torch.nn.functional.rms_norm(x, (HIDDEN,))
            out: torch.Tensor = x + self.down(torch.nn.functional.silu(self.up(h)))
            return out

    model = torch.nn.Sequential(*(Layer() for _ in range(LAYERS))).to(device=device, dtype=dtype).eval()
    static_in = {size: torch.zeros(size, HIDDEN, device=device, dtype=dtype) for size in SIZES}

    class GraphWrapper:
        """CUDAGraphWrapper's shape: capture on the first call per descriptor, replay afterwards."""

        def __init__(self, runnable: Callable[[torch.Tensor], torch.Tensor]) -> None:
            self.runnable = runnable
            self.runtime_mode = full_mode
            self.concrete_cudagraph_entries: dict[Descriptor, Entry] = {}

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            context = get_forward_context()
            mode = context.cudagraph_runtime_mode
            if mode == none_mode or mode != self.runtime_mode:
                return self.runnable(x)
            assert context.batch_descriptor is not None
            entry = self.concrete_cudagraph_entries.setdefault(
                context.batch_descriptor, Entry(context.batch_descriptor)
            )
            if entry.cudagraph is None:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):  # a private pool per graph: each capture allocates
                    entry.output = self.runnable(x)
                entry.cudagraph = graph
                return entry.output  # type: ignore[no-any-return]
            entry.cudagraph.replay()
            return entry.output  # type: ignore[no-any-return]

    with tempfile.TemporaryDirectory() as directory:
        observer = Observer(Recorder(directory))
        observer._device = torch.cuda
        observer._modes = Mode
        plain = GraphWrapper(model)
        hooked_class = type("HookedGraphWrapper", (GraphWrapper,), {"__call__": GraphWrapper.__call__})
        # what the observer does to vLLM's CUDAGraphWrapper
        if not hook_graph_wrapper(observer, hooked_class, CUDA_GRAPH_WRAPPER, get_context=get_forward_context):
            print("FAIL: the graph wrapper stand-in could not be hooked")
            return 1
        hooked = hooked_class(model)

        global CONTEXT_NOW
        with torch.inference_mode():
            for size in SIZES:  # warm up eagerly (kernels, cuBLAS workspaces), as vLLM does
                CONTEXT_NOW = ForwardContext(none_mode, Descriptor(size))
                hooked(static_in[size])
            torch.cuda.synchronize()
            for wrapper in (plain, hooked):
                for size in SIZES:
                    CONTEXT_NOW = ForwardContext(full_mode, Descriptor(size))
                    wrapper(static_in[size])
            torch.cuda.synchronize()

            figures: dict[str, Any] = {"sizes": list(SIZES), "per_size": {}}
            failures: list[str] = []

            # independent device time of one replay per size
            reference: dict[int, float] = {}
            for size in SIZES:
                CONTEXT_NOW = ForwardContext(full_mode, Descriptor(size))
                event: Any = torch.cuda.Event
                start, end = event(enable_timing=True), event(enable_timing=True)
                start.record()
                for _ in range(20):
                    plain(static_in[size])
                end.record()
                end.synchronize()
                reference[size] = start.elapsed_time(end) / 20 / 1000

            def issue(wrapper: GraphWrapper, size: int, count: int) -> float:
                """Host seconds per replay to issue `count` replays (no synchronisation inside)."""
                global CONTEXT_NOW
                CONTEXT_NOW = ForwardContext(full_mode, Descriptor(size))
                begin = time.perf_counter()
                for _ in range(count):
                    wrapper(static_in[size])
                return (time.perf_counter() - begin) / count

            syncs: list[str] = []
            with counting_synchronisations(torch, syncs):
                host_hooked = {size: issue(hooked, size, REPLAYS) for size in SIZES}
            torch.cuda.synchronize()
            host_plain = {size: issue(plain, size, REPLAYS) for size in SIZES}
            torch.cuda.synchronize()
            for _ in range(50):
                if observer.recorder.timer.pending == 0:
                    break
                observer.recorder.report()
                time.sleep(0.01)
            report = observer.recorder.report()

        captures = {c["size"]: c for c in report["captures"]}
        replays = {r["size"]: r for r in report["replay"]}
        for size in SIZES:
            capture, replay = captures.get(size), replays.get(size)
            row = {
                "capture_memory_bytes": capture and capture["memory_bytes"],
                "capture_seconds": capture and capture["seconds"],
                "replays": replay and replay["count"],
                "timed": replay and replay["timed"],
                "p50_seconds": replay and replay["p50_seconds"],
                "reference_seconds": reference[size],
                "host_issue_us_plain": host_plain[size] * 1e6,
                "host_issue_us_hooked": host_hooked[size] * 1e6,
            }
            figures["per_size"][size] = row
            if not capture or not capture["memory_bytes"] or capture["memory_bytes"] <= 0:
                failures.append(f"size {size}: capture memory not positive ({capture})")
            if not replay or replay["count"] != REPLAYS or replay["timed"] != REPLAYS:
                failures.append(f"size {size}: replays {replay and replay['count']}/{replay and replay['timed']}")
            elif not 0.5 * reference[size] <= replay["p50_seconds"] <= 2.0 * reference[size] + 50e-6:
                failures.append(f"size {size}: p50 {replay['p50_seconds']} far from {reference[size]}")
            if host_hooked[size] >= 0.5 * reference[size]:
                failures.append(
                    f"size {size}: issuing a hooked replay took {host_hooked[size] * 1e6:.1f} us on the host, "
                    f"vs {reference[size] * 1e6:.1f} us of device time: the hook waits for the device"
                )
        if syncs:
            failures.append(f"synchronisations while issuing hooked replays: {sorted(set(syncs))}")
        if report["errors"]:
            failures.append(f"hook errors: {report['errors']}")
        added = statistics.median(host_hooked[s] - host_plain[s] for s in SIZES) * 1e6
        figures["hook_added_host_us_per_replay_median"] = added
        figures["synchronisations"] = len(syncs)
        figures["failures"] = failures

    print(
        f"{'size':>5} {'capture MiB':>12} {'capture s':>10} {'p50 us':>8} {'ref us':>8} {'issue us':>9} {'hooked':>8}"
    )
    for size in SIZES:
        row = figures["per_size"][size]
        print(
            f"{size:>5} {(row['capture_memory_bytes'] or 0) / 2**20:>12.1f} {row['capture_seconds'] or 0:>10.4f} "
            f"{(row['p50_seconds'] or 0) * 1e6:>8.1f} {row['reference_seconds'] * 1e6:>8.1f} "
            f"{row['host_issue_us_plain']:>9.1f} {row['host_issue_us_hooked']:>8.1f}"
        )
    print(f"host time the hook adds per replay (median over sizes): {added:.2f} us; synchronisations: {len(syncs)}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
    for failure in failures:
        print("FAIL:", failure)
    print("PASS" if not failures else "FAILED")
    return 0 if not failures else 1


@contextmanager
def counting_synchronisations(torch: Any, calls: list[str]) -> Iterator[None]:
    """Record every synchronize call torch offers while the block runs."""
    targets = [
        (torch.cuda, "synchronize"),
        (torch.cuda.Stream, "synchronize"),
        (torch.cuda.Event, "synchronize"),
        (torch.cuda.Event, "wait"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def counting(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(label)
            return original(*args, **kwargs)

        return wrapper

    for owner, name, original in saved:
        setattr(owner, name, counting(f"{getattr(owner, '__name__', owner)}.{name}", original))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Memory used by the graph metrics with 64 captured sizes, in the engine and in the runtime.

- In the engine: one process's Recorder after 64 captures and replays of every size (each
  size's recent-sample ring full: 512 latencies), measured with tracemalloc; and the size of
  the report file it writes.
- In the engine, time: `Recorder.report()` (what the flush thread builds once a second while
  replays are timed) with every size's ring full of jittered latencies, when every size got a
  new replay time since the last report and when none did.
- In the runtime: building /metrics from 8 such reports (tensor parallel 8), measured with
  tracemalloc (peak), and the size of the exposition text and of /status.

    .venv/bin/python scripts/bench_metrics_memory.py [--sizes 64] [--workers 8]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu_runtime import reports
from npu_runtime.observer.recorder import RECENT_SAMPLES, Recorder
from npu_runtime.serving.status import PlanView, RuntimeStatus


def kib(n: int | float) -> str:
    return f"{n / 1024:.1f} KiB"


def filled_recorder(directory: str | None, sizes: list[int], rng: random.Random | None = None) -> Recorder:
    """Every size captured and replayed RECENT_SAMPLES times; latencies rising, or jittered with `rng`."""
    recorder = Recorder(directory, vllm_version="0.31.0")
    for size in sizes:
        recorder.record_capture(("FULL", size), 8 << 20, 0.05)
        stats_key = ("FULL", size)
        for i in range(RECENT_SAMPLES):
            recorder.count_replay(stats_key)
            recorder.replay[stats_key].observe(0.001 + (rng.random() * 1e-4 if rng else i * 1e-6))
        recorder.record_decode_step(None)
    recorder.record_memory("npu:0", total=64 << 30, free=2 << 30, weights=15 << 30, kv_cache=40 << 30)
    return recorder


def report_ms(recorder: Recorder, *, new_samples: bool, repeats: int = 50) -> float:
    """Median milliseconds of one `report()`; with `new_samples`, every size gets a replay time first."""
    rng = random.Random(1)
    timings = []
    recorder.report()
    for _ in range(repeats):
        if new_samples:
            for stats in recorder.replay.values():
                stats.observe(0.001 + rng.random() * 1e-4)
        start = time.perf_counter()
        recorder.report()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, default=64)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    sizes = [1, 2, 4] + [8 * i for i in range(1, args.sizes - 2)]
    sizes = sizes[: args.sizes]

    with tempfile.TemporaryDirectory() as directory:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        recorder = filled_recorder(directory, sizes)
        engine_bytes = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        recorder.flush()
        report_bytes = reports.report_path(directory, recorder.pid).stat().st_size
        timed = filled_recorder(None, sizes, random.Random(0))
        report_changed_ms = report_ms(timed, new_samples=True)
        report_unchanged_ms = report_ms(timed, new_samples=False)

        report = json.loads(reports.report_path(directory, recorder.pid).read_text())
        for worker in range(1, args.workers):
            reports.write_report(directory, recorder.pid + worker, {**report, "pid": recorder.pid + worker})
        status = RuntimeStatus(directory, "FULL_DECODE_ONLY")
        status.set_plan(PlanView("FULL_DECODE_ONLY", "FULL_DECODE_ONLY", {}))

        from npu_runtime.serving.server import exposition

        exposition(status)  # imports and caches outside the measurement
        gc.collect()
        tracemalloc.start()
        text = exposition(status)
        scrape_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        document = json.dumps(status.document())

    print(f"graph metrics with {len(sizes)} captured sizes (FULL), {RECENT_SAMPLES} recent replays kept per size")
    print(f"  engine, one process: recorder {kib(engine_bytes)}, report file {kib(report_bytes)}")
    print(
        f"  engine, one process: report() {report_changed_ms:.2f} ms with a new replay time at every size, "
        f"{report_unchanged_ms:.2f} ms with none"
    )
    lines = text.count(b"\n")
    print(
        f"  runtime, {args.workers} reports: /metrics scrape peak {kib(scrape_peak)}, "
        f"exposition {kib(len(text))} ({lines} lines), /status {kib(len(document))}"
    )


if __name__ == "__main__":
    main()

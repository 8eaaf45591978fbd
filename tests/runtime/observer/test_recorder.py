"""The observer's recorder and replay timer: bounded, non-blocking, written as reports."""

from __future__ import annotations

import time
from pathlib import Path

from npu_runtime import reports
from npu_runtime.observer.recorder import RECENT_SAMPLES, EventTimer, Recorder, ReplayStats, percentile, percentiles

from tests.runtime.observer.fakes import FakeDevice


def test_timer_reads_only_completed_events_in_order() -> None:
    device = FakeDevice()
    timer = EventTimer(lambda: device.Event(enable_timing=True))
    for key, took in ((("FULL", 1), 0.001), (("FULL", 2), 0.003)):
        pair = timer.start()
        assert pair is not None
        device.now += took
        timer.stop(pair, key)
    device.completed = False
    assert timer.drain() == []
    assert timer.pending == 2
    device.completed = True
    drained = timer.drain()
    assert [key for key, _ in drained] == [("FULL", 1), ("FULL", 2)]
    assert [round(seconds, 6) for _, seconds in drained] == [0.001, 0.003]
    assert timer.pending == 0


def test_timer_reuses_events_and_bounds_what_is_pending() -> None:
    device = FakeDevice()
    made: list[object] = []

    def make() -> FakeDevice:
        event = device.Event(enable_timing=True)
        made.append(event)
        return event  # type: ignore[return-value]

    timer = EventTimer(make, max_pending=4)  # type: ignore[arg-type]
    device.completed = False
    for _ in range(6):
        pair = timer.start()
        if pair is not None:
            timer.stop(pair, ("FULL", 1))
    assert timer.pending == 4  # the 5th and 6th replays were not timed
    assert len(made) == 8
    device.completed = True
    assert len(timer.drain()) == 4
    assert timer.start() is not None
    assert len(made) == 8  # a drained pair is reused


def test_timer_without_events_times_nothing() -> None:
    timer = EventTimer(None)
    assert timer.start() is None
    assert timer.drain() == []


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_percentiles_sort_once_for_several_fractions() -> None:
    samples = [float(i) for i in range(100, 0, -1)]
    assert percentiles(samples, (0.5, 0.99)) == [percentile(samples, 0.5), percentile(samples, 0.99)] == [50.0, 99.0]
    assert percentiles([], (0.5, 0.99)) == [None, None]


def test_replay_percentiles_are_kept_until_a_new_sample_arrives() -> None:
    stats = ReplayStats()
    assert stats.p50_p99() == (None, None)
    for seconds in (0.003, 0.001, 0.002):
        stats.observe(seconds)
    first = stats.p50_p99()
    assert first == (0.002, 0.003)
    assert stats.p50_p99() is first  # nothing new: not sorted again
    stats.observe(0.0005)
    assert stats.p50_p99() == (0.001, 0.003)
    for _ in range(RECENT_SAMPLES):  # the ring wraps: only the newest samples count
        stats.observe(0.01)
    assert stats.p50_p99() == (0.01, 0.01)


def test_report_shape_and_flush(tmp_path: Path) -> None:
    recorder = Recorder(str(tmp_path), vllm_version="0.31.0")
    recorder.record_capture(("FULL", 4), 1 << 20, 0.25)
    recorder.record_capture(("FULL", 4), None, 0.05)  # a second piece without memory
    recorder.count_replay(("FULL", 4))
    recorder.record_decode_step(None)
    recorder.record_decode_step("BatchAboveMaxCaptureSize")
    recorder.record_memory("npu:0", total=64 << 30, weights=None, bogus=1)
    recorder.record_memory("npu:0", kv_cache=8 << 30)
    recorder.record_resolved_mode("FULL_DECODE_ONLY")
    recorder.flush()
    [report] = reports.read_reports(tmp_path)
    assert report["captures"] == [{"mode": "FULL", "size": 4, "memory_bytes": 1 << 20, "seconds": 0.3, "graphs": 2}]
    assert report["replay"][0]["count"] == 1
    assert report["decode_steps"] == 2
    assert report["eager_fallbacks"] == {"BatchAboveMaxCaptureSize": 1}
    assert report["memory"] == {"device": "npu:0", "total": 64 << 30, "kv_cache": 8 << 30}
    assert report["resolved_mode"] == "FULL_DECODE_ONLY"


def test_downgrades_and_phases_are_written_at_once(tmp_path: Path) -> None:
    recorder = Recorder(str(tmp_path))
    recorder.record_downgrade("FULL_DECODE_ONLY", "NONE", "X", "m")
    recorder.record_downgrade("FULL_DECODE_ONLY", "NONE", "X", "again")  # the same downgrade once
    assert len(reports.read_reports(tmp_path)[0]["downgrades"]) == 1
    recorder.set_phase("capturing")
    assert reports.read_reports(tmp_path)[0]["phase"] == "capturing"


def test_the_flush_thread_writes_what_changed(tmp_path: Path) -> None:
    recorder = Recorder(str(tmp_path), flush_seconds=0.05)
    recorder.ensure_flusher()
    recorder.ensure_flusher()  # one thread per process
    recorder.record_decode_step(None)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = reports.read_reports(tmp_path)
        if found and found[0]["decode_steps"] == 1:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the flush thread did not write the report")
    recorder.close()


def test_a_forked_child_starts_clean(tmp_path: Path) -> None:
    recorder = Recorder(str(tmp_path))
    recorder.record_decode_step(None)
    recorder.after_fork_in_child()
    assert recorder.decode_steps == 0
    assert recorder.report()["pid"] > 0

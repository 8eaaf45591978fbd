"""The decode batch distribution one engine process records (issue 37): exact counts, the bound,
the decay, and the report; then what /status and /metrics make of several processes' reports."""

from __future__ import annotations

from typing import Any

import pytest
from npu_runtime import metrics
from npu_runtime.observer.batches import DecodeBatchCounter
from npu_runtime.observer.recorder import Recorder
from npu_runtime.serving import batches


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_exact_counts_per_size() -> None:
    counter = DecodeBatchCounter(clock=Clock())
    for tokens in (3, 3, 8, 3, 17):
        counter.count(tokens)
    assert counter.counts == {3: 3, 8: 1, 17: 1}
    assert counter.weights() == {3: 3.0, 8: 1.0, 17: 1.0}


def test_bounded_sizes_beyond_the_bound_are_counted_as_dropped() -> None:
    counter = DecodeBatchCounter(clock=Clock(), max_sizes=2)
    for tokens in (1, 2, 3, 1, 0, -4):
        counter.count(tokens)
    assert counter.counts == {1: 2, 2: 1}
    assert counter.dropped == 3


def test_decay_follows_the_traffic_and_an_idle_engine_keeps_the_distribution() -> None:
    clock = Clock()
    counter = DecodeBatchCounter(half_life_seconds=100.0, clock=clock)
    for _ in range(8):
        counter.count(4)
    counter.count(16)
    assert counter.weights() == {4: 8.0, 16: 1.0}
    clock.now = 100.0  # one half-life, no traffic: every size halves, the shares stay
    assert counter.weights() == pytest.approx({4: 4.0, 16: 0.5})
    for _ in range(6):
        counter.count(16)
    clock.now = 200.0  # the new traffic weighs more than the old
    weights = counter.weights()
    # Steps count from the fold that sees them (the flush, once a second in an engine).
    assert weights == pytest.approx({4: 2.0, 16: 0.25 + 6.0})
    assert weights[16] > weights[4]
    assert counter.counts == {4: 8, 16: 7}  # the counts themselves never decay (a counter)


def test_the_recorder_reports_the_batches() -> None:
    recorder = Recorder(None, batch_half_life_seconds=60.0)
    recorder.record_decode_step(None, 8)
    recorder.record_decode_step("NoMatchingGraph", 3)
    recorder.record_decode_step(None)  # a hook that cannot say the size: a step, not a batch
    report = recorder.report()
    assert report["decode_steps"] == 3
    assert report["decode_batches"]["counts"] == {"3": 1, "8": 1}
    assert report["decode_batches"]["half_life_seconds"] == 60.0


PLAN: dict[str, Any] = {"decode_query_len": 2, "max_num_seqs": 8, "capture_sizes": [2, 4, 8, 16]}


def test_status_section_takes_the_largest_per_size_over_processes_and_bounds_it_by_the_ceiling() -> None:
    counts: dict[int, int] = {}
    weights: dict[int, float] = {}
    # Two tensor-parallel workers saw the same steps; the API server reports none.
    for report in (
        {"decode_batches": {"counts": {"4": 10, "6": 5, "40": 1}, "weights": {"4": 9.5, "6": 4.75, "40": 1.0}}},
        {"decode_batches": {"counts": {"4": 10, "6": 4}, "weights": {"4": 9.5, "6": 3.8}}},
        {"pid": 1},
        {"decode_batches": {"counts": {"x": 1, "8": True}, "weights": []}},
    ):
        batches.merge_process(counts, weights, report)
    assert counts == {4: 10, 6: 5, 40: 1}
    section = batches.section(PLAN, counts, weights, [0.5, 1.5, 1.0])
    assert section == {
        "query_len": 2,
        "ceiling": 16,
        "steps": 15,
        "above_ceiling": 1,
        "weights": {"4": 9.5, "6": 4.75},
        "sizes": [2, 4, 8, 16],
        "capture_seconds_per_size": 1.0,
    }
    assert batches.section({}, counts, weights, []) is None  # before the plan


def test_the_metric_counts_decode_steps_per_size() -> None:
    values = metrics.MetricValues(
        requested_mode="FULL_DECODE_ONLY",
        effective_mode="FULL_DECODE_ONLY",
        downgrades={},
        capture_sizes={},
        capture_memory={},
        capture_seconds={},
        replay={},
        eager_fallbacks={},
        device_memory={},
        instrumentation_errors={},
        decode_batches={4: 10, 6: 5},
    )
    family = next(f for f in metrics.families(values) if f.name == "npu_graph_decode_batches")
    assert family.type == "counter"
    samples = {s.labels["size"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert samples == {"4": 10, "6": 5}

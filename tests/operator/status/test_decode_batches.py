"""The operator's side of the decode batch distribution (issue 37): the pods' sections checked,
folded into the calibration record under its trust rules, status.graph's fields, and the whole
path from a runtime's /status to the next pod's plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from npu_operator.status import calibration, decode_batches
from npu_operator.status.decode_batches import DecodeBatchesSection, SpecLimits
from npu_operator.status.findings import PodReport
from npu_operator.status.graph import graph_status
from npu_operator.status.reports import parse_report
from npu_runtime.contract import PlanOptions
from npu_runtime.observer.recorder import Recorder
from npu_runtime.planner.plan import plan_for
from npu_runtime.serving.status import PlanView, RuntimeStatus

from tests.runtime.conftest import FIXTURES

NOW = "2026-01-01T00:00:00Z"
KEY = {
    "config_digest": "d",
    "quantization": None,
    "device_name": "Ascend910B3",
    "layout": "tp1-pp1-dp1-ep1-nodes1",
    "engine": "e",
}
LIMITS = SpecLimits(query_len=1, max_num_seqs=64)
RECORD = {"schema": 1, "key": KEY, "measured": {"weights_bytes": 1}, "capture_failure": None}


def section(steps: int, weights: dict[int, float], query_len: int = 1) -> DecodeBatchesSection:
    return DecodeBatchesSection(query_len, steps, weights, (1, 2, 4, 64), 0.5)


def test_a_section_is_checked_and_never_raises() -> None:
    good = {"query_len": 1, "steps": 300, "weights": {"20": 2.5, "x": 1, "0": 1, "21": float("inf"), "22": True}}
    parsed = decode_batches.parse_section({**good, "sizes": [64, 1, -3, "8"], "capture_seconds_per_size": 7})
    assert parsed == DecodeBatchesSection(1, 300, {20: 2.5}, (1, 64), 7.0)
    bad: Any
    for bad in (None, [], {**good, "query_len": 0}, {**good, "steps": "many"}, {**good, "weights": [1]}):
        assert decode_batches.parse_section(bad) is None


def test_each_pod_is_one_vote_bounded_by_the_spec() -> None:
    pods = [
        ("a", KEY, section(200, {20: 3.0, 500: 9.0})),  # 500 tokens is above max_num_seqs x 1 = 64: dropped
        ("b", KEY, section(100, {20: 1.0, 30: 2.0})),
        ("c", KEY, section(900, {20: 50.0}, query_len=2)),  # another speculative setting than the spec's: ignored
        ("d", {**KEY, "layout": "tp2-pp1-dp1-ep1-nodes1"}, section(900, {40: 50.0})),  # not the record's key
    ]
    record = decode_batches.fold(None, RECORD, pods, LIMITS)
    assert record is not None
    assert [(v["pod"], v["weights"]) for v in record[decode_batches.VOTES_FIELD]] == [
        ("a", {"20": 1.0}),
        ("b", {"20": 0.3333, "30": 0.6667}),
    ]
    assert record["decode_batches"] == {
        "query_len": 1,
        "steps": 300,
        "weights": {"20": 0.6666, "30": 0.3333},  # the mean of the two pods' shares (1 + 0.3333) / 2, 0.6667 / 2
        "sizes": [1, 2, 4, 64],
        "capture_seconds_per_size": 0.5,
    }


def test_one_pod_alone_makes_no_distribution_and_a_second_pod_does() -> None:
    alone = decode_batches.fold(None, RECORD, [("a", KEY, section(500, {20: 1.0}))], LIMITS)
    assert alone is not None and "decode_batches" not in alone
    # The same pod again (a later tick) is still one vote; another pod, later, makes two.
    again = decode_batches.fold(alone, RECORD, [("a", KEY, section(900, {20: 1.0}))], LIMITS)
    assert again is not None and "decode_batches" not in again and len(again[decode_batches.VOTES_FIELD]) == 1
    second = decode_batches.fold(again, RECORD, [("b", KEY, section(300, {24: 1.0}))], LIMITS)
    assert second is not None and second["decode_batches"]["weights"] == {"20": 0.5, "24": 0.5}


def test_a_pod_claiming_huge_steps_and_weights_moves_the_distribution_by_one_vote() -> None:
    honest = [(pod, KEY, section(400, {20: 30.0, 24: 10.0})) for pod in ("a", "b", "c")]
    liar = ("x", KEY, section(10**18, {7: 1e300}))
    record = decode_batches.fold(None, RECORD, [*honest, liar], LIMITS)
    assert record is not None
    agreed = record["decode_batches"]
    assert agreed["weights"] == {"7": 0.25, "20": 0.5625, "24": 0.1875}
    assert agreed["steps"] == 3 * 400 + 2 * 400  # each vote counts at most twice the median


def test_a_pod_with_few_steps_keeps_its_vote_and_a_new_key_starts_again() -> None:
    two = [("a", KEY, section(500, {20: 1.0})), ("b", KEY, section(500, {20: 1.0}))]
    kept = decode_batches.fold(None, RECORD, two, LIMITS)
    assert kept is not None
    fresh_pod = decode_batches.fold(kept, RECORD, [("a", KEY, section(3, {50: 1.0}))], LIMITS)  # a restart
    assert fresh_pod is not None and fresh_pod["decode_batches"] == kept["decode_batches"]
    new_key = {**RECORD, "key": {**KEY, "engine": "another"}}
    restarted = decode_batches.fold(kept, new_key, [], LIMITS) or {}
    assert "decode_batches" not in restarted and decode_batches.VOTES_FIELD not in restarted
    assert decode_batches.fold(kept, None, [], LIMITS) is None


def test_only_the_latest_votes_are_kept_and_a_hand_edit_that_is_none_is_dropped() -> None:
    pods = [(f"pod-{n}", KEY, section(200, {20 + n: 1.0})) for n in range(12)]
    record = decode_batches.fold(None, RECORD, pods, LIMITS)
    assert record is not None
    assert [v["pod"] for v in record[decode_batches.VOTES_FIELD]] == [f"pod-{n}" for n in range(4, 12)]
    junk = [
        {"pod": "z", "steps": -1},
        {"pod": 3},
        "vote",
        {"pod": "y", "query_len": 1, "steps": 5, "weights": {"x": 1}, "sizes": []},
        {"pod": "w", "query_len": 1, "steps": 5, "weights": {"0": 1}, "sizes": []},  # no batch of 0 tokens
    ]
    edited = {**record, decode_batches.VOTES_FIELD: [*junk, *record[decode_batches.VOTES_FIELD]]}
    assert decode_batches.stored_votes(edited) == record[decode_batches.VOTES_FIELD]


def test_votes_cast_under_another_spec_are_kept_but_not_counted() -> None:
    """The record's key does not follow max_num_seqs or the speculative tokens: a vote cast under a
    larger ceiling counts only its sizes within this spec's, one under another 1 + k not at all."""
    wide = SpecLimits(query_len=1, max_num_seqs=256)
    before = decode_batches.fold(None, RECORD, [("a", KEY, section(500, {20: 1.0, 200: 1.0}))], wide)
    assert before is not None
    record = decode_batches.fold(before, RECORD, [("b", KEY, section(500, {30: 1.0}))], LIMITS)
    assert record is not None and record["decode_batches"]["weights"] == {"20": 0.25, "30": 0.5}
    speculative = SpecLimits(query_len=2, max_num_seqs=64)
    other = decode_batches.fold(record, RECORD, [], speculative)
    assert other is not None and "decode_batches" not in other and len(other[decode_batches.VOTES_FIELD]) == 2


def test_the_record_stays_well_below_its_size_limit() -> None:
    limits = SpecLimits(query_len=4, max_num_seqs=1024)
    heavy = {size: float(size) for size in range(4, 4097, 1)}
    pods = [(f"pod-{n}", KEY, section(10**6, heavy, query_len=4)) for n in range(decode_batches.MAX_VOTES)]
    record = decode_batches.fold(None, RECORD, pods, limits)
    assert record is not None
    assert len(record[decode_batches.VOTES_FIELD]) == decode_batches.MAX_VOTES
    assert all(len(v["weights"]) == decode_batches.VOTE_SIZES for v in record[decode_batches.VOTES_FIELD])
    assert len(json.dumps(record)) < calibration.MAX_RECORD_BYTES / 2


def test_status_graph_says_where_the_sizes_come_from() -> None:
    plan = {
        "capture_sizes": [20, 23, 64],
        "capture_sizes_from": {
            "source": "traffic",
            "reason": "...",
            "steps": 4000,
            "expected_padding": {"grid": 4.12345, "chosen": 0.31},
        },
    }
    report = parse_report({"state": "ready", "plan": plan})
    graph = graph_status("FULL_DECODE_ONLY", [PodReport("a", report)], {}, now=NOW, same_generation=True)
    assert graph["captureSizesFrom"] == "traffic"
    assert graph["expectedPadding"] == {"grid": 4.12, "chosen": 0.31}
    assert graph["decodeStepsBehind"] == 4000
    junk = parse_report({"state": "ready", "plan": {"capture_sizes_from": {"source": "random"}}})
    assert "captureSizesFrom" not in graph_status(
        "FULL_DECODE_ONLY", [PodReport("a", junk)], {}, now=NOW, same_generation=True
    )


def test_from_a_runtimes_status_to_the_next_pods_plan(tmp_path: Path) -> None:
    """The runtime's /status (observer reports of real Recorder objects) -> the operator's parse
    and fold -> the record in its ConfigMap -> the next pod's plan, which chooses from it."""
    model = str(FIXTURES / "qwen2.5-7b")
    options: dict[str, Any] = {
        "device_kind": "npu",
        "device_name": "Ascend910B3",
        "device_count": 1,
        "max_num_seqs": 64,
        "max_model_len": 4096,
    }
    first = plan_for(PlanOptions(**options), model, environ={})
    observer_dir = tmp_path / "observer"
    observer_dir.mkdir()
    recorder = Recorder(str(observer_dir))
    recorder.record_memory("npu:0", weights=15 << 30)
    for batch in [18] * 300 + [22] * 500 + [23] * 200 + [60] * 10:
        recorder.record_decode_step(None, batch)
    recorder.flush()
    status = RuntimeStatus(str(observer_dir), "FULL_DECODE_ONLY")
    status.set_plan(PlanView("FULL_DECODE_ONLY", first.effective_mode, first.to_dict()))
    document = json.loads(json.dumps(status.document()))
    assert document["calibration"]["decode_batches"]["steps"] == 1010

    report = parse_report(document)
    assert report.calibration is not None and report.calibration.decode_batches is not None
    sections = [report.calibration]
    who = calibration.Reporter("pod-0", "uid-0")
    layouts = calibration.expected_layouts(1, 1, 1, 1, expert=False)
    record = calibration.fold_record(None, [(who, s) for s in sections], layouts)
    # Two replicas that ran the same traffic (a distribution needs QUORUM pods' votes).
    votes = [(uid, s.key, s.decode_batches) for uid in ("uid-0", "uid-1") for s in sections if s.decode_batches]
    record = decode_batches.fold(None, record, votes, LIMITS)
    configmap = calibration.configmap("demo", "default", {}, record or {})
    path = tmp_path / "record.json"
    path.write_text(configmap["data"][calibration.RECORD_FILE])

    second = plan_for(PlanOptions(**options, calibration=str(path)), model, environ={})
    assert second.calibration["record"] == "applied"
    assert {18, 22, 23} <= set(second.capture_sizes) and second.capture_sizes[-1] == 64
    assert len(second.capture_sizes) <= len(first.capture_sizes)
    chosen = second.to_dict()["capture_sizes_from"]
    assert chosen["source"] == "traffic" and chosen["steps"] == 2 * 1010
    assert chosen["expected_padding"]["chosen"] < chosen["expected_padding"]["grid"]

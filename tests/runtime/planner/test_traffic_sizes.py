"""Capture sizes from traffic (issue 37): the exact choice against brute force and hand-checked
cases, the ceiling kept, the release's rules, stability under noise, the grid without traffic,
the record's section, and the record -> plan path."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import sizes
from npu_runtime.planner.plan import plan_for
from npu_runtime.planner.traffic_sizes import (
    DecodeBatches,
    SizeRules,
    TrafficBudget,
    candidate_sizes,
    choose_sizes,
    expected_padding,
    optimal_sizes,
    padded_share,
    parse_decode_batches,
    size_rules,
    tokens_for,
)

from tests.runtime.conftest import FIXTURES

QWEN7B = FIXTURES / "qwen2.5-7b"
NPU_OPTIONS: dict[str, Any] = {
    "device_kind": "npu",
    "device_name": "Ascend910B3",
    "device_count": 1,
    "max_num_seqs": 64,
    "max_model_len": 4096,
}


def brute_force(
    weights: dict[int, float], candidates: tuple[int, ...], max_sizes: int, cost: float
) -> tuple[float, tuple[int, ...]]:
    """Every subset holding the ceiling: the smallest objective (the reference for the DP)."""
    *below, ceiling = sorted(candidates)
    best: tuple[float, tuple[int, ...]] | None = None
    for k in range(min(max_sizes, len(candidates))):
        for combo in itertools.combinations(below, k):
            chosen = (*combo, ceiling)
            value = expected_padding(chosen, weights) + cost * len(chosen)
            if best is None or value < best[0] - 1e-12:
                best = (value, chosen)
    assert best is not None
    return best


# -- the objective, by hand ------------------------------------------------------------------------


def test_expected_padding_by_hand() -> None:
    # Half the steps at 3 (padded to 4: 1 token), half at 5 (padded to 8: 3 tokens): 2 tokens per step.
    assert expected_padding([1, 2, 4, 8], {3: 1.0, 5: 1.0}) == pytest.approx(2.0)
    # 5 is padded by 3 > 25 % of 5; 3 by 1 > 25 % of 3 too; 4 not at all.
    assert padded_share([4, 8], {3: 1.0, 4: 2.0, 5: 1.0}) == pytest.approx(0.5)


def test_the_optimum_of_a_hand_checked_distribution() -> None:
    # Batches sit between 17 and 23, ceiling 32: with two sizes, 23 and 32 pad nothing below 23.
    weights = {17: 1.0, 19: 2.0, 21: 3.0, 23: 4.0}
    assert optimal_sizes(weights, candidate_sizes(32, SizeRules()), 2) == (23, 32)
    # Three sizes: 19 and 23 (padding (17->19) 2 x 0.1 + (21->23) 2 x 0.3 = 0.8) beats every other pair.
    chosen = optimal_sizes(weights, candidate_sizes(32, SizeRules()), 3)
    assert chosen == (19, 23, 32)
    assert expected_padding(chosen, weights) == pytest.approx(0.8)
    # The grid's 24 pads every one of those steps: (7 x 1 + 5 x 2 + 3 x 3 + 1 x 4) / 10 = 3 tokens.
    assert expected_padding(sizes.covering_sizes(32, 1, 32), weights) == pytest.approx(3.0)


def test_the_dp_equals_brute_force_on_small_distributions() -> None:
    rng = random.Random(37)
    for _ in range(300):
        ceiling = rng.randint(1, 13)
        support = rng.sample(range(1, ceiling + 1), rng.randint(1, ceiling))
        weights = {batch: rng.choice([0.01, 0.5, 1.0, 7.0]) * rng.random() + 1e-3 for batch in support}
        rules = SizeRules(query_len=rng.choice([1, 1, 2]), multiple_of=rng.choice([1, 1, 2, 3]))
        candidates = candidate_sizes(ceiling, rules)
        max_sizes = rng.randint(1, 6)
        cost = rng.choice([0.0, 0.0, 0.05, 0.5])
        chosen = optimal_sizes(weights, candidates, max_sizes, cost)
        value, _ = brute_force(weights, candidates, max_sizes, cost)
        assert expected_padding(chosen, weights) + cost * len(chosen) == pytest.approx(value, abs=1e-9)
        assert chosen[-1] == ceiling and len(chosen) <= max(max_sizes, 1)
        assert set(chosen) <= set(candidates)


def test_a_per_size_cost_drops_sizes_that_save_too_little() -> None:
    weights = {8: 100.0, 12: 1.0}  # 12 is rare: padding it to 16 costs 4 x 1/101 tokens per step
    candidates = candidate_sizes(16, SizeRules())
    assert optimal_sizes(weights, candidates, 3, per_size_cost=0.0) == (8, 12, 16)
    assert optimal_sizes(weights, candidates, 3, per_size_cost=0.1) == (8, 16)


# -- the ceiling and the release's rules -------------------------------------------------------------


def test_the_ceiling_is_always_kept() -> None:
    # Every batch is tiny: still the ceiling (no eager decode step), even with one size allowed.
    weights = {1: 10.0, 2: 5.0}
    assert optimal_sizes(weights, candidate_sizes(256, SizeRules()), 1) == (256,)
    assert optimal_sizes(weights, candidate_sizes(256, SizeRules()), 4)[-1] == 256
    assert optimal_sizes({}, candidate_sizes(256, SizeRules()), 4) == (256,)


def test_sizes_are_multiples_of_the_speculative_query_len_and_of_tp_under_flashcomm1() -> None:
    rules = size_rules(query_len=2, full_decode=True, tensor_parallel=4, flashcomm1=True)
    assert (rules.query_len, rules.multiple_of, rules.step) == (2, 4, 4)
    weights = {2 * n: 1.0 for n in (3, 5, 9, 11)}  # 6, 10, 18, 22 tokens
    chosen = optimal_sizes(weights, candidate_sizes(64, rules), 4)
    assert all(size % 4 == 0 for size in chosen) and chosen[-1] == 64
    value, _ = brute_force(weights, candidate_sizes(64, rules), 4, 0.0)
    assert expected_padding(chosen, weights) == pytest.approx(value)
    # Without flashcomm1 the TP rule does not apply; without FULL decode nor does 1 + k.
    assert size_rules(query_len=2, full_decode=True, tensor_parallel=4, flashcomm1=False).step == 2
    assert size_rules(query_len=2, full_decode=False, tensor_parallel=1, flashcomm1=False).step == 1


def test_a_distribution_recorded_with_another_speculative_setting_is_converted_through_requests() -> None:
    batches = DecodeBatches(query_len=2, weights={4: 1.0, 6: 1.0, 400: 1.0}, steps=1000)
    # 2 and 3 requests -> 6 and 9 tokens at 1 + 2; 200 requests is above the ceiling 96: dropped.
    assert tokens_for(batches, 3, 96) == {6: 1.0, 9: 1.0}


# -- the choice: grid, traffic, hysteresis ----------------------------------------------------------


GRID = tuple(sizes.covering_sizes(64, 1, 64))  # 1, 2, 4, 8, 16, ..., 64: 11 sizes


def test_without_a_distribution_or_with_too_few_steps_the_grid_stays() -> None:
    budget = TrafficBudget(len(GRID))
    assert choose_sizes(None, grid=GRID, rules=SizeRules(), budget=budget).sizes == GRID
    few = DecodeBatches(1, {20: 5.0}, steps=12)
    choice = choose_sizes(few, grid=GRID, rules=SizeRules(), budget=budget)
    assert (choice.sizes, choice.source) == (GRID, "grid")
    assert "12 decode steps" in choice.reason


def test_traffic_sizes_pad_less_than_the_grid_with_no_more_graphs() -> None:
    weights = dict.fromkeys(range(17, 24), 1.0) | dict.fromkeys(range(30, 41), 0.2)
    batches = DecodeBatches(1, weights, steps=5000)
    choice = choose_sizes(batches, grid=GRID, rules=SizeRules(), budget=TrafficBudget(len(GRID), 0.0))
    assert choice.source == "traffic"
    assert len(choice.sizes) <= len(GRID) and choice.sizes[-1] == 64
    assert choice.padding_grid is not None and choice.padding_chosen is not None
    assert choice.padding_chosen < choice.padding_grid / 4
    assert choice.to_dict()["expected_padding"] == {
        "grid": round(choice.padding_grid, 4),
        "chosen": round(choice.padding_chosen, 4),
    }


def test_stable_under_noise_the_previous_sizes_are_kept() -> None:
    rng = random.Random(5)
    base = {b: 1.0 + (b % 5) for b in range(9, 49)}
    first = choose_sizes(
        DecodeBatches(1, base, steps=10_000), grid=GRID, rules=SizeRules(), budget=TrafficBudget(6, 0.0)
    )
    assert first.source == "traffic"
    reshuffled = 0
    for _ in range(20):
        noisy = {b: w * rng.uniform(0.9, 1.1) for b, w in base.items()}
        # Without the previous sizes the optimum may move with the noise...
        fresh = choose_sizes(
            DecodeBatches(1, noisy, steps=10_000), grid=GRID, rules=SizeRules(), budget=TrafficBudget(6, 0.0)
        )
        reshuffled += fresh.sizes != first.sizes
        # ... with them (what the engine ran with, in the record), the sizes stay.
        kept = choose_sizes(
            DecodeBatches(1, noisy, steps=10_000, sizes=first.sizes),
            grid=GRID,
            rules=SizeRules(),
            budget=TrafficBudget(6, 0.0),
        )
        assert kept.sizes == first.sizes
        assert kept.source in ("previous", "traffic")
    assert reshuffled > 0, "the noise never moved the optimum: the test shows nothing"


def test_a_real_shift_in_traffic_replaces_the_previous_sizes() -> None:
    before = choose_sizes(
        DecodeBatches(1, dict.fromkeys(range(5, 12), 1.0), steps=5000),
        grid=GRID,
        rules=SizeRules(),
        budget=TrafficBudget(4, 0.0),
    )
    after = choose_sizes(
        DecodeBatches(1, dict.fromkeys(range(40, 50), 1.0), steps=5000, sizes=before.sizes),
        grid=GRID,
        rules=SizeRules(),
        budget=TrafficBudget(4, 0.0),
    )
    assert after.source == "traffic" and after.sizes != before.sizes


def test_previous_sizes_that_break_the_budget_or_the_rules_are_not_kept() -> None:
    weights = dict.fromkeys(range(20, 30), 1.0)
    # The previous list has 5 sizes but the budget now allows 3; and one not a multiple of 2.
    for previous, rules in (((22, 24, 26, 28, 64), SizeRules()), ((21, 64), SizeRules(query_len=2))):
        choice = choose_sizes(
            DecodeBatches(1, weights, steps=5000, sizes=previous), grid=GRID, rules=rules, budget=TrafficBudget(3)
        )
        assert choice.sizes != previous and len(choice.sizes) <= 3


# -- the record's section --------------------------------------------------------------------------


def test_the_record_section_is_validated() -> None:
    good = {"query_len": 1, "steps": 10, "weights": {"3": 1.5}, "sizes": [4, 64], "capture_seconds_per_size": 0.8}
    parsed = parse_decode_batches(good)
    assert parsed == DecodeBatches(1, {3: 1.5}, 10, (4, 64), 0.8)
    assert parse_decode_batches(None) is None
    bad: Any
    for bad in (
        [],
        {**good, "query_len": 0},
        {**good, "steps": -1},
        {**good, "weights": {"x": 1}},
        {**good, "weights": {"3": float("nan")}},
        {**good, "weights": {"3": -1}},
        {**good, "sizes": [0]},
        {**good, "capture_seconds_per_size": 1e9},
    ):
        with pytest.raises(PlanError, match=r"decode_batches"):
            parse_decode_batches(bad)


# -- the record -> plan path -----------------------------------------------------------------------


def test_the_next_plan_chooses_its_sizes_from_the_record(tmp_path: Path) -> None:
    first = plan_for(PlanOptions(**NPU_OPTIONS), str(QWEN7B), environ={})
    assert first.capture_sizes == GRID and "capture_sizes_from" not in first.to_dict()
    weights = {str(b): 10.0 for b in range(17, 24)} | {"40": 1.0}
    record = {
        "schema": 1,
        "key": first.calibration["key"],
        "measured": {},
        "capture_failure": None,
        "decode_batches": {"query_len": 1, "steps": 4000, "weights": weights, "sizes": list(GRID)},
    }
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    second = plan_for(PlanOptions(**NPU_OPTIONS, calibration=str(path)), str(QWEN7B), environ={})
    assert second.capture_sizes != first.capture_sizes
    assert second.capture_sizes[-1] == 64 and len(second.capture_sizes) <= len(first.capture_sizes)
    assert {17, 18, 19, 20, 21, 22, 23} & set(second.capture_sizes)
    shown = second.to_dict()["capture_sizes_from"]
    assert shown["source"] == "traffic" and shown["steps"] == 4000
    assert shown["expected_padding"]["chosen"] < shown["expected_padding"]["grid"]
    # Fewer graphs, less graph memory: the budget is the grid's, never more.
    assert second.memory.graph_bytes <= first.memory.graph_bytes
    # A compilation config with exactly those sizes goes to vLLM.
    config = json.loads(second.vllm_args[second.vllm_args.index("--compilation-config") + 1])
    assert config["cudagraph_capture_sizes"] == list(second.capture_sizes)


def test_an_explicit_capture_list_is_never_replaced(tmp_path: Path) -> None:
    first = plan_for(PlanOptions(**NPU_OPTIONS), str(QWEN7B), environ={})
    record = {
        "schema": 1,
        "key": first.calibration["key"],
        "measured": {},
        "capture_failure": None,
        "decode_batches": {"query_len": 1, "steps": 4000, "weights": {"20": 1.0}},
    }
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    options = PlanOptions(**NPU_OPTIONS, calibration=str(path), capture_sizes=(8, 64))
    assert plan_for(options, str(QWEN7B), environ={}).capture_sizes == (8, 64)

#!/usr/bin/env python3
"""Padding with vLLM's grid against capture sizes chosen from traffic (docs/planner.md, "Sizes from traffic").

    python scripts/bench_capture_sizes.py [--seconds 600] [--seed 37]

A continuous-batching replica is simulated at several request rates and max_num_seqs settings:
Poisson arrivals, ShareGPT-like prompt and output lengths (lognormal, medians 220 and 180 tokens,
clipped to 1..4096), a step admits waiting requests while fewer than max_num_seqs run (that step
has a prefill: a mixed batch, run eagerly, not a decode step), otherwise it is a uniform decode
step of every running request. Step time: 15 ms + 0.12 ms per decoded token + 0.06 ms per
prefilled token (a mid-size model on one device; only the shape of the batch sequence matters).

The first half of the simulated time is the recorded distribution (what the observer counts and
the calibration record carries); the sizes are chosen from it by the planner's own code
(npu_runtime.planner.traffic_sizes) and scored on the second half, which they have not seen.
For each scenario the table gives, per policy, the graphs captured, the padded tokens per decode
step, the share of decode steps padded by more than 25 %, the estimated capture seconds
(CAPTURE_SECONDS_ESTIMATE for an NPU, per size) and the graph memory the planner estimates for
Qwen2.5-7B on one 64 GiB 910B3 (first capture + per-size increment).

Policies: grid (the planner's covering list: vLLM's grid plus the ceiling), traffic (same count:
at most as many sizes as the grid), traffic (auto: the per-size capture-time term decides the
count), traffic (1/4: a quarter of the grid's count).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))

from npu_runtime.contract import PlanOptions  # noqa: E402
from npu_runtime.planner import sizes, traffic_sizes  # noqa: E402
from npu_runtime.planner.plan import plan_for  # noqa: E402
from npu_runtime.planner.traffic_sizes import DecodeBatches, SizeRules, TrafficBudget  # noqa: E402

MODEL = ROOT / "tests" / "runtime" / "fixtures" / "models" / "qwen2.5-7b"
PROMPT_MEDIAN, OUTPUT_MEDIAN, SIGMA = 220, 180, 1.0
STEP_BASE, PER_DECODE_TOKEN, PER_PREFILL_TOKEN = 0.015, 0.00012, 0.00006
MAX_BATCHED_TOKENS = 4096
SECONDS_PER_SIZE = traffic_sizes.CAPTURE_SECONDS_ESTIMATE["npu"]


def lognormal(rng: random.Random, median: float) -> int:
    return max(1, min(4096, int(rng.lognormvariate(math.log(median), SIGMA))))


def simulate(rate: float, max_num_seqs: int, seconds: float, seed: int) -> list[tuple[float, int]]:
    """(time, batch) of every uniform decode step of a replica under Poisson arrivals at `rate`."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, int]] = []
    t = 0.0
    while t < seconds:
        t += rng.expovariate(rate)
        arrivals.append((t, len(arrivals)))
    prompts = [lognormal(rng, PROMPT_MEDIAN) for _ in arrivals]
    outputs = [lognormal(rng, OUTPUT_MEDIAN) for _ in arrivals]
    waiting: list[int] = []
    running: list[tuple[int, int]] = []  # (tokens left, request)
    now, next_arrival, steps = 0.0, 0, []
    while now < seconds:
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= now:
            waiting.append(next_arrival)
            next_arrival += 1
        if not waiting and not running:
            now = arrivals[next_arrival][0] if next_arrival < len(arrivals) else seconds
            continue
        prefill = 0
        while waiting and len(running) < max_num_seqs and prefill + prompts[waiting[0]] <= MAX_BATCHED_TOKENS:
            request = waiting.pop(0)
            prefill += prompts[request]
            running.append((outputs[request], request))
        if prefill == 0 and waiting and len(running) < max_num_seqs:  # a prompt above the budget: alone
            request = waiting.pop(0)
            prefill = prompts[request]
            running.append((outputs[request], request))
        decoded = len(running)
        if prefill == 0:
            steps.append((now, decoded))
        running = [(left - 1, request) for left, request in running if left > 1]
        now += STEP_BASE + PER_DECODE_TOKEN * decoded + PER_PREFILL_TOKEN * prefill
    return steps


@dataclass(frozen=True)
class Row:
    policy: str
    sizes: tuple[int, ...]
    padding: float
    share: float


def graph_memory(max_num_seqs: int, count: int) -> float:
    """MiB of graph memory the planner estimates for `count` sizes (Qwen2.5-7B, 910B3)."""
    plan = plan_for(
        PlanOptions(
            device_kind="npu",
            device_name="Ascend910B3",
            device_count=1,
            max_num_seqs=max_num_seqs,
            max_model_len=4096,
            graph_mode="FULL_DECODE_ONLY",
        ),
        str(MODEL),
        environ={},
    )
    memory = plan.memory
    return (memory.graph_first_capture_bytes + (count - 1) * memory.graph_per_size_bytes) / (1 << 20)


def rows(recorded: Counter[int], held_out: Counter[int], max_num_seqs: int) -> list[Row]:
    grid = sizes.covering_sizes(max_num_seqs, 1, max_num_seqs)
    weights = {b: float(c) for b, c in held_out.items()}
    batches = DecodeBatches(1, {b: float(c) for b, c in recorded.items()}, sum(recorded.values()))
    rules = SizeRules()
    out = [Row("grid", grid, traffic_sizes.expected_padding(grid, weights), traffic_sizes.padded_share(grid, weights))]
    for name, budget in (
        ("traffic, same count", TrafficBudget(len(grid), 0.0)),
        ("traffic, auto", TrafficBudget(len(grid), SECONDS_PER_SIZE)),
        ("traffic, 1/4 count", TrafficBudget(max(2, len(grid) // 4), 0.0)),
    ):
        chosen = traffic_sizes.choose_sizes(batches, grid=grid, rules=rules, budget=budget).sizes
        out.append(
            Row(
                name,
                chosen,
                traffic_sizes.expected_padding(chosen, weights),
                traffic_sizes.padded_share(chosen, weights),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="simulated seconds per scenario")
    parser.add_argument("--seed", type=int, default=37)
    args = parser.parse_args()
    scenarios = [(64, 1.0), (64, 3.0), (64, 6.0), (256, 3.0), (256, 8.0), (256, 12.0)]
    print(
        "| max_num_seqs | rate req/s | decode steps | mean batch | policy | graphs | padded tok/step "
        "| steps padded >25% | capture s | graph MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for max_num_seqs, rate in scenarios:
        steps = simulate(rate, max_num_seqs, args.seconds, args.seed)
        half = args.seconds / 2
        recorded = Counter(b for t, b in steps if t < half)
        held_out = Counter(b for t, b in steps if t >= half)
        mean = sum(b * c for b, c in held_out.items()) / max(sum(held_out.values()), 1)
        memory = {count: graph_memory(max_num_seqs, count) for count in range(1, 80)}
        for row in rows(recorded, held_out, max_num_seqs):
            count = len(row.sizes)
            print(
                f"| {max_num_seqs} | {rate:g} | {sum(held_out.values())} | {mean:.1f} | {row.policy} | {count} "
                f"| {row.padding:.2f} | {row.share:.1%} | {count * SECONDS_PER_SIZE:.0f} | {memory[count]:.0f} |"
            )


if __name__ == "__main__":
    main()

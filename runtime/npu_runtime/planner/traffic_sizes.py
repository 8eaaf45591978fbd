"""Capture sizes chosen from the decode batches a replica really runs (docs/planner.md, "Sizes from traffic").

A decode step of b tokens replays the smallest captured size s >= b and pads it with s - b
tokens of wasted work. Given the recorded distribution p(b) (the observer counts every decode
step, `npu_runtime.observer.batches`; the calibration record carries it to the next plan), the
planner picks the sizes that minimise the expected padded tokens per decode step

    padding(S) = sum_b p(b) * (next_S(b) - b),      next_S(b) = min {s in S : s >= b}

plus a per-size term (each size costs capture seconds at startup, `TrafficBudget.per_size_cost`),
under the graph budget the fit allows (`max_sizes`: memory, streams, device caps; never more than
the grid would capture). The ceiling (the largest decode batch) is always captured, so no decode
step runs eagerly, and every size respects the engine release's rules (`SizeRules`: a multiple
of 1 + speculative tokens, and of TP where flashcomm1 needs it).

Exact: only the smallest allowed size at or above each recorded batch can be worth capturing (a
size between two such points can be lowered to the one below it without padding more), and the
cost of a segment (r_j, r_i] satisfies the quadrangle inequality, so the dynamic programme over k
breakpoints uses the monotone divide-and-conquer step: O(k m log m) for m candidate points.

Stable: the sizes the engine ran with when the distribution was recorded are kept unless the new
choice lowers the objective by more than HYSTERESIS_RELATIVE of it (and HYSTERESIS_TOKENS), so a
little noise in the traffic does not reshuffle the graphs at every rollout. With no distribution,
or one with fewer than MIN_DECODE_STEPS steps behind it, the grid stays (`source` "grid").

Pure: no I/O. The record's `decode_batches` section is validated here (`parse_decode_batches`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from npu_runtime.contract import PlanError

__all__ = [
    "HYSTERESIS_RELATIVE",
    "HYSTERESIS_TOKENS",
    "MAX_RECORD_SIZES",
    "MIN_DECODE_STEPS",
    "DecodeBatches",
    "SizeChoice",
    "SizeRules",
    "TrafficBudget",
    "candidate_sizes",
    "choose_sizes",
    "expected_padding",
    "optimal_sizes",
    "padded_share",
    "parse_decode_batches",
    "tokens_for",
]

MIN_DECODE_STEPS: Final = 200  # fewer steps recorded than this: the grid stays
HYSTERESIS_RELATIVE: Final = 0.10  # a new choice must lower the objective by more than 10 % ...
HYSTERESIS_TOKENS: Final = 0.05  # ... and by more than 0.05 padded tokens per step
# A size must save this many padded tokens per decode step per second it takes to capture: one
# NPU capture of about a second must save a quarter of a token per step to be worth its startup.
TOKENS_PER_CAPTURE_SECOND: Final = 0.25
# Capture time per size when nothing was measured: about a second on an NPU after the model load
# (vllm-ascend's ACL graph capture); the observer's npu_graph_capture_seconds replace it.
CAPTURE_SECONDS_ESTIMATE: Final = {"npu": 1.0, "cuda": 0.1, "cpu": 0.0}
MAX_RECORD_SIZES: Final = 4096  # distinct batch sizes a record may hold
MAX_BATCH_TOKENS: Final = 1 << 20


@dataclass(frozen=True)
class DecodeBatches:
    """A recorded decode-batch distribution: relative weight per batch size in tokens."""

    query_len: int
    """1 + speculative tokens when it was recorded: a batch of n requests is n x query_len tokens."""
    weights: Mapping[int, float]
    steps: int
    """Decode steps counted (before decay): how much evidence is behind the weights."""
    sizes: tuple[int, ...] = ()
    """The capture sizes the engine ran with while it was recorded (the hysteresis' reference)."""
    capture_seconds_per_size: float | None = None
    """The median capture time of one size, measured; None when not measured."""


@dataclass(frozen=True)
class SizeRules:
    """What the engine release requires of a capture-size list, passed in by the plan."""

    query_len: int = 1
    """FULL decode with speculative decoding: multiples of 1 + k
    (vLLM's CompilationConfig.adjust_cudagraph_sizes_for_spec_decode)."""
    multiple_of: int = 1
    """TP under vllm-ascend's flashcomm1 (sequence parallelism): sizes not a multiple of TP are
    dropped, as vLLM's VllmConfig.update_sizes_for_sequence_parallelism does for its own pass."""

    @property
    def step(self) -> int:
        return math.lcm(max(self.query_len, 1), max(self.multiple_of, 1))


@dataclass(frozen=True)
class TrafficBudget:
    """How many sizes the fit allows, and what one more size costs in padded tokens per step."""

    max_sizes: int
    capture_seconds_per_size: float = 0.0
    tokens_per_capture_second: float = TOKENS_PER_CAPTURE_SECOND

    @property
    def per_size_cost(self) -> float:
        return max(self.capture_seconds_per_size, 0.0) * max(self.tokens_per_capture_second, 0.0)


@dataclass(frozen=True)
class SizeChoice:
    """The sizes, where they come from, and the expected padding before (grid) and after."""

    sizes: tuple[int, ...]
    source: str
    """"grid" (no usable distribution), "traffic" (the optimum), "previous" (kept: not enough better)."""
    reason: str
    padding_grid: float | None = None
    padding_chosen: float | None = None
    steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "reason": self.reason,
            "steps": self.steps,
            "expected_padding": None
            if self.padding_chosen is None
            else {"grid": _round(self.padding_grid), "chosen": _round(self.padding_chosen)},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# -- the objective --------------------------------------------------------------------------------


def expected_padding(sizes: Sequence[int], weights: Mapping[int, float]) -> float:
    """Padded tokens per decode step, sum p(b) (next(b) - b); batches above the largest size are
    eager (no padding) and count in the total weight only."""
    ordered = sorted(sizes)
    total = sum(weights.values())
    if not ordered or total <= 0:
        return 0.0
    padded = 0.0
    for batch, weight in weights.items():
        index = bisect.bisect_left(ordered, batch)
        if index < len(ordered):
            padded += weight * (ordered[index] - batch)
    return padded / total


def padded_share(sizes: Sequence[int], weights: Mapping[int, float], above: float = 0.25) -> float:
    """The share of decode steps padded by more than `above` of their own size."""
    ordered = sorted(sizes)
    total = sum(weights.values())
    if not ordered or total <= 0:
        return 0.0
    share = 0.0
    for batch, weight in weights.items():
        index = bisect.bisect_left(ordered, batch)
        if index < len(ordered) and ordered[index] - batch > above * batch:
            share += weight
    return share / total


def candidate_sizes(ceiling: int, rules: SizeRules) -> tuple[int, ...]:
    """Every size the release allows up to `ceiling`: multiples of `rules.step`, and the ceiling."""
    step = rules.step
    return tuple(sorted({*range(step, ceiling + 1, step), ceiling})) if ceiling >= 1 else ()


def tokens_for(batches: DecodeBatches, query_len: int, ceiling: int) -> dict[int, float]:
    """The distribution in this plan's tokens: batches recorded with another 1 + k are converted
    through their request count; batches above `ceiling` are dropped (they run eagerly whatever
    the sizes, so the choice cannot change their cost)."""
    out: dict[int, float] = {}
    for batch, weight in batches.weights.items():
        tokens = batch if batches.query_len == query_len else -(-batch // batches.query_len) * query_len
        if 1 <= tokens <= ceiling and weight > 0:
            out[tokens] = out.get(tokens, 0.0) + weight
    return out


# -- the exact choice -----------------------------------------------------------------------------


def optimal_sizes(
    weights: Mapping[int, float], candidates: Sequence[int], max_sizes: int, per_size_cost: float = 0.0
) -> tuple[int, ...]:
    """The subset of `candidates` (which must hold their largest, the ceiling, kept always) of at
    most `max_sizes` sizes that minimises expected_padding + per_size_cost x sizes. Exact."""
    allowed = sorted(set(candidates))
    if not allowed:
        return ()
    ceiling = allowed[-1]
    total = sum(w for b, w in weights.items() if b <= ceiling and w > 0)
    if total <= 0 or max_sizes <= 1:
        return (ceiling,)
    # Only the smallest allowed size at or above each recorded batch can be a breakpoint.
    support = sorted(b for b, w in weights.items() if b <= ceiling and w > 0)
    points = sorted({allowed[bisect.bisect_left(allowed, b)] for b in support} | {ceiling})
    # Prefix sums over the points: mass and mass x batch of the batches at or below each point.
    mass = [0.0] * (len(points) + 1)
    moment = [0.0] * (len(points) + 1)
    position = 0
    for index, point in enumerate(points):
        m = mass[index]
        t = moment[index]
        while position < len(support) and support[position] <= point:
            p = weights[support[position]] / total
            m += p
            t += p * support[position]
            position += 1
        mass[index + 1], moment[index + 1] = m, t

    def segment(j: int, i: int) -> float:
        """Padding of the batches in (points[j], points[i]] (j = -1: from 0), all padded to points[i]."""
        return points[i] * (mass[i + 1] - mass[j + 1]) - (moment[i + 1] - moment[j + 1])

    count = len(points)
    layers = min(max_sizes, count)
    best = [segment(-1, i) for i in range(count)]  # exactly one size, ending at point i
    choices: list[list[int]] = [[-1] * count]
    results = [best[-1]]
    for _ in range(1, layers):
        best, argmin = _next_layer(best, segment, count)
        choices.append(argmin)
        results.append(best[-1])
    objective = [value + per_size_cost * (k + 1) for k, value in enumerate(results)]
    # The fewest sizes among equal objectives (to 12 digits, so float noise does not add a size).
    k = min(range(len(objective)), key=lambda index: (round(objective[index], 12), index))
    chosen = [count - 1]
    for layer in range(k, 0, -1):
        chosen.append(choices[layer][chosen[-1]])
    return tuple(sorted(points[i] for i in chosen))


def _next_layer(best: list[float], segment: Callable[[int, int], float], count: int) -> tuple[list[float], list[int]]:
    """One more size: next[i] = min over j < i of best[j] + segment(j, i), with its argmin.

    The segment cost satisfies the quadrangle inequality (a later end pads every batch of a
    segment more), so the best j is monotone in i: divide and conquer, O(count log count).
    """
    current = [math.inf] * count
    argmin = [-1] * count
    stack = [(1, count - 1, 0, count - 2)]
    while stack:
        low, high, opt_low, opt_high = stack.pop()
        if low > high:
            continue
        middle = (low + high) // 2
        value, where = math.inf, opt_low
        for j in range(opt_low, min(middle - 1, opt_high) + 1):
            candidate = best[j] + segment(j, middle)
            if candidate < value:
                value, where = candidate, j
        current[middle], argmin[middle] = value, where
        stack.append((low, middle - 1, opt_low, where))
        stack.append((middle + 1, high, where, opt_high))
    return current, argmin


def choose_sizes(
    batches: DecodeBatches | None,
    *,
    grid: Sequence[int],
    rules: SizeRules,
    budget: TrafficBudget,
    min_steps: int = MIN_DECODE_STEPS,
) -> SizeChoice:
    """The capture sizes for this plan: `grid` (the sizes the fit would keep without traffic, the
    ceiling last) unless a distribution with enough steps says better; see the module."""
    grid = tuple(sorted(grid))
    if not grid:
        return SizeChoice((), "grid", "no graphs")
    if batches is None:
        return SizeChoice(grid, "grid", "no decode batches recorded yet")
    if batches.steps < min_steps:
        return SizeChoice(
            grid, "grid", f"{batches.steps} decode steps recorded, fewer than {min_steps}", steps=batches.steps
        )
    ceiling = grid[-1]
    weights = tokens_for(batches, rules.query_len, ceiling)
    if not weights:
        return SizeChoice(grid, "grid", "no recorded decode batch at or below the ceiling", steps=batches.steps)
    cost = budget.per_size_cost
    allowed = candidate_sizes(ceiling, rules)
    new = optimal_sizes(weights, allowed, budget.max_sizes, cost)
    grid_padding = expected_padding(grid, weights)

    def objective(sizes: Sequence[int]) -> float:
        return expected_padding(sizes, weights) + cost * len(sizes)

    previous = tuple(sorted(batches.sizes))
    allowed_set = set(allowed)
    usable = (
        bool(previous)
        and previous[-1] == ceiling
        and len(previous) <= budget.max_sizes
        and all(size in allowed_set for size in previous)
    )
    if usable and previous != new:
        before, after = objective(previous), objective(new)
        if before - after <= max(HYSTERESIS_RELATIVE * before, HYSTERESIS_TOKENS):
            return SizeChoice(
                previous,
                "previous",
                f"the sizes the engine ran with are kept: the optimum lowers the objective only from "
                f"{before:.3f} to {after:.3f} padded tokens per step (hysteresis {HYSTERESIS_RELATIVE:.0%})",
                grid_padding,
                expected_padding(previous, weights),
                batches.steps,
            )
    chosen_padding = expected_padding(new, weights)
    return SizeChoice(
        new,
        "traffic",
        f"{len(new)} sizes minimise the expected padding over {batches.steps} recorded decode steps "
        f"({grid_padding:.3f} -> {chosen_padding:.3f} padded tokens per step; grid {len(grid)} sizes)",
        grid_padding,
        chosen_padding,
        batches.steps,
    )


# -- what the plan passes in ----------------------------------------------------------------------


def size_rules(*, query_len: int, full_decode: bool, tensor_parallel: int, flashcomm1: bool) -> SizeRules:
    """The engine release's rules for this plan's sizes: multiples of 1 + k for FULL decode graphs,
    and of TP when vllm-ascend's flashcomm1 splits each batch over TP (the plan's own flashcomm1
    decision, `resolve.resolve_flashcomm1`)."""
    return SizeRules(
        query_len=query_len if full_decode else 1,
        multiple_of=tensor_parallel if flashcomm1 and tensor_parallel > 1 else 1,
    )


def capture_seconds(batches: DecodeBatches | None, device_kind: str) -> float:
    """Seconds one more size takes to capture: measured by the record, else the device's estimate."""
    if batches is not None and batches.capture_seconds_per_size is not None:
        return batches.capture_seconds_per_size
    return CAPTURE_SECONDS_ESTIMATE.get(device_kind, 1.0)


# -- the record's section -------------------------------------------------------------------------


def parse_decode_batches(value: Any, *, where: str = "the record") -> DecodeBatches | None:
    """The record's `decode_batches` section (None when absent); PlanError("calibration") names
    what is wrong:

        {"query_len": int, "steps": int, "weights": {"<tokens>": number >= 0},
         "sizes": [int], "capture_seconds_per_size": number|null}
    """
    if value is None:
        return None

    def bad(what: str) -> PlanError:
        return PlanError("calibration", f"{where}: decode_batches.{what}")

    if not isinstance(value, Mapping):
        raise bad("must be an object")
    query_len: Any = value.get("query_len")
    steps: Any = value.get("steps")
    if not _whole(query_len, 1, 64):
        raise bad("query_len must be a whole number from 1 to 64")
    if not _whole(steps, 0, 1 << 62):
        raise bad("steps must be a whole number")
    raw = value.get("weights")
    if not isinstance(raw, Mapping) or len(raw) > MAX_RECORD_SIZES:
        raise bad(f"weights must be an object of at most {MAX_RECORD_SIZES} sizes")
    weights: dict[int, float] = {}
    for key, weight in raw.items():
        if not (isinstance(key, str) and key.isdigit() and 1 <= int(key) <= MAX_BATCH_TOKENS):
            raise bad(f"weights: {str(key)[:20]!r} is not a batch size in tokens")
        if not (
            isinstance(weight, int | float) and not isinstance(weight, bool) and math.isfinite(weight) and weight >= 0
        ):
            raise bad(f"weights.{key} must be a finite number >= 0")
        weights[int(key)] = float(weight)
    sizes = value.get("sizes") or []
    if (
        not isinstance(sizes, list)
        or len(sizes) > MAX_RECORD_SIZES
        or not all(_whole(s, 1, MAX_BATCH_TOKENS) for s in sizes)
    ):
        raise bad("sizes must be a list of batch sizes in tokens")
    seconds = value.get("capture_seconds_per_size")
    if seconds is not None and not (
        isinstance(seconds, int | float)
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and 0 <= seconds < 3600
    ):
        raise bad("capture_seconds_per_size must be a number of seconds below 3600")
    return DecodeBatches(
        int(query_len),
        weights,
        int(steps),
        tuple(sorted({int(s) for s in sizes})),
        None if seconds is None else float(seconds),
    )


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

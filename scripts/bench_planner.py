#!/usr/bin/env python3
"""Time the planner on every fixture model and count the decode batches each capture list misses.

    python scripts/bench_planner.py [--runs 50] [--max-num-seqs-limit 1024]

For each fixture (tests/runtime/fixtures/models), on a 64 GiB Ascend 910B3 with the smallest
tensor-parallel size that fits:

- the planner's time: inspect_model + make_plan, in process (median of --runs), and one
  `npu-runtime plan --json` subprocess, interpreter start included;
- over max_num_seqs = 1..limit: how many values are off vLLM's grid (1, 2, 4, 8k, 256 + 16k), and
  for how many of them the default capture list leaves decode batches to run eagerly, for
  vllm-ascend's default (ceiling min(max_num_seqs, 512), #16049), upstream vLLM 0.31's default
  (ceiling min(2 x max_num_seqs, 512) plus max_num_seqs when it fits), and this planner.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))

from npu_runtime.contract import ASCEND_RECOMMENDED_ENV, PlanOptions  # noqa: E402
from npu_runtime.planner import sizes  # noqa: E402
from npu_runtime.planner.model import ModelInfo, inspect_model  # noqa: E402
from npu_runtime.planner.plan import DoesNotFitError, PlanError, make_plan  # noqa: E402
from npu_runtime.planner.probe import DeviceInfo  # noqa: E402

FIXTURES = ROOT / "tests" / "runtime" / "fixtures" / "models"
DEVICE = DeviceInfo("npu", "Ascend910B3", 8, 64 << 30, None, "override")
ENV = ASCEND_RECOMMENDED_ENV  # what serve plans with in a pod (HCCL_OP_EXPANSION_MODE=AIV)
MAX_MODEL_LEN = 4096


def smallest_tp(model: ModelInfo) -> int:
    for tp in (1, 2, 4, 8):
        if model.num_attention_heads % tp:
            continue
        try:
            make_plan(PlanOptions(tensor_parallel=tp, max_model_len=MAX_MODEL_LEN), DEVICE, model, environ=ENV)
        except (DoesNotFitError, PlanError):
            continue
        return tp
    raise SystemExit(f"{model.path}: does not fit a 910B3 at any TP size")


def time_plan(path: Path, tp: int, runs: int) -> float:
    """Median seconds of inspect_model + make_plan: the reading is part of what is timed."""
    options = PlanOptions(tensor_parallel=tp, max_model_len=MAX_MODEL_LEN)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        make_plan(options, DEVICE, inspect_model(path), environ=ENV)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def time_cli(path: Path, tp: int) -> float:
    argv = [sys.executable, "-m", "npu_runtime.cli", "plan", "--model", str(path), "--device-kind", "npu",
            "--device-name", DEVICE.name, "--device-memory", "64Gi", "--tensor-parallel", str(tp),
            "--max-model-len", str(MAX_MODEL_LEN), "--json"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env={"PYTHONPATH": str(ROOT / "runtime")})
    return time.perf_counter() - start


def planner_misses(model: ModelInfo, tp: int, limit: int, off_grid: set[int]) -> int:
    """Off-grid max_num_seqs values for which the plan leaves some decode batch eager (or cannot plan)."""
    misses = 0
    for n in sorted(off_grid):
        try:
            plan = make_plan(
                PlanOptions(max_num_seqs=n, tensor_parallel=tp, max_model_len=MAX_MODEL_LEN),
                DEVICE,
                model,
                environ=ENV,
            )
        except (DoesNotFitError, PlanError):
            misses += 1
            continue
        if plan.effective_mode == "NONE" or plan.eager_decode_batches is not None:
            misses += 1
    return misses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--max-num-seqs-limit", type=int, default=1024)
    args = parser.parse_args()
    limit = args.max_num_seqs_limit

    grid = set(sizes.grid(limit))
    off_grid = {n for n in range(1, limit + 1) if n not in grid}
    # max_num_seqs values whose default list leaves decode batches eager, each checked once.
    ascend_missed = {n for n in range(1, limit + 1) if sizes.uncovered(sizes.vllm_ascend_default_sizes(n), n)}
    vllm_missed = {n for n in range(1, limit + 1) if sizes.uncovered(sizes.vllm_default_sizes(n), n)}
    ascend_misses, all_ascend = len(ascend_missed & off_grid), len(ascend_missed)
    vllm_misses, all_vllm = len(vllm_missed & off_grid), len(vllm_missed)

    print(f"device: {DEVICE.name} {DEVICE.total_bytes >> 30} GiB, max_model_len {MAX_MODEL_LEN}, HCCL AIV")
    print(f"max_num_seqs 1..{limit}: {len(off_grid)} off vLLM's grid ({len(grid)} on it)")
    print("values for which the default capture list leaves decode batches eager:")
    print(f"  vllm-ascend default: {ascend_misses} off-grid ({all_ascend} of all {limit})")
    print(f"  vLLM 0.31 default:   {vllm_misses} off-grid ({all_vllm} of all {limit})")
    print()
    header = f"{'fixture':<22}{'tp':>3}{'plan ms':>9}{'cli ms':>8}{'planner misses':>16}"
    print(header)
    print("-" * len(header))
    for path in sorted(p for p in FIXTURES.iterdir() if (p / "config.json").is_file()):
        model = inspect_model(path)
        tp = smallest_tp(model)
        in_process = time_plan(path, tp, args.runs)
        whole = time_cli(path, tp)
        misses = planner_misses(model, tp, limit, off_grid)
        print(f"{path.name:<22}{tp:>3}{in_process * 1000:>9.2f}{whole * 1000:>8.0f}{misses:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

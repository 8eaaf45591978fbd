"""Plans for the deployments of issue 35's tests: capture sizes and KV tokens per device, term by term.

    python scripts/plan_deployments.py [--engine-release 0.25.1rc1]

For each deployment it prints the plan's capture sizes, what the engine release's algorithm keeps of
the plan's list and what it would capture by default (`planner/releases.py`), and the KV cache tokens
per device with the memory terms behind them. Run it with another checkout of `npu_runtime` on
PYTHONPATH to compare releases of the planner (options that checkout lacks are left out).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from npu_runtime.contract import GIB, PlanOptions
from npu_runtime.planner.model import inspect_model
from npu_runtime.planner.plan import make_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.runtime.planner import test_engine_capture_sizes as GOLDEN  # noqa: E402

FIXTURES = ROOT / "tests" / "runtime" / "fixtures" / "models"
AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}
# The deployments of the golden capture-size test (one table: what the test checks is what this prints).
DEPLOYMENTS = {name: case[:3] for name, case in GOLDEN.DEPLOYMENTS.items()}

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine-release", default=None)
    args = parser.parse_args()
    known = {f.name for f in dataclasses.fields(PlanOptions)}
    for name, (model_name, device, options) in DEPLOYMENTS.items():
        wanted = {**options, "engine_release": args.engine_release}
        dropped = sorted(k for k, v in wanted.items() if k not in known and v is not None)
        plan = make_plan(
            PlanOptions(**{k: v for k, v in wanted.items() if k in known}),
            device,
            inspect_model(str(FIXTURES / model_name)),
            environ=AIV,
        )
        m = plan.memory
        print(f"== {name}" + (f" (this planner lacks {', '.join(dropped)})" if dropped else ""))
        print(f"   mode {plan.effective_mode}, plan sizes {list(plan.capture_sizes)}")
        steps = getattr(plan, "capture_size_steps", ())
        if steps:
            print(f"   engine {plan.engine_release} on the plan's list: {list(steps[-1].sizes)}")
            print(f"   engine {plan.engine_release} default list:       {list(plan.engine_default_sizes)}")
        print(
            f"   KV tokens/device {m.kv_cache_tokens}  (kv {m.kv_cache_bytes / GIB:.2f} GiB = budget "
            f"{m.budget_bytes / GIB:.2f} - weights {m.weights_bytes / GIB:.2f} - activation "
            f"{m.activation_bytes / MIB:.0f} MiB - margin {m.margin_bytes / MIB:.0f} MiB - graphs "
            f"{m.graph_bytes / MIB:.0f} MiB)"
        )


if __name__ == "__main__":
    main()

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
from pathlib import Path
from typing import Any

from npu_runtime.contract import GIB, PlanOptions
from npu_runtime.planner.model import inspect_model
from npu_runtime.planner.plan import make_plan
from npu_runtime.planner.probe import DeviceInfo

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "runtime" / "fixtures" / "models"
A2 = DeviceInfo("npu", "Ascend910B3", 8, 64 * GIB, None, "override")
A3 = DeviceInfo("npu", "Ascend910_9392", 16, 64 * GIB, None, "override")
AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}

DEPLOYMENTS: dict[str, tuple[str, DeviceInfo, dict[str, Any]]] = {
    "qwen2.5-7b 1x910B3": ("qwen2.5-7b", A2, {"max_model_len": 32768}),
    "qwen3-32b 910B3 TP4": ("qwen3-32b", A2, {"tensor_parallel": 4, "max_num_seqs": 64}),
    "qwen3-32b 910B3 TP4 flashcomm1": ("qwen3-32b", A2, {"tensor_parallel": 4, "max_num_seqs": 64, "flashcomm1": True}),
    "qwen3-235b-a22b-w8a8 A3 TP4 DP4 EP16 fused-MC2 flashcomm1": (
        "qwen3-235b-a22b-w8a8",
        A3,
        {
            "tensor_parallel": 4,
            "data_parallel": 4,
            "enable_expert_parallel": True,
            "quantization": "ascend",
            "max_num_seqs": 64,
            "max_model_len": 32768,
            "max_num_batched_tokens": 8192,
            "flashcomm1": True,
            "fused_mc2": 1,
        },
    ),
    "deepseek-r1-w8a8 A3 TP4 DP4 EP16 MTP3": (
        "deepseek-r1-w8a8",
        A3,
        {
            "data_parallel": 4,
            "tensor_parallel": 4,
            "enable_expert_parallel": True,
            "quantization": "ascend",
            "speculative_method": "mtp",
            "speculative_tokens": 3,
            "max_num_seqs": 16,
            "max_model_len": 16384,
            "max_num_batched_tokens": 4096,
            "gpu_memory_utilization": 0.92,
        },
    ),
}

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

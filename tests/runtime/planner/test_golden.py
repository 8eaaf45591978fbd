"""Golden plans: every fixture model x the devices of issue 3 x tensor-parallel sizes, plus scenarios.

The expected plans live in golden/*.json. After a deliberate change, regenerate them with

    UPDATE_GOLDEN=1 pytest tests/runtime/planner/test_golden.py

and review the diff: it is the change's effect on every plan.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from npu_runtime.contract import PlanOptions
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.plan import DoesNotFitError, PlanError, make_plan
from npu_runtime.planner.probe import DeviceInfo

from tests.runtime.conftest import DEVICES, GIB, MODEL_NAMES, POD_ENV, R1_RECIPE, load_model

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TENSOR_PARALLEL = {
    "910B3-64GiB": (1, 2, 4, 8),
    "910B4-32GiB": (1, 2, 4, 8),
    "310P-44GiB": (1, 2, 4),
    "GPU-141GiB": (1, 2, 4, 8),
    "CPU-64GiB": (1,),
}
# An off-grid max_num_seqs (vLLM-Ascend's default list would stop at 96) and a context every fixture has.
BASE: dict[str, Any] = {"max_num_seqs": 100, "max_model_len": 4096}


def outcome(options: PlanOptions, device: DeviceInfo, model: ModelInfo, env: dict[str, str]) -> dict[str, Any]:
    try:
        return make_plan(options, device, model, environ=env).to_dict()
    except PlanError as exc:
        return {"error": {"exit": 2, "field": exc.field, "message": exc.message}}
    except DoesNotFitError as exc:
        return {"error": {"exit": 3, "message": str(exc)}}


def compare(name: str, actual: dict[str, Any]) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(actual, indent=1, sort_keys=True) + "\n"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} is missing: run UPDATE_GOLDEN=1 pytest {__file__}"
    expected = json.loads(path.read_text())
    for key in sorted(set(expected) | set(actual)):
        assert actual.get(key) == expected.get(key), f"{name}.json [{key}] changed (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_device_table(model_name: str) -> None:
    model = load_model(model_name)
    table = {
        f"{device_name}/tp{tp}": outcome(PlanOptions(tensor_parallel=tp, **BASE), DEVICES[device_name], model, POD_ENV)
        for device_name, tps in TENSOR_PARALLEL.items()
        for tp in tps
    }
    compare(model_name, table)


SCENARIOS: dict[str, tuple[str, str, dict[str, Any], dict[str, str]]] = {
    # name: (model, device, options, environment)
    "issue-16049-max-num-seqs-12": (
        "qwen3-30b-a3b",
        "910B3-64GiB",
        {"max_num_seqs": 12, "tensor_parallel": 4},
        POD_ENV,
    ),
    "mtp-speculative": (
        "deepseek-v2-lite",
        "910B3-64GiB",
        {"max_num_seqs": 48, "tensor_parallel": 2, "speculative_method": "mtp", "speculative_tokens": 2},
        POD_ENV,
    ),
    "piecewise-default-hccl": (
        "llama-3.1-70b",
        "910B3-64GiB",
        {"graph_mode": "PIECEWISE", "tensor_parallel": 8, "max_model_len": 8192},
        {},
    ),
    "full-and-piecewise-aiv": (
        "qwen2.5-72b-instruct",
        "910B3-64GiB",
        {"graph_mode": "FULL_AND_PIECEWISE", "tensor_parallel": 4},
        POD_ENV,
    ),
    "mla-full-on-gpu": ("deepseek-v2-lite", "GPU-141GiB", {"graph_mode": "FULL", "max_model_len": 32768}, {}),
    "shared-npu-stream-budget": (
        "qwen2.5-7b",
        "910B4-32GiB",
        {"graph_mode": "FULL_AND_PIECEWISE", "stream_budget": 200, "max_model_len": 8192},
        POD_ENV,
    ),
    "explicit-sizes-below-max-num-seqs": (
        "llama-3.1-8b",
        "910B4-32GiB",
        {"capture_sizes": (1, 2, 4, 8, 16, 32), "max_num_seqs": 64, "max_model_len": 8192},
        POD_ENV,
    ),
    "enforce-eager": ("qwen2.5-7b", "910B3-64GiB", {"enforce_eager": True}, POD_ENV),
    "cpu-engine-resolves": ("qwen2.5-7b", "CPU-64GiB", {"max_num_seqs": 12, "max_model_len": 4096}, {}),
}


def test_scenarios() -> None:
    results: dict[str, Any] = {}
    for name, (model_name, device_name, options, env) in SCENARIOS.items():
        model, device = load_model(model_name), DEVICES[device_name]
        if name == "cpu-engine-resolves":
            results[name] = make_plan(PlanOptions(**options), device, model, resolve_mode=False, environ=env).to_dict()
        else:
            results[name] = outcome(PlanOptions(**options), device, model, env)
    compare("scenarios", results)


A3_NODE = DeviceInfo("npu", "Ascend910_9392", 16, 64 * GIB, None, "override")  # Atlas 800 A3: 16 x 64 GiB
A2_NODE = DeviceInfo("npu", "Ascend910B3", 8, 64 * GIB, None, "override")  # Atlas 800 A2: 8 x 64 GiB
A2_32_NODE = DeviceInfo("npu", "Ascend910B4", 8, 32 * GIB, None, "override")
MOE_LAYOUTS: dict[str, tuple[str, DeviceInfo, dict[str, Any]]] = {
    "deepseek-r1-w8a8/a3-1node-dp4-tp4-ep-mtp3": ("deepseek-r1-w8a8", A3_NODE, R1_RECIPE),
    "deepseek-r1-w8a8/a2-2nodes-dp4-tp4-ep-mtp3": ("deepseek-r1-w8a8", A2_NODE, {**R1_RECIPE, "nodes": 2}),
    "deepseek-r1-w8a8/a2-1node-tp8-does-not-fit": ("deepseek-r1-w8a8", A2_NODE, {"tensor_parallel": 8}),
    "deepseek-r1-w8a8/a2-2nodes-dp3-uneven": (
        "deepseek-r1-w8a8",
        A2_NODE,
        {**R1_RECIPE, "nodes": 2, "data_parallel": 3},
    ),
    "deepseek-r1-bf16/a2-4nodes-dp8-tp4-ep": (
        "deepseek-r1-bf16",
        A2_NODE,
        {
            "nodes": 4,
            "data_parallel": 8,
            "tensor_parallel": 4,
            "enable_expert_parallel": True,
            "max_num_seqs": 32,
            "max_model_len": 16384,
            "speculative_method": "mtp",
            "speculative_tokens": 1,
        },
    ),
    "deepseek-r1-bf16/a3-1node-dp4-tp4-ep-does-not-fit": (
        "deepseek-r1-bf16",
        A3_NODE,
        R1_RECIPE | {"quantization": None},
    ),
    "deepseek-v3-fp8/a3-2nodes-dp8-tp4-ep": (
        "deepseek-v3",
        A3_NODE,
        {
            "nodes": 2,
            "data_parallel": 8,
            "tensor_parallel": 4,
            "enable_expert_parallel": True,
            "max_num_seqs": 32,
            "max_model_len": 32768,
        },
    ),
    "qwen3-235b-a22b/a3-1node-dp4-tp4-ep": (
        "qwen3-235b-a22b",
        A3_NODE,
        {
            "data_parallel": 4,
            "tensor_parallel": 4,
            "enable_expert_parallel": True,
            "max_num_seqs": 64,
            "max_model_len": 32768,
        },
    ),
    "qwen3-235b-a22b/a2-1node-tp8": ("qwen3-235b-a22b", A2_NODE, {"tensor_parallel": 8, "max_model_len": 32768}),
    "qwen3-235b-a22b/a2-32gib-1node-dp2-tp4-ep": (
        "qwen3-235b-a22b",
        A2_32_NODE,
        {"data_parallel": 2, "tensor_parallel": 4, "enable_expert_parallel": True, "max_model_len": 32768},
    ),
    "qwen3-30b-a3b/a2-32gib-dp2-tp2-ep": (
        "qwen3-30b-a3b",
        A2_32_NODE,
        {"data_parallel": 2, "tensor_parallel": 2, "enable_expert_parallel": True, "max_num_seqs": 100},
    ),
    "kimi-k2-instruct/a3-2nodes-dp8-tp4-ep": (
        "kimi-k2-instruct",
        A3_NODE,
        {
            "nodes": 2,
            "data_parallel": 8,
            "tensor_parallel": 4,
            "enable_expert_parallel": True,
            "max_num_seqs": 32,
            "max_model_len": 32768,
        },
    ),
}


def test_moe_layouts() -> None:
    results = {
        name: outcome(PlanOptions(**options), device, load_model(model_name), POD_ENV)
        for name, (model_name, device, options) in MOE_LAYOUTS.items()
    }
    compare("moe-layouts", results)
    # The tutorial's layouts plan in FULL_DECODE_ONLY on one A3 node and on two A2 nodes.
    for name in ("deepseek-r1-w8a8/a3-1node-dp4-tp4-ep-mtp3", "deepseek-r1-w8a8/a2-2nodes-dp4-tp4-ep-mtp3"):
        assert results[name]["effective_mode"] == "FULL_DECODE_ONLY", name
        assert all(size % 4 == 0 for size in results[name]["capture_sizes"]), name

"""Golden capture-size lists per engine release, derived by hand from the release's functions.

Each expected list below is worked out in its comment from the functions `releases.py` cites, read
at vllm-ascend v0.23.0 / v0.25.1rc1 and vLLM v0.23.0 / v0.25.1 (the five functions are the same in
both pairs; vLLM 0.25.1's _set_cudagraph_sizes only reads num_speculative_tokens differently):

- P  vllm_ascend/platform.py NPUPlatform._get_default_max_cudagraph_capture_size:
     ceiling min(max_num_seqs x (1 + k), 512) when no ceiling and no list is given;
- S  vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: ceiling clipped to max_num_batched_tokens;
     grid 1, 2, 4, range(8, min(c + 1, 256), 8), range(256, c + 1, 16), max_num_batched_tokens
     appended when <= c; an explicit list is only de-duplicated, sorted and clipped;
- F  vllm_ascend/platform.py check_and_update_config -> VllmConfig.update_sizes_for_sequence_parallelism:
     with TP > 1 and flashcomm1, only multiples of TP;
- R  vllm/config/compilation.py CompilationConfig.adjust_cudagraph_sizes_for_spec_decode: FULL decode
     and k > 0: round up to multiples of 1 + k (max(1 + k, TP) under flashcomm1), keep <= the largest;
- D  vllm/v1/cudagraph_dispatcher.py CudagraphDispatcher.initialize_cudagraph_keys: FULL_DECODE_ONLY
     keeps 1 + k <= size <= max_num_seqs x (1 + k); mixed modes keep every size.

The plan passes its list to the engine (--compilation-config cudagraph_capture_sizes), so the engine
runs S (explicit), F, R, D on it: the plan's list must come out unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import releases
from npu_runtime.planner.plan import Plan, make_plan
from npu_runtime.planner.probe import DeviceInfo

from tests.runtime.conftest import GIB, R1_RECIPE, load_model

A2 = DeviceInfo("npu", "Ascend910B3", 8, 64 * GIB, None, "override")
A3 = DeviceInfo("npu", "Ascend910_9392", 16, 64 * GIB, None, "override")
AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}
RELEASES = ("0.23.0", "0.25.1rc1")

EIGHTS_TO_64 = [8, 16, 24, 32, 40, 48, 56, 64]

# name: (model, device, options, the plan's list, the engine's default list)
DEPLOYMENTS: dict[str, tuple[str, DeviceInfo, dict[str, Any], list[int], list[int]]] = {
    # max_num_seqs 256, k 0, max_num_batched_tokens 2048 (the plan's), FULL_DECODE_ONLY, TP 1.
    # Default: P 256; S clip min(2048, 256) = 256, grid 1, 2, 4, 8..248, 256 (2048 > 256: not
    # appended); F no (TP 1); R no (k 0); D 1 <= s <= 256: all. Plan: the same grid plus the ceiling
    # 256, already on it.
    "qwen2.5-7b/1x910B3": (
        "qwen2.5-7b",
        A2,
        {"max_model_len": 32768},
        [1, 2, 4, *range(8, 257, 8)],
        [1, 2, 4, *range(8, 257, 8)],
    ),
    # max_num_seqs 64, TP 4, no flashcomm1. P 64; S 1, 2, 4, 8..64; F off; R no; D all.
    "qwen3-32b/tp4": (
        "qwen3-32b",
        A2,
        {"tensor_parallel": 4, "max_num_seqs": 64},
        [1, 2, 4, *EIGHTS_TO_64],
        [1, 2, 4, *EIGHTS_TO_64],
    ),
    # flashcomm1: F drops 1 and 2 (not multiples of 4), from the plan's list and from the default.
    "qwen3-32b/tp4-flashcomm1": (
        "qwen3-32b",
        A2,
        {"tensor_parallel": 4, "max_num_seqs": 64, "flashcomm1": True},
        [4, *EIGHTS_TO_64],
        [4, *EIGHTS_TO_64],
    ),
    # The same off-grid 30 in FULL_DECODE_ONLY: D keeps nothing above 30, so the plan adds 28, the
    # largest multiple of 4 within it: candidates 1, 2, 4, 8, 16, 24, 28, 30; F keeps 4, 8, 16, 24,
    # 28; D keeps them (1 <= s <= 30). Batches of 29 and 30 run eagerly, as the plan warns.
    # Default: P 30; S 1, 2, 4, 8, 16, 24; F 4, 8, 16, 24.
    "qwen3-32b/tp4-flashcomm1-30-seqs": (
        "qwen3-32b",
        A2,
        {"tensor_parallel": 4, "max_num_seqs": 30, "flashcomm1": True},
        [4, 8, 16, 24, 28],
        [4, 8, 16, 24],
    ),
    # An off-grid max_num_seqs 30 under flashcomm1, FULL_AND_PIECEWISE. Default: P 30; S 1, 2, 4, 8,
    # 16, 24; F 4, 8, 16, 24: batches of 25..30 have no graph. Plan: our ceiling 30 rounded up to a
    # multiple of TP, 32, plus the grid in requests 1, 2, 4, 8, 16, 24, 30; F keeps 4, 8, 16, 24, 32
    # (30 is dropped); R no (k 0); D mixed: all.
    "qwen3-32b/tp4-flashcomm1-30-seqs-full-and-piecewise": (
        "qwen3-32b",
        A2,
        {"tensor_parallel": 4, "max_num_seqs": 30, "flashcomm1": True, "graph_mode": "FULL_AND_PIECEWISE"},
        [4, 8, 16, 24, 32],
        [4, 8, 16, 24],
    ),
    # W8A8, TP 4 x DP 4, EP 16, fused MC2, flashcomm1, max_num_seqs 64, max_num_batched_tokens 8192.
    # P 64; S 1, 2, 4, 8..64 (8192 > 64); F drops 1, 2; R no; D all within 1..64.
    "qwen3-235b-a22b-w8a8/a3-tp4-dp4-ep16-fused-mc2-flashcomm1": (
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
        [4, *EIGHTS_TO_64],
        [4, *EIGHTS_TO_64],
    ),
    # W8A8 with MTP k = 3, max_num_seqs 16, max_num_batched_tokens 4096, TP 4 (no flashcomm1).
    # Default: P min(16 x 4, 512) = 64; S 1, 2, 4, 8..64; F off; R rounds to multiples of 4: 1 -> 4,
    # 2 -> 4, the rest are multiples: 4, 8..64; D 4 <= s <= 64: all.
    # Plan: the grid in requests 1, 2, 4, 8, 16 times 4 = 4, 8, 16, 32, 64 (every decode batch of n
    # requests pads to a size of whole requests); R and D keep them.
    "deepseek-r1-w8a8/a3-tp4-dp4-ep16-mtp3": (
        "deepseek-r1-w8a8",
        A3,
        R1_RECIPE,
        [4, 8, 16, 32, 64],
        [4, *EIGHTS_TO_64],
    ),
}


def deployment_plan(name: str, release: str) -> Plan:
    model, device, options, _, _ = DEPLOYMENTS[name]
    return make_plan(PlanOptions(**options, engine_release=release), device, load_model(model), environ=AIV)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_plan_lists_exactly_what_the_release_captures(name: str, release: str) -> None:
    _, _, _, planned, default = DEPLOYMENTS[name]
    plan = deployment_plan(name, release)
    assert plan.engine_release == release
    assert list(plan.capture_sizes) == planned
    # The engine's algorithm run on the plan's explicit list leaves it unchanged ...
    assert list(plan.capture_size_steps[-1].sizes) == planned
    assert [s.step for s in plan.capture_size_steps] == [
        "grid",
        *(["flashcomm1"] if plan.flashcomm1 and plan.tensor_parallel > 1 else []),
        *(["spec-decode"] if plan.decode_query_len > 1 else []),
        "decode-range",
    ]
    # ... and the list is what the engine is given.
    compilation = json.loads(plan.vllm_args[plan.vllm_args.index("--compilation-config") + 1])
    assert compilation["cudagraph_capture_sizes"] == planned
    # Without the plan's list the release would capture its own default.
    assert list(plan.engine_default_sizes) == default


def test_the_plan_names_what_the_engine_drops() -> None:
    plan = deployment_plan("qwen3-235b-a22b-w8a8/a3-tp4-dp4-ep16-fused-mc2-flashcomm1", "0.23.0")
    assert any("[1, 2] left out" in w and "update_sizes_for_sequence_parallelism" in w for w in plan.warnings)
    assert plan.memory.moe_dispatch == {"profile": "FUSED_MC2", "decode": "FUSED_MC2"}


def test_flashcomm1_from_the_environment() -> None:
    model, device, options, planned, _ = DEPLOYMENTS["qwen3-32b/tp4-flashcomm1"]
    without_flag = {k: v for k, v in options.items() if k != "flashcomm1"}
    plan = make_plan(
        PlanOptions(**without_flag), device, load_model(model), environ={**AIV, "VLLM_ASCEND_ENABLE_FLASHCOMM1": "1"}
    )
    assert plan.flashcomm1 and list(plan.capture_sizes) == planned


# -- the algorithm's steps on their own ----------------------------------------------------------------


def run(**given: Any) -> tuple[int, ...]:
    arguments: dict[str, Any] = {
        "mode": "FULL_DECODE_ONLY",
        "max_num_seqs": 64,
        "decode_query_len": 1,
        "max_num_batched_tokens": 2048,
        "tensor_parallel": 1,
        "flashcomm1": False,
        **given,
    }
    return releases.engine_capture_sizes(releases.RULES["0.25.1rc1"], **arguments)[-1].sizes


def test_default_ceiling_is_capped_at_512_and_clipped_to_batched_tokens() -> None:
    assert run(max_num_seqs=1024, mode="PIECEWISE")[-1] == 512
    # max_num_batched_tokens 100 < ceiling 256: clipped, and appended as an off-grid size.
    assert run(max_num_seqs=256, max_num_batched_tokens=100, mode="PIECEWISE")[-2:] == (96, 100)


def test_spec_decode_rounds_up_and_keeps_sizes_within_the_largest() -> None:
    # k = 2: 1, 2 -> 3; 4 -> 6; 8 -> 9; 10 -> 12 > 10 dropped. FULL_DECODE_ONLY: 3 <= s <= 30.
    assert run(explicit=[1, 2, 4, 8, 10], decode_query_len=3, max_num_seqs=10) == (3, 6, 9)


def test_spec_decode_under_flashcomm1_needs_a_common_multiple() -> None:
    with pytest.raises(PlanError):
        run(decode_query_len=3, tensor_parallel=4, flashcomm1=True)  # max(3, 4) = 4 is no multiple of 3
    # k = 1, TP 4: multiples of 4.
    assert run(explicit=[4, 8, 12], decode_query_len=2, tensor_parallel=4, flashcomm1=True) == (4, 8, 12)


def test_full_decode_only_keeps_the_decode_range() -> None:
    assert run(explicit=[1, 2, 4, 8, 16], max_num_seqs=4, decode_query_len=2) == (2, 4, 8)
    assert run(explicit=[1, 2, 4, 8, 16], max_num_seqs=4, decode_query_len=2, mode="FULL_AND_PIECEWISE") == (
        2,
        4,
        8,
        16,
    )


def test_an_unknown_release_is_refused() -> None:
    with pytest.raises(PlanError) as refused:
        releases.select("0.9.0")
    assert refused.value.field == "engine_release"
    assert releases.select(None).release == releases.DEFAULT_RELEASE == "0.23.0"
    assert releases.select(None, installed="0.25.1rc1").release == "0.25.1rc1"
    assert releases.select("v0.25.1rc1").vllm == "0.25.1"

"""LoRA adapters in the plan (issue 47): vLLM 0.31's slot allocation worked out by hand, the graph
capture cases, the vllm-ascend release rules, and the KV cache they take."""

from __future__ import annotations

from typing import Any

import pytest
from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner.calibration import with_later_fields
from npu_runtime.planner.lora import capture_cases
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.plan import Plan, make_plan
from npu_runtime.planner.probe import DeviceInfo

from tests.runtime.conftest import DEVICES, POD_ENV

NPU = DEVICES["910B3-64GiB"]
BIG = DEVICES["GPU-141GiB"]
BF16 = 2


def plan(model: ModelInfo, resolve_mode: bool = True, device: DeviceInfo = NPU, **options: Any) -> Plan:
    return make_plan(PlanOptions(**options), device, model, environ=POD_ENV, resolve_mode=resolve_mode)


class TestAllocation:
    """Each wrapper's create_lora_weights (vllm/lora/layers/*.py): lora_a (slots, 1, rank, input) and
    lora_b (slots, 1, output, rank) per slice, column-parallel outputs and row-parallel inputs / TP."""

    def test_dense_gqa_qwen2_5_7b(self, models: dict[str, ModelInfo]) -> None:
        # hidden 3584, 28 q heads / 4 kv heads of 128, intermediate 18944, 28 layers; Qwen2ForCausalLM
        # has no embedding_modules, so embed_tokens and lm_head get no slots.
        slots, rank, h, inter = 8, 64, 3584, 18944
        qkv = 3 * slots * rank * h + slots * (28 * 128 + 2 * 4 * 128) * rank  # 3 slices of A, B per slice
        o = slots * rank * (28 * 128) + slots * h * rank
        gate_up = 2 * slots * rank * h + 2 * slots * inter * rank
        down = slots * rank * inter + slots * h * rank
        expected = 28 * (qkv + o + gate_up + down) * BF16
        assert expected == 2_583_691_264
        p = plan(models["qwen2.5-7b"], max_model_len=32768, max_num_seqs=48, max_loras=8, max_lora_rank=64)
        assert p.memory.lora_bytes == expected
        assert p.memory.lora is not None
        assert {t.module for t in p.memory.lora.terms} == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}

    def test_moe_qwen3_30b_a3b(self, models: dict[str, ModelInfo]) -> None:
        # hidden 2048, 32 q / 4 kv heads of 128, 48 MoE layers of 128 experts (768 wide), vocab 151936;
        # Qwen3MoeForCausalLM lists embed_tokens and lm_head in embedding_modules. Rank: vLLM's 16.
        slots, rank, h, e, i, vocab = 4, 16, 2048, 128, 768, 151936
        qkv = 3 * slots * rank * h + slots * (32 * 128 + 2 * 4 * 128) * rank
        o = slots * rank * 4096 + slots * h * rank
        # FusedMoEWithLoRA: w13 (2 slices) A (slots, E, rank, h), B (slots, E, I, rank);
        # w2 A (slots, E, rank, I), B (slots, E, h, rank).
        experts = 2 * slots * e * rank * h + 2 * slots * e * i * rank + slots * e * rank * i + slots * e * h * rank
        gate = slots * rank * h + slots * e * rank  # GateLinear -> ReplicatedLinearWithLoRA
        embed = slots * vocab * rank + slots * h * rank  # VocabParallelEmbeddingWithLoRA
        lm_head = slots * rank * h + slots * vocab * rank  # LogitsProcessorWithLoRA
        expected = (48 * (qkv + o + experts + gate) + embed + lm_head) * BF16
        assert expected == 6_803_521_536
        p = plan(models["qwen3-30b-a3b"], device=BIG, max_model_len=4096, max_loras=4)  # one rank holds it
        assert p.memory.lora_bytes == expected

    def test_tensor_parallel_shards_b_of_column_and_a_of_row(self, models: dict[str, ModelInfo]) -> None:
        slots, rank, h, tp = 8, 64, 3584, 4
        q, kv, inter = 28 * 128 // tp, 1 * 128, 18944 // tp  # 4 kv heads over 4 ranks: one each
        qkv = 3 * slots * rank * h + slots * (q + 2 * kv) * rank
        o = slots * rank * q + slots * h * rank
        gate_up = 2 * slots * rank * h + 2 * slots * inter * rank
        down = slots * rank * inter + slots * h * rank
        p = plan(models["qwen2.5-7b"], max_model_len=32768, tensor_parallel=tp, max_loras=slots, max_lora_rank=rank)
        assert p.memory.lora_bytes == 28 * (qkv + o + gate_up + down) * BF16

    def test_fully_sharded_shards_a_of_column_and_b_of_row(self, models: dict[str, ModelInfo]) -> None:
        slots, rank, h, tp = 8, 64, 3584, 4
        q, kv, inter = 28 * 128 // tp, 128, 18944 // tp
        qkv = 3 * slots * (rank // tp) * h + slots * (q + 2 * kv) * rank
        o = slots * rank * q + slots * (h // tp) * rank
        gate_up = 2 * slots * (rank // tp) * h + 2 * slots * inter * rank
        down = slots * rank * inter + slots * (h // tp) * rank
        p = plan(
            models["qwen2.5-7b"],
            max_model_len=32768,
            tensor_parallel=tp,
            max_loras=slots,
            max_lora_rank=rank,
            fully_sharded_loras=True,
        )
        assert p.memory.lora_bytes == 28 * (qkv + o + gate_up + down) * BF16


class TestKvCache:
    def test_eager_kv_is_reduced_by_exactly_the_adapters(self, models: dict[str, ModelInfo]) -> None:
        base: dict[str, Any] = {"max_model_len": 32768, "max_num_seqs": 48, "graph_mode": "NONE"}
        off = plan(models["qwen2.5-7b"], **base)
        on = plan(models["qwen2.5-7b"], **base, max_loras=8, max_lora_rank=64)
        assert on.memory.lora_bytes > 0
        assert off.memory.kv_cache_bytes - on.memory.kv_cache_bytes == on.memory.lora_bytes

    def test_graphs_take_one_increment_more_per_size(self, models: dict[str, ModelInfo]) -> None:
        base: dict[str, Any] = {"max_model_len": 32768, "max_num_seqs": 48}
        off = plan(models["qwen2.5-7b"], **base)
        on = plan(models["qwen2.5-7b"], **base, max_loras=8, max_lora_rank=64)
        assert on.capture_sizes == off.capture_sizes
        extra = len(off.capture_sizes) * off.memory.graph_per_size_bytes  # 2 cases: every size once more
        assert on.memory.graph_bytes - off.memory.graph_bytes == extra
        assert off.memory.kv_cache_bytes - on.memory.kv_cache_bytes == on.memory.lora_bytes + extra
        assert on.to_dict()["graphs"] == {"lora_cases": 2, "captured": 2 * len(on.capture_sizes)}
        assert on.to_dict()["memory"]["lora_bytes"] == on.memory.lora_bytes
        assert any("LoRA adapters" in w and "tokens of KV cache" in w for w in on.warnings)

    def test_plans_without_lora_show_no_lora_keys(self, models: dict[str, ModelInfo]) -> None:
        d = plan(models["qwen2.5-7b"], max_model_len=4096).to_dict()
        assert "lora_bytes" not in d["memory"] and "graphs" not in d

    def test_the_warning_names_the_sizes_the_adapters_drop(self, models: dict[str, ModelInfo]) -> None:
        # A stream budget that holds the sizes once but not twice: the LoRA cases take sizes.
        model = models["qwen2.5-7b"]
        base: dict[str, Any] = {
            "max_model_len": 32768,
            "max_num_seqs": 256,
            "graph_mode": "PIECEWISE",
            "stream_budget": 500,
        }
        off = plan(model, **base)
        on = plan(model, **base, max_loras=8, max_lora_rank=64)
        dropped = sorted(set(off.capture_sizes) - set(on.capture_sizes))
        assert dropped, "the stream budget with 2 LoRA cases keeps fewer sizes"
        assert any(f"capture sizes dropped for them: {dropped}" in w for w in on.warnings)


class TestCaptureCases:
    def test_cases(self) -> None:
        assert capture_cases(None) == 1
        assert capture_cases(8) == 2  # [0, 9]
        assert capture_cases(8, specialize=False) == 1  # [9]
        assert capture_cases(8, specialize_active=True) == 6  # [0, 1, 2, 4, 8, 9]
        assert capture_cases(3, specialize_active=True) == 4  # [0, 1, 2, 4]


class TestReleaseRules:
    def test_tp_lora_runs_eagerly_without_11940(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], max_model_len=32768, tensor_parallel=2, max_loras=2)
        assert p.effective_mode == "NONE"
        assert [d.reason for d in p.downgrades][-1] == "LoraTensorParallelGraphs"
        assert "#11940" in p.downgrades[-1].message

    def test_tp_lora_is_a_warning_when_the_engine_resolves_the_mode(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], resolve_mode=False, max_model_len=32768, tensor_parallel=2, max_loras=2)
        assert p.effective_mode != "NONE"
        assert any("#11940" in w for w in p.warnings)

    def test_single_rank_lora_keeps_its_graphs(self, models: dict[str, ModelInfo]) -> None:
        assert plan(models["qwen2.5-7b"], max_model_len=32768, max_loras=2).effective_mode != "NONE"

    def test_moe_lora_with_expert_parallel(self, models: dict[str, ModelInfo]) -> None:
        options: dict[str, Any] = {
            "max_model_len": 4096,
            "tensor_parallel": 2,
            "enable_expert_parallel": True,
            "max_loras": 2,
        }
        with pytest.raises(PlanError) as err:
            plan(models["qwen3-30b-a3b"], **options, engine_release="0.23.0")
        assert err.value.field == "max_loras"
        assert plan(models["qwen3-30b-a3b"], **options, engine_release="0.25.1rc1").memory.lora_bytes > 0

    def test_quantized_moe_lora_is_refused(self, models: dict[str, ModelInfo]) -> None:
        with pytest.raises(PlanError) as err:
            plan(models["qwen3-235b-a22b-w8a8"], max_model_len=4096, tensor_parallel=8, max_loras=2)
        assert err.value.field == "max_loras"

    @pytest.mark.parametrize(
        ("options", "field"),
        [
            ({"max_loras": 2, "max_lora_rank": 20}, "max_lora_rank"),
            ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras"),
            (
                {"max_loras": 2, "max_lora_rank": 1, "tensor_parallel": 2, "fully_sharded_loras": True},
                "fully_sharded_loras",
            ),
        ],
    )
    def test_what_vllm_refuses(self, models: dict[str, ModelInfo], options: dict[str, Any], field: str) -> None:
        with pytest.raises(PlanError) as err:
            plan(models["qwen2.5-7b"], max_model_len=4096, **options)
        assert err.value.field == field


class TestEngineArguments:
    def test_lora_flags(self, models: dict[str, ModelInfo]) -> None:
        args = plan(models["qwen2.5-7b"], max_model_len=4096, max_loras=8, max_cpu_loras=16).vllm_args
        i = args.index("--enable-lora")
        assert args[i : i + 7] == (
            "--enable-lora",
            "--max-loras",
            "8",
            "--max-lora-rank",
            "16",
            "--max-cpu-loras",
            "16",
        )
        assert "--fully-sharded-loras" not in args

    def test_fully_sharded_flag_and_off(self, models: dict[str, ModelInfo]) -> None:
        on = plan(models["qwen2.5-7b"], max_model_len=4096, max_loras=2, fully_sharded_loras=True).vllm_args
        assert "--fully-sharded-loras" in on
        assert "--enable-lora" not in plan(models["qwen2.5-7b"], max_model_len=4096).vllm_args


def test_lora_is_part_of_the_calibration_key(models: dict[str, ModelInfo]) -> None:
    """The slots and the graphs per LoRA case change what the engine measures: a record of the same model
    without adapters is not this plan's, and an older key without the field reads as no LoRA."""
    with_lora = plan(models["qwen2.5-7b"], max_model_len=32768, max_num_seqs=48, max_loras=8, max_lora_rank=64)
    without = plan(models["qwen2.5-7b"], max_model_len=32768, max_num_seqs=48)
    assert with_lora.to_dict()["calibration"]["key"]["lora"] == "8x64"
    assert without.to_dict()["calibration"]["key"]["lora"] is None
    older = {k: v for k, v in without.to_dict()["calibration"]["key"].items() if k != "lora"}
    assert with_later_fields(older) == without.to_dict()["calibration"]["key"]

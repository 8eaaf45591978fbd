"""Each memory term of the planner against the engine's rule, for the recipes it is checked on.

Every expected figure is derived here from the model's config.json and the rule the term's module
cites (vLLM 0.23.0, vllm-ascend v0.23.0), not read back from the planner: DeepSeek-R1 W8A8 on A3
and A2 (HCCL_BUFFSIZE 200 and 1024), Qwen3-235B-A22B, and a dense model with more TP ranks than
KV heads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from npu_runtime.contract import MIB, PlanError, PlanOptions
from npu_runtime.planner.model import inspect_model
from npu_runtime.planner.plan import Plan, make_plan
from npu_runtime.planner.probe import DeviceError, DeviceInfo, device_from_options

from tests.runtime.conftest import FIXTURES, GIB, R1_RECIPE, load_model

A3 = DeviceInfo("npu", "Ascend910_9392", 16, round(61.27 * GIB), None, "device-table")
A2 = DeviceInfo("npu", "Ascend910B3", 8, round(60.96 * GIB), None, "device-table")
AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}
BF16 = 2
INT8 = 1


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name / "config.json").read_text())
    return data


def r1_plan(device: DeviceInfo, env: dict[str, str], **changes: Any) -> Plan:
    nodes = {"nodes": 2} if device is A2 else {}
    return make_plan(
        PlanOptions(**{**R1_RECIPE, **nodes, **changes}), device, load_model("deepseek-r1-w8a8"), environ=env
    )


# -- device memory ---------------------------------------------------------------------------------


def test_a_named_device_plans_with_what_torch_npu_reports_for_it() -> None:
    # vllm-ascend logs "Free memory on device (60.89/61.27 GiB)" on A3; torch_npu's OOM message says
    # "60.96 GiB total capacity" on 64 GB A2 parts (vllm-ascend #1670, #1127, #6611).
    a3 = device_from_options(PlanOptions(device_kind="npu", device_name="Ascend910_9392", device_count=16))
    a2 = device_from_options(PlanOptions(device_kind="npu", device_name="Ascend910B3", device_count=8))
    assert (a3.total_bytes, a3.source, a3.count) == (round(61.27 * GIB), "device-table", 16)
    assert (a2.total_bytes, a2.source) == (round(60.96 * GIB), "device-table")
    given = device_from_options(PlanOptions(device_kind="npu", device_name="Ascend910_9392", device_memory=64 * GIB))
    assert (given.total_bytes, given.source) == (64 * GIB, "override")
    with pytest.raises(DeviceError) as unknown:  # 910B4: no figure to quote, so no guess
        device_from_options(PlanOptions(device_kind="npu", device_name="Ascend910B4"))
    assert unknown.value.field == "device_memory"


# -- weights ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [A3, A2], ids=["A3", "A2"])
def test_r1_w8a8_replicated_tensors_and_absorbed_mla_copies(device: DeviceInfo) -> None:
    c = config("deepseek-r1-w8a8")
    h, layers, tp = c["hidden_size"], c["num_hidden_layers"], 4
    moe_layers = layers - c["first_k_dense_replace"]
    qkv_a = h * c["q_lora_rank"] + h * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
    router = h * c["n_routed_experts"]
    # fused_qkv_a_proj (disable_tp) at W8A8 in the main layers, bf16 router gates; the MTP layer is
    # FLOAT in the description: its fused_qkv_a_proj, router and eh_proj (2h x h) in bf16.
    main = layers * qkv_a * INT8 + moe_layers * router * BF16
    mtp = c["num_nextn_predict_layers"] * (qkv_a + router + 2 * h * h) * BF16
    # W_UK_T and W_UV: kv_lora_rank x heads/tp x (qk_nope + v) in bf16, main and MTP layers.
    absorbed = (
        c["kv_lora_rank"] * (c["num_attention_heads"] // tp) * (c["qk_nope_head_dim"] + c["v_head_dim"]) * BF16
    ) * (layers + c["num_nextn_predict_layers"])
    terms = r1_plan(device, AIV).memory.weight_terms
    assert terms.replicated == main + mtp
    assert terms.mla_absorbed == absorbed
    assert terms.kv_head_replicas == 0  # MLA: one latent KV, no heads to replicate


def test_r1_w8a8_experts_with_eplb_redundant_experts() -> None:
    c = config("deepseek-r1-w8a8")
    model = load_model("deepseek-r1-w8a8")
    experts = model.expert_weight_bytes + model.draft_expert_weight_bytes  # MTP on: its experts load too
    plain = r1_plan(A3, AIV).memory.weight_terms.experts
    redundant = r1_plan(A3, AIV, redundant_experts=16)
    # fused_moe.py: local_num_experts = (num_experts + redundant) // ep_size.
    assert redundant.layout.experts_per_rank == (c["n_routed_experts"] + 16) // 16 == 17
    assert plain == math.ceil(experts * 16 / c["n_routed_experts"])
    assert redundant.memory.weight_terms.experts == math.ceil(experts * 17 / c["n_routed_experts"])


def test_mtp_precision_follows_the_description(tmp_path: Path) -> None:
    c = config("deepseek-r1-w8a8")
    expert_params = c["n_routed_experts"] * 3 * c["hidden_size"] * c["moe_intermediate_size"]
    as_shipped = inspect_model(FIXTURES / "deepseek-r1-w8a8")  # layer 61 entries are FLOAT
    assert as_shipped.draft_expert_weight_bytes == expert_params * BF16
    directory = copy_model(tmp_path, "deepseek-r1-w8a8")
    description = json.loads((directory / "quant_model_description.json").read_text())
    for name in description:
        if ".layers.61." in name and ("proj" in name or ".experts." in name) and "kv_b_proj" not in name:
            description[name] = "W8A8_DYNAMIC"
    (directory / "quant_model_description.json").write_text(json.dumps(description))
    quantized = inspect_model(directory)
    assert quantized.draft_expert_weight_bytes == expert_params * INT8
    assert quantized.draft_weight_bytes < as_shipped.draft_weight_bytes


def test_a_quantized_kv_b_proj_is_refused_naming_the_layer(tmp_path: Path) -> None:
    directory = copy_model(tmp_path, "deepseek-r1-w8a8")
    description = json.loads((directory / "quant_model_description.json").read_text())
    description["model.layers.3.self_attn.kv_b_proj.weight"] = "W8A8"
    (directory / "quant_model_description.json").write_text(json.dumps(description))
    with pytest.raises(PlanError) as refused:
        make_plan(PlanOptions(**R1_RECIPE), A3, inspect_model(directory), environ=AIV)
    assert refused.value.field == "quantization"
    assert "model.layers.3.self_attn.kv_b_proj.weight" in refused.value.message


def test_dense_model_with_more_tp_ranks_than_kv_heads_holds_one_kv_head_per_rank() -> None:
    c = config("qwen2.5-72b-instruct")  # 8 KV heads over TP 16
    h, kv, tp = c["hidden_size"], c["num_key_value_heads"], 16
    head_dim = h // c["num_attention_heads"]
    plan = make_plan(
        PlanOptions(tensor_parallel=tp, max_model_len=8192), A3, load_model("qwen2.5-72b-instruct"), environ=AIV
    )
    # QKVParallelLinear: each rank holds max(1, kv / tp) = 1 whole head of k and v, not kv / tp of one.
    extra = c["num_hidden_layers"] * 2 * h * head_dim * (1 - kv / tp) * BF16
    assert plan.memory.weight_terms.kv_head_replicas == math.ceil(extra)
    assert plan.memory.weight_terms.replicated == 0


def test_qwen3_235b_router_kv_heads_and_dispatch_under_dp2_tp8_ep16() -> None:
    c = config("qwen3-235b-a22b")
    h, tp, layers = c["hidden_size"], 8, c["num_hidden_layers"]
    options = PlanOptions(
        tensor_parallel=tp, data_parallel=2, enable_expert_parallel=True, max_model_len=8192, max_num_seqs=64
    )
    plan = make_plan(options, A3, load_model("qwen3-235b-a22b"), environ=AIV)
    terms = plan.memory.weight_terms
    assert terms.replicated == layers * h * c["num_experts"] * BF16  # every layer is MoE (decoder_sparse_step 1)
    extra = layers * 2 * h * c["head_dim"] * (1 - c["num_key_value_heads"] / tp) * BF16  # 4 KV heads, TP 8
    assert terms.kv_head_replicas == math.ceil(extra)
    assert plan.layout.experts_per_rank == c["num_experts"] // 16
    # 2048 profile tokens exceed the MC2 capacity min(ceil(64 / 8), 512) x 8 = 64: ALLTOALL on A3.
    assert plan.memory.moe_dispatch == {"profile": "ALLTOALL", "decode": "MC2"}
    assert [(c.group, c.ranks, c.buffer_mb) for c in plan.memory.communicators] == [
        ("tp", 8, 200),
        ("dp", 2, 50),
        ("ep", 16, 200),
        ("mc2", 16, 200),
    ]


# -- communication ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [A3, A2], ids=["A3", "A2"])
@pytest.mark.parametrize("buffsize", [200, 1024])
def test_r1_communicators_from_hccl_buffsize(device: DeviceInfo, buffsize: int) -> None:
    # tp and ep at 200 MB, dp at max(ceil(5 x 4 B / 1 MiB), 50) = 50 MB, mc2 at HCCL_BUFFSIZE; two
    # buffers each (vllm_ascend/utils.py get_hccl_config_for_pg_options).
    expected = 2 * (200 + 50 + 200 + buffsize) * MIB
    from_env = r1_plan(device, {**AIV, "HCCL_BUFFSIZE": str(buffsize)}).memory
    from_flag = r1_plan(device, AIV, hccl_buffsize=buffsize).memory
    assert from_env.communication_bytes == from_flag.communication_bytes == expected
    assert [(c.group, c.ranks, c.buffer_mb) for c in from_env.communicators] == [
        ("tp", 4, 200),
        ("dp", 4, 50),
        ("ep", 16, 200),
        ("mc2", 16, buffsize),
    ]
    # margin = the buffers + our 128 MiB safety term: no ACL context (it predates the worker's memory
    # snapshot) and no 150 MiB (only in vllm-ascend's --kv-cache-memory suggestion), per
    # vllm_ascend/worker/worker.py NPUWorker.determine_available_memory / compile_or_warm_up_model.
    assert from_env.margin_bytes == expected + 128 * MIB


def test_ep_on_one_dp_rank_shares_the_tp_communicator() -> None:
    # DP 1: the ep group has the tp group's ranks and options: one communicator (reuse domain "shared").
    plan = make_plan(
        PlanOptions(tensor_parallel=16, enable_expert_parallel=True, max_model_len=8192),
        A3,
        load_model("qwen3-235b-a22b"),
        environ=AIV,
    )
    assert [c.group for c in plan.memory.communicators] == ["tp", "mc2"]


def test_hccl_buffsize_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(PlanError) as refused:
        r1_plan(A3, {**AIV, "HCCL_BUFFSIZE": "1G"})
    assert refused.value.field == "HCCL_BUFFSIZE"


# -- activation ------------------------------------------------------------------------------------


def r1_activation(mode: str) -> int:
    """The profile run of 4096 tokens on one rank of DP 4 x TP 4 (EP 16), by the MoE dispatch: the
    larger of the attention and the MLP phase beside the residual stream, or the logits phase
    (vllm-ascend's _dummy_sampler_run computes the logits of max_num_seqs rows, no sampler)."""
    c = config("deepseek-r1-w8a8")
    h, tokens, tp, dp, top_k = c["hidden_size"], 4096, 4, 4, c["num_experts_per_tok"]
    heads = c["num_attention_heads"] // tp
    qkv = heads * (2 * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) + c["v_head_dim"])  # 192 + 192 + 128
    attention_out = heads * c["v_head_dim"]
    per_row = 2 * h + 3 * c["moe_intermediate_size"]
    if mode == "ALLTOALL":  # tokens split over TP first, then top_k rows each
        moe = math.ceil(tokens / tp) * top_k * per_row
    else:  # ALLGATHER: every DP rank's tokens gathered, this rank's share of the rows
        moe = 2 * tokens * dp * h + math.ceil(tokens * dp * top_k / (dp * tp)) * per_row
    dense = tokens * 3 * c["intermediate_size"] // tp  # the first three layers' MLP
    attention_phase = tokens * (2 * h + qkv + attention_out)
    mlp_phase = 2 * tokens * h + max(moe, dense)
    forward = BF16 * (tokens * h + max(attention_phase, mlp_phase))
    logits = BF16 * (tokens * h + 16 * (math.ceil(c["vocab_size"] / tp) + c["vocab_size"]))
    return int(max(forward, logits))


def test_r1_activation_a3_all_to_all_a2_all_gather() -> None:
    a3, a2 = r1_plan(A3, AIV).memory, r1_plan(A2, AIV).memory
    # 4096 tokens exceed the MC2 capacity min(ceil(64 / 4), 512) x 4 = 64: A3 ALLTOALL, A2 ALLGATHER;
    # a decode graph of 64 tokens fits it: MC2 on both (A2: 16 experts per device, EP 16).
    assert a3.moe_dispatch == {"profile": "ALLTOALL", "decode": "MC2"}
    assert a2.moe_dispatch == {"profile": "ALLGATHER", "decode": "MC2"}
    assert a3.activation_bytes == r1_activation("ALLTOALL")
    assert a2.activation_bytes == r1_activation("ALLGATHER")
    assert a2.activation_bytes > a3.activation_bytes


def copy_model(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    shutil.copytree(FIXTURES / name, directory)
    return directory


# -- the engine's accounting on dense models, flashcomm1 and fused MC2 ------------------------------


def qwen3_32b_plan(**changes: Any) -> Plan:
    options = PlanOptions(tensor_parallel=4, max_num_seqs=64, **changes)
    return make_plan(options, A2, load_model("qwen3-32b"), environ=AIV)


@pytest.mark.parametrize("flashcomm1", [False, True])
def test_dense_activation_is_the_larger_phase_or_the_logits(flashcomm1: bool) -> None:
    # vllm-ascend NPUWorker.determine_available_memory reads the torch peak of the profile run: one
    # layer's MLP phase (the larger here), beside the residual stream, which flashcomm1 splits over
    # TP; the logits phase (NPUModelRunner._dummy_sampler_run) computes logits only, no sampler.
    c = config("qwen3-32b")
    h, inter, tp, tokens, seqs = c["hidden_size"], c["intermediate_size"], 4, 2048, 64
    heads, kv, hd = c["num_attention_heads"] // tp, c["num_key_value_heads"] // tp, c["head_dim"]
    residual = tokens // tp if flashcomm1 else tokens
    attention_phase = tokens * (2 * h + heads * hd + 2 * kv * hd + heads * hd)
    mlp_phase = 2 * tokens * h + tokens * 3 * inter // tp
    forward = BF16 * (residual * h + max(attention_phase, mlp_phase))
    logits = BF16 * (tokens * h + seqs * (math.ceil(c["vocab_size"] / tp) + c["vocab_size"]))
    memory = qwen3_32b_plan(flashcomm1=flashcomm1).memory
    assert memory.activation_bytes == max(forward, logits) == forward


def test_dense_margin_is_the_tp_communicator_and_the_safety_term() -> None:
    # No ACL context (created before the worker's memory snapshot), no 150 MiB (only in the
    # --kv-cache-memory suggestion): 2 x 200 MB for the tp group and our 128 MiB.
    memory = qwen3_32b_plan().memory
    assert [(c.group, c.ranks) for c in memory.communicators] == [("tp", 4)]
    assert memory.margin_bytes == 2 * 200 * MIB + 128 * MIB


def test_fused_mc2_never_creates_the_ep_communicator() -> None:
    # enable_fused_mc2 = 1 with EP 16 <= 32: FUSED_MC2 for the profile run and for decode
    # (_select_a3_moe_comm_method); the ep group (shared with world) then runs no collective, and
    # HCCL creates communicators lazily, so only mc2 holds buffers.
    common: dict[str, Any] = {
        "tensor_parallel": 4,
        "data_parallel": 4,
        "enable_expert_parallel": True,
        "quantization": "ascend",
        "max_num_seqs": 64,
        "max_model_len": 32768,
        "max_num_batched_tokens": 8192,
    }
    model = load_model("qwen3-235b-a22b-w8a8")
    fused = make_plan(PlanOptions(**common, fused_mc2=1), A3, model, environ=AIV).memory
    plain = make_plan(PlanOptions(**common), A3, model, environ=AIV).memory
    assert fused.moe_dispatch == {"profile": "FUSED_MC2", "decode": "FUSED_MC2"}
    assert [c.group for c in fused.communicators] == ["tp", "dp", "mc2"]
    assert plain.moe_dispatch == {"profile": "ALLTOALL", "decode": "MC2"}
    assert [c.group for c in plain.communicators] == ["tp", "dp", "ep", "mc2"]
    assert plain.margin_bytes - fused.margin_bytes == 2 * 200 * MIB


def test_the_worked_example_in_docs_planner_md() -> None:
    # docs/planner.md "Worked example": Llama-3.1-8B, one 32 GiB 910B4, max_num_seqs 100, 4096 tokens.
    c = config("llama-3.1-8b")
    h, inter, vocab, t = c["hidden_size"], c["intermediate_size"], c["vocab_size"], 2048
    total = 32 * GIB
    budget = math.floor(total * 0.9)
    weights = 16_060_522_496  # the index's total_size
    mlp_phase = t * h + 2 * t * h + t * 3 * inter  # residual + MLP input and output + gate/up/act
    activation = BF16 * mlp_phase
    assert activation > BF16 * (t * h + 100 * 2 * vocab)  # the logits phase is smaller
    margin = 128 * MIB
    first = BF16 * 100 * (3 * h + 3 * inter) + 64 * MIB
    graphs = first + 15 * MIB  # 16 sizes: 1, 2, 4, 8, ..., 96, 100
    kv = budget - weights - activation - margin - graphs
    per_token = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * (h // c["num_attention_heads"]) * BF16
    device = DeviceInfo("npu", "Ascend910B4", 8, total, None, "override")
    plan = make_plan(PlanOptions(max_num_seqs=100, max_model_len=4096), device, load_model("llama-3.1-8b"), environ=AIV)
    m = plan.memory
    assert (m.budget_bytes, m.weights_bytes, m.activation_bytes, m.margin_bytes) == (
        30_923_764_531,
        weights,
        activation,
        margin,
    )
    assert (m.activation_bytes, m.graph_first_capture_bytes, m.graph_bytes) == (226_492_416, 78_168_064, 93_896_704)
    assert first == m.graph_first_capture_bytes and graphs == m.graph_bytes
    assert m.kv_cache_bytes == kv == 14_408_635_187
    assert (m.kv_bytes_per_token, m.kv_cache_tokens) == (per_token, kv // per_token) == (131_072, 109_929)
    assert m.engine_gpu_memory_utilization == 0.8972


def test_w8a8_per_channel_parameters_and_their_fp32_copies() -> None:
    # ModelSlim W8A8_DYNAMIC (w8a8_dynamic.py): weight_scale + weight_offset in bf16 and a
    # weight_scale_fp32 copy, 8 bytes per output channel, for every quantized linear layer and for
    # the experts' w13 (2 x moe_intermediate) and w2 (hidden) on this rank.
    c = config("qwen3-235b-a22b-w8a8")
    tp, layers, h, hd = 4, c["num_hidden_layers"], c["hidden_size"], c["head_dim"]
    attention = (c["num_attention_heads"] // tp + 2 * max(1, c["num_key_value_heads"] // tp)) * hd + h
    experts = c["num_experts"] // 16 * (2 * c["moe_intermediate_size"] + h)  # EP 16: 8 experts per rank
    options = PlanOptions(
        tensor_parallel=tp,
        data_parallel=4,
        enable_expert_parallel=True,
        quantization="ascend",
        max_num_seqs=64,
        max_model_len=32768,
    )
    terms = make_plan(options, A3, load_model("qwen3-235b-a22b-w8a8"), environ=AIV).memory.weight_terms
    assert terms.quant_params == layers * (attention + experts) * 8 == 47_935_488
    bf16 = make_plan(dataclasses.replace(options, quantization=None), A3, load_model("qwen3-235b-a22b"), environ=AIV)
    assert bf16.memory.weight_terms.quant_params == 0

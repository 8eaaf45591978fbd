"""The planner's MoE terms: experts over DP x TP (EP or sliced), quantized bytes, MTP, nodes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest
from npu_runtime.contract import PlanOptions
from npu_runtime.planner.plan import DoesNotFitError, PlanError, make_plan, node_engine_args
from npu_runtime.planner.probe import DeviceInfo

from tests.runtime.conftest import FIXTURES, GIB, load_model

A3 = DeviceInfo("npu", "Ascend910_9392", 16, 64 * GIB, None, "override")
A2 = DeviceInfo("npu", "Ascend910B3", 8, 64 * GIB, None, "override")
AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}
R1: dict[str, Any] = {"max_num_seqs": 16, "max_model_len": 16384, "gpu_memory_utilization": 0.92}


def test_routed_experts_split_over_dp_x_tp_dense_parts_over_tp() -> None:
    model = load_model("deepseek-r1-w8a8")
    plan = make_plan(PlanOptions(data_parallel=4, tensor_parallel=4, enable_expert_parallel=True, **R1), A3, model)
    dense = model.weight_bytes - model.expert_weight_bytes - model.replicated_weight_bytes
    terms = plan.memory.weight_terms
    assert (terms.split, terms.replicated, terms.experts) == (
        math.ceil(dense / 4),
        model.replicated_weight_bytes,
        math.ceil(model.expert_weight_bytes / 16),
    )
    assert (plan.layout.ep_size, plan.layout.experts_per_rank, plan.layout.moe_tensor_parallel) == (16, 16, 1)
    # Without EP vLLM slices every expert over the same 16 ranks: the same bytes for 256 experts.
    sliced = make_plan(PlanOptions(data_parallel=4, tensor_parallel=4, **R1), A3, model)
    assert (sliced.layout.ep_size, sliced.layout.moe_tensor_parallel) == (1, 16)
    ep_terms, sliced_terms = plan.memory.weight_terms, sliced.memory.weight_terms
    assert sliced_terms.total - sliced_terms.quant_params == ep_terms.total - ep_terms.quant_params
    # Only the per-channel parameters differ: a sliced w2 keeps a scale per hidden output on every rank.
    assert sliced_terms.quant_params > ep_terms.quant_params


def test_uneven_experts_load_the_busiest_rank_and_say_so() -> None:
    model = load_model("qwen3-30b-a3b")  # 128 experts over EP 3: ranks hold 43, 43, 42
    plan = make_plan(PlanOptions(data_parallel=3, enable_expert_parallel=True, max_model_len=4096), A2, model)
    assert plan.layout.experts_per_rank == 43
    assert any("do not divide evenly" in w for w in plan.warnings)


def test_w8a8_weights_are_half_of_bf16_except_embeddings() -> None:
    bf16, w8a8 = load_model("deepseek-r1-bf16"), load_model("deepseek-r1-w8a8")
    assert (w8a8.quantization, w8a8.quant_scheme, w8a8.quant_bits, w8a8.expert_quant_bits) == (
        "ascend",
        "W8A8_DYNAMIC",
        8,
        8,
    )
    embeddings = 2 * 129280 * 7168 * 2
    assert w8a8.weight_bytes - embeddings // 2 == pytest.approx(bf16.weight_bytes / 2, rel=0.01)
    assert w8a8.expert_weight_bytes * 2 == bf16.expert_weight_bytes
    # ModelSlim leaves the MTP layer in bfloat16.
    assert w8a8.draft_weight_bytes == bf16.draft_weight_bytes


def test_mtp_loads_the_draft_layer_and_its_kv_cache() -> None:
    model = load_model("deepseek-r1-w8a8")
    base = PlanOptions(data_parallel=4, tensor_parallel=4, enable_expert_parallel=True, **R1)
    without = make_plan(base, A3, model)
    mtp = make_plan(PlanOptions(**{**base.__dict__, "speculative_method": "mtp", "speculative_tokens": 3}), A3, model)
    assert mtp.memory.weights_bytes > without.memory.weights_bytes
    assert mtp.memory.kv_bytes_per_token == without.memory.kv_bytes_per_token * 62 // 61
    assert all(size % 4 == 0 for size in mtp.capture_sizes)


def test_two_nodes_run_whole_dp_ranks_each() -> None:
    model = load_model("deepseek-r1-w8a8")
    options = PlanOptions(nodes=2, data_parallel=4, tensor_parallel=4, enable_expert_parallel=True, **R1)
    plan = make_plan(options, A2, model)
    leader, worker = plan.layout.per_node
    assert (leader.role, leader.data_parallel_ranks, worker.role, worker.data_parallel_start_rank) == (
        "leader",
        (0, 1),
        "worker",
        2,
    )
    assert node_engine_args(plan.layout, 0, "10.0.0.1", 13389) == (
        "--data-parallel-size-local",
        "2",
        "--data-parallel-address",
        "10.0.0.1",
        "--data-parallel-rpc-port",
        "13389",
    )
    assert node_engine_args(plan.layout, 1, "10.0.0.1", 13389)[-3:] == ("--headless", "--data-parallel-start-rank", "2")
    assert "--enable-expert-parallel" in plan.vllm_args
    assert plan.vllm_args[-2:] == ("--quantization", "ascend")


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"nodes": 2, "data_parallel": 3, "tensor_parallel": 4}, "data_parallel", "split evenly over 2 nodes"),
        ({"nodes": 2, "data_parallel": 2, "tensor_parallel": 16}, "tensor_parallel", "spans more than one node"),
        ({"nodes": 2, "data_parallel": 4, "tensor_parallel": 8}, "tensor_parallel", "on each of 2 nodes"),
        ({"data_parallel": 2, "tensor_parallel": 4, "max_num_batched_tokens": 8}, "max_num_batched_tokens", "below"),
    ],
)
def test_layouts_the_engine_cannot_run_name_the_field(options: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(PlanError, match=message) as caught:
        make_plan(PlanOptions(max_model_len=4096, **options), A2, load_model("deepseek-r1-w8a8"))
    assert caught.value.field == field


def test_ascend_quantization_needs_a_modelslim_description() -> None:
    with pytest.raises(PlanError, match=r"quant_model_description\.json") as caught:
        make_plan(PlanOptions(quantization="ascend", tensor_parallel=8), A2, load_model("qwen3-30b-a3b"))
    assert caught.value.field == "quantization"


def test_too_few_devices_name_the_smallest_layout() -> None:
    with pytest.raises(DoesNotFitError, match=r"data parallel 2 x tensor parallel 8 \(16 devices, 2 node"):
        make_plan(PlanOptions(tensor_parallel=8, enable_expert_parallel=True), A2, load_model("deepseek-r1-w8a8"))


def test_ep_adds_its_communication_groups_to_margin_and_streams() -> None:
    model = load_model("deepseek-r1-w8a8")
    common = {"data_parallel": 4, "tensor_parallel": 4, "stream_budget": 1800, **R1}
    sliced = make_plan(PlanOptions(**common), A3, model, environ=AIV)
    ep = make_plan(PlanOptions(enable_expert_parallel=True, **common), A3, model, environ=AIV)
    assert ep.memory.margin_bytes - sliced.memory.margin_bytes == 400 * 2**20  # vllm-ascend's MC2 group
    assert ep.streams.per_size == sliced.streams.per_size + 1  # update_aclgraph_sizes: + enable_expert_parallel


def test_cli_json_has_the_per_rank_layout() -> None:
    out = subprocess.run(
        [
            sys.executable, "-m", "npu_runtime.cli", "plan", "--json",
            "--model", str(FIXTURES / "deepseek-r1-w8a8"),
            "--device-kind", "npu", "--device-name", "Ascend910B3", "--device-memory", "64Gi", "--device-count", "8",
            "--nodes", "2", "--data-parallel", "4", "--tensor-parallel", "4", "--enable-expert-parallel",
            "--quantization", "ascend", "--speculative-method", "mtp", "--speculative-tokens", "3",
            "--max-num-seqs", "16", "--max-model-len", "16384", "--max-num-batched-tokens", "4096",
            "--gpu-memory-utilization", "0.92",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["layout"]["nodes"] == 2
    assert [n["data_parallel_ranks"] for n in plan["layout"]["per_node"]] == [[0, 1], [2, 3]]
    assert plan["quantization"] == "ascend"
    assert plan["effective_mode"] == "FULL_DECODE_ONLY"


def test_serve_adds_this_nodes_flags_and_needs_the_leaders_address() -> None:
    from npu_runtime.contract import parse_serve_args
    from npu_runtime.serving.serve import ServeError, Supervisor, node_args

    argv = ["--model", str(FIXTURES / "deepseek-r1-w8a8"), "--nodes", "2", "--data-parallel", "4"]
    argv += ["--tensor-parallel", "4", "--enable-expert-parallel", "--max-model-len", "4096", "--node-rank", "1"]
    worker = parse_serve_args([*argv, "--data-parallel-address", "r1-0.r1.llm"])
    plan = make_plan(worker.plan, A2, load_model("deepseek-r1-w8a8"))
    assert node_args(worker, plan) == (
        "--data-parallel-size-local",
        "2",
        "--data-parallel-address",
        "r1-0.r1.llm",
        "--data-parallel-rpc-port",
        "13389",
        "--headless",
        "--data-parallel-start-rank",
        "2",
    )
    # A headless worker is ready when the leader's engine is.
    supervisor = Supervisor(worker, environ={})
    try:
        assert supervisor.health_url == "http://r1-0.r1.llm:8000/health"
    finally:
        supervisor.close()
    with pytest.raises(ServeError, match="--data-parallel-address"):
        node_args(parse_serve_args(argv), plan)
    with pytest.raises(ServeError, match="--node-rank: 2 is not a node"):
        node_args(parse_serve_args([*argv[:-1], "2", "--data-parallel-address", "x"]), plan)


def test_a_headless_worker_runs_vllms_headless_launcher_not_the_api_server() -> None:
    from npu_runtime.contract import ServeOptions
    from npu_runtime.serving import launch

    options = ServeOptions(model="/m")
    worker = launch.engine_argv(options, ("--data-parallel-size-local", "2", "--headless"), python="py")
    leader = launch.engine_argv(options, ("--data-parallel-size-local", "2"), python="py")
    assert worker[:3] == ["py", "-m", "npu_runtime.serving.headless"]
    assert leader[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]


def test_the_headless_entry_point_refuses_to_start_an_api_server() -> None:
    # In a child interpreter: importing vLLM (and torch) here would leak into other tests.
    out = subprocess.run(
        [sys.executable, "-m", "npu_runtime.serving.headless", "--model", "/m"],
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    if "No module named 'vllm'" in out.stderr:
        pytest.skip("vLLM is not installed")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--headless is required" in out.stderr

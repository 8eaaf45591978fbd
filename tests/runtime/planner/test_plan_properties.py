"""Properties of every plan (hypothesis), as issue 3 lists them."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from npu_runtime.contract import GRAPH_MODES, PlanOptions
from npu_runtime.planner import sizes
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.plan import DoesNotFitError, Plan, PlanError, make_plan
from npu_runtime.planner.probe import DeviceInfo

from tests.runtime.conftest import GIB, MODEL_NAMES, load_model

MODELS = {name: load_model(name) for name in MODEL_NAMES}
NPU_NAMES = ("Ascend910B3", "Ascend910B4", "Ascend910_9392", "Ascend310P3", "Ascend950PR")


@st.composite
def cases(draw: st.DrawFn) -> tuple[PlanOptions, DeviceInfo, ModelInfo, dict[str, str]]:
    model = MODELS[draw(st.sampled_from(MODEL_NAMES))]
    kind = draw(st.sampled_from(("npu", "npu", "npu", "cuda", "cpu")))
    name = {"npu": draw(st.sampled_from(NPU_NAMES)), "cuda": "NVIDIA H200", "cpu": "cpu"}[kind]
    divisors = [t for t in (1, 2, 4, 8) if model.num_attention_heads % t == 0]
    tp = 1 if kind == "cpu" else draw(st.sampled_from(divisors))
    spec = draw(st.sampled_from((0, 0, 0, 1, 2, 3)))
    # Memory from a bit below the weights' share to many times it, so that most cases fit.
    share = model.weight_bytes // tp
    memory = draw(st.integers(share * 9 // 10, share * 6 + 64 * GIB))
    options = PlanOptions(
        graph_mode=draw(st.sampled_from(GRAPH_MODES)),
        max_num_seqs=draw(st.integers(1, 1024)),
        max_model_len=draw(st.integers(64, min(model.max_position_embeddings, 32768))),
        tensor_parallel=tp,
        speculative_method="mtp" if spec else None,
        speculative_tokens=spec,
        stream_budget=draw(st.one_of(st.none(), st.integers(1, 2048))),
        gpu_memory_utilization=draw(st.sampled_from((0.5, 0.8, 0.9, 0.95))),
        dtype="float16" if "310P" in name else "auto",
    )
    device = DeviceInfo(kind, name, 8, memory, None, "override")
    env = {"HCCL_OP_EXPANSION_MODE": "AIV"} if draw(st.booleans()) else {}
    return options, device, model, env


def try_plan(options: PlanOptions, device: DeviceInfo, model: ModelInfo, env: dict[str, str]) -> Plan | None:
    try:
        return make_plan(options, device, model, environ=env)
    except (DoesNotFitError, PlanError):
        return None


PROPERTY_SETTINGS: dict[str, Any] = {
    "max_examples": 300,
    "deadline": None,
    "suppress_health_check": [HealthCheck.filter_too_much, HealthCheck.too_slow],
}


@settings(**PROPERTY_SETTINGS)
@given(cases())
def test_every_plan(case: tuple[PlanOptions, DeviceInfo, ModelInfo, dict[str, str]]) -> None:
    options = case[0]
    plan = try_plan(*case)
    assume(plan is not None)
    assert plan is not None
    captured = plan.capture_sizes
    q = 1 + options.speculative_tokens
    ceiling = options.max_num_seqs * q

    # Sizes sorted, unique, positive, none above the ceiling.
    assert list(captured) == sorted(set(captured))
    assert all(0 < s <= ceiling for s in captured)
    if plan.effective_mode != "NONE":
        # The largest equals the ceiling, so every decode batch 1..max_num_seqs has a graph.
        assert captured[-1] == ceiling
        assert not sizes.uncovered(captured, options.max_num_seqs, q)
    else:
        assert captured == ()

    # Memory parts sum to at most the device budget, and the KV cache holds one full sequence.
    m = plan.memory
    parts = m.weights_bytes + m.activation_bytes + m.margin_bytes + m.graph_bytes + m.kv_cache_bytes
    assert parts <= m.budget_bytes <= m.total_bytes
    assert m.kv_cache_bytes >= m.min_kv_cache_bytes
    assert 0 < m.engine_gpu_memory_utilization <= options.gpu_memory_utilization

    # The stream estimate never exceeds the budget.
    assert not plan.streams.applies or plan.streams.estimate <= (plan.streams.budget or 0)


@settings(**PROPERTY_SETTINGS)
@given(cases(), st.integers(1, 512 * GIB))
def test_more_memory_never_removes_a_size(
    case: tuple[PlanOptions, DeviceInfo, ModelInfo, dict[str, str]], extra: int
) -> None:
    options, device, model, env = case
    smaller = try_plan(*case)
    assume(smaller is not None)
    assert smaller is not None
    larger = try_plan(options, dataclasses.replace(device, total_bytes=device.total_bytes + extra), model, env)
    assert larger is not None  # what fits in less memory fits in more
    assert set(smaller.capture_sizes) <= set(larger.capture_sizes)


def test_every_max_num_seqs_up_to_1024_is_covered() -> None:
    model = MODELS["qwen3-30b-a3b"]
    device = DeviceInfo("npu", "Ascend910B3", 8, 64 * GIB, None, "override")
    for max_num_seqs in range(1, 1025):
        plan = make_plan(PlanOptions(max_num_seqs=max_num_seqs, max_model_len=4096, tensor_parallel=2), device, model)
        assert plan.capture_sizes[-1] == max_num_seqs, max_num_seqs
        assert plan.eager_decode_batches is None


MOE_MODELS = [name for name in MODEL_NAMES if MODELS[name].is_moe]
ROOMY = 4096 * GIB  # enough for any fixture on one device: the properties compare plans, not fits


def moe_plan(model: ModelInfo, **options: Any) -> Plan:
    device = DeviceInfo("npu", "Ascend910_9392", 32, ROOMY, None, "override")
    return make_plan(PlanOptions(**options), device, model, environ={"HCCL_OP_EXPANSION_MODE": "AIV"})


@settings(**{**PROPERTY_SETTINGS, "max_examples": 150})
@given(
    name=st.sampled_from(MOE_MODELS),
    dp=st.sampled_from((1, 2, 4, 8)),
    tp=st.sampled_from((1, 2, 4)),
    mtp=st.booleans(),
)
def test_expert_parallel_never_increases_weights_per_device(name: str, dp: int, tp: int, mtp: bool) -> None:
    """Where the EP size divides the experts (vLLM's determine_expert_map then gives every rank the
    same count), whole experts per rank never weigh more than every expert tensor-sliced."""
    model = MODELS[name]
    assume(model.num_attention_heads % tp == 0 and model.num_experts and model.num_experts % (dp * tp) == 0)
    spec: dict[str, Any] = {"speculative_method": "mtp", "speculative_tokens": 1} if mtp else {}
    common = {"data_parallel": dp, "tensor_parallel": tp, "max_model_len": 4096, "max_num_seqs": 16, **spec}
    with_ep = moe_plan(model, enable_expert_parallel=True, **common)
    without = moe_plan(model, **common)
    assert with_ep.memory.weights_bytes <= without.memory.weights_bytes


@settings(**{**PROPERTY_SETTINGS, "max_examples": 150})
@given(
    name=st.sampled_from(MODEL_NAMES),
    local=st.sampled_from((1, 2, 4)),
    tp=st.sampled_from((1, 2, 4)),
    nodes=st.integers(1, 4),
    ep=st.booleans(),
    memory=st.integers(24, 160),
)
def test_more_nodes_never_remove_a_capture_size(
    name: str, local: int, tp: int, nodes: int, ep: bool, memory: int
) -> None:
    """Per-node layout fixed (DP ranks per node x TP), one more node: the experts spread over more
    ranks and nothing else grows, so every capture size stays. From DP 1 to DP 2 the replica gains
    its DP and EP communication groups, which cost memory and streams: that step is excluded."""
    model = MODELS[name]
    assume(model.num_attention_heads % tp == 0 and local * tp <= 16 and local * nodes >= 2)
    device = DeviceInfo("npu", "Ascend910_9392", 16, memory * GIB, None, "override")

    def sizes_for(n: int) -> tuple[int, ...] | None:
        options = PlanOptions(
            nodes=n,
            data_parallel=local * n,
            tensor_parallel=tp,
            enable_expert_parallel=ep,
            max_model_len=4096,
            max_num_seqs=64,
        )
        plan = try_plan(options, device, model, {"HCCL_OP_EXPANSION_MODE": "AIV"})
        return plan.capture_sizes if plan else None

    fewer, more = sizes_for(nodes), sizes_for(nodes + 1)
    if fewer is not None:
        assert more is not None, "a layout that fits stops fitting with one more node"
        assert set(fewer) <= set(more)

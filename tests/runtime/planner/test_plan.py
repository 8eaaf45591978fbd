"""make_plan: the behaviours issue 3 asks for, one by one."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from npu_runtime import cli
from npu_runtime.contract import ASCEND_RECOMMENDED_ENV, MIB, PlanOptions, ServeOptions
from npu_runtime.planner import sizes
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.plan import DoesNotFitError, Plan, PlanError, make_plan, plan_for
from npu_runtime.planner.probe import DeviceInfo, probe_device
from npu_runtime.serving import failures
from npu_runtime.serving.serve import ServeError, make_serve_plan

from tests.runtime.conftest import DEVICES, FIXTURES, GIB, POD_ENV

NPU = DEVICES["910B3-64GiB"]
GPU = DEVICES["GPU-141GiB"]
CPU = DEVICES["CPU-64GiB"]


def plan(model: ModelInfo, device: DeviceInfo = NPU, env: dict[str, str] | None = None, **options: Any) -> Plan:
    return make_plan(PlanOptions(**options), device, model, environ=POD_ENV if env is None else env)


def compilation_config(p: Plan) -> dict[str, object]:
    args = list(p.vllm_args)
    loaded: dict[str, object] = json.loads(args[args.index("--compilation-config") + 1])
    return loaded


class TestCaptureSizes:
    def test_off_grid_max_num_seqs_is_captured(self, models: dict[str, ModelInfo]) -> None:
        # vllm-ascend #16049: the default list stops at 8 for max_num_seqs=12.
        p = plan(models["qwen3-30b-a3b"], tensor_parallel=4, max_num_seqs=12)
        assert p.capture_sizes == (1, 2, 4, 8, 12)
        assert p.eager_decode_batches is None
        assert compilation_config(p) == {
            "cudagraph_mode": "FULL_DECODE_ONLY",
            "cudagraph_capture_sizes": [1, 2, 4, 8, 12],
        }

    def test_speculative_decoding_multiplies_the_batch(self, models: dict[str, ModelInfo]) -> None:
        p = plan(
            models["deepseek-v2-lite"],
            tensor_parallel=2,
            max_num_seqs=12,
            speculative_method="mtp",
            speculative_tokens=1,
        )
        assert p.decode_query_len == 2
        assert p.capture_sizes == (2, 4, 8, 16, 24)
        args = list(p.vllm_args)
        assert json.loads(args[args.index("--speculative-config") + 1]) == {
            "method": "mtp",
            "num_speculative_tokens": 1,
        }

    def test_the_draft_model_reaches_the_speculative_config(self, models: dict[str, ModelInfo]) -> None:
        p = plan(
            models["llama-3.1-8b"],
            max_num_seqs=12,
            max_model_len=4096,
            speculative_method="eagle",
            speculative_tokens=2,
            speculative_model="/models/eagle-llama-3.1-8b",
        )
        args = list(p.vllm_args)
        assert json.loads(args[args.index("--speculative-config") + 1]) == {
            "method": "eagle",
            "num_speculative_tokens": 2,
            "model": "/models/eagle-llama-3.1-8b",
        }

    def test_explicit_sizes_are_kept(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], max_num_seqs=64, capture_sizes=(1, 16, 64))
        assert p.capture_sizes == (1, 16, 64)

    def test_explicit_sizes_below_max_num_seqs_leave_batches_eager(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], max_num_seqs=64, capture_sizes=(1, 2, 4, 8))
        assert p.eager_decode_batches == (9, 64)
        assert any("9..64 requests" in w for w in p.warnings)

    def test_lower_max_capture_size_is_the_ceiling(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], max_num_seqs=300, max_capture_size=100)
        assert p.capture_sizes[-1] == 100 == p.max_capture_size
        assert p.eager_decode_batches == (101, 300)

    def test_max_num_batched_tokens_holds_the_largest_size(self, models: dict[str, ModelInfo]) -> None:
        p = plan(
            models["qwen2.5-7b"],
            device=GPU,
            max_num_seqs=1024,
            speculative_method="ngram",
            speculative_tokens=3,
        )
        assert p.capture_sizes[-1] == 4096 <= p.max_num_batched_tokens
        assert p.eager_decode_batches is None


class TestModes:
    def test_cpu_runs_eagerly(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], device=CPU, max_model_len=4096)
        assert (p.effective_mode, p.capture_sizes) == ("NONE", ())
        assert [d.reason for d in p.downgrades] == ["CpuHasNoGraphs"]
        assert "--enforce-eager" in p.vllm_args
        assert compilation_config(p) == {"cudagraph_mode": "NONE"}

    def test_cpu_kv_cache_space(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], device=CPU, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, max_model_len=4096)
        assert p.memory.kv_cache_bytes == GIB
        with pytest.raises(DoesNotFitError, match="VLLM_CPU_KVCACHE_SPACE=1"):
            plan(models["qwen2.5-7b"], device=CPU, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, max_model_len=32768)

    def test_engine_resolves_mode(self, models: dict[str, ModelInfo]) -> None:
        p = make_plan(PlanOptions(max_model_len=4096, max_num_seqs=12), CPU, models["qwen2.5-7b"], resolve_mode=False)
        assert (p.requested_mode, p.effective_mode, p.mode_resolved_by) == ("FULL_DECODE_ONLY",) * 2 + ("engine",)
        assert p.downgrades == ()
        assert p.capture_sizes == (1, 2, 4, 8, 12)
        assert "--enforce-eager" not in p.vllm_args
        assert any("expected to downgrade" in w and "CpuHasNoGraphs" in w for w in p.warnings)

    def test_engine_resolves_mode_even_when_graphs_do_not_fit(self, models: dict[str, ModelInfo]) -> None:
        options = PlanOptions(graph_mode="PIECEWISE", stream_budget=20, max_model_len=4096)
        p = make_plan(options, NPU, models["qwen2.5-7b"], resolve_mode=False, environ=POD_ENV)
        assert (p.effective_mode, p.capture_sizes) == ("PIECEWISE", (256,))
        assert any("not even the largest capture size fits the stream budget" in w for w in p.warnings)

    def test_mla_full_request_on_npu(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["deepseek-v2-lite"], graph_mode="FULL", tensor_parallel=2)
        assert p.effective_mode == "FULL_DECODE_ONLY"
        assert [d.reason for d in p.downgrades] == ["MlaNoMixedBatchGraphs"]


class TestStreams:
    def test_no_release_enforces_a_stream_budget(self, models: dict[str, ModelInfo]) -> None:
        # update_aclgraph_sizes is absent from vllm-ascend v0.21.0rc1 on (releases.RULES): no cap.
        for release in ("0.23.0", "0.25.1rc1"):
            p = plan(
                models["llama-3.1-70b"],
                env={},
                graph_mode="PIECEWISE",
                tensor_parallel=8,
                max_model_len=8192,
                engine_release=release,
            )
            assert (p.streams.applies, p.streams.budget, p.streams.enforced_by) == (False, None, "none")
            assert p.capture_sizes == sizes.covering_sizes(256, 1, 256)
            assert not any("stream budget" in w for w in p.warnings)

    def test_piecewise_is_thinned_to_the_stream_budget(self, models: dict[str, ModelInfo]) -> None:
        # Non-AIV HCCL, TP 8, 80 layers: (80 + 1) x (1 + 2) = 243 streams per size, 40 up front.
        p = plan(
            models["llama-3.1-70b"],
            env={},
            graph_mode="PIECEWISE",
            tensor_parallel=8,
            max_model_len=8192,
            stream_budget=1800,
        )
        assert p.streams.enforced_by == "user (--stream-budget)"
        assert (p.streams.per_size, p.streams.fixed) == (243, 40)
        assert len(p.capture_sizes) == (1800 - 40) // 243 == 7
        assert p.capture_sizes[0] == 1
        assert p.capture_sizes[-1] == 256
        assert p.streams.estimate == 40 + 7 * 243 <= (p.streams.budget or 0)
        assert any("stream budget" in w for w in p.warnings)

    def test_aiv_allows_more_sizes(self, models: dict[str, ModelInfo]) -> None:
        p = plan(
            models["llama-3.1-70b"], graph_mode="PIECEWISE", tensor_parallel=8, max_model_len=8192, stream_budget=1800
        )
        assert p.streams.hccl_op_expansion_mode == "AIV"
        assert len(p.capture_sizes) == (1800 - 2 * 81) // (2 * 81) == 10

    def test_full_decode_only_costs_about_one_stream_per_size(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["llama-3.1-70b"], tensor_parallel=8, max_model_len=8192, stream_budget=1800)
        assert p.streams.per_size == 2  # one graph x (1 + one TP group)
        assert p.capture_sizes == sizes.covering_sizes(256, 1, 256)  # nothing thinned

    def test_a_shared_npu_gets_fewer_streams(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], graph_mode="FULL_AND_PIECEWISE", stream_budget=10, max_model_len=4096)
        assert p.effective_mode == "FULL_DECODE_ONLY"
        assert [d.reason for d in p.downgrades] == ["StreamBudgetExceeded"]
        assert p.streams.estimate <= 10

    def test_piecewise_without_streams_runs_eagerly(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], graph_mode="PIECEWISE", stream_budget=20, max_model_len=4096)
        assert (p.effective_mode, p.capture_sizes, p.streams.estimate) == ("NONE", (), 0)


class TestDevices:
    def test_310p(self, models: dict[str, ModelInfo]) -> None:
        p310 = DEVICES["310P-44GiB"]
        p = plan(models["qwen2.5-7b"], device=p310, tensor_parallel=2, max_model_len=4096)
        assert p.dtype == "float16"
        assert "float16" in p.vllm_args
        assert len(p.capture_sizes) == 2  # the 310P guide's graph limit with TP > 1
        assert plan(models["qwen2.5-7b"], device=p310, max_model_len=4096).capture_sizes[-1] == 256
        with pytest.raises(PlanError) as mla:
            plan(models["deepseek-v2-lite"], device=p310)
        assert mla.value.field == "model"
        with pytest.raises(PlanError) as bf16:
            plan(models["qwen2.5-7b"], device=p310, dtype="bfloat16")
        assert bf16.value.field == "dtype"

    @pytest.mark.parametrize(("given", "resolved"), [("bf16", "bfloat16"), ("half", "float16"), ("float", "float32")])
    def test_dtype_aliases_resolve_before_they_are_checked(
        self, models: dict[str, ModelInfo], given: str, resolved: str
    ) -> None:
        p = plan(models["qwen2.5-7b"], device=GPU, dtype=given, max_model_len=4096)
        assert p.dtype == resolved
        assert p.vllm_args[p.vllm_args.index("--dtype") + 1] == resolved
        if resolved == "bfloat16":
            with pytest.raises(PlanError) as on_310p:
                plan(models["qwen2.5-7b"], device=DEVICES["310P-44GiB"], dtype=given)
            assert on_310p.value.field == "dtype"

    def test_310p_mask_is_counted(self, models: dict[str, ModelInfo]) -> None:
        p310 = DEVICES["310P-44GiB"]
        short = plan(models["qwen2.5-7b"], device=p310, max_model_len=4096)
        long = plan(models["qwen2.5-7b"], device=p310, max_model_len=32768)
        assert long.memory.activation_bytes - short.memory.activation_bytes == 2 * (32768**2 - 4096**2)
        derived = plan(models["qwen2.5-7b"], device=p310, tensor_parallel=4)  # 131072 tokens: a 32 GiB mask
        assert any("set --max-model-len explicitly" in w and "32.00 GiB" in w for w in derived.warnings)

    def test_950_piecewise_keeps_four_sizes(self, models: dict[str, ModelInfo]) -> None:
        a5 = DeviceInfo("npu", "Ascend950PR", 8, 128 * GIB, None, "override")
        p = plan(models["qwen2.5-7b"], device=a5, graph_mode="PIECEWISE", max_model_len=4096)
        assert len(p.capture_sizes) == 4

    def test_graph_memory_is_reserved_by_lowering_utilisation_on_npu(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], max_model_len=4096)
        assert p.memory.graph_reserved_by == "plan"
        expected = math.floor((p.memory.budget_bytes - p.memory.graph_bytes) / p.memory.total_bytes * 1e4) / 1e4
        assert p.memory.engine_gpu_memory_utilization == expected < 0.9
        assert f"{expected:g}" in p.vllm_args

    def test_vllm_reserves_its_own_graph_memory_on_cuda(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], device=GPU, max_model_len=4096)
        assert (p.memory.graph_reserved_by, p.memory.engine_gpu_memory_utilization) == ("engine", 0.9)
        off = plan(models["qwen2.5-7b"], device=GPU, env={"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"})
        assert off.memory.graph_reserved_by == "plan"


class TestMemory:
    def test_parts_fill_the_budget(self, models: dict[str, ModelInfo]) -> None:
        m = plan(models["llama-3.1-70b"], tensor_parallel=4).memory
        parts = m.weights_bytes + m.activation_bytes + m.margin_bytes + m.graph_bytes + m.kv_cache_bytes
        assert parts == m.budget_bytes == math.floor(64 * GIB * 0.9)
        assert m.kv_cache_bytes >= m.min_kv_cache_bytes

    def test_tight_memory_thins_sizes(self, models: dict[str, ModelInfo]) -> None:
        model = models["qwen2.5-7b"]
        roomy = plan(model, max_num_seqs=256, max_model_len=4096).memory
        # Leave room for the first graph and three more sizes only.
        need = roomy.weights_bytes + roomy.activation_bytes + roomy.margin_bytes + roomy.min_kv_cache_bytes
        need += roomy.graph_first_capture_bytes + 3 * roomy.graph_per_size_bytes
        tight = dataclasses.replace(NPU, total_bytes=math.ceil(need / 0.9) + 1)
        p = plan(model, device=tight, max_num_seqs=256, max_model_len=4096)
        assert len(p.capture_sizes) == 4
        assert (p.capture_sizes[0], p.capture_sizes[-1]) == (1, 256)
        assert any("thinned" in w and "device memory" in w for w in p.warnings)

    def test_no_room_for_the_largest_graph_downgrades(self, models: dict[str, ModelInfo]) -> None:
        model = models["qwen2.5-7b"]
        roomy = plan(model, max_num_seqs=256, max_model_len=4096).memory
        need = roomy.weights_bytes + roomy.activation_bytes + roomy.margin_bytes + roomy.min_kv_cache_bytes
        tight = dataclasses.replace(NPU, total_bytes=math.ceil((need + 1) / 0.9) + 1)
        p = plan(model, device=tight, max_num_seqs=256, max_model_len=4096)
        assert (p.effective_mode, p.capture_sizes) == ("NONE", ())
        assert [d.reason for d in p.downgrades] == ["GraphMemoryExceedsBudget"]
        assert "--enforce-eager" in p.vllm_args

    def test_full_and_piecewise_without_room_for_its_graphs_runs_eagerly(self, models: dict[str, ModelInfo]) -> None:
        # Not FULL_DECODE_ONLY, although its first capture costs half: just below FULL_AND_PIECEWISE's
        # first capture that would keep dozens of sizes, and a MiB more brings FULL_AND_PIECEWISE back
        # with one size, so more memory would remove sizes (test_plan_properties' monotonicity).
        model = models["qwen2.5-7b"]
        options: dict[str, Any] = {"graph_mode": "FULL_AND_PIECEWISE", "max_num_seqs": 256, "max_model_len": 4096}
        roomy = plan(model, **options).memory
        need = roomy.weights_bytes + roomy.activation_bytes + roomy.margin_bytes + roomy.min_kv_cache_bytes
        need += roomy.graph_first_capture_bytes
        below = plan(model, device=dataclasses.replace(NPU, total_bytes=math.floor((need - MIB) / 0.9)), **options)
        above = plan(model, device=dataclasses.replace(NPU, total_bytes=math.ceil((need + MIB) / 0.9)), **options)
        assert (below.effective_mode, below.capture_sizes) == ("NONE", ())
        assert [d.reason for d in below.downgrades] == ["GraphMemoryExceedsBudget"]
        assert (above.effective_mode, above.capture_sizes) == ("FULL_AND_PIECEWISE", (256,))
        assert set(below.capture_sizes) <= set(above.capture_sizes)

    def test_weights_alone_do_not_fit(self, models: dict[str, ModelInfo]) -> None:
        with pytest.raises(DoesNotFitError, match=r"135\.43 GiB per device .* > 32\.00 GiB.*tensor parallel 8"):
            plan(models["qwen2.5-72b-instruct"], device=DEVICES["910B4-32GiB"])

    def test_no_room_for_one_sequence(self, models: dict[str, ModelInfo]) -> None:
        # 131072 tokens of Llama-3.1-8B KV cache take 16 GiB; about 12 GiB are left on a 32 GiB 910B4.
        with pytest.raises(DoesNotFitError, match=r"one 131072-token sequence.*lower --max-model-len"):
            plan(models["llama-3.1-8b"], device=DEVICES["910B4-32GiB"])

    def test_free_memory_below_the_request(self, models: dict[str, ModelInfo]) -> None:
        busy = dataclasses.replace(NPU, free_bytes=20 * GIB)
        with pytest.raises(DoesNotFitError, match="free device memory"):
            plan(models["qwen2.5-7b"], device=busy, max_model_len=4096)

    def test_checkpoint_dtype_differs_from_the_run_dtype(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["qwen2.5-7b"], dtype="float32", max_model_len=4096, device=GPU)
        assert p.memory.weights_bytes == 2 * models["qwen2.5-7b"].weight_bytes


class TestInvalidInput:
    @pytest.mark.parametrize(
        ("options", "field"),
        [
            ({"capture_sizes": (4, 2)}, "capture_sizes"),
            ({"capture_sizes": (1, 512), "max_num_seqs": 256}, "capture_sizes"),
            ({"capture_sizes": (1, 8), "max_capture_size": 16}, "max_capture_size"),
            ({"speculative_tokens": 2}, "speculative_method"),
            ({"speculative_method": "mtp"}, "speculative_tokens"),
            (
                {"speculative_method": "mtp", "speculative_tokens": 1, "max_capture_size": 9},
                "max_capture_size",
            ),
            ({"tensor_parallel": 8}, "tensor_parallel"),  # 28 heads
            ({"tensor_parallel": 4, "data_parallel": 4}, "tensor_parallel"),  # 16 > 8 devices
            ({"max_model_len": 10**6}, "max_model_len"),
            ({"graph_mode": "SOMETIMES"}, "graph_mode"),
            ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
            ({"stream_budget": 0}, "stream_budget"),
        ],
    )
    def test_field_is_named(self, models: dict[str, ModelInfo], options: dict[str, Any], field: str) -> None:
        with pytest.raises(PlanError) as caught:
            plan(models["qwen2.5-7b"], **options)
        assert caught.value.field == field
        assert str(caught.value).startswith(f"{field}: ")

    def test_long_context_allowed_by_env(self, models: dict[str, ModelInfo]) -> None:
        p = plan(models["llava-1.5-7b"], env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, max_model_len=8192)
        assert p.max_model_len == 8192

    def test_ascend_launch_blocking(self, models: dict[str, ModelInfo]) -> None:
        with pytest.raises(PlanError) as caught:
            plan(models["qwen2.5-7b"], env={"ASCEND_LAUNCH_BLOCKING": "1"})
        assert caught.value.field == "ASCEND_LAUNCH_BLOCKING"


def test_json_contract(models: dict[str, ModelInfo]) -> None:
    data = json.loads(json.dumps(plan(models["deepseek-v2-lite"], tensor_parallel=2).to_dict()))
    for key in (
        "requested_mode",
        "effective_mode",
        "capture_sizes",
        "downgrades",
        "memory",
        "vllm_args",
        "warnings",
    ):
        assert key in data
    for key in ("total_bytes", "weights_bytes", "kv_cache_bytes", "graph_bytes", "activation_bytes"):
        assert isinstance(data["memory"][key], int)
    assert all(isinstance(s, int) for s in data["capture_sizes"])
    assert all(isinstance(a, str) for a in data["vllm_args"])
    for forbidden in ("--model", "--port", "--host"):
        assert forbidden not in data["vllm_args"]
    cpu = plan(models["qwen2.5-7b"], device=CPU, max_model_len=4096).to_dict()
    assert set(cpu["downgrades"][0]) == {"from_mode", "to_mode", "reason", "message"}


class TestServePlan:
    """serve's seam to the planner (`make_serve_plan`): the same plan_for, its errors as one-line causes."""

    NPU_OVERRIDES: dict[str, Any] = {"device_kind": "npu", "device_name": "Ascend910B3", "device_memory": 64 * GIB}

    @staticmethod
    def serve_plan(model: Path, environ: dict[str, str] | None = None, **options: Any) -> Plan:
        return make_serve_plan(ServeOptions(model=str(model), plan=PlanOptions(**options)), environ=environ or {})

    @staticmethod
    def serve_error(model: Path, **options: Any) -> ServeError:
        with pytest.raises(ServeError) as caught:
            TestServePlan.serve_plan(model, **options)
        return caught.value

    def test_flashcomm1_and_fused_mc2_come_from_the_additional_config(self) -> None:
        # vllm_ascend/ascend_config.py _get_config_value: the additional config first, then the environment.
        options = PlanOptions(tensor_parallel=4, max_num_seqs=64, **self.NPU_OVERRIDES)
        config = '{"enable_flashcomm1": true, "enable_fused_mc2": 1}'
        served = make_serve_plan(
            ServeOptions(model=str(FIXTURES / "qwen3-32b"), plan=options, additional_config=config), environ={}
        )
        assert served.flashcomm1 and served.capture_sizes[:2] == (4, 8)
        off = make_serve_plan(
            ServeOptions(model=str(FIXTURES / "qwen3-32b"), plan=options, additional_config='{"enable_flashcomm1": 0}'),
            environ={"VLLM_ASCEND_ENABLE_FLASHCOMM1": "1"},
        )
        assert not off.flashcomm1 and off.capture_sizes[:2] == (1, 2)

    def test_a_device_kind_this_machine_lacks_is_invalid_configuration(self) -> None:
        other = next(kind for kind in ("npu", "cuda", "cpu") if kind != probe_device().kind)
        error = self.serve_error(FIXTURES / "qwen2.5-7b", device_kind=other)  # no --device-memory
        assert (error.failure.reason, error.exit_code) == (failures.INVALID_CONFIGURATION, cli.EXIT_INVALID)
        assert error.failure.message.startswith("--device-memory: ")

    def test_a_model_error_is_model_invalid_whatever_the_path_says(self, tmp_path: Path) -> None:
        named = tmp_path / "customer-support-llm"  # "support" in the path is not an unsupported model
        named.mkdir()
        (named / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        error = self.serve_error(named, **self.NPU_OVERRIDES)
        assert (error.failure.reason, error.exit_code) == (failures.MODEL_INVALID, cli.EXIT_INVALID)
        assert "num_hidden_layers" in error.failure.message
        (named / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": ')
        broken = self.serve_error(named, **self.NPU_OVERRIDES)
        assert (broken.failure.reason, broken.exit_code) == (failures.MODEL_INVALID, cli.EXIT_INVALID)
        assert "config.json" in broken.failure.message

    def test_invalid_options_and_no_fit_keep_their_exit_codes(self) -> None:
        invalid = self.serve_error(FIXTURES / "qwen2.5-7b", max_model_len=10**6, **self.NPU_OVERRIDES)
        assert (invalid.failure.reason, invalid.exit_code) == (failures.INVALID_CONFIGURATION, cli.EXIT_INVALID)
        assert invalid.failure.message.startswith("--max-model-len: ")
        small = {**self.NPU_OVERRIDES, "device_memory": 32 * GIB}
        no_fit = self.serve_error(FIXTURES / "qwen2.5-72b-instruct", **small)
        assert (no_fit.failure.reason, no_fit.exit_code) == (failures.MODEL_DOES_NOT_FIT, cli.EXIT_DOES_NOT_FIT)

    def test_the_plan_sees_the_engine_environment(self) -> None:
        # launch.engine_env sets HCCL_OP_EXPANSION_MODE=AIV where the pod leaves it unset; a set value wins.
        options: dict[str, Any] = {
            "graph_mode": "PIECEWISE",
            "tensor_parallel": 8,
            "max_model_len": 8192,
            "stream_budget": 1800,
        }
        model = FIXTURES / "llama-3.1-70b"
        unset = self.serve_plan(model, {}, **options, **self.NPU_OVERRIDES)
        assert unset.streams.hccl_op_expansion_mode == "AIV"
        assert unset == plan_for(
            PlanOptions(**options, **self.NPU_OVERRIDES), str(model), environ=ASCEND_RECOMMENDED_ENV
        )
        chosen = self.serve_plan(model, {"HCCL_OP_EXPANSION_MODE": "HOST"}, **options, **self.NPU_OVERRIDES)
        assert chosen.streams.hccl_op_expansion_mode == "default"
        assert len(chosen.capture_sizes) < len(unset.capture_sizes)

    def test_engine_resolves_mode_reaches_the_plan(self) -> None:
        options = ServeOptions(
            model=str(FIXTURES / "qwen2.5-7b"),
            plan=PlanOptions(device_kind="cpu", device_memory=64 * GIB, max_model_len=4096),
            engine_resolves_mode=True,
        )
        p = make_serve_plan(options, environ={})
        assert (p.mode_resolved_by, p.effective_mode, p.downgrades) == ("engine", "FULL_DECODE_ONLY", ())

"""Graph-mode resolution: one test per rule of the table, and warnings for what it cannot know."""

from __future__ import annotations

import dataclasses

import pytest
from npu_runtime.contract import GRAPH_MODES, GRAPH_MODES_WEAKEST_FIRST, GraphMode, graph_mode_rank
from npu_runtime.planner import modes
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.modes import RULES, Downgrade, resolve_mode
from npu_runtime.planner.probe import DeviceInfo

from tests.runtime.conftest import DEVICES

NPU = DEVICES["910B3-64GiB"]
GPU = DEVICES["GPU-141GiB"]
CPU = DEVICES["CPU-64GiB"]
A100 = DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", 8, 80 << 30, None, "override")


def test_every_rule_names_its_source_and_a_camelcase_reason() -> None:
    reasons = [rule.reason for rule in RULES]
    assert len(set(reasons)) == len(reasons)
    for rule in RULES:
        assert rule.reason[0].isupper()
        assert "_" not in rule.reason
        assert " " not in rule.reason
        assert ".py" in rule.source or "#" in rule.source


def test_the_mode_tables_know_every_graph_mode() -> None:
    # The CLI's choices (contract.GRAPH_MODES) and the tables' keys must be the same names.
    assert set(modes._DECODE) == set(modes._MIXED) == set(GRAPH_MODES)
    assert set(modes._WITHOUT_PIECEWISE) | set(modes._WITHOUT_PIECEWISE.values()) <= set(GRAPH_MODES)


def test_one_mode_type_ranks_the_modes_weakest_first() -> None:
    # The status's effective mode is the worst rank's: the order is the one definition in contract.GraphMode.
    assert GRAPH_MODES_WEAKEST_FIRST == ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL", "FULL_AND_PIECEWISE")
    assert set(GRAPH_MODES_WEAKEST_FIRST) == set(GRAPH_MODES) == {mode.value for mode in GraphMode}
    assert [graph_mode_rank(m) for m in GRAPH_MODES_WEAKEST_FIRST] == [0, 1, 2, 3, 4]
    assert graph_mode_rank("EAGER") == graph_mode_rank(None) == -1
    assert (modes.NONE, modes.PIECEWISE, modes.FULL_DECODE_ONLY, modes.FULL, modes.FULL_AND_PIECEWISE) == (
        GRAPH_MODES_WEAKEST_FIRST
    )
    assert all(type(m) is str for m in (modes.NONE, *GRAPH_MODES, *GRAPH_MODES_WEAKEST_FIRST))  # plain in JSON/YAML


def test_decode_graphs_and_dropping_piecewise_follow_cudagraphmode() -> None:
    assert [m for m in GRAPH_MODES if modes.decode_mode_is_graph(m)] == [
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
        "FULL",
        "PIECEWISE",
    ]
    assert {m: modes.without_piecewise(m) for m in GRAPH_MODES} == {
        "FULL_DECODE_ONLY": "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE": "FULL_DECODE_ONLY",
        "FULL": "FULL",
        "PIECEWISE": "NONE",
        "NONE": "NONE",
    }
    for mode in GRAPH_MODES:
        assert not modes.has_piecewise_graphs(modes.without_piecewise(mode))


@pytest.mark.parametrize("mode", [m for m in GRAPH_MODES if m != "NONE"])
def test_cpu_has_no_graphs(models: dict[str, ModelInfo], mode: str) -> None:
    effective, downgrades, _ = resolve_mode(mode, device=CPU, model=models["qwen2.5-7b"])
    assert effective == "NONE"
    assert [d.reason for d in downgrades] == ["CpuHasNoGraphs"]
    assert downgrades[0].from_mode == mode


def test_none_stays_none_without_a_downgrade(models: dict[str, ModelInfo]) -> None:
    assert resolve_mode("NONE", device=CPU, model=models["qwen2.5-7b"]) == ("NONE", (), ())


def test_enforce_eager(models: dict[str, ModelInfo]) -> None:
    effective, downgrades, _ = resolve_mode(
        "FULL_DECODE_ONLY", device=NPU, model=models["qwen2.5-7b"], enforce_eager=True
    )
    assert (effective, downgrades[0].reason) == ("NONE", "EnforceEager")


def test_full_decode_only_is_kept_for_dense_and_mla_on_npu(models: dict[str, ModelInfo]) -> None:
    for name in ("qwen2.5-7b", "deepseek-v2-lite", "qwen3-30b-a3b", "llava-1.5-7b"):
        assert resolve_mode("FULL_DECODE_ONLY", device=NPU, model=models[name]) == (
            "FULL_DECODE_ONLY",
            (),
            (),
        )


@pytest.mark.parametrize(("device", "expected"), [(NPU, "FULL_DECODE_ONLY"), (GPU, "FULL_AND_PIECEWISE")])
def test_mla_full_loses_mixed_batch_graphs(models: dict[str, ModelInfo], device: DeviceInfo, expected: str) -> None:
    effective, downgrades, _ = resolve_mode("FULL", device=device, model=models["deepseek-v2-lite"])
    assert effective == expected
    assert downgrades == (Downgrade("FULL", expected, "MlaNoMixedBatchGraphs", downgrades[0].message),)


def test_fa2_gpus_lose_mixed_batch_graphs_fa3_keeps_them(models: dict[str, ModelInfo]) -> None:
    assert resolve_mode("FULL", device=A100, model=models["llama-3.1-8b"])[0] == "FULL_AND_PIECEWISE"
    assert resolve_mode("FULL", device=GPU, model=models["llama-3.1-8b"]) == ("FULL", (), ())


def test_encoder_decoder(models: dict[str, ModelInfo]) -> None:
    t5 = dataclasses.replace(models["qwen2.5-7b"], is_encoder_decoder=True)
    on_npu = resolve_mode("FULL_DECODE_ONLY", device=NPU, model=t5)
    assert (on_npu[0], on_npu[1][0].reason) == ("PIECEWISE", "EncoderDecoderPiecewiseOnly")
    assert resolve_mode("FULL_DECODE_ONLY", device=GPU, model=t5)[0] == "FULL_DECODE_ONLY"
    on_gpu = resolve_mode("FULL_AND_PIECEWISE", device=GPU, model=t5)
    assert (on_gpu[0], on_gpu[1][0].reason) == ("FULL_DECODE_ONLY", "EncoderDecoderFullDecodeOnly")


def test_pooling_models_lose_full_graphs(models: dict[str, ModelInfo]) -> None:
    embed = dataclasses.replace(models["qwen2.5-7b"], is_pooling=True)
    effective, downgrades, _ = resolve_mode("FULL_DECODE_ONLY", device=NPU, model=embed)
    assert (effective, downgrades[0].reason) == ("PIECEWISE", "PoolingModelNoFullGraphs")


def test_downgrades_chain_in_engine_order(models: dict[str, ModelInfo]) -> None:
    both = dataclasses.replace(models["qwen2.5-7b"], is_pooling=True, is_encoder_decoder=True)
    effective, downgrades, _ = resolve_mode("FULL", device=NPU, model=both, enforce_eager=False)
    assert effective == "PIECEWISE"
    assert [d.reason for d in downgrades] == ["PoolingModelNoFullGraphs"]
    assert downgrades[0].message.startswith("FULL -> PIECEWISE: ")


class TestUnknownCasesKeepTheModeAndWarn:
    def test_unknown_architecture(self, models: dict[str, ModelInfo]) -> None:
        odd = dataclasses.replace(models["qwen2.5-7b"], architecture="FancyNewForCausalLM")
        effective, downgrades, warnings = resolve_mode("FULL_DECODE_ONLY", device=NPU, model=odd)
        assert (effective, downgrades) == ("FULL_DECODE_ONLY", ())
        assert any("FancyNewForCausalLM" in w for w in warnings)

    def test_unknown_npu_family(self, models: dict[str, ModelInfo]) -> None:
        odd = dataclasses.replace(NPU, name="unknown")
        effective, _, warnings = resolve_mode("FULL_DECODE_ONLY", device=odd, model=models["qwen2.5-7b"])
        assert effective == "FULL_DECODE_ONLY"
        assert any("NPU family unknown" in w for w in warnings)

    def test_unknown_gpu_with_full(self, models: dict[str, ModelInfo]) -> None:
        odd = dataclasses.replace(GPU, name="Mystery GPU")
        effective, _, warnings = resolve_mode("FULL", device=odd, model=models["llama-3.1-8b"])
        assert effective == "FULL"
        assert any("AttentionCGSupport.ALWAYS" in w for w in warnings)

    def test_piecewise_on_310p(self, models: dict[str, ModelInfo]) -> None:
        p310 = DEVICES["310P-44GiB"]
        assert resolve_mode("FULL_DECODE_ONLY", device=p310, model=models["qwen2.5-7b"])[2] == ()
        assert resolve_mode("PIECEWISE", device=p310, model=models["qwen2.5-7b"])[2]

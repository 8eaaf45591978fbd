"""Calibration: the record's key, bounds and margin, the capture-failure cap, /status's section, and
the operator's side of the loop (parse, trust rules, merge, ConfigMap)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from npu_operator.kube import names
from npu_operator.status import calibration as status_calibration
from npu_operator.status.reports import parse_report
from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import calibration
from npu_runtime.planner.plan import make_plan, plan_for
from npu_runtime.serving.measured import calibration_section

from tests.runtime.conftest import FIXTURES, load_model

GIB = 1 << 30
R1 = FIXTURES / "deepseek-r1-w8a8"
A3 = ["npu", "Ascend910_9392"]
OPTIONS: dict[str, Any] = {
    "device_kind": "npu",
    "device_name": "Ascend910_9392",
    "device_count": 16,
    "tensor_parallel": 4,
    "data_parallel": 4,
    "enable_expert_parallel": True,
    "max_num_seqs": 16,
    "max_model_len": 16384,
    "max_num_batched_tokens": 4096,
    "gpu_memory_utilization": 0.92,
}
AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}


def first_plan() -> Any:
    return plan_for(PlanOptions(**OPTIONS), str(R1), environ=AIV)


def write_record(tmp_path: Path, record: dict[str, Any]) -> str:
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    return str(path)


def record_for(plan: Any, measured: dict[str, int], failure: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schema": 1, "key": plan.calibration["key"], "measured": measured, "capture_failure": failure}


def test_the_key_names_model_quantization_device_layout_and_engine(tmp_path: Path) -> None:
    key = first_plan().calibration["key"]
    assert key["layout"] == "tp4-pp1-dp4-ep16-nodes1"
    assert (key["quantization"], key["device_name"]) == ("ascend", "Ascend910_9392")
    assert key["engine"] == calibration.engine_release()
    assert key["config_digest"] == calibration.config_digest(str(R1))
    changed = tmp_path / "model"
    shutil.copytree(R1, changed)
    description = json.loads((changed / "quant_model_description.json").read_text())
    description["model.layers.3.mlp.gate.weight"] = "FLOAT "  # any byte of the description changes the key
    (changed / "quant_model_description.json").write_text(json.dumps(description))
    assert calibration.config_digest(str(changed)) != key["config_digest"]


def test_measured_figures_plus_the_margin_replace_the_estimates(tmp_path: Path) -> None:
    plan = first_plan()
    measured = {"weights_bytes": 46 * GIB, "graph_first_capture_bytes": 300 << 20, "graph_per_size_bytes": 8 << 20}
    path = write_record(tmp_path, record_for(plan, measured))
    calibrated = plan_for(PlanOptions(**OPTIONS, calibration=path), str(R1), environ=AIV)
    assert calibrated.calibration["record"] == "applied"
    assert calibrated.memory.weights_bytes == math.ceil(46 * GIB * 1.1)
    assert calibrated.memory.weights_source == "calibration"
    assert calibrated.memory.graph_first_capture_bytes == math.ceil((300 << 20) * 1.1)
    assert calibrated.memory.graph_per_size_bytes == math.ceil((8 << 20) * 1.1)
    assert calibrated.memory.kv_cache_tokens < plan.memory.kv_cache_tokens  # what remains, as before


def test_a_measured_kv_cache_gives_back_the_safety_term_and_no_more(tmp_path: Path) -> None:
    # margin.NPU_SAFETY is ours, not the engine's: where the engine allocated more KV cache than the
    # plan estimated, the plan takes up to that term back; where it allocated less, the plan says less.
    plan = first_plan()
    estimate, safety = plan.memory.kv_cache_bytes, 128 << 20

    def calibrated(kv_cache_bytes: int) -> int:
        path = write_record(tmp_path, record_for(plan, {"kv_cache_bytes": kv_cache_bytes}))
        kv: int = plan_for(PlanOptions(**OPTIONS, calibration=path), str(R1), environ=AIV).memory.kv_cache_bytes
        return kv

    assert calibrated(estimate + (64 << 20)) == estimate + (64 << 20)
    assert calibrated(estimate + GIB) == estimate + safety
    assert calibrated(estimate - GIB) == estimate - GIB


def test_a_record_of_another_key_is_ignored_and_said_so(tmp_path: Path) -> None:
    plan = first_plan()
    record = record_for(plan, {"weights_bytes": 50 * GIB})
    record["key"] = {**record["key"], "device_name": "Ascend910B3"}
    other = plan_for(PlanOptions(**OPTIONS, calibration=write_record(tmp_path, record)), str(R1), environ=AIV)
    assert other.calibration["record"] == "other-key"
    assert other.memory.weights_bytes == plan.memory.weights_bytes
    assert any("another key" in w and "Ascend910B3" in w for w in other.warnings)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"measured": {"weights_bytes": True}}, "whole number"),
        ({"measured": {"weights_bytes": -1}}, "whole number"),
        ({"measured": {"weights_bytes": 1 << 50}}, "16 TiB"),
        ({"measured": {"activation": 1}}, "may only hold"),
        ({"capture_failure": {"size": 16, "error_class": "Segfault"}}, "error_class"),
        ({"schema": 2}, "schema"),
    ],
)
def test_records_out_of_bounds_exit_2_naming_calibration(tmp_path: Path, change: dict[str, Any], problem: str) -> None:
    record = {**record_for(first_plan(), {"weights_bytes": GIB}), **change}
    with pytest.raises(PlanError) as refused:
        calibration.load_record(write_record(tmp_path, record))
    assert refused.value.field == "calibration"
    assert problem in refused.value.message


def test_a_record_larger_than_the_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(" " * (calibration.MAX_RECORD_BYTES + 1))
    with pytest.raises(PlanError, match="larger than"):
        calibration.load_record(str(path))
    assert calibration.load_record(str(tmp_path / "absent.json")) is None  # no record yet: estimates


def test_a_record_that_is_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "record.json"
    os.mkfifo(fifo)  # st_size 0: a stat-then-read check would block here forever
    with pytest.raises(PlanError, match="is a FIFO"):
        calibration.load_record(str(fifo))


def test_a_capture_that_failed_caps_the_next_plan_below_it_as_a_downgrade(tmp_path: Path) -> None:
    plan = first_plan()
    assert max(plan.capture_sizes) == 16
    failure = {"size": 16, "error_class": "StreamResourcesExhausted"}
    path = write_record(tmp_path, record_for(plan, {}, failure))
    capped = plan_for(PlanOptions(**OPTIONS, calibration=path), str(R1), environ=AIV)
    assert max(capped.capture_sizes) < 16
    assert capped.calibration["capped_below"] == 16
    [downgrade] = [d for d in capped.downgrades if d.reason == "CaptureFailedBefore"]
    assert (downgrade.from_mode, downgrade.to_mode) == ("FULL_DECODE_ONLY", "FULL_DECODE_ONLY")
    assert "16" in downgrade.message and "StreamResourcesExhausted" in downgrade.message
    # Failing at the smallest size leaves nothing to capture: the plan runs eagerly, it does not loop.
    smallest = write_record(tmp_path, record_for(plan, {}, {"size": 1, "error_class": "GraphCaptureOutOfMemory"}))
    eager = plan_for(PlanOptions(**OPTIONS, calibration=smallest), str(R1), environ=AIV)
    assert (eager.effective_mode, eager.capture_sizes) == ("NONE", ())


def test_without_resolve_mode_a_failure_below_every_size_keeps_the_engine_s_mode(tmp_path: Path) -> None:
    plan = first_plan()
    smallest = write_record(tmp_path, record_for(plan, {}, {"size": 1, "error_class": "GraphCaptureOutOfMemory"}))
    options = PlanOptions(**OPTIONS, calibration=smallest)
    kept = plan_for(options, str(R1), environ=AIV, resolve_mode=False)
    assert kept.effective_mode == "FULL_DECODE_ONLY"  # the engine's to change, never the planner's
    assert kept.capture_sizes == (max(plan.capture_sizes),)  # thinned to the ceiling, as when none fits
    assert kept.calibration["capped_below"] is None
    assert not [d for d in kept.downgrades if d.reason == "CaptureFailedBefore"]
    assert any("GraphCaptureOutOfMemory" in w and "capturing size 1" in w for w in kept.warnings)


def test_status_section_compares_estimated_and_measured() -> None:
    plan = make_plan(PlanOptions(max_num_seqs=8, max_model_len=4096), _a2(), load_model("llama-3.1-8b"), environ=AIV)
    document = plan.to_dict()
    captures = {("FULL_DECODE_ONLY", 8): {"memory_bytes": 80 << 20}, ("FULL_DECODE_ONLY", 4): {"memory_bytes": 2 << 20}}
    memory = {("npu:0", "weights"): 15 * GIB, ("npu:1", "weights"): 16 * GIB, ("plan", "weights"): 1}
    failure = {"reason": "GraphCaptureOutOfMemory", "message": "..."}
    section = calibration_section(document, captures, memory, failure)
    assert section is not None
    assert section["measured"] == {
        "weights_bytes": 16 * GIB,  # the busiest device
        "graph_first_capture_bytes": 80 << 20,
        "graph_per_size_bytes": 2 << 20,
    }
    assert section["ratio"]["weights_bytes"] == round(16 * GIB / plan.memory.weights_bytes, 4)
    assert section["capture_failure"] == {"size": 2, "error_class": "GraphCaptureOutOfMemory"}  # 8, 4 captured
    assert section["key"] == plan.calibration["key"]


def _a2() -> Any:
    from npu_runtime.planner.probe import DeviceInfo

    return DeviceInfo("npu", "Ascend910B3", 8, round(60.96 * GIB), None, "device-table")


# -- the operator's side --------------------------------------------------------------------------------


def section_doc(layout: str = "tp4-pp1-dp4-ep16-nodes1", **changes: Any) -> dict[str, Any]:
    key = {"config_digest": "abc", "quantization": "ascend", "device_name": "A3", "layout": layout, "engine": "vllm"}
    return {
        "key": key,
        "estimated": {"weights_bytes": 40 * GIB},
        "measured": {"weights_bytes": 42 * GIB, "kv_cache_bytes": 9 * GIB},
        "capture_failure": None,
        **changes,
    }


def test_operator_keeps_only_known_bounded_figures() -> None:
    lying = section_doc(measured={"weights_bytes": 1 << 60, "kv_cache_bytes": "9", "budget": 5, "graph_bytes": 7})
    report = parse_report({"state": "ready", "calibration": lying})
    assert report.calibration is not None
    assert report.calibration.measured == {"graph_bytes": 7}
    assert parse_report({"calibration": {"key": "x"}}).calibration is None
    assert status_calibration.ratios(status_calibration.parse_section(section_doc()) or _never()) == {
        "weights_bytes": 1.05
    }


def test_a_report_for_another_layout_is_ignored() -> None:
    section = status_calibration.parse_section(section_doc("tp8-pp1-dp2-ep16-nodes1"))
    assert section is not None
    assert status_calibration.merge_record(None, section, (4, 1, 4, 1)) is None


def test_a_failure_only_lowers_the_cap_and_a_new_key_starts_afresh() -> None:
    failed = status_calibration.parse_section(
        section_doc(capture_failure={"size": 32, "error_class": "GraphCaptureOutOfMemory"})
    )
    assert failed is not None
    record = status_calibration.merge_record(None, failed, (4, 1, 4, 1))
    assert record is not None and record["capture_failure"]["size"] == 32
    bigger = status_calibration.parse_section(
        section_doc(capture_failure={"size": 64, "error_class": "GraphCaptureOutOfMemory"})
    )
    assert bigger is not None
    again = status_calibration.merge_record(record, bigger, (4, 1, 4, 1))
    assert again is not None and again["capture_failure"]["size"] == 32  # a later lie cannot raise it
    other_key = section_doc()
    other_key["key"] = {**other_key["key"], "engine": "vllm-next"}
    fresh_section = status_calibration.parse_section(other_key)
    assert fresh_section is not None
    fresh = status_calibration.merge_record(again, fresh_section, (4, 1, 4, 1))
    assert fresh is not None and fresh["capture_failure"] is None
    # The stored record is one the runtime accepts.
    parsed = calibration.parse_record(json.loads(json.dumps(fresh)))
    assert parsed.measured == {"weights_bytes": 42 * GIB, "kv_cache_bytes": 9 * GIB}


def test_the_configmap_holds_the_record_under_the_resource_name() -> None:
    record = {"schema": 1, "key": {}, "measured": {}, "capture_failure": None}
    cm = status_calibration.configmap("r1", "ns", {"inference.npu.dev/name": "r1"}, record)
    assert cm["metadata"]["name"] == "r1-calibration"
    assert json.loads(cm["data"][names.RECORD_FILE]) == record


def _never() -> Any:
    raise AssertionError("unreachable")

"""Shared fixtures of the runtime tests: the real model configs and the devices of the golden table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from npu_runtime.planner.model import ModelInfo, inspect_model
from npu_runtime.planner.probe import DeviceInfo

GIB = 1 << 30
FIXTURES = Path(__file__).parent / "fixtures" / "models"
MODEL_NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())

# The devices of issue 3's table, described as the --device-* overrides describe them.
DEVICES: dict[str, DeviceInfo] = {
    "910B3-64GiB": DeviceInfo("npu", "Ascend910B3", 8, 64 * GIB, None, "override"),
    "910B4-32GiB": DeviceInfo("npu", "Ascend910B4", 8, 32 * GIB, None, "override"),
    "310P-44GiB": DeviceInfo("npu", "Ascend310P3", 8, 44 * GIB, None, "override"),
    "GPU-141GiB": DeviceInfo("cuda", "NVIDIA H200", 8, 141 * GIB, None, "override"),
    "CPU-64GiB": DeviceInfo("cpu", "cpu", 1, 64 * GIB, None, "override"),
}
# Pods set HCCL_OP_EXPANSION_MODE=AIV (the recommended Ascend environment, README "The operator in one paragraph").
POD_ENV = {"HCCL_OP_EXPANSION_MODE": "AIV"}


def load_model(name: str) -> ModelInfo:
    """A fixture model, with its path made relative so plans do not depend on the checkout."""
    return dataclasses.replace(inspect_model(FIXTURES / name), path=f"fixtures/models/{name}")


@pytest.fixture(scope="session")
def models() -> dict[str, ModelInfo]:
    return {name: load_model(name) for name in MODEL_NAMES}

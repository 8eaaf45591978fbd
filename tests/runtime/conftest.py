"""Shared fixtures of the runtime tests: the real model configs and the devices of the golden table; the
local hub serving the tiny model, with both hub clients kept inside the test's folders (the fetch tests)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_runtime.fetch import download as fetch
from npu_runtime.fetch.hub import HUGGING_FACE, MODEL_SCOPE
from npu_runtime.planner.model import ModelInfo, inspect_model
from npu_runtime.planner.probe import DeviceInfo
from npu_sandbox.fixtures.local_hub import LocalHub, Repo

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
# vllm-ascend's DeepSeek-R1 W8A8 recipe (docs/source/tutorials/models/DeepSeek-R1.md): DP 4 x TP 4,
# expert parallel, --quantization ascend, MTP with 3 speculative tokens, FULL_DECODE_ONLY.
R1_RECIPE: dict[str, Any] = {
    "data_parallel": 4,
    "tensor_parallel": 4,
    "enable_expert_parallel": True,
    "quantization": "ascend",
    "speculative_method": "mtp",
    "speculative_tokens": 3,
    "max_num_seqs": 16,
    "max_model_len": 16384,
    "max_num_batched_tokens": 4096,
    "gpu_memory_utilization": 0.92,
}
# Pods set HCCL_OP_EXPANSION_MODE=AIV (the recommended Ascend environment, README "The operator in one paragraph").
POD_ENV = {"HCCL_OP_EXPANSION_MODE": "AIV"}


def load_model(name: str) -> ModelInfo:
    """A fixture model, with its path made relative so plans do not depend on the checkout."""
    return dataclasses.replace(inspect_model(FIXTURES / name), path=f"fixtures/models/{name}")


@pytest.fixture(scope="session")
def models() -> dict[str, ModelInfo]:
    return {name: load_model(name) for name in MODEL_NAMES}


# The fetch tests' hub: the tiny model as one repository, in both hubs' API shapes.
REPO = "org/tiny-llama"
HUBS = [HUGGING_FACE, MODEL_SCOPE]
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def repo(tiny_model: Path) -> Repo:
    return Repo.from_directory(REPO, tiny_model)


@pytest.fixture
def hub(repo: Repo) -> Iterator[LocalHub]:
    with LocalHub([repo]) as running:
        yield running


@pytest.fixture
def quiet_hub_clients(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither client may read a real token or write outside the test's folders."""
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv(fetch.TOKEN_ENV, raising=False)

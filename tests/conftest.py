"""Fixtures shared by every test folder (the tiny generated model) and the engine tests' ceiling."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

# The hard ceiling of one engine test, its engines' start in its fixtures included (pytest-timeout
# counts setup). The waits inside follow the engines' progress (npu_sandbox.progress) and fail a start
# that stalls within minutes; this only ends a test that keeps advancing without ever finishing.
ENGINE_TEST_TIMEOUT = 2400


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Engine tests get ENGINE_TEST_TIMEOUT instead of the suite's 300 s, unless they name their own."""
    for item in items:
        if item.get_closest_marker("engine") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ENGINE_TEST_TIMEOUT))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama model directory (generated once per session, seeded, no download).

    Built in a child interpreter: it needs torch, and the test process itself must not import
    torch (the probe tests check that probing leaves it unimported).
    """
    return _build_tiny_model(tmp_path_factory, "tiny-llama")


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's shape as a Mixtral (4 experts, 2 per token): for what vLLM runs only with a MoE
    model, such as external data parallelism."""
    return _build_tiny_model(tmp_path_factory, "tiny-mixtral", "--moe")


def _build_tiny_model(tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str) -> Path:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers (the sandbox extra)")
    path = tmp_path_factory.mktemp("models") / name
    subprocess.run(
        [sys.executable, "-m", "npu_sandbox.fixtures.tiny_model", *flags, str(path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return path

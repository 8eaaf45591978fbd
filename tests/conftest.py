"""Fixtures shared by every test folder: the tiny generated model."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama model directory (generated once per session, seeded, no download).

    Built in a child interpreter: it needs torch, and the test process itself must not import
    torch (the probe tests check that probing leaves it unimported).
    """
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers (the sandbox extra)")
    path = tmp_path_factory.mktemp("models") / "tiny-llama"
    subprocess.run(
        [sys.executable, "-m", "npu_sandbox.fixtures.tiny_model", str(path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return path

"""Fixtures shared by every test folder: the tiny generated model."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama model directory (generated once per session, seeded, no download)."""
    pytest.importorskip("transformers")
    from npu_sandbox.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")

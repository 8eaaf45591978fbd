"""Fixtures for the operator: a local API, the real operator over HTTP, and manifests."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_operator.api.config import OperatorConfig
from npu_sandbox.cluster import LocalCluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Short intervals so that a test sees several resyncs; everything else as in production.
# The sandbox example's hostPath model directory, listed as a platform engineer lists the nodes'
# model disk (the default pod-template policy refuses hostPath sources elsewhere).
SANDBOX_HOST_PATHS = ("/tmp/npu-sandbox/models",)
TEST_CONFIG = OperatorConfig(resync_seconds=1.0, metrics_port=0, health_port=0, allowed_host_paths=SANDBOX_HOST_PATHS)


def example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    return copy.deepcopy(document)


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster() as local:
        yield local


@pytest.fixture
async def operator(cluster: LocalCluster) -> AsyncIterator[LocalCluster]:
    await cluster.start_operator(TEST_CONFIG)
    yield cluster
    await cluster.stop_operator()

"""Fixtures of the in-process cluster: a local Kubernetes API over HTTP and the real kopf operator on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from npu_sandbox.cluster import LocalCluster

from tests.examples import TEST_CONFIG


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster() as local:
        yield local


@pytest.fixture
async def operator(cluster: LocalCluster) -> AsyncIterator[LocalCluster]:
    await cluster.start_operator(TEST_CONFIG)
    yield cluster
    await cluster.stop_operator()

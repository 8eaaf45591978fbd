"""The shipped examples as test input, the operator settings the tests run with, and the
environment of an operator run as its own process."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from npu_operator.api.config import OperatorConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# Short intervals so that a test sees several resyncs; everything else as in production.
# The sandbox example's hostPath model directory, listed as a platform engineer lists the nodes'
# model disk (the default pod-template policy refuses hostPath sources elsewhere).
SANDBOX_HOST_PATHS = ("/tmp/npu-sandbox/models",)
TEST_CONFIG = OperatorConfig(resync_seconds=1.0, metrics_port=0, health_port=0, allowed_host_paths=SANDBOX_HOST_PATHS)


def example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    return copy.deepcopy(document)

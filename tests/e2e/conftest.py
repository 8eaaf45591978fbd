"""One sandbox run (README's first command) per test session, shared by the tests that judge it:
the chain itself (test_sandbox.py) and, when Prometheus is installed, what a real Prometheus
scraped from it (test_sandbox.py, test_dashboard_queries.py). Starting a real vLLM engine takes
most of a minute; doing it once keeps the suite short."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


@dataclasses.dataclass(frozen=True)
class SandboxRun:
    result: subprocess.CompletedProcess[str]
    summary: dict[str, Any]
    workdir: Path


@pytest.fixture(scope="session")
def sandbox_run(tmp_path_factory: pytest.TempPathFactory) -> SandboxRun:
    folder = tmp_path_factory.mktemp("sandbox-run")
    workdir = folder / "sandbox"
    summary_path = folder / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "npu_sandbox", "--workdir", str(workdir), "--summary", str(summary_path)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return SandboxRun(result, json.loads(summary_path.read_text()), workdir)

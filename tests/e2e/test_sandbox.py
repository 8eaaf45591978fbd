"""README's first command, end to end: the sandbox in non-interactive mode, judged by its JSON summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.serve_helpers import alive


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and alive(int(entry.name)):
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_the_sandbox_runs_the_whole_chain_and_leaves_nothing_behind(tmp_path: Path) -> None:
    workdir = tmp_path / "sandbox"
    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "npu_sandbox", "--workdir", str(workdir), "--summary", str(summary_path)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())

    assert summary["ready"] is True
    assert summary["phase"] == "Ready"
    assert (summary["requested_mode"], summary["effective_mode"]) == ("FULL_DECODE_ONLY", "NONE")
    assert [d["reason"] for d in summary["downgrades"]] == ["CpuHasNoGraphs"]
    downgrade_events = [e for e in summary["events"] if e["reason"] == "GraphModeDowngraded"]
    assert len(downgrade_events) == 1
    assert downgrade_events[0]["type"] == "Warning"
    assert isinstance(summary["completion"], str)
    assert any(
        line.startswith('npu_graph_mode_info{effective="NONE",requested="FULL_DECODE_ONLY"} 1')
        for line in summary["metrics"]
    )
    assert any(line.startswith("npu_graph_downgrades_total{") for line in summary["metrics"])

    for line in ("kubectl get npuinf", "NAME ", "tiny-llama", "Ready after", "cleaning up"):
        assert line in result.stdout
    for pid in summary["pids"].values():
        assert pid is not None and not alive(pid), f"process {pid} outlived the sandbox"
    assert processes_mentioning(str(workdir)) == []

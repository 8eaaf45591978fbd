"""`npu-operator render` as a user runs it: a subprocess, a file, stdout and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

from tests.operator.conftest import EXAMPLES


def render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "npu_operator.cli", "render", *args], capture_output=True, text=True, timeout=60
    )


def test_render_prints_valid_children_that_request_npus() -> None:
    result = render("-f", str(EXAMPLES / "qwen2.5-32b-tp4.yaml"))
    assert result.returncode == 0, result.stderr
    children = list(yaml.safe_load_all(result.stdout))
    assert [c["kind"] for c in children] == ["Deployment", "Service"]
    for child in children:
        kubernetes_validate.validate(child, "1.37.0", strict=True)
    limits = children[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["huawei.com/Ascend910"] == 4


def test_render_json() -> None:
    result = render("-f", str(EXAMPLES / "qwen2.5-7b-910b.yaml"), "-o", "json", "--pod-monitor-api")
    assert result.returncode == 0, result.stderr
    assert [c["kind"] for c in json.loads(result.stdout)] == [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "PodMonitor",
    ]


def test_render_refuses_an_invalid_manifest_naming_the_field(tmp_path: Path) -> None:
    manifest = yaml.safe_load((EXAMPLES / "sandbox-cpu.yaml").read_text())
    manifest["spec"]["parallelism"] = {"tensor": 2}
    second = yaml.safe_load((EXAMPLES / "sandbox-cpu.yaml").read_text())
    second["metadata"]["name"] = "other"
    second["spec"]["npu"] = {"count": 1, "resourceName": "kubernetes.io/npu"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([manifest, second]))
    result = render("-f", str(path))
    assert result.returncode == 2
    assert "spec.parallelism: parallelism.tensor x pipeline x data (2) must equal npu.count (0)" in result.stderr
    assert "spec.npu.resourceName" in result.stderr
    assert result.stdout.strip() == ""


def test_a_bad_operator_setting_exits_with_its_name(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_operator.cli", "render", "-f", str(EXAMPLES / "sandbox-cpu.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NPU_OPERATOR_RESYNC_SECONDS": "-1", "PATH": "/usr/bin"},
    )
    assert result.returncode == 2
    assert "NPU_OPERATOR_RESYNC_SECONDS" in result.stderr

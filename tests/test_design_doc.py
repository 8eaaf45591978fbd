"""docs/design.md stands on its own and agrees with the code: its metric table, its names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from npu_operator.controller import metrics as operator_metrics
from npu_runtime import contract

from tests.design_metrics import DESIGN_DOC, DESIGN_TABLE, OPERATOR_PREFIX

ROOT = Path(__file__).resolve().parents[1]


def test_the_metric_table_is_read_whole() -> None:
    assert len(DESIGN_TABLE) == 12
    assert {kind for kind, _labels in DESIGN_TABLE.values()} == {"gauge", "counter", "histogram"}
    assert DESIGN_TABLE["npu_graph_downgrades_total"] == ("counter", ("from_mode", "to_mode", "reason", "stage"))


def test_the_operator_metrics_have_the_documented_labels() -> None:
    defined = {
        "npu_operator_reconciles_total": tuple(operator_metrics.RECONCILES._labelnames),
        "npu_operator_reconcile_duration_seconds": tuple(operator_metrics.RECONCILE_DURATION._labelnames),
    }
    documented = {name: labels for name, (_kind, labels) in DESIGN_TABLE.items() if name.startswith(OPERATOR_PREFIX)}
    assert documented == defined


def test_the_documented_pod_args_are_the_serve_contracts_flags() -> None:
    text = DESIGN_DOC.read_text(encoding="utf-8")
    block = text[text.index("## Contract 1") : text.index("## Contract 2")]
    documented = set(re.findall(r"(--[a-z][a-z0-9-]+)", block))
    flags = {option for action in contract.serve_parser()._actions for option in action.option_strings}
    flags -= {"-h", "--help"}
    assert documented == flags


def test_nothing_in_the_project_refers_to_the_teams_private_notes() -> None:
    # The project's documents stand alone: no file a user's clone lacks is cited.
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", "") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for needle in ("DESIGN" + ".md", "ENVIRONMENT" + ".md", "../" + "shared"):
            if needle in text:
                offenders.append(f"{name}: {needle}")
    assert not offenders, offenders

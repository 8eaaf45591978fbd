"""The chart's alerts evaluated by Prometheus' own rule engine: `promtool check rules` on the
rendered PrometheusRule's groups, and `promtool test rules` with tests/chart/promtool/alerts.test.yaml
(input series for every alert, the kube-state-metrics series included; one case where each alert
fires with its labels and annotations, one near miss where it must not).

promtool comes with Debian's `prometheus` package, which scripts/bootstrap installs when it runs as
root on Debian; elsewhere these tests are skipped and say so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_sandbox.demo.prometheus import rules_file

from tests.chart.helm import CHART, JSON, one, render

TESTS = Path(__file__).resolve().parent / "promtool" / "alerts.test.yaml"


@pytest.fixture(scope="module")
def rule_groups(tmp_path_factory: pytest.TempPathFactory) -> list[JSON]:
    objects = render({"monitoring": {"prometheusRule": {"enabled": True}}}, tmp_path_factory.mktemp("values"))
    groups: list[JSON] = one(objects, "PrometheusRule")["spec"]["groups"]
    return groups


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory, rule_groups: list[JSON]) -> Path:
    """rules.yaml (what prometheus-operator hands Prometheus) next to a copy of the unit tests."""
    folder = tmp_path_factory.mktemp("promtool")
    (folder / "rules.yaml").write_text(rules_file(rule_groups), encoding="utf-8")
    shutil.copy(TESTS, folder / TESTS.name)
    return folder


def run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def rule_names(groups: list[JSON], kind: str) -> list[str]:
    return [rule[kind] for group in groups for rule in group["rules"] if kind in rule]


def test_prometheus_accepts_the_rendered_rule_groups(promtool: str, rules_dir: Path, rule_groups: list[JSON]) -> None:
    result = run(promtool, "check", "rules", "rules.yaml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in rule_groups)
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_prometheus_accepts_the_rule_groups_with_other_values(promtool: str, tmp_path: Path) -> None:
    """Thresholds, windows and extra labels other than the defaults still make valid rules."""
    alerts = {
        "crashLooping": {"restarts": 5, "window": "1h", "for": "0s"},
        "eagerFallbacks": {"ratio": 0.2, "window": "5m"},
        "replayLatencyRegression": {"factor": 2, "offset": "7d", "window": "1h"},
        "podNotReady": {"for": "2h"},
    }
    values = {
        "monitoring": {"prometheusRule": {"enabled": True, "additionalAlertLabels": {"team": "llm"}, "alerts": alerts}}
    }
    groups = one(render(values, tmp_path), "PrometheusRule")["spec"]["groups"]
    (tmp_path / "rules.yaml").write_text(rules_file(groups), encoding="utf-8")
    result = run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(rule["labels"]["team"] == "llm" for group in groups for rule in group["rules"])
    crash = next(rule for group in groups for rule in group["rules"] if rule["alert"] == "NPUInferenceCrashLooping")
    assert "[1h]) >= 5" in crash["expr"] and "at least 5 times in 1h" in crash["annotations"]["description"]


def test_every_alert_fires_and_holds_back_as_the_unit_tests_expect(promtool: str, rules_dir: Path) -> None:
    result = run(promtool, "test", "rules", TESTS.name, cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_case_and_a_near_miss(rule_groups: list[JSON]) -> None:
    alerts = rule_names(rule_groups, "alert")
    assert len(alerts) == 9, alerts
    cases: list[dict[str, Any]] = yaml.safe_load(TESTS.read_text(encoding="utf-8"))["tests"]
    for alert in alerts:
        fires = [c["name"] for c in cases if any(t["alertname"] == alert and t["exp_alerts"] for t in _checks(c))]
        near_misses = [
            c["name"]
            for c in cases
            if "near miss" in c["name"]
            and any(t["alertname"] == alert and not t["exp_alerts"] for t in _checks(c))
            and not any(t["exp_alerts"] for t in _checks(c))
        ]
        assert fires, f"{alert}: no case where it fires in {TESTS.name}"
        assert near_misses, f"{alert}: no near miss (a case named '... near miss ...' where it stays silent)"
        for name in fires:
            for check in _checks(next(c for c in cases if c["name"] == name)):
                for expected in check["exp_alerts"]:
                    assert expected.get("exp_annotations", {}).keys() == {"summary", "description"}, name
    # Recording rules would need promql_expr_test cases; the chart ships none today.
    assert rule_names(rule_groups, "record") == []


def _checks(case: dict[str, Any]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = case.get("alert_rule_test", [])
    return checks


def test_the_kube_state_metrics_series_the_alerts_join_against_are_documented(rule_groups: list[JSON]) -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    exprs = " ".join(rule["expr"] for group in rule_groups for rule in group["rules"])
    for series in ("kube_pod_container_status_restarts_total", "kube_pod_status_ready"):
        assert series in exprs
        assert series in readme, f"chart README: say that the alerts need kube-state-metrics' {series}"

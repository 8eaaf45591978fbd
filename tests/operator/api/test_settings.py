"""Each operator setting under its names: the chart value, the variable, the settings file's key,
`render --set`; and the hint a refusal gives, which names them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_operator.api.config import SETTINGS, ConfigError, OperatorConfig, how_to_allow, load_config

from tests.chart.helm import CHART, one
from tests.chart.helm import render as helm_render

# Per setting: a value as values.yaml writes it, and what the operator reads from it.
SAMPLES: dict[str, tuple[Any, Any]] = {
    "runtime_image": ({"repository": "registry.example/rt", "tag": "2"}, "registry.example/rt:2"),
    "chip_runtime_images": (["A3=registry.example/rt:2-a3"], ("A3=registry.example/rt:2-a3",)),
    "npu_resource_name": ("huawei.com/Ascend310P", "huawei.com/Ascend310P"),
    "cluster_profile": ("volcano", "volcano"),
    "runtime_class_name": ("ascend", "ascend"),
    "node_discovery": (False, False),
    "namespaces": (["llm", "batch"], ("llm", "batch")),
    "log_level": ("DEBUG", "DEBUG"),
    "resync_seconds": (7, 7.0),
    "status_poll_seconds": (9, 9.0),
    "status_concurrency": (3, 3),
    "status_timeout_seconds": (2, 2.0),
    "peering_name": ("llm-operators", "llm-operators"),
    "standalone": (True, True),
    "health_port": (8181, 8181),
    "metrics_port": (8282, 8282),
    "prometheus_address": ("http://prometheus.example:9090", "http://prometheus.example:9090"),
    "picker_image": ({"repository": "registry.example/epp", "tag": "v1"}, "registry.example/epp:v1"),
    "pod_template_policy": ("Permissive", "Permissive"),
    "allowed_registries": (["quay.io/ascend"], ("quay.io/ascend",)),
    "allowed_priority_classes": (["inference-high"], ("inference-high",)),
    "allowed_host_paths": (["/data/models"], ("/data/models",)),
    "allow_service_account_token": (True, True),
    "allowed_prometheus_addresses": (["https://prometheus.example.com"], ("https://prometheus.example.com",)),
    "allowed_gateway_namespaces": (["gateways"], ("gateways",)),
}
EXPECTED = OperatorConfig(**{field: read for field, (_written, read) in SAMPLES.items()})


def chart_values(assignments: dict[str, Any]) -> dict[str, Any]:
    """Nested values from dotted chart-value paths."""
    values: dict[str, Any] = {}
    for path, value in assignments.items():
        *parents, last = path.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return values


def test_every_setting_has_a_sample_and_differs_from_its_default() -> None:
    assert set(SAMPLES) == set(SETTINGS)
    assert all(getattr(EXPECTED, field) != getattr(OperatorConfig(), field) for field in SETTINGS)


def test_every_chart_value_named_is_in_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    for setting in SETTINGS.values():
        node = values
        for part in setting.chart_value.split("."):
            assert isinstance(node, dict) and part in node, f"{setting.field}: {setting.chart_value} not in values.yaml"
            node = node[part]


def test_every_variable_named_is_the_one_load_config_reads() -> None:
    for field, setting in SETTINGS.items():
        written, read = SAMPLES[field]
        text = f"{written['repository']}:{written['tag']}" if isinstance(written, dict) else written
        text = ",".join(text) if isinstance(text, list) else str(text)
        assert getattr(load_config({setting.variable: text}), field) == read, setting.variable


def test_the_chart_gives_each_value_to_the_operator_as_its_variable(tmp_path: Path) -> None:
    values = chart_values({setting.chart_value: SAMPLES[field][0] for field, setting in SETTINGS.items()})
    values["watch"]["scope"] = "namespaced"  # watch.namespaces is read with this scope only
    deployment = one(helm_render(values, tmp_path), "Deployment")
    env = {var["name"]: var["value"] for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert load_config(env) == EXPECTED


def test_render_set_takes_a_chart_value_or_a_file_key_over_variables_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("allowedHostPaths: [/from/file]\nresyncSeconds: 10\nlogLevel: ERROR\n", encoding="utf-8")
    config = load_config(
        {"NPU_OPERATOR_RESYNC_SECONDS": "20", "NPU_OPERATOR_LOG_LEVEL": "WARNING"},
        file=path,
        assignments=["operator.podTemplatePolicy.allowedHostPaths={/a,/b}", "logLevel=DEBUG"],
    )
    assert (config.allowed_host_paths, config.resync_seconds, config.log_level) == (("/a", "/b"), 20.0, "DEBUG")
    assert load_config({}, assignments=["allowedRegistries=quay.io/x,ghcr.io/y"]).allowed_registries == (
        "quay.io/x",
        "ghcr.io/y",
    )


@pytest.mark.parametrize(
    ("assignment", "fragment"),
    [
        ("allowedHostPath=/data", "--set allowedHostPath: no such setting"),
        ("operator.podTemplatePolicy.allowedHostPaths", "must be KEY=VALUE"),
        ("operator.podTemplatePolicy.allowedHostPaths=relative", "--set operator.podTemplatePolicy.allowedHostPaths"),
        ("operator.podTemplatePolicy.mode=Lax", "must be Restricted or Permissive"),
    ],
)
def test_a_bad_set_is_named(assignment: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({}, assignments=[assignment])
    assert fragment in str(caught.value)


def test_a_settings_file_is_read_with_the_bounds_of_any_named_file(tmp_path: Path) -> None:
    fifo = tmp_path / "settings.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a FIFO, not a regular file"):
        load_config({}, file=fifo)
    with pytest.raises(ConfigError, match=r"NPU_OPERATOR_CONFIG=/nonexistent: cannot read: file not found"):
        load_config({"NPU_OPERATOR_CONFIG": "/nonexistent"})


def test_the_hint_names_the_chart_value_the_variable_and_a_set_for_helm_and_render() -> None:
    assert how_to_allow("allowed_host_paths", ("/data/models", "/tmp/x")) == (
        "allowed by the chart value operator.podTemplatePolicy.allowedHostPaths"
        " (variable NPU_OPERATOR_ALLOWED_HOST_PATHS),"
        " e.g. --set 'operator.podTemplatePolicy.allowedHostPaths={/data/models,/tmp/x}'"
    )
    assert how_to_allow("allow_service_account_token", "true") == (
        "allowed by the chart value operator.podTemplatePolicy.allowServiceAccountToken"
        " (variable NPU_OPERATOR_ALLOW_SERVICE_ACCOUNT_TOKEN),"
        " e.g. --set operator.podTemplatePolicy.allowServiceAccountToken=true"
    )
    assert how_to_allow("allowed_host_paths", ("/",)) is None  # no value of the setting allows the root

"""The operator's own settings: environment variables over an optional YAML file, checked at startup.

Every setting has one key in the file (camelCase), one variable (NPU_OPERATOR_ + upper snake
case) and one chart value (`SETTINGS`); the variable wins over the file, and `render --set` over
both. A bad value stops the operator with a message naming the key and where it came from,
before any resource is touched; a refusal that a setting decides names how to allow it (`how_to_allow`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from npu_runtime.files import FileProblem, read_text

from npu_operator.api.validation import extended_resource_problem

CONFIG_FILE_VARIABLE: Final = "NPU_OPERATOR_CONFIG"
# npu_operator.api.clusters checks that these are its profiles' names and the families it maps.
CLUSTER_PROFILES: Final = ("ascend-docker-runtime", "device-plugin", "volcano", "cce")
CHIP_FAMILIES: Final = ("A2", "A3", "A5", "310P")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ConfigError(ValueError):
    """A setting is invalid; the message names it and its source."""


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    # The runtime image for resources that do not set spec.engine.image.
    runtime_image: str = "ghcr.io/npu-inference/npu-runtime:0.1.0"
    # The runtime image per NPU family ("A3=registry/npu-runtime:0.1.0-a3"); a family not listed
    # gets runtime_image with vllm-ascend's tag suffix for it (npu_operator.api.clusters.runtime_image).
    chip_runtime_images: tuple[str, ...] = ()
    # The extended resource for resources that do not set spec.npu.resourceName; empty: the
    # cluster profile's name for the spec's chip (npu_operator.api.clusters.npu_resource).
    npu_resource_name: str = ""
    # How the cluster's nodes get NPUs and their driver (npu_operator.api.clusters.PROFILES).
    cluster_profile: str = "ascend-docker-runtime"
    # The RuntimeClass of the inference pods (empty: the node's default container runtime).
    runtime_class_name: str = ""
    # Read the Nodes (list/watch, cluster-wide, read-only) to say which NPU resources and chips
    # they offer when a spec asks for one no node has; off: the pods' FailedScheduling Events only.
    node_discovery: bool = True
    # Namespaces to watch; empty means the whole cluster.
    namespaces: tuple[str, ...] = ()
    log_level: str = "INFO"
    # How often every resource's children and status are checked again, in seconds.
    resync_seconds: float = 30.0
    # How often the runtimes' /status reports are read, and how many reads at once (operator-wide).
    status_poll_seconds: float = 15.0
    status_concurrency: int = 16
    status_timeout_seconds: float = 3.0
    # Peering: replicas with the same peering name never act together; the highest priority acts.
    peering_name: str = "npu-operator"
    standalone: bool = False
    # The operator's own endpoints: kopf's liveness probe and Prometheus metrics (0 disables each).
    health_port: int = 8081
    metrics_port: int = 8080
    # spec.autoscaling: the Prometheus KEDA queries, unless the resource names one.
    prometheus_address: str = "http://prometheus-operated.monitoring.svc:9090"
    # spec.routing: the endpoint picker's image, llm-d's router EPP (the image the Gateway API
    # Inference Extension points to since v1.6.0), pinned to a release.
    picker_image: str = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.9.0"
    # How much of a pod an NPUInference may shape (npu_operator.policy; docs/security.md):
    # Restricted refuses what widens a pod's privileges beyond these lists; Permissive leaves it
    # to the cluster's Pod Security admission.
    pod_template_policy: str = "Restricted"
    # Registries (host or host/path) spec.engine.image may name; the runtime image is always allowed.
    allowed_registries: tuple[str, ...] = ("ghcr.io/npu-inference",)
    allowed_priority_classes: tuple[str, ...] = ()
    # Node directories a hostPath model source may lie under (none: hostPath sources are refused).
    allowed_host_paths: tuple[str, ...] = ()
    allow_service_account_token: bool = False
    # Prometheus addresses spec.autoscaling.prometheus.address may name besides prometheus_address
    # (none: KEDA queries only the operator's Prometheus). KEDA's scaler sends a GET to whatever
    # address a ScaledObject names, from KEDA's pod.
    allowed_prometheus_addresses: tuple[str, ...] = ()
    # Namespaces whose Gateways spec.routing.gateway may attach to besides the resource's own (none).
    allowed_gateway_namespaces: tuple[str, ...] = ()


def _positive_float(text: Any) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be a positive number, got {text!r}")
    return value


def _positive_int(text: Any) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return value


def _port(text: Any) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"must be a port number (0 disables), got {text!r}")
    return value


def _boolean(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be true or false, got {text!r}")


def _non_empty(text: Any) -> str:
    value = str(text).strip()
    if not value:
        raise ValueError("must not be empty")
    return value


def _url(text: Any) -> str:
    value = _non_empty(text)
    if not value.startswith(("http://", "https://")) or any(c.isspace() for c in value):
        raise ValueError(f"must be an http:// or https:// URL, got {text!r}")
    return value


def _urls(value: Any) -> tuple[str, ...]:
    return tuple(_url(item) for item in _strings(value))


def _resource_name(text: Any) -> str:
    value = str(text).strip()
    if value and (problem := extended_resource_problem(value)):
        raise ValueError(problem)
    return value


def _namespaces(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value).split(",")
    names = tuple(str(item).strip() for item in items if str(item).strip())
    for name in names:
        if not _NAMESPACE.match(name):
            raise ValueError(f"{name!r} is not a namespace name")
    return names


def _strings(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value).split(",")
    return tuple(str(item).strip() for item in items if str(item).strip())


def _registries(value: Any) -> tuple[str, ...]:
    names = _strings(value)
    for name in names:
        if not re.match(r"^[a-z0-9]([-a-z0-9.:]*[a-z0-9])?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*/?$", name):
            raise ValueError(f"{name!r} is not a registry (host[:port][/path])")
    return names


def _host_paths(value: Any) -> tuple[str, ...]:
    paths = _strings(value)
    for path in paths:
        if not path.startswith("/") or ".." in path.split("/") or path.rstrip("/") == "":
            raise ValueError(f"{path!r} must be an absolute directory other than / (without '..')")
    return paths


def _chip_images(value: Any) -> tuple[str, ...]:
    entries = _strings(value)
    for entry in entries:
        family, equals, image = entry.partition("=")
        if not equals or family not in CHIP_FAMILIES or not image.strip():
            raise ValueError(f"{entry!r} must be FAMILY=IMAGE with FAMILY one of {', '.join(CHIP_FAMILIES)}")
    return entries


def _cluster_profile(text: Any) -> str:
    value = str(text).strip()
    if value not in CLUSTER_PROFILES:
        raise ValueError(f"must be one of {', '.join(CLUSTER_PROFILES)}, got {text!r}")
    return value


def _runtime_class(text: Any) -> str:
    value = str(text).strip()
    if (value and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", value)) or len(value) > 253:
        raise ValueError(f"{text!r} is not a RuntimeClass name (a DNS subdomain)")
    return value


def _policy(text: Any) -> str:
    value = str(text).strip()
    if value not in ("Restricted", "Permissive"):
        raise ValueError(f"must be Restricted or Permissive, got {text!r}")
    return value


def _log_level(text: Any) -> str:
    value = str(text).strip().upper()
    if value not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"must be DEBUG, INFO, WARNING or ERROR, got {text!r}")
    return value


_PARSERS: Final[dict[str, Callable[[Any], Any]]] = {
    "runtime_image": _non_empty,
    "chip_runtime_images": _chip_images,
    "npu_resource_name": _resource_name,
    "cluster_profile": _cluster_profile,
    "runtime_class_name": _runtime_class,
    "node_discovery": _boolean,
    "namespaces": _namespaces,
    "log_level": _log_level,
    "resync_seconds": _positive_float,
    "status_poll_seconds": _positive_float,
    "status_concurrency": _positive_int,
    "status_timeout_seconds": _positive_float,
    "peering_name": _non_empty,
    "standalone": _boolean,
    "health_port": _port,
    "metrics_port": _port,
    "prometheus_address": _url,
    "picker_image": _non_empty,
    "pod_template_policy": _policy,
    "allowed_registries": _registries,
    "allowed_priority_classes": _strings,
    "allowed_host_paths": _host_paths,
    "allow_service_account_token": _boolean,
    "allowed_prometheus_addresses": _urls,
    "allowed_gateway_namespaces": _namespaces,
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def env_variable(field: str) -> str:
    return "NPU_OPERATOR_" + field.upper()


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting under each of its names: the field, the file's key, the variable, the chart value."""

    field: str
    chart_value: str  # its path in charts/npu-inference-operator/values.yaml

    @property
    def key(self) -> str:
        return _camel(self.field)

    @property
    def variable(self) -> str:
        return env_variable(self.field)

    @property
    def is_list(self) -> bool:
        return isinstance(getattr(OperatorConfig(), self.field), tuple)


_CHART_VALUES: Final = {
    "runtime_image": "operator.runtimeImage",  # repository and tag
    "chip_runtime_images": "operator.chipRuntimeImages",
    "npu_resource_name": "operator.npuResourceName",
    "cluster_profile": "npu.clusterProfile",
    "runtime_class_name": "npu.runtimeClassName",
    "node_discovery": "npu.nodeDiscovery",
    "namespaces": "watch.namespaces",
    "log_level": "operator.logLevel",
    "resync_seconds": "operator.resyncSeconds",
    "status_poll_seconds": "operator.statusPollSeconds",
    "status_concurrency": "operator.statusConcurrency",
    "status_timeout_seconds": "operator.statusTimeoutSeconds",
    "peering_name": "operator.peeringName",
    "standalone": "operator.standalone",
    "health_port": "operator.healthPort",
    "metrics_port": "operator.metricsPort",
    "prometheus_address": "operator.prometheusAddress",
    "picker_image": "operator.pickerImage",  # repository and tag
    "pod_template_policy": "operator.podTemplatePolicy.mode",
    "allowed_registries": "operator.podTemplatePolicy.allowedRegistries",
    "allowed_priority_classes": "operator.podTemplatePolicy.allowedPriorityClasses",
    "allowed_host_paths": "operator.podTemplatePolicy.allowedHostPaths",
    "allow_service_account_token": "operator.podTemplatePolicy.allowServiceAccountToken",
    "allowed_prometheus_addresses": "operator.podTemplatePolicy.allowedPrometheusAddresses",
    "allowed_gateway_namespaces": "operator.podTemplatePolicy.allowedGatewayNamespaces",
}
# Every setting by field: the one place that knows its key, variable and chart value.
SETTINGS: Final = {field: Setting(field, _CHART_VALUES[field]) for field in _PARSERS}


def how_to_allow(field: str, value: str | tuple[str, ...]) -> str | None:
    """How to allow what the setting `field` refuses: its chart value and variable, and the `--set`
    (for helm and `npu-operator render` alike) that gives it `value` (a list: the whole list).
    None when `value` is not one the setting takes (such a refusal no value of it can lift)."""
    setting = SETTINGS[field]
    try:
        _PARSERS[field](",".join(value) if isinstance(value, tuple) else value)
    except (TypeError, ValueError):
        return None
    text = "{" + ",".join(value) + "}" if isinstance(value, tuple) else value
    assignment = shlex.quote(f"{setting.chart_value}={text}")
    return f"allowed by the chart value {setting.chart_value} (variable {setting.variable}), e.g. --set {assignment}"


def setting_named(name: str) -> Setting:
    """The setting that `name` (its key in the file, or its chart value) names; ConfigError if none."""
    for setting in SETTINGS.values():
        if name in (setting.key, setting.chart_value):
            return setting
    known = ", ".join(setting.chart_value for setting in SETTINGS.values())
    raise ConfigError(f"--set {name}: no such setting (a chart value, or a key of the settings file); known: {known}")


def _assignment(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` of `render --set`: the field and its value (a list also as helm writes it, {a,b})."""
    name, equals, value = text.partition("=")
    if not equals:
        raise ConfigError(f"--set {text}: must be KEY=VALUE")
    setting = setting_named(name.strip())
    if setting.is_list and value.startswith("{") and value.endswith("}"):
        value = value[1:-1]
    return setting.field, value


def load_config(
    environ: Mapping[str, str] | None = None, *, file: Path | None = None, assignments: Sequence[str] = ()
) -> OperatorConfig:
    """Read the settings file (`file`, else the one NPU_OPERATOR_CONFIG names, if any), then the
    variables, then `assignments` (KEY=VALUE, as `render --set` gives them); raise ConfigError."""
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str]] = {}
    named = environ.get(CONFIG_FILE_VARIABLE)
    path = file if file is not None else Path(named) if named else None
    if path is not None:
        source = f"{CONFIG_FILE_VARIABLE}={path}" if file is None else str(path)
        for key, value in _read_file(path, source).items():
            raw[key] = (value, f"{path}: {_camel(key)}")
    for field in _PARSERS:
        if (value := environ.get(env_variable(field))) is not None:
            raw[field] = (value, env_variable(field))
    for text in assignments:
        field, value = _assignment(text)
        raw[field] = (value, f"--set {text}")
    values: dict[str, Any] = {}
    for field, (value, source) in raw.items():
        try:
            values[field] = _PARSERS[field](value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return OperatorConfig(**values)


def _read_file(path: Path, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_text(path)) or {}
    except FileProblem as exc:
        raise ConfigError(f"{source}: cannot read: {str(exc).removeprefix(f'{path}: ')}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of settings")
    known = {_camel(field): field for field in _PARSERS}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return {known[key]: value for key, value in data.items()}


def python_log_level(config: OperatorConfig) -> int:
    return int(logging.getLevelName(config.log_level))


MAX_BACKOFF_SECONDS: Final = 300.0


def backoff_seconds(interval: float, failures: int) -> float:
    """The wait after `failures` failures in a row: the interval, doubled per failure, at most 5 min."""
    return float(min(interval * 2 ** max(failures - 1, 0), MAX_BACKOFF_SECONDS))


def jittered(base: float, ceiling: float, rng: Callable[[], float] = random.random) -> float:
    """`base` spread over +-50 % (so that many clients do not retry in step), at most `ceiling`."""
    return min(ceiling, base * (0.5 + rng()))

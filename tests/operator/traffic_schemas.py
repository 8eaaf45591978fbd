"""The checks a ScaledObject, an InferencePool, an HTTPRoute and the endpoint picker's config must pass,
kept from those projects' own published schemas and sources (never a copy of their files).

- KEDA ScaledObject: kedacore/keda v2.20.2, config/crd/bases/keda.sh_scaledobjects.yaml (required
  scaleTargetRef.name and triggers[].type/metadata, metadata a map of strings, min/max/polling
  bounds, the minReplicaCount <= maxReplicaCount CEL rule) and pkg/scalers/prometheus_scaler.go
  (the Prometheus trigger's metadata: serverAddress, query and threshold required, threshold and
  activationThreshold parsed as floats, ignoreNullValues and unsafeSsl as bools, authModes as
  pkg/scalers/authentication's Config reads it), triggers[].authenticationRef (name, kind enum), and
  no warning from the webhook's verifyScaledObjects (pollingInterval, cooldownPeriod). HPA bounds
  on the behaviour from k8s.io/api autoscaling/v2 (periodSeconds 1..1800, stabilizationWindowSeconds
  0..3600).
- InferencePool: kubernetes-sigs/gateway-api-inference-extension v1.6.0, config/crd/bases/
  inference.networking.k8s.io_inferencepools.yaml (v1: selector.matchLabels 1..64 entries, label
  value pattern, targetPorts 1..8 unique ports, endpointPickerRef name/kind/port, failureMode enum,
  its CEL rule "port is required when kind is 'Service'").
- HTTPRoute: Gateway API v1 (parentRefs, backendRefs by group/kind/name, hostnames: at most 16 of
  apis/v1/shared_types.go's Hostname), the fields this operator sets;
  rules[].timeouts from kubernetes-sigs/gateway-api v1.4.0 apis/v1/httproute_types.go
  (HTTPRouteTimeouts: request, backendRequest, its CEL rule "backendRequest timeout cannot be longer
  than request timeout") and apis/v1/shared_types.go (Duration, GEP-2257's pattern).
- The picker: llm-d/llm-d-router v0.9.0: apix/config/v1alpha1/endpointpickerconfig_types.go
  (EndpointPickerConfig, FlowControlConfig: the loader decodes strictly, pkg/epp/config/loader/
  configloader.go decodeRawConfig), the plugin types registered in pkg/epp/framework/plugins, the concurrency
  detector's parameters (saturationdetector/concurrency/config.go: maxConcurrency > 0, headroom >= 0,
  concurrencyMode requests|tokens), the core metrics extractor's parameters
  (datalayer/extractor/metrics/factories.go: modelServerExtractorParams, engineConfigParams) and the
  flags of pkg/epp/server/options.go.
- Istio's DestinationRule: istio/api v1.30.3 networking/v1alpha3/destination_rule.proto (host
  required; TrafficPolicy.port_level_settings of PortSelector number and ClientTLSSettings: mode
  DISABLE|SIMPLE|MUTUAL|ISTIO_MUTUAL, insecure_skip_verify a bool), the fields this operator sets.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

KEDA_API_VERSION = "keda.sh/v1alpha1"
POOL_API_VERSION = "inference.networking.k8s.io/v1"

_INT32 = {"type": "integer", "format": "int32"}
_HPA_POLICY = {
    "type": "object",
    "required": ["periodSeconds", "type", "value"],
    "properties": {
        "periodSeconds": {**_INT32, "minimum": 1, "maximum": 1800},
        "type": {"enum": ["Pods", "Percent"]},
        "value": {**_INT32, "minimum": 1},
    },
}
_HPA_RULES = {
    "type": "object",
    "properties": {
        "policies": {"type": "array", "items": _HPA_POLICY},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "stabilizationWindowSeconds": {**_INT32, "minimum": 0, "maximum": 3600},
    },
}
SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": KEDA_API_VERSION},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "advanced": {
                    "type": "object",
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleDown": _HPA_RULES, "scaleUp": _HPA_RULES},
                                },
                                "name": {"type": "string"},
                            },
                        },
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                    },
                },
                "cooldownPeriod": {**_INT32, "minimum": 0},
                "idleReplicaCount": {**_INT32, "minimum": 0},
                "initialCooldownPeriod": {**_INT32, "minimum": 0},
                "maxReplicaCount": {**_INT32, "minimum": 1},
                "minReplicaCount": {**_INT32, "minimum": 0},
                "pollingInterval": {**_INT32, "minimum": 1},
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string", "minLength": 1},
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["metadata", "type"],
                        "additionalProperties": False,
                        "properties": {
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {
                                    "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
                                    "name": {"type": "string"},
                                },
                            },
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "name": {"type": "string"},
                            "type": {"type": "string", "minLength": 1},
                            "useCachedMetrics": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}

_LABEL_VALUE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_KIND = "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
_PORT = {"type": "object", "required": ["number"], "properties": {"number": {**_INT32, "minimum": 1, "maximum": 65535}}}
INFERENCE_POOL: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": POOL_API_VERSION},
        "kind": {"const": "InferencePool"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["selector", "targetPorts"],
            "additionalProperties": False,
            "properties": {
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "endpointPickerRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                        "group": {"type": "string", "maxLength": 253, "pattern": _GROUP},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": _KIND},
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "port": _PORT,
                    },
                },
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "minProperties": 1,
                            "maxProperties": 64,
                            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": _LABEL_VALUE},
                        }
                    },
                },
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": _PORT},
            },
        },
    },
}

_PARENT_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "group": {"type": "string"},
        "kind": {"type": "string"},
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
        "sectionName": {"type": "string", "minLength": 1, "maxLength": 253},
        "port": _INT32,
    },
}
# kubernetes-sigs/gateway-api v1.4.0 apis/v1/shared_types.go Hostname (kubebuilder markers).
HOSTNAME = {
    "type": "string",
    "minLength": 1,
    "maxLength": 253,
    "pattern": r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}
HTTP_ROUTE: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "kind": {"const": "HTTPRoute"},
        "spec": {
            "type": "object",
            "properties": {
                "parentRefs": {"type": "array", "maxItems": 32, "items": _PARENT_REF},
                "hostnames": {"type": "array", "maxItems": 16, "items": HOSTNAME},
                "rules": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {
                        "type": "object",
                        "properties": {
                            "matches": {"type": "array", "maxItems": 64},
                            "timeouts": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "request": {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"},
                                    "backendRequest": {
                                        "type": "string",
                                        "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$",
                                    },
                                },
                            },
                            "backendRefs": {
                                "type": "array",
                                "maxItems": 16,
                                "items": {
                                    "type": "object",
                                    "required": ["name"],
                                    "properties": {
                                        "group": {"type": "string"},
                                        "kind": {"type": "string"},
                                        "name": {"type": "string", "minLength": 1},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

# Plugin types registered by llm-d-router v0.9.0 that the rendered config may use.
PICKER_PLUGIN_TYPES = frozenset(
    {
        "inflight-load-producer",  # pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload
        "concurrency-detector",  # pkg/epp/framework/plugins/flowcontrol/saturationdetector/concurrency
        "queue-scorer",  # .../scheduling/scorer/queuedepth
        "kv-cache-utilization-scorer",  # .../scheduling/scorer/kvcacheutilization
        "prefix-cache-scorer",  # .../scheduling/scorer/prefix
        "active-request-scorer",  # .../scheduling/scorer/activerequest (a consumer of the in-flight counts)
        "lora-affinity-scorer",  # .../scheduling/scorer/loraaffinity (no parameters)
        "token-producer",  # .../requestcontrol/dataproducer/tokenizer (modelName, vllm.url)
        "precise-prefix-cache-producer",  # .../requestcontrol/dataproducer/preciseprefixcache
        "endpoint-notification-source",  # .../datalayer/source/notifications (endpoint_datasource.go)
        "metrics-data-source",  # .../datalayer/source/metrics
        "core-metrics-extractor",  # .../datalayer/extractor/metrics
    }
)
# pkg/epp/server/options.go (and controller-runtime's zap options for --zap-encoder).
PICKER_FLAGS = frozenset(
    {
        "--pool-name",
        "--pool-namespace",
        "--pool-group",
        "--config-file",
        "--grpc-port",
        "--grpc-health-port",
        "--metrics-port",
        "--secure-serving",
        "--zap-encoder",
        "--tracing",
        "--metrics-endpoint-auth",
    }
)
FEATURE_GATES = frozenset({"flowControl", "dataLayer"})
# EndpointPickerConfig's fields and FlowControlConfig's (endpointpickerconfig_types.go json tags).
PICKER_CONFIG_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "featureGates",
        "plugins",
        "schedulingProfiles",
        "dataLayer",
        "flowControl",
        "requestHandler",
        "saturationDetector",
        "parser",
    }
)
FLOW_CONTROL_FIELDS = frozenset(
    {
        "maxBytes",
        "maxRequests",
        "defaultRequestTTL",
        "defaultPriorityBand",
        "defaultNegativePriorityBand",
        "priorityBands",
        "usageLimitPolicyPluginRef",
        "saturationDetector",
    }
)
# factories.go modelServerExtractorParams and engineConfigParams json tags.
EXTRACTOR_FIELDS = frozenset({"engineLabelKey", "defaultEngine", "engineConfigs"})
ENGINE_CONFIG_FIELDS = frozenset(
    {
        "name",
        "queuedRequestsSpec",
        "runningRequestsSpec",
        "kvUsageSpec",
        "loraSpec",
        "cacheInfoSpec",
        "cacheBlockSizeLabelName",
        "cacheNumBlocksLabelName",
        "cacheBlockSizeSpec",
        "cacheNumBlocksSpec",
        "customMetrics",
    }
)
# factories.go defaultEngineConfigs (appended to the configured ones unless one has their name) and
# DefaultEngineType, the name newCoreMetricsExtractorPlugin reserves.
BUILT_IN_ENGINES = frozenset({"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm", "triton"})
RESERVED_ENGINE = "default"
_FLOAT = re.compile(r"^-?\d+(\.\d+)?$")
# A PromQL instant-vector selector as the extractor's metric specs are written (spec.go
# parseStringToSpec): a metric name, then optionally {label=value,...} with quoted or bare values.
_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_SPEC = re.compile(rf"^\s*({_METRIC_NAME})\s*(?:\{{([^}}]*)\}})?\s*$")
_PAIR = re.compile(rf'^\s*({_LABEL_NAME})\s*=\s*(?:"([^"]*)"|([^",}}\s]+))\s*$')


def validate_scaled_object(obj: dict[str, Any]) -> None:
    """Raise when `obj` is not a ScaledObject KEDA would accept with Prometheus triggers."""
    jsonschema.validate(obj, SCALED_OBJECT)
    spec = obj["spec"]
    # The CRD's CEL rule (maxReplicaCount defaults to 100).
    assert spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100), "minReplicaCount > maxReplicaCount"
    for trigger in spec["triggers"]:
        if trigger["type"] != "prometheus":
            continue
        metadata = trigger["metadata"]
        for key in ("serverAddress", "query", "threshold"):
            assert metadata.get(key), f"prometheus trigger without {key}"
        for key in ("threshold", "activationThreshold"):
            if key in metadata:
                assert _FLOAT.match(metadata[key]), f"{key} {metadata[key]!r} is not a float"
        if "ignoreNullValues" in metadata:
            assert metadata["ignoreNullValues"] in ("true", "false")
        if "unsafeSsl" in metadata:
            assert metadata["unsafeSsl"] in ("true", "false")
        if "authModes" in metadata:
            assert_auth_modes(metadata["authModes"])
    assert not keda_warnings(obj), keda_warnings(obj)


# pkg/scalers/authentication/authentication_types.go Config.Modes: `keda:"name=authModes;authMode, ...,
# enum=apiKey;basic;tls;bearer;custom;oauth, exclusiveSet=bearer;basic;oauth"`, split on "," and trimmed
# (pkg/scalers/scalersconfig/typed_config.go, the enum and exclusiveSet checks).
AUTH_MODES = ("apiKey", "basic", "tls", "bearer", "custom", "oauth")
EXCLUSIVE_AUTH_MODES = ("bearer", "basic", "oauth")


def assert_auth_modes(value: str) -> None:
    modes = [mode.strip() for mode in value.split(",")]
    assert all(mode in AUTH_MODES for mode in modes), f"authModes {value!r} must be among {AUTH_MODES}"
    assert sum(mode in EXCLUSIVE_AUTH_MODES for mode in modes) <= 1, (
        f"authModes {value!r}: one of {EXCLUSIVE_AUTH_MODES}"
    )


POLLING_NOT_RELEVANT = "PollingInterval is configured but is not relevant"
COOLDOWN_NOT_RELEVANT = "CooldownPeriod is configured but is not relevant"


def keda_warnings(obj: dict[str, Any]) -> list[str]:
    """The warnings KEDA's webhook answers a ScaledObject with about pollingInterval and cooldownPeriod
    (v2.20.2 apis/keda/v1alpha1/scaledobject_webhook.go verifyScaledObjects): each is irrelevant with
    minReplicaCount above 0 (unset: 0) unless idleReplicaCount is 0, pollingInterval also unless a
    trigger uses cached metrics."""
    spec = obj["spec"]
    active = spec.get("minReplicaCount", 0) > 0 and spec.get("idleReplicaCount") != 0
    cached = any(trigger.get("useCachedMetrics") for trigger in spec.get("triggers", ()))
    warnings = []
    if "pollingInterval" in spec and active and not cached:
        warnings.append(POLLING_NOT_RELEVANT)
    if "cooldownPeriod" in spec and active:
        warnings.append(COOLDOWN_NOT_RELEVANT)
    return warnings


def validate_inference_pool(obj: dict[str, Any]) -> None:
    jsonschema.validate(obj, INFERENCE_POOL)
    ref = obj["spec"].get("endpointPickerRef")
    if ref is not None:  # the CRD's CEL rule
        assert ref.get("kind", "Service") != "Service" or "port" in ref, "port is required when kind is 'Service'"
    numbers = [port["number"] for port in obj["spec"]["targetPorts"]]
    assert len(numbers) == len(set(numbers)), "port number must be unique"


def validate_http_route(obj: dict[str, Any]) -> None:
    jsonschema.validate(obj, HTTP_ROUTE)
    for rule in obj["spec"].get("rules", []):
        timeouts = rule.get("timeouts", {})
        if "request" in timeouts and "backendRequest" in timeouts and duration(timeouts["request"]) != 0:
            # The CRD's CEL rule on HTTPRouteTimeouts.
            assert duration(timeouts["backendRequest"]) <= duration(timeouts["request"]), (
                "backendRequest timeout cannot be longer than request timeout"
            )


def duration(text: str) -> float:
    """Seconds of a Gateway API Duration (GEP-2257: up to four <number><h|m|s|ms> parts)."""
    assert re.fullmatch(r"([0-9]{1,5}(h|m|s|ms)){1,4}", text), text
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * units[unit] for n, unit in re.findall(r"([0-9]+)(ms|h|m|s)", text))


def metric_spec(text: str) -> tuple[str, dict[str, str]] | None:
    """The (name, labels) of an extractor metric spec; None for "" (spec.go: the empty spec is nil).
    Raises ValueError where parseStringToSpec returns an error."""
    if text == "":
        return None
    found = _SPEC.match(text)
    if found is None:
        raise ValueError(f"not a valid metric specification: {text!r}")
    labels: dict[str, str] = {}
    block = (found.group(2) or "").strip()
    for pair in block.split(",") if block else ():
        matched = _PAIR.match(pair)
        if matched is None:
            raise ValueError(f"invalid label pair {pair!r} in specification: {text!r}")
        labels[matched.group(1)] = matched.group(2) if matched.group(2) is not None else matched.group(3)
    return found.group(1), labels


def latest_sample(
    spec: tuple[str, dict[str, str]], families: dict[str, list[tuple[dict[str, str], float, int | None]]]
) -> float:
    """The value the extractor reads for `spec` from `families` (name -> [(labels, value, timestamp ms)]):
    among the series whose labels include the spec's, the one with the latest timestamp, the first one
    when timestamps tie or are missing (spec.go Spec.getLatestMetric keeps a later one only when its
    timestamp is strictly greater; a sample without one reads as 0). Raises LookupError where it errors."""
    name, wanted = spec
    series = families.get(name)
    if not series:
        raise LookupError(f"metric family {name!r} not found or empty")
    best: tuple[float, int] | None = None
    for labels, value, timestamp in series:
        if wanted.items() <= labels.items() and (best is None or (timestamp or 0) > best[1]):
            best = (value, timestamp or 0)
    if best is None:
        raise LookupError(f"no matching metric found for {name!r} with labels {wanted}")
    return best[0]


def validate_destination_rule(obj: dict[str, Any]) -> None:
    assert obj["apiVersion"] in ("networking.istio.io/v1", "networking.istio.io/v1beta1")
    assert obj["kind"] == "DestinationRule"
    spec = obj["spec"]
    assert set(spec) <= {"host", "trafficPolicy", "subsets", "exportTo", "workloadSelector"}, spec
    assert isinstance(spec["host"], str) and spec["host"], "host is required"
    policy = spec.get("trafficPolicy", {})
    for setting in policy.get("portLevelSettings", []):
        assert set(setting) <= {"port", "loadBalancer", "connectionPool", "outlierDetection", "tls"}, setting
        number = setting["port"]["number"]
        assert isinstance(number, int) and 1 <= number <= 65535
        tls = setting.get("tls", {})
        assert tls.get("mode", "DISABLE") in ("DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL")
        assert isinstance(tls.get("insecureSkipVerify", False), bool)


def validate_picker_config(config: dict[str, Any]) -> None:
    """Raise when `config` is not an EndpointPickerConfig llm-d's picker v0.9.0 loads."""
    assert config["apiVersion"] == "llm-d.ai/v1alpha1" and config["kind"] == "EndpointPickerConfig"
    assert set(config) <= PICKER_CONFIG_FIELDS, set(config) - PICKER_CONFIG_FIELDS
    assert set(config.get("flowControl", {})) <= FLOW_CONTROL_FIELDS
    assert set(config.get("featureGates", [])) <= FEATURE_GATES
    names: dict[str, str] = {}
    for plugin in config["plugins"]:
        assert plugin["type"] in PICKER_PLUGIN_TYPES, plugin["type"]
        names[plugin.get("name", plugin["type"])] = plugin["type"]
        if plugin["type"] == "concurrency-detector":
            params = plugin.get("parameters", {})
            assert isinstance(params.get("maxConcurrency", 100), int) and params.get("maxConcurrency", 100) > 0
            assert params.get("headroom", 0.0) >= 0
            assert params.get("concurrencyMode", "requests") in ("requests", "tokens")
        if plugin["type"] == "core-metrics-extractor":
            validate_extractor_parameters(plugin.get("parameters", {}))
    for profile in config["schedulingProfiles"]:
        for ref in profile["plugins"]:
            assert ref["pluginRef"] in names, ref
    detector = effective_saturation_detector(config)
    if detector is not None:
        # validation.go validateSaturationDetector: it must name a configured plugin.
        assert names.get(detector) in ("concurrency-detector", "utilization-detector"), detector
    # The concurrency detector consumes the in-flight counts (detector.go Consumes), and so does the active
    # request scorer (activerequest/active_request.go, a plugin.ConsumerPlugin): a producer must exist.
    if {"concurrency-detector", "active-request-scorer"} & set(names.values()):
        assert "inflight-load-producer" in names.values()


def validate_extractor_parameters(params: dict[str, Any]) -> None:
    """The checks newCoreMetricsExtractorPlugin (factories.go) makes before the picker starts."""
    assert set(params) <= EXTRACTOR_FIELDS, params
    engines = params.get("engineConfigs", [])
    for engine in engines:
        assert set(engine) <= ENGINE_CONFIG_FIELDS, engine
        assert engine["name"] and engine["name"] != RESERVED_ENGINE, engine["name"]
        for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec"):
            metric_spec(engine.get(key, ""))
    known = {engine["name"] for engine in engines} | BUILT_IN_ENGINES
    assert params.get("defaultEngine", "vllm") in known, "defaultEngine not found in engineConfigs"


def effective_saturation_detector(config: dict[str, Any]) -> str | None:
    """The detector the picker runs: flowControl.saturationDetector, else the deprecated top-level one
    (configloader.go LoadRawConfig copies it there only when the new field is unset)."""
    new = config.get("flowControl", {}).get("saturationDetector")
    old = config.get("saturationDetector")
    chosen = new if new is not None else old
    return None if chosen is None else str(chosen["pluginRef"])


def deprecations(config: dict[str, Any]) -> list[str]:
    """The DEPRECATION lines configloader.go LoadRawConfig logs for `config`."""
    found = []
    if config.get("apiVersion") == "inference.networking.x-k8s.io/v1alpha1":
        found.append("apiVersion inference.networking.x-k8s.io/v1alpha1/EndpointPickerConfig")
    if "saturationDetector" in config:
        found.append("top-level saturationDetector")
    if "parser" in config:
        found.append("top-level parser")
    return found


def picker_flags(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}

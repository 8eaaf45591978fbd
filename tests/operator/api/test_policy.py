"""Everything a user writes is data: no kubelet expansion, owned flags in every spelling, the
pod-template policy's refusals, and tokens only over https.

The expansion check runs the kubelet's own rules (kubernetes third_party/forked/golang/expansion,
Expand: `$$` is a literal `$`, `$(NAME)` is replaced from the container's env) over every
argument and env value of every container the builders make, after writing `$(LEAK)` into each
string field of the spec in turn.
"""

from __future__ import annotations

import copy
import dataclasses
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_operator import cli, topologies
from npu_operator.api import crd
from npu_operator.api.config import SETTINGS, ConfigError, OperatorConfig, load_config
from npu_operator.api.policy import policy_problems
from npu_operator.api.spec import parse_spec
from npu_operator.api.validation import owned_flag, validate_spec
from npu_operator.children import engine_pod
from npu_operator.controller.desired import desired_state, read_spec
from npu_operator.kube import names as kube_names

from tests.examples import EXAMPLES, example

CONFIG = OperatorConfig()
OPERATOR_REFERENCES = {kube_names.LWS_LEADER_ADDRESS, kube_names.LWS_WORKER_INDEX}


def kubelet_references(value: str) -> tuple[set[str], str]:
    """The variables the kubelet would expand in `value`, and the string it would pass on (names kept)."""
    names: set[str] = set()
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] == "$" and i + 1 < len(value):
            if value[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if value[i + 1] == "(" and (end := value.find(")", i + 2)) != -1:
                names.add(value[i + 2 : end])
                out.append(value[i : end + 1])
                i = end + 1
                continue
        out.append(value[i])
        i += 1
    return names, "".join(out)


def container_strings(children: list[dict[str, Any]]) -> Iterator[str]:
    for child in children:
        spec = child.get("spec", {})
        templates = [spec.get("template"), spec.get("leaderWorkerTemplate", {}).get("workerTemplate")]
        for template in filter(None, templates):
            for container in [*template["spec"]["containers"], *template["spec"].get("initContainers", [])]:
                yield from container.get("args", [])
                yield from (var["value"] for var in container.get("env", []) if "value" in var)


def string_leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from string_leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from string_leaves(value, (*path, index))
    elif isinstance(node, str):
        yield path


def every_field_manifest(name: str) -> dict[str, Any]:
    """An example with every string field that can reach a container filled in."""
    manifest = example(name)
    spec = manifest["spec"]
    engine = spec.setdefault("engine", {})
    engine.update(
        extraArgs=["--enable-prefix-caching", "--seed", "1"],
        env=[{"name": "MY_VAR", "value": "v"}, *engine.get("env", [])],
        quantization="w8a8",
        additionalConfig={"ascend_scheduler_config": {"enabled": "yes"}},
        speculative={"method": "draft_model", "numTokens": 2, "model": "/models/draft"},
    )
    source = spec["model"]["source"]
    for hub in ("huggingFace", "modelScope"):
        if hub in source:
            source[hub].update(
                revision="main",
                allowPatterns=["*.json"],
                ignorePatterns=["*.bin"],
                endpoint="https://mirror.example",
                tokenSecretRef={"name": "hub-token", "key": "token"},
            )
    return manifest


def set_leaf(manifest: dict[str, Any], path: tuple[Any, ...], value: str) -> None:
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@pytest.mark.parametrize("name", ["qwen2.5-7b-910b.yaml", "qwen2.5-7b-modelscope.yaml", "deepseek-r1-w8a8-2node.yaml"])
def test_no_field_of_the_spec_is_expanded_by_the_kubelet(name: str) -> None:
    manifest = every_field_manifest(name)
    reaching: set[tuple[Any, ...]] = set()
    for path in string_leaves(manifest["spec"]):
        changed = copy.deepcopy(manifest)
        node: Any = changed["spec"]
        for key in path:
            node = node[key]
        set_leaf(changed["spec"], path, node + "$(LEAK)$$(LEAK2)")
        try:
            children = topologies.build_children("m", "ns", parse_spec(changed["spec"]), CONFIG)
        except (ValueError, KeyError, TypeError):
            continue  # a value no builder accepts (an enum, a size): it reaches no container
        for value in container_strings(children):
            names, passed = kubelet_references(value)
            assert names <= OPERATOR_REFERENCES, (path, value)
            if "$(LEAK)$$(LEAK2)" in passed:  # reached a container, and arrives as written
                reaching.add(path)
    fields = {".".join(str(key) for key in path if not isinstance(key, int)) for path in reaching}
    expected = {"model.name", "engine.extraArgs", "engine.env.value", "engine.quantization", "engine.speculative.model"}
    expected.add("engine.additionalConfig.ascend_scheduler_config.enabled")
    if "modelscope" in name:
        hub = "model.source.modelScope"
        expected |= {f"{hub}.{field}" for field in ("revision", "allowPatterns", "ignorePatterns", "endpoint")}
    else:
        expected.add("model.path")
    assert expected <= fields, expected - fields


def test_the_operators_own_references_still_expand() -> None:
    spec = parse_spec(example("deepseek-r1-w8a8-2node.yaml")["spec"])
    children = topologies.build_children("m", "ns", spec, CONFIG)
    names = set().union(*(kubelet_references(value)[0] for value in container_strings(children)))
    assert names == OPERATOR_REFERENCES


@pytest.mark.parametrize("arg", ["-qawq", "-qfp8", "-q=awq", "-q", "--quantization=awq", "--quant", "-O3"])
def test_owned_flags_in_short_form_are_refused(arg: str) -> None:
    assert owned_flag(arg) in ("-q", "--quantization", "-O")
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["engine"]["extraArgs"] = [arg]
    problems = validate_spec(parse_spec(manifest["spec"]))
    assert [p.field for p in problems] == ["spec.engine.extraArgs[0]"]


# --- the pod-template policy ----------------------------------------------------------------------

REFUSED: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    # (id, spec changes, the field named, the operator setting that allows it)
    (
        "image",
        {"engine": {"image": "evil.example/miner:1"}},
        "spec.engine.image",
        {"allowed_registries": ("evil.example",)},
    ),
    (
        "image-prefix-lookalike",
        {"engine": {"image": "ghcr.io/npu-inference-evil/x:1"}},
        "spec.engine.image",
        {"allowed_registries": ("ghcr.io/npu-inference-evil",)},
    ),
    (
        "service-account",
        {"template": {"serviceAccountName": "cluster-admin-sa"}},
        "spec.template.serviceAccountName",
        {"allow_service_account_token": True},
    ),
    (
        "priority-class",
        {"template": {"priorityClassName": "system-cluster-critical"}},
        "spec.template.priorityClassName",
        {"allowed_priority_classes": ("system-cluster-critical",)},
    ),
    (
        "host-root",
        {"model": {"source": {"hostPath": {"path": "/", "type": "Directory"}}, "path": "/models/m"}},
        "spec.model.source.hostPath.path",
        {"pod_template_policy": "Permissive"},
    ),
    (
        "host-path-not-listed",
        {"model": {"source": {"hostPath": {"path": "/data/models/qwen", "type": "Directory"}}, "path": "/models/m"}},
        "spec.model.source.hostPath.path",
        {"allowed_host_paths": ("/data/models",)},
    ),
    (
        "every-taint",
        {"template": {"tolerations": [{"operator": "Exists"}]}},
        "spec.template.tolerations[0]",
        {"pod_template_policy": "Permissive"},
    ),
    (
        "control-plane-selector",
        {"template": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}},
        "spec.template.nodeSelector[node-role.kubernetes.io/control-plane]",
        {"pod_template_policy": "Permissive"},
    ),
    (
        # With it, a nodeSelector on a control-plane node's kubernetes.io/hostname lands the pod there.
        "control-plane-toleration",
        {
            "template": {
                "nodeSelector": {"kubernetes.io/hostname": "master-0"},
                "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
            }
        },
        "spec.template.tolerations[0]",
        {"pod_template_policy": "Permissive"},
    ),
    (
        "apparmor-unconfined",
        {
            "template": {
                "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/runtime": "unconfined"}}
            }
        },
        "spec.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/runtime]",
        {"pod_template_policy": "Permissive"},
    ),
    (
        "multus-network-of-another-namespace",
        {"template": {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "kube-system/host-net"}}}},
        "spec.template.metadata.annotations[k8s.v1.cni.cncf.io/networks]",
        {"pod_template_policy": "Permissive"},
    ),
    (
        # KEDA's pod would GET this address every polling interval (an internal host, cloud metadata).
        "tenant-prometheus-address",
        {"autoscaling": {"prometheus": {"address": "http://169.254.169.254/latest"}}},
        "spec.autoscaling.prometheus.address",
        {"allowed_prometheus_addresses": ("http://169.254.169.254/latest",)},
    ),
    (
        # No hostnames: on a shared Gateway the route matching `/` takes every tenant's traffic.
        "route-without-hostnames",
        {"routing": {"gateway": {"name": "inference-gateway"}}},
        "spec.routing.gateway.hostnames",
        {"pod_template_policy": "Permissive"},
    ),
    (
        "gateway-of-another-namespace",
        {"routing": {"gateway": {"name": "shared", "namespace": "gateway-system", "hostnames": ["qwen.example.com"]}}},
        "spec.routing.gateway.namespace",
        {"allowed_gateway_namespaces": ("gateway-system",)},
    ),
    (
        "secret-in-env",
        {"engine": {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}},
        "spec.engine.env[0].valueFrom.secretKeyRef",
        {"pod_template_policy": "Permissive"},
    ),
]


def with_changes(changes: dict[str, Any]) -> dict[str, Any]:
    manifest = example("qwen2.5-7b-910b.yaml")
    for section, values in changes.items():
        manifest["spec"].setdefault(section, {})
        if section == "model":
            manifest["spec"]["model"] = {**manifest["spec"]["model"], **values}
        else:
            manifest["spec"][section].update(values)
    return manifest


@pytest.mark.parametrize(("changes", "field", "allowing"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_the_default_policy_refuses_what_widens_a_pod(
    changes: dict[str, Any],
    field: str,
    allowing: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    manifest = with_changes(changes)
    assert read_spec(example("qwen2.5-7b-910b.yaml"), CONFIG)[1] == []
    desired = desired_state(manifest, CONFIG, frozenset())
    assert [problem.field for problem in desired.problems] == [field]
    assert not desired.manifests  # nothing is applied: Degraded/InvalidSpec names the field
    # The setting that allows it (or Permissive) lets the same spec through.
    assert policy_problems(parse_spec(manifest["spec"]), dataclasses.replace(CONFIG, **allowing)) == []
    assert policy_problems(parse_spec(manifest["spec"]), OperatorConfig(pod_template_policy="Permissive")) == []
    # And `npu-operator render`, as a user checks a file, says the same.
    path = tmp_path / "resource.yaml"
    path.write_text(yaml.safe_dump(manifest))
    monkeypatch.delenv("NPU_OPERATOR_CONFIG", raising=False)
    assert cli.main(["render", "-f", str(path)]) == 2
    refusal = next(line for line in capsys.readouterr().err.splitlines() if line.strip().startswith(field))
    # It names the chart value and the variable that allow it, and the --set that does, which render takes.
    hint = shlex.split(refusal.split("e.g. ", 1)[1])
    setting = next(s for s in SETTINGS.values() if hint[1].startswith(s.chart_value + "="))
    assert hint[0] == "--set" and f"chart value {setting.chart_value} (variable {setting.variable})" in refusal
    assert cli.main(["render", "-f", str(path), *hint]) == 0, capsys.readouterr().err


def test_a_refused_host_path_says_how_to_allow_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for setting in SETTINGS.values():
        monkeypatch.delenv(setting.variable, raising=False)
    monkeypatch.delenv("NPU_OPERATOR_CONFIG", raising=False)
    assert cli.main(["render", "-f", str(EXAMPLES / "sandbox-cpu.yaml")]) == 2
    assert capsys.readouterr().err.splitlines()[1] == (
        "  spec.model.source.hostPath.path: '/tmp/npu-sandbox/models' is not under an allowed host directory"
        " (allowed: none); allowed by the chart value operator.podTemplatePolicy.allowedHostPaths"
        " (variable NPU_OPERATOR_ALLOWED_HOST_PATHS),"
        " e.g. --set 'operator.podTemplatePolicy.allowedHostPaths={/tmp/npu-sandbox/models}'"
    )
    # With one directory allowed already, the --set keeps it: helm's --set replaces a whole list.
    config = OperatorConfig(allowed_host_paths=("/data/models",))
    (problem,) = policy_problems(parse_spec(example("sandbox-cpu.yaml")["spec"]), config)
    assert problem.message.endswith(
        "--set 'operator.podTemplatePolicy.allowedHostPaths={/data/models,/tmp/npu-sandbox/models}'"
    )


def test_what_only_the_permissive_policy_allows_says_so() -> None:
    manifest = with_changes({"template": {"tolerations": [{"operator": "Exists"}]}, "engine": {"image": "vllm:1"}})
    problems = policy_problems(parse_spec(manifest["spec"]), CONFIG)
    assert [p.field for p in problems] == ["spec.engine.image", "spec.template.tolerations[0]"]
    for problem in problems:  # a bare image name lies under no registry a setting can list
        assert problem.message.endswith(
            "refused by podTemplatePolicy Restricted; allowed by the chart value operator.podTemplatePolicy.mode"
            " (variable NPU_OPERATOR_POD_TEMPLATE_POLICY), e.g. --set operator.podTemplatePolicy.mode=Permissive"
        )


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("http://prometheus-operated.monitoring.svc:9090", True),  # the operator's own (CONFIG's default)
        ("http://prometheus-operated.monitoring.svc:9090/", True),  # KEDA appends /api/v1/query: the same
        ("https://prometheus.example.com", True),  # listed
        ("https://prometheus.example.com/", True),
        ("https://prometheus.example.com@169.254.169.254", False),  # a user part: another host
        ("https://prometheus.example.com.evil.test", False),
        ("https://prometheus.example.com/../federate", False),  # another path is another address
        ("http://prometheus.example.com", False),  # another scheme
        ("http://127.0.0.1:10250", False),
    ],
)
def test_a_resources_prometheus_is_the_operators_or_a_listed_one(address: str, allowed: bool) -> None:
    """KEDA's Prometheus scaler takes `serverAddress` as any string and GETs `serverAddress +
    "/api/v1/query?..."` from KEDA's pod (kedacore/keda pkg/scalers/prometheus_scaler.go:
    prometheusMetadata.ServerAddress, ExecutePromQuery): only a trailing `/` may differ."""
    manifest = with_changes({"autoscaling": {"prometheus": {"address": address}}})
    config = dataclasses.replace(CONFIG, allowed_prometheus_addresses=("https://prometheus.example.com",))
    problems = policy_problems(parse_spec(manifest["spec"]), config)
    assert [p.field for p in problems] == ([] if allowed else ["spec.autoscaling.prometheus.address"])
    for problem in problems:
        assert "KEDA would send its queries there" in problem.message
        assert "operator.podTemplatePolicy.allowedPrometheusAddresses" in problem.message


def test_a_gateway_in_the_resources_own_namespace_needs_no_setting() -> None:
    gateway = {"name": "inference-gateway", "namespace": "llm", "hostnames": ["qwen.llm.example.com"]}
    manifest = with_changes({"routing": {"gateway": gateway}})
    assert manifest["metadata"]["namespace"] == "llm"
    assert read_spec(manifest, CONFIG)[1] == []
    del manifest["spec"]["routing"]["gateway"]["namespace"]  # unset: the resource's own
    assert read_spec(manifest, CONFIG)[1] == []
    manifest["metadata"]["namespace"] = "tenant-b"
    manifest["spec"]["routing"]["gateway"]["namespace"] = "llm"  # now another tenant's Gateway
    assert [p.field for p in read_spec(manifest, CONFIG)[1]] == ["spec.routing.gateway.namespace"]


@pytest.mark.parametrize(
    ("hostname", "valid"),
    [
        ("qwen.example.com", True),
        ("*.inference.example.com", True),
        ("localhost", True),
        ("Qwen.example.com", False),  # Gateway API's Hostname: lower-case labels
        ("qwen.example.com:443", False),  # no port
        ("*", False),  # a wildcard only as the first label of a name
        ("a.*.example.com", False),
        ("qwen_1.example.com", False),
        ("", False),
    ],
)
def test_route_hostnames_are_gateway_api_hostnames(hostname: str, valid: bool) -> None:
    """The CRD takes what Gateway API's Hostname type takes (kubernetes-sigs/gateway-api v1.4.0
    apis/v1/shared_types.go Hostname: 1..253 characters, its pattern; HTTPRouteSpec.Hostnames at most 16)."""
    manifest = with_changes({"routing": {"gateway": {"name": "gw", "hostnames": [hostname]}}})
    assert (crd.validate(manifest) == []) is valid
    many = with_changes({"routing": {"gateway": {"name": "gw", "hostnames": [f"h{i}.example.com" for i in range(17)]}}})
    assert any("hostnames" in error for error in crd.validate(many))


def test_policy_settings_are_checked_at_startup() -> None:
    config = load_config(
        {
            "NPU_OPERATOR_POD_TEMPLATE_POLICY": "Permissive",
            "NPU_OPERATOR_ALLOWED_REGISTRIES": "quay.io/ascend, registry.local:5000/llm",
            "NPU_OPERATOR_ALLOWED_HOST_PATHS": "/data/models",
            "NPU_OPERATOR_ALLOW_SERVICE_ACCOUNT_TOKEN": "true",
        }
    )
    assert (config.pod_template_policy, config.allowed_registries, config.allowed_host_paths) == (
        "Permissive",
        ("quay.io/ascend", "registry.local:5000/llm"),
        ("/data/models",),
    )
    for variable, value in (
        ("NPU_OPERATOR_POD_TEMPLATE_POLICY", "Lax"),
        ("NPU_OPERATOR_ALLOWED_HOST_PATHS", "/"),
        ("NPU_OPERATOR_ALLOWED_HOST_PATHS", "relative"),
        ("NPU_OPERATOR_ALLOWED_REGISTRIES", "https://quay.io"),
        ("NPU_OPERATOR_ALLOWED_PROMETHEUS_ADDRESSES", "prometheus:9090"),
        ("NPU_OPERATOR_ALLOWED_GATEWAY_NAMESPACES", "Gateways"),
    ):
        with pytest.raises(ConfigError, match=variable):
            load_config({variable: value})


# --- tokens ---------------------------------------------------------------------------------------


def test_a_token_goes_to_a_plain_http_endpoint_only_when_the_resource_says_so() -> None:
    manifest = example("qwen2.5-7b-modelscope.yaml")
    hub = manifest["spec"]["model"]["source"]["modelScope"]
    hub.update(endpoint="http://mirror.internal", tokenSecretRef={"name": "ms-token"})
    problems = validate_spec(parse_spec(manifest["spec"]))
    assert [p.field for p in problems] == ["spec.model.source.modelScope.endpoint"]
    assert "sendTokenOverHTTP" in problems[0].message
    hub["sendTokenOverHTTP"] = True
    spec = parse_spec(manifest["spec"])
    assert validate_spec(spec) == []
    assert "--send-token-over-http" in engine_pod.fetch_args(spec)


def test_an_additional_config_larger_than_one_argument_should_be_is_refused() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["engine"]["additionalConfig"] = {"blob": "x" * 20000}
    problems = validate_spec(parse_spec(manifest["spec"]))
    assert [p.field for p in problems] == ["spec.engine.additionalConfig"]
    assert "16384" in problems[0].message
    manifest["spec"]["engine"]["additionalConfig"] = {"ascend_scheduler_config": {"enabled": True}}
    assert validate_spec(parse_spec(manifest["spec"])) == []

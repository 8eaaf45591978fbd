"""The chart as helm renders it: lint, every value set valid, the operator's settings, RBAC, peering."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from npu_operator import topologies
from npu_operator.api.config import OperatorConfig, load_config
from npu_operator.api.spec import parse_spec
from npu_operator.children import kinds as children
from npu_operator.children import kinds as children_kinds
from npu_operator.kube import client, names
from npu_operator.status import calibration

from tests.chart import monitoring
from tests.chart.helm import (
    CHART,
    JSON,
    NAMESPACE,
    ROOT,
    by_kind,
    helm,
    one,
    render,
    template,
    validate,
    value_args,
)

MONITORING_ON = {
    "monitoring": {
        "operatorPodMonitor": {"enabled": True},
        "inferencePodMonitor": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
        "prometheusRule": {"enabled": True},
    }
}
NAMESPACED = {"watch": {"scope": "namespaced", "namespaces": ["llm", "research"]}}
CLUSTER = {"watch": {"scope": "cluster"}}  # the opt-in: every namespace
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cluster": CLUSTER,
    "monitoring-on": MONITORING_ON,
    "namespaced": NAMESPACED,
    "namespaced-release-namespace": {
        "watch": {"scope": "namespaced"},
        "rbac": {"namespacedDiscovery": False},
        "npu": {"nodeDiscovery": False},
    },
    "nodes-only": {"watch": {"scope": "namespaced"}, "rbac": {"namespacedDiscovery": False}},
    "crds-off": {"crds": {"install": False}, "peering": {"installCRDs": False}},
    "standalone": {"operator": {"standalone": True}},
    "everything": {
        **NAMESPACED,
        **MONITORING_ON,
        "replicaCount": 2,
        "crds": {"install": True, "keep": False},
        "operator": {"extraEnv": [{"name": "PYTHONASYNCIODEBUG", "value": "0"}], "logLevel": "DEBUG"},
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "llm"},
    },
}


@pytest.fixture(scope="module")
def defaults() -> list[JSON]:
    return render()


@pytest.fixture(scope="module")
def peering_crds(defaults: list[JSON]) -> list[JSON]:
    """The chart's peering CRDs, to validate peering objects rendered without them (installCRDs off)."""
    return [crd for crd in by_kind(defaults, "CustomResourceDefinition") if crd["spec"]["group"] == "kopf.dev"]


def container(objects: list[JSON]) -> JSON:
    containers: list[JSON] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(objects: list[JSON]) -> dict[str, str]:
    return {var["name"]: var["value"] for var in container(objects)["env"]}


# --- lint and validation ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_is_clean(name: str, tmp_path: Path) -> None:
    result = helm("lint", "--strict", str(CHART), *value_args(VALUE_SETS[name], tmp_path))
    assert "0 chart(s) failed" in result.stdout
    assert "[ERROR]" not in result.stdout and "[WARNING]" not in result.stdout


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_object_passes_validation(name: str, tmp_path: Path, peering_crds: list[JSON]) -> None:
    objects = render(VALUE_SETS[name], tmp_path)
    assert objects
    for obj in objects:
        validate(obj, [*objects, *peering_crds])


def test_default_values_render_the_operator_and_nothing_that_needs_prometheus(defaults: list[JSON]) -> None:
    kinds = sorted(obj["kind"] for obj in defaults)
    assert kinds == [
        "ClusterRole",  # kopf's read-only discovery
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "Deployment",
        "KopfPeering",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    assert not [obj for obj in defaults if obj["apiVersion"].startswith("monitoring.coreos.com")]


# --- the operator Deployment ---------------------------------------------------------------------


def test_one_operator_replaced_not_rolled(defaults: list[JSON]) -> None:
    deployment = one(defaults, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["metadata"]["namespace"] == NAMESPACE


def test_liveness_probe_is_kopfs_health_endpoint(defaults: list[JSON]) -> None:
    runtime = container(defaults)
    probe = runtime["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    ports = {port["name"]: port["containerPort"] for port in runtime["ports"]}
    assert ports[probe["port"]] == int(env_of(defaults)["NPU_OPERATOR_HEALTH_PORT"]) == 8081
    assert ports["metrics"] == int(env_of(defaults)["NPU_OPERATOR_METRICS_PORT"]) == 8080


def test_operator_runs_hardened(defaults: list[JSON]) -> None:
    pod = one(defaults, "Deployment")["spec"]["template"]["spec"]
    runtime = container(defaults)
    security = runtime["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert runtime["resources"]["requests"]["cpu"] and runtime["resources"]["requests"]["memory"]
    assert runtime["args"] == ["run"], "the image's entrypoint is npu-operator; the chart only picks the command"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_operator_accepts_the_settings_the_chart_gives_it(name: str, tmp_path: Path) -> None:
    objects = render(VALUE_SETS[name], tmp_path)
    config = load_config({k: v for k, v in env_of(objects).items() if k.startswith("NPU_OPERATOR_")})
    assert config.runtime_image == "ghcr.io/npu-inference/npu-runtime:0.1.0"
    assert config.npu_resource_name == ""  # the cluster profile's for each spec's NPU family
    assert config.cluster_profile == "ascend-docker-runtime"
    assert config.node_discovery is VALUE_SETS[name].get("npu", {}).get("nodeDiscovery", True)
    scope = VALUE_SETS[name].get("watch", {})
    if scope.get("scope", "namespaced") == "namespaced":  # the default
        assert config.namespaces == tuple(scope.get("namespaces") or [NAMESPACE])
    else:
        assert config.namespaces == ()


def test_operator_settings_come_from_values(tmp_path: Path) -> None:
    values = {
        "operator": {
            "runtimeImage": {"repository": "registry.example.com/npu-runtime", "tag": "1.2.3-a3"},
            "npuResourceName": "huawei.com/Ascend910C",
            "resyncSeconds": 60,
            "peeringName": "llm-operators",
            "podTemplatePolicy": {
                "allowedRegistries": ["registry.example.com", "quay.io/ascend"],
                "allowedPriorityClasses": ["inference-high"],
                "allowedHostPaths": ["/data/models"],
            },
        },
        "image": {"repository": "registry.example.com/npu-operator", "tag": "1.2.3"},
    }
    objects = render(values, tmp_path)
    config = load_config(env_of(objects))
    assert config.pod_template_policy == "Restricted"  # the default, kept beside the lists given
    assert config.allowed_registries == ("registry.example.com", "quay.io/ascend")
    assert config.allowed_priority_classes == ("inference-high",)
    assert config.allowed_host_paths == ("/data/models",)
    assert config.allow_service_account_token is False
    permissive = render({"operator": {"podTemplatePolicy": {"mode": "Permissive"}}}, tmp_path)
    assert load_config(env_of(permissive)).pod_template_policy == "Permissive"
    assert config.runtime_image == "registry.example.com/npu-runtime:1.2.3-a3"
    assert config.npu_resource_name == "huawei.com/Ascend910C"
    assert config.resync_seconds == 60
    assert config.peering_name == "llm-operators"
    assert container(objects)["image"] == "registry.example.com/npu-operator:1.2.3"
    assert one(objects, "KopfPeering")["metadata"]["name"] == "llm-operators"


# --- RBAC ----------------------------------------------------------------------------------------

# (api group, resource) -> verbs: what the operator's code and kopf use (see templates/rbac.yaml).
NAMESPACED_RULES = {
    ("inference.npu.dev", "npuinferences"): {"get", "list", "watch", "patch"},
    ("inference.npu.dev", "npuinferences/status"): {"get", "patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("monitoring.coreos.com", "podmonitors"): {"get", "list", "watch", "create", "patch", "delete"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("disaggregatedset.x-k8s.io", "disaggregatedsets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "persistentvolumeclaims"): {"get", "create", "patch"},
    ("apps", "replicasets"): {"get", "list", "watch"},
    ("apps", "statefulsets"): {"get", "list", "watch"},
    ("", "events"): {"create"},
    ("keda.sh", "scaledobjects"): {"get", "list", "watch", "create", "patch", "delete"},
    ("inference.networking.k8s.io", "inferencepools"): {"get", "list", "watch", "create", "patch", "delete"},
    ("gateway.networking.k8s.io", "httproutes"): {"get", "list", "watch", "create", "patch", "delete"},
    ("networking.istio.io", "destinationrules"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "serviceaccounts"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "list", "watch", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "list", "watch", "create", "patch", "delete"},
    # Only so that the picker's Role may grant it (RBAC escalation check).
    ("inference.networking.x-k8s.io", "inferenceobjectives"): {"get", "list", "watch"},
    ("inference.networking.x-k8s.io", "inferencemodelrewrites"): {"get", "list", "watch"},
    ("llm-d.ai", "inferenceobjectives"): {"get", "list", "watch"},
    ("llm-d.ai", "inferencemodelrewrites"): {"get", "list", "watch"},
}


def grants(role: JSON) -> dict[tuple[str, str], set[str]]:
    result: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                result.setdefault((group, resource), set()).update(rule["verbs"])
    return result


# npu.nodeDiscovery (on by default): the operator reads which NPUs the nodes offer.
NODE_RULE: dict[tuple[str, str], set[str]] = {("", "nodes"): {"get", "list", "watch"}}
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate"})


def test_the_default_grants_write_rights_only_in_the_namespaces_it_serves(defaults: list[JSON]) -> None:
    """Issue 33 item 8: by default nothing cluster-wide that a namespaced grant can do. The only
    ClusterRole reads CRDs and namespace names (kopf's discovery) and Nodes; every write right is in a Role of
    the release namespace, the one the operator serves (NPU_OPERATOR_NAMESPACES), so a compromised
    operator can write nothing in kube-system or any other namespace."""
    for role in by_kind(defaults, "ClusterRole"):
        assert not any(set(verbs) & WRITE_VERBS for verbs in grants(role).values()), grants(role)
        assert grants(role) == {
            ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
            ("", "namespaces"): {"list", "watch"},
            **NODE_RULE,
        }
    (role,) = by_kind(defaults, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role) == {**NAMESPACED_RULES, ("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch"}}
    assert env_of(defaults)["NPU_OPERATOR_NAMESPACES"] == NAMESPACE


def test_cluster_scope_grants_exactly_what_is_used(tmp_path: Path) -> None:
    defaults = render(CLUSTER, tmp_path)
    role = one(defaults, "ClusterRole")
    assert grants(role) == {
        **NAMESPACED_RULES,
        ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        **NODE_RULE,
    }
    binding = one(defaults, "ClusterRoleBinding")
    account = one(defaults, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert one(defaults, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert not by_kind(defaults, "Role") and not by_kind(defaults, "RoleBinding")


# --- the cluster-wide opt-in's admission policy --------------------------------------------------

OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:npu-npu-inference-operator"


def admitted(policy: JSON, operation: str, namespace: str, new: JSON | None, old: JSON | None, user: str) -> bool:
    """Whether the ValidatingAdmissionPolicy lets the request through, its CEL evaluated as the API
    server does (matchConditions first: an unmatched request is not validated; then every validation)."""
    environment = celpy.Environment()
    request = {"operation": operation, "namespace": namespace, "userInfo": {"username": user}}
    variables = {"request": json_to_cel(request), "object": json_to_cel(new), "oldObject": json_to_cel(old)}

    def holds(expression: str) -> bool:
        return bool(environment.program(environment.compile(expression)).evaluate(variables))

    if not all(holds(condition["expression"]) for condition in policy["spec"]["matchConditions"]):
        return True
    return all(holds(validation["expression"]) for validation in policy["spec"]["validations"])


def confined_kinds(policy: JSON) -> set[tuple[str, str]]:
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    return {(group, resource) for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]}


def test_the_cluster_wide_opt_in_confines_the_operators_writes_to_objects_it_manages(tmp_path: Path) -> None:
    objects = render(CLUSTER, tmp_path)
    policy = one(objects, "ValidatingAdmissionPolicy")
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    # The kinds a write to which takes over a namespace, all of them writable under the ClusterRole.
    assert confined_kinds(policy) == {
        ("", "configmaps"),
        ("", "services"),
        ("", "serviceaccounts"),
        ("apps", "deployments"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("policy", "poddisruptionbudgets"),
    }
    assert confined_kinds(policy) <= set(grants(one(objects, "ClusterRole")))
    ours = {"metadata": {"name": "m", "labels": {"app.kubernetes.io/managed-by": "npu-operator"}}}
    foreign = {"metadata": {"name": "coredns", "labels": {"k8s-app": "kube-dns"}}}
    bare: JSON = {"metadata": {"name": "x"}}
    me = OPERATOR_USER
    assert admitted(policy, "CREATE", "llm", ours, None, me)
    assert admitted(policy, "UPDATE", "llm", ours, ours, me)
    assert admitted(policy, "DELETE", "llm", None, ours, me)
    assert not admitted(policy, "CREATE", "llm", bare, None, me)
    assert not admitted(policy, "UPDATE", "llm", ours, foreign, me)  # adopting another's object by labelling it
    assert not admitted(policy, "UPDATE", "llm", foreign, ours, me)
    assert not admitted(policy, "DELETE", "llm", None, foreign, me)
    for namespace in ("kube-system", "kube-public", "kube-node-lease"):
        assert not admitted(policy, "CREATE", namespace, ours, None, me)  # a forged label does not help there
        assert not admitted(policy, "UPDATE", namespace, foreign, foreign, me)
    assert admitted(policy, "UPDATE", "kube-system", foreign, foreign, "system:serviceaccount:kube-system:admin")
    # The namespaced default needs none: its Roles grant nothing outside the served namespaces.
    assert not by_kind(render({}, tmp_path), "ValidatingAdmissionPolicy")
    assert not by_kind(
        render({**CLUSTER, "rbac": {"confineClusterWrites": {"enabled": False}}}, tmp_path), "ValidatingAdmissionPolicy"
    )


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_object_the_operator_writes_passes_the_cluster_wide_policy(example: str, tmp_path: Path) -> None:
    """The policy must never refuse the operator's own writes: every child of a confined kind that it
    builds (the endpoint picker's too) and the calibration record carry its label."""
    policy = one(render(CLUSTER, tmp_path), "ValidatingAdmissionPolicy")
    manifest = yaml.safe_load((ROOT / "examples" / example).read_text(encoding="utf-8"))
    spec = parse_spec(manifest["spec"])
    built = topologies.build_children("m", "llm", spec, OperatorConfig(), children_kinds.Capabilities.everything())
    built.append(calibration.configmap("m", "llm", names.labels("m"), {}))
    plurals = {(kind.resource.group, kind.resource.kind): kind.resource.plural for kind in children.KINDS}
    confined = confined_kinds(policy)
    written = [c for c in built if (group := c["apiVersion"].rpartition("/")[0], plurals[group, c["kind"]]) in confined]
    assert written
    for child in written:
        assert admitted(policy, "CREATE", "llm", child, None, OPERATOR_USER), child["metadata"]
        assert admitted(policy, "UPDATE", "llm", child, child, OPERATOR_USER), child["metadata"]
        assert admitted(policy, "DELETE", "llm", None, child, OPERATOR_USER), child["metadata"]


def test_every_kind_the_operator_touches_has_a_rule() -> None:
    """A new child kind in the operator's table without a rule here fails this test."""
    resources = (*(kind.resource for kind in children.KINDS), client.PODS, client.EVENTS, client.NPU_INFERENCES)
    touched = {(r.group, r.plural) for r in resources}
    assert touched <= set(NAMESPACED_RULES)


def test_namespaced_scope_grants_roles_in_each_namespace_only(tmp_path: Path) -> None:
    objects = render(NAMESPACED, tmp_path)
    roles = by_kind(objects, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["llm", "research"]
    for role in roles:
        assert grants(role) == {**NAMESPACED_RULES, ("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch"}}
    bindings = by_kind(objects, "RoleBinding")
    assert sorted((b["metadata"]["namespace"], b["subjects"][0]["namespace"]) for b in bindings) == [
        ("llm", NAMESPACE),
        ("research", NAMESPACE),
    ]
    # The only cluster-wide grant: kopf's read-only watch of CRDs and namespace names, and the Nodes read.
    assert grants(one(objects, "ClusterRole")) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
        **NODE_RULE,
    }
    assert env_of(objects)["NPU_OPERATOR_NAMESPACES"] == "llm,research"


def test_namespaced_scope_without_discovery_has_no_cluster_grant(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["namespaced-release-namespace"], tmp_path)
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")
    assert [role["metadata"]["namespace"] for role in by_kind(objects, "Role")] == [NAMESPACE]


@pytest.mark.parametrize("scope", [NAMESPACED, CLUSTER])
def test_the_nodes_are_read_only_with_node_discovery(scope: dict[str, Any], tmp_path: Path) -> None:
    """npu.nodeDiscovery (on by default) grants get/list/watch of Nodes, cluster-wide (a ClusterRole and
    its binding even in namespaced scope: Nodes are not namespaced); off, no rule names Nodes, and the
    operator is told not to ask (NPU_OPERATOR_NODE_DISCOVERY)."""
    on = render(scope, tmp_path)
    roles = by_kind(on, "ClusterRole")
    assert [grants(role)[("", "nodes")] for role in roles if ("", "nodes") in grants(role)] == [
        {"get", "list", "watch"}
    ]
    bound = {b["roleRef"]["name"] for b in by_kind(on, "ClusterRoleBinding")}
    assert {role["metadata"]["name"] for role in roles if ("", "nodes") in grants(role)} <= bound
    assert env_of(on)["NPU_OPERATOR_NODE_DISCOVERY"] == "true"
    off = render({**scope, "npu": {"nodeDiscovery": False}}, tmp_path)
    for role in [*by_kind(off, "ClusterRole"), *by_kind(off, "Role")]:
        assert ("", "nodes") not in grants(role)
    assert env_of(off)["NPU_OPERATOR_NODE_DISCOVERY"] == "false"


def test_node_discovery_alone_is_the_only_cluster_grant_in_namespaced_scope(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["nodes-only"], tmp_path)
    assert grants(one(objects, "ClusterRole")) == NODE_RULE
    assert one(objects, "ClusterRoleBinding")["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]


@pytest.mark.parametrize("name", ["defaults", "cluster", "namespaced", "nodes-only"])
def test_every_rbac_rule_says_who_needs_it(name: str, tmp_path: Path) -> None:
    text = template(VALUE_SETS[name], tmp_path, "--show-only", "templates/rbac.yaml")
    lines = text.splitlines()
    rules = [index for index, line in enumerate(lines) if re.match(r"^\s*- apiGroups:", line)]
    assert rules
    for index in rules:
        back = index - 1
        while not lines[back].strip().startswith("#"):
            assert not lines[back].strip().startswith("rules:"), f"uncommented rule: {lines[index]}"
            back -= 1
        comment: list[str] = []
        while lines[back].strip().startswith("#"):
            comment.insert(0, lines[back].strip())
            back -= 1
        assert re.search(r"\b(framework|application)\b", " ".join(comment)), comment


def test_no_rbac_when_disabled(tmp_path: Path) -> None:
    objects = render({"rbac": {"create": False}}, tmp_path)
    assert not [obj for obj in objects if obj["apiVersion"].startswith("rbac.authorization.k8s.io")]


# --- peering -------------------------------------------------------------------------------------


def test_cluster_peering_object_is_a_hook_named_as_the_operator_expects(tmp_path: Path) -> None:
    defaults = render(CLUSTER, tmp_path)
    peering = one(defaults, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == env_of(defaults)["NPU_OPERATOR_PEERING_NAME"]
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert peering["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert env_of(defaults)["NPU_OPERATOR_STANDALONE"] == "false"


def test_namespaced_peering_objects_in_each_watched_namespace(tmp_path: Path) -> None:
    objects = render(NAMESPACED, tmp_path)
    assert not by_kind(objects, "ClusterKopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in by_kind(objects, "KopfPeering")) == ["llm", "research"]


def test_standalone_has_no_peering_object(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["standalone"], tmp_path)
    assert not by_kind(objects, "ClusterKopfPeering") and not by_kind(objects, "KopfPeering")
    assert env_of(objects)["NPU_OPERATOR_STANDALONE"] == "true"


# --- values the chart refuses ------------------------------------------------------------------

BAD_VALUES = [
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    ({"replicaCount": "two"}, "/replicaCount"),
    ({"replicaCount": 0}, "/replicaCount"),
    ({"watch": {"scope": "everywhere", "namespaces": []}}, "/watch/scope"),
    ({"watch": {"scope": "namespaced", "namespaces": ["Not_A_Namespace"]}}, "/watch/namespaces/0"),
    ({"operator": {"logLevel": "TRACE"}}, "/operator/logLevel"),
    ({"operator": {"npuResourceName": "Ascend910"}}, "/operator/npuResourceName"),
    ({"operator": {"healthPort": 70000}}, "/operator/healthPort"),
    ({"crds": {"install": "yes"}}, "/crds/install"),
    ({"monitoring": {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}}, "/monitoring/grafanaDashboard/labels"),
    ({"monitoring": {"prometheusRule": {"alerts": {"eagerFallbacks": {"ratio": 5}}}}}, "/eagerFallbacks/ratio"),
    ({"monitoring": {"prometheusRule": {"alerts": {"podNotReady": {"for": "forever"}}}}}, "/podNotReady/for"),
    ({"monitoring": {"prometheusRule": {"alerts": {"podNotReady": {"page": True}}}}}, "'page' not allowed"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_the_schema_rejects_bad_values_naming_them(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    for command in ("template", "lint"):
        args = [command, *(["npu"] if command == "template" else []), str(CHART), *value_args(values, tmp_path)]
        result = helm(*args, check=False)
        assert result.returncode != 0, f"helm {command} accepted {values}"
        output = result.stdout + result.stderr
        assert "schema" in output and message in output, output


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"watch": {"scope": "cluster", "namespaces": ["llm"]}},
            'watch.namespaces is set but watch.scope is "cluster"',
        ),
        ({"operator": {"standalone": True}, "replicaCount": 2}, "replicaCount > 1 needs kopf peering"),
        ({"operator": {"healthPort": 9000, "metricsPort": 9000}}, "must differ"),
        ({"serviceAccount": {"create": False, "name": ""}}, "serviceAccount.name is required"),
    ],
)
def test_values_that_do_not_fit_together_fail_with_a_message(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    result = helm("template", "npu", str(CHART), *value_args(values, tmp_path), check=False)
    assert result.returncode != 0
    assert message in result.stderr


# Values that hold Kubernetes objects or free-form maps: their inner keys are Kubernetes' own.
PASS_THROUGH = {"podSecurityContext", "securityContext", "resources", "labels", "annotations"}


def test_every_value_is_documented() -> None:
    """Each key in values.yaml has a comment right above it, except inside Kubernetes objects."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    parents: list[tuple[int, str]] = []  # (indent, key) of the enclosing keys
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z_][\w.-]*):", line)
        if not match:
            continue
        indent, key = len(match[1]), match[2]
        parents = [(i, k) for i, k in parents if i < indent]
        if not any(k in PASS_THROUGH for _, k in parents):
            previous = lines[index - 1].strip() if index else ""
            assert previous.startswith("#"), f"values.yaml line {index + 1} has no comment: {line.strip()}"
        parents.append((indent, key))


# --- NOTES.txt -----------------------------------------------------------------------------------


def notes(values: dict[str, Any] | None, tmp_path: Path) -> str:
    result = helm(
        "install", "npu", str(CHART), "--dry-run=client", "--namespace", NAMESPACE, *value_args(values, tmp_path)
    )
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_say_how_npuinferences_are_deleted_around_an_uninstall(tmp_path: Path) -> None:
    text = notes(None, tmp_path)
    assert "Uninstalling leaves the NPUInferences serving" in text and "keeps no finalizer" in text
    assert "inference.npu.dev/finalizer" in text and "remove it by hand" in text
    assert "kubectl get npuinf" in text
    assert f"It serves NPUInference resources in: {NAMESPACE}." in text
    assert "every namespace" in notes(CLUSTER, tmp_path)


def test_notes_follow_the_values(tmp_path: Path) -> None:
    text = notes({**NAMESPACED, **MONITORING_ON}, tmp_path)
    assert "llm, research" in text
    assert "kube-state-metrics" in text
    assert "kopfpeering npu-operator -n NAMESPACE" in text


# --- the PodMonitors agree with the pods the operator builds -------------------------------------


def operator_children() -> list[JSON]:
    """What the operator applies for the 7B example, PodMonitor included."""
    manifest = yaml.safe_load((ROOT / "examples" / "qwen2.5-7b-910b.yaml").read_text(encoding="utf-8"))
    spec = parse_spec(manifest["spec"])
    return topologies.build_children(
        "qwen", "llm", spec, OperatorConfig(), children_kinds.Capabilities(pod_monitor=True)
    )


def test_inference_pod_monitor_selects_the_operators_pods_on_their_ports(tmp_path: Path) -> None:
    objects = render(MONITORING_ON, tmp_path)
    monitor = one(objects, "PodMonitor", "npu-npu-inference-operator-inference")
    children = operator_children()
    pod = one(children, "Deployment")["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}  # the namespaces served
    cluster = one(render({**MONITORING_ON, **CLUSTER}, tmp_path), "PodMonitor", "npu-npu-inference-operator-inference")
    assert cluster["spec"]["namespaceSelector"] == {"any": True}
    ports = {port["name"] for port in pod["spec"]["containers"][0]["ports"]}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"http", "metrics"} == ports


def test_both_inference_pod_monitors_give_series_the_same_labels(tmp_path: Path) -> None:
    """The chart's PodMonitor and the operator's per-resource one: same endpoints, same labels."""
    chart_monitor = one(render(MONITORING_ON, tmp_path), "PodMonitor", "npu-npu-inference-operator-inference")
    operator_monitor = one(operator_children(), "PodMonitor")
    monitoring.validate(operator_monitor)
    assert chart_monitor["spec"]["podTargetLabels"] == operator_monitor["spec"]["podTargetLabels"]
    assert operator_monitor["spec"]["podTargetLabels"] == [names.NAME_LABEL]

    def endpoints(monitor: JSON) -> list[tuple[str, str, str]]:
        return sorted(
            (e["port"], e["path"], json.dumps(e["relabelings"], sort_keys=True))
            for e in monitor["spec"]["podMetricsEndpoints"]
        )

    assert endpoints(chart_monitor) == endpoints(operator_monitor)
    # A LeaderWorkerSet pod's group and node become the target labels `group` and `node_rank`.
    relabelings = operator_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {r["targetLabel"]: r["sourceLabels"] for r in relabelings} == {
        "group": ["__meta_kubernetes_pod_label_leaderworkerset_sigs_k8s_io_group_index"],
        "node_rank": ["__meta_kubernetes_pod_label_leaderworkerset_sigs_k8s_io_worker_index"],
    }


def test_operator_pod_monitor_selects_the_operator_pod(tmp_path: Path) -> None:
    objects = render(MONITORING_ON, tmp_path)
    monitor = one(objects, "PodMonitor", "npu-npu-inference-operator")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert "metrics" in {port["name"] for port in container(objects)["ports"]}


def test_namespaced_inference_pod_monitor_looks_in_the_watched_namespaces(tmp_path: Path) -> None:
    objects = render({**NAMESPACED, **MONITORING_ON}, tmp_path)
    monitor = one(objects, "PodMonitor", "npu-npu-inference-operator-inference")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm", "research"]}


def test_the_chart_readme_covers_every_top_level_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    assert [key for key in values if f"`{key}" not in readme] == []

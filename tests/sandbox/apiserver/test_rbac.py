"""The chart's RBAC against every request the operator makes, by the rules of Kubernetes' RBAC authorizer.

The requests are derived from the operator's code, so a new kind of child, watch or client call is
checked without editing this file: the kopf registry `handlers.registry` makes for the scope (each
watched resource: list and watch), our informers' kinds (list and watch), kopf's own resources
(peering, CRDs, Events, the bookkeeping patches on handled resources), `children.KINDS` (the
client's apply: create and patch; get; delete), and the client's own resources (the status
subresource, the model cache's claim). The rules come from `helm template` of the chart, in both
watch scopes. The authorizer is the emulator's (`npu_sandbox.apiserver.rbac`, which follows
plugin/pkg/auth/authorizer/rbac); its matching rules and the 403's wording are pinned down here
too. tests/e2e/test_helm.py runs the operator with the ServiceAccount's token against the
installed chart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from kopf._cogs.structs import references
from npu_operator.api.config import OperatorConfig
from npu_operator.children import kinds as children
from npu_operator.controller import handlers, watches
from npu_operator.kube import client
from npu_sandbox.apiserver import rbac

from tests.chart.helm import NAMESPACE, RELEASE, render

ACCOUNT = f"{RELEASE}-npu-inference-operator"
USER = rbac.User.service_account(NAMESPACE, ACCOUNT)
WORKLOAD_NAMESPACE = "models"

JSON = dict[str, Any]


def policy(objects: Sequence[JSON]) -> rbac.Policy:
    def of(kind: str) -> list[JSON]:
        return [obj for obj in objects if obj["kind"] == kind]

    return rbac.Policy(
        roles={(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in of("Role")},
        cluster_roles={r["metadata"]["name"]: r for r in of("ClusterRole")},
        role_bindings=of("RoleBinding"),
        cluster_role_bindings=of("ClusterRoleBinding"),
    )


def _named(selector: references.Selector) -> tuple[str, str]:
    """(group, plural) of a kopf selector; kopf's own constants name the plural positionally (any_name)."""
    return selector.group or "", str(selector.plural or selector.any_name)


def _handled(cluster_wide: bool, namespace: str) -> Iterator[tuple[str, str, str]]:
    """(group, plural, registry) of every resource kopf watches for the operator's handlers."""
    registry = handlers.registry(OperatorConfig(namespaces=() if cluster_wide else (namespace,)))
    for name in ("_indexing", "_watching", "_spawning", "_changing"):
        for handler in getattr(registry, name).get_all_handlers():
            yield *_named(handler.selector), name


def operator_requests(namespace: str, cluster_wide: bool) -> list[tuple[str, str, str, str, str]]:
    """(verb, group, resource, subresource, namespace) of every request the operator makes; "" is cluster scope."""
    watch_in = "" if cluster_wide else namespace
    requests: set[tuple[str, str, str, str, str]] = set()
    for group, plural, registry in _handled(cluster_wide, namespace):
        requests |= {("list", group, plural, "", watch_in), ("watch", group, plural, "", watch_in)}
        if registry in ("_spawning", "_changing"):  # kopf's finalizer (added, or removed where not required)
            requests.add(("patch", group, plural, "", namespace))
    # kopf removes the finalizer an earlier version of the operator left on an NPUInference.
    requests.add(("patch", client.NPU_INFERENCES.group, client.NPU_INFERENCES.plural, "", namespace))
    for resource in watches.server_selectors():  # the informers: list, then watch
        requests |= {(verb, resource.group, resource.plural, "", watch_in) for verb in ("list", "watch")}
    for kind in children.KINDS:  # client.KubeClient: apply (create or patch), get, delete
        resource = kind.resource
        requests |= {
            (verb, resource.group, resource.plural, "", namespace) for verb in ("create", "patch", "get", "delete")
        }
    status = client.NPU_INFERENCES
    requests.add(("patch", status.group, status.plural, "status", namespace))  # client.patch_status
    claim = client.PERSISTENT_VOLUME_CLAIMS  # the model cache: an unforced apply, and a get when it conflicts
    requests |= {(verb, claim.group, claim.plural, "", namespace) for verb in ("create", "patch", "get")}
    requests.add(("create", client.EVENTS.group, client.EVENTS.plural, "", namespace))  # kopf.event, worker Events
    # kopf's own: the CRD observer, and the peering object's watch and keep-alive patches.
    crd_group, crd_plural = _named(references.CRDS)
    requests |= {(verb, crd_group, crd_plural, "", "") for verb in ("list", "watch")}
    peering = references.CLUSTER_PEERINGS_K if cluster_wide else references.NAMESPACED_PEERINGS_K
    peering_group, peering_plural = _named(peering)
    requests |= {(verb, peering_group, peering_plural, "", watch_in) for verb in ("list", "watch", "patch")}
    return sorted(requests)


@pytest.mark.parametrize("scope", ["cluster", "namespaced"])
def test_the_chart_grants_every_request_the_operator_makes(scope: str, tmp_path: Any) -> None:
    values: JSON = {"watch": {"scope": scope, "namespaces": [WORKLOAD_NAMESPACE] if scope == "namespaced" else []}}
    rules = policy(render(values, tmp_path))
    requests = operator_requests(WORKLOAD_NAMESPACE, cluster_wide=scope == "cluster")
    assert len(requests) > 30  # the derivation found the kinds
    denied = []
    for verb, group, resource, subresource, namespace in requests:
        attributes = rbac.Attributes(USER, verb, group, resource, subresource, namespace, "")
        if not rules.authorize(attributes)[0]:
            denied.append(rbac.forbidden(attributes)["message"])
    assert denied == []
    # Least privilege: nothing the operator never does, e.g. reading Secrets or deleting its own resource.
    for verb, group, resource in (("get", "", "secrets"), ("delete", "inference.npu.dev", "npuinferences")):
        attributes = rbac.Attributes(USER, verb, group, resource, "", WORKLOAD_NAMESPACE)
        assert not rules.authorize(attributes)[0]


def test_a_namespaced_install_grants_nothing_outside_its_namespaces(tmp_path: Any) -> None:
    rules = policy(render({"watch": {"scope": "namespaced", "namespaces": [WORKLOAD_NAMESPACE]}}, tmp_path))
    inside = rbac.Attributes(USER, "patch", "apps", "deployments", "", WORKLOAD_NAMESPACE, "x")
    assert rules.authorize(inside)[0]
    for namespace in ("default", ""):
        assert not rules.authorize(rbac.Attributes(USER, "patch", "apps", "deployments", "", namespace, "x"))[0]


RULE: JSON = {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"], "verbs": ["get", "patch"]}


@pytest.mark.parametrize(
    ("rule", "verb", "group", "resource", "subresource", "name", "allowed"),
    [
        (RULE, "patch", "apps", "deployments", "", "a", True),
        (RULE, "patch", "", "deployments", "", "a", False),  # another API group
        (RULE, "delete", "apps", "deployments", "", "a", False),
        (RULE, "patch", "apps", "deployments", "status", "a", False),  # a subresource is its own resource
        (RULE, "patch", "apps", "deployments", "scale", "a", True),
        ({**RULE, "resources": ["*/scale"]}, "get", "apps", "deployments", "scale", "a", True),
        ({**RULE, "resources": ["*/scale"]}, "get", "apps", "deployments", "", "a", False),
        ({**RULE, "resources": ["*"]}, "get", "apps", "deployments", "status", "a", True),
        ({**RULE, "apiGroups": ["*"], "verbs": ["*"]}, "delete", "policy", "deployments", "", "a", True),
        ({**RULE, "resourceNames": ["a"]}, "get", "apps", "deployments", "", "a", True),
        ({**RULE, "resourceNames": ["a"]}, "get", "apps", "deployments", "", "b", False),
        ({**RULE, "resourceNames": ["a"], "verbs": ["list"]}, "list", "apps", "deployments", "", "", False),
    ],
)
def test_rules_match_as_kubernetes_rbac_matches_them(
    rule: JSON, verb: str, group: str, resource: str, subresource: str, name: str, allowed: bool
) -> None:
    attributes = rbac.Attributes(USER, verb, group, resource, subresource, "ns", name)
    assert rbac.rule_allows(attributes, rule) is allowed


def test_bindings_name_the_account_its_groups_or_a_user_and_a_missing_role_is_named() -> None:
    role = {"metadata": {"name": "r", "namespace": "ns"}, "rules": [RULE]}
    binding = {
        "metadata": {"name": "b", "namespace": "ns"},
        "roleRef": {"kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "op"}],  # no namespace: the binding's
    }
    cluster_binding = {
        "metadata": {"name": "cb"},
        "roleRef": {"kind": "ClusterRole", "name": "gone"},
        "subjects": [{"kind": "Group", "name": "system:serviceaccounts:ns"}],
    }
    rules = rbac.Policy({("ns", "r"): role}, {}, [binding], [cluster_binding])
    op = rbac.User.service_account("ns", "op")
    assert rules.authorize(rbac.Attributes(op, "get", "apps", "deployments", "", "ns", "x")) == (True, "")
    other = rbac.User.service_account("ns", "other")
    allowed, reason = rules.authorize(rbac.Attributes(other, "get", "apps", "deployments", "", "ns", "x"))
    assert not allowed and reason == 'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found'


def test_the_403_reads_as_the_api_servers() -> None:
    named = rbac.Attributes(USER, "patch", "apps", "deployments", "", "models", "tiny")
    assert rbac.forbidden(named) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'deployments.apps "tiny" is forbidden: User "system:serviceaccount:npu-system:'
        'npu-npu-inference-operator" cannot patch resource "deployments" in API group "apps" in the namespace "models"',
        "reason": "Forbidden",
        "details": {"name": "tiny", "group": "apps", "kind": "deployments"},
        "code": 403,
    }
    listing = rbac.Attributes(USER, "list", "", "pods", "", "", "")
    assert rbac.forbidden(listing)["message"] == (
        'pods is forbidden: User "system:serviceaccount:npu-system:npu-npu-inference-operator" cannot list resource'
        ' "pods" in API group "" at the cluster scope'
    )
    status = rbac.Attributes(USER, "patch", "inference.npu.dev", "npuinferences", "status", "m", "x")
    assert (
        'cannot patch resource "npuinferences/status" in API group "inference.npu.dev"'
        in rbac.forbidden(status)["message"]
    )

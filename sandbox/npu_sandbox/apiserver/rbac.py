"""Kubernetes' RBAC authorizer, for the requests the emulator serves with a ServiceAccount's token.

A kube-apiserver turns each request into attributes (user, verb, API group, resource,
subresource, namespace, name), then asks its authorizers; RBAC allows the request when a rule of
a role bound to the user matches every attribute, and says nothing otherwise (the request is then
forbidden). This module follows the upstream sources, read at kubernetes v1.35:

- plugin/pkg/auth/authorizer/rbac/rbac.go: `RBACAuthorizer.Authorize` walks the ClusterRoleBindings,
  then the RoleBindings of the request's namespace (`VisitRulesFor`), and `RuleAllows` matches one
  rule; a binding whose role is missing is skipped and named in the reason ("RBAC: ...").
- pkg/apis/rbac/v1/evaluation_helpers.go: `VerbMatches`, `APIGroupMatches`, `ResourceMatches`
  (`*`, the combined `resource/subresource`, and `*/subresource`), `ResourceNameMatches` (an empty
  list matches every name; a list never matches a request without a name: list, watch, create).
- plugin/pkg/auth/authorizer/rbac/subject_locator.go `appliesToUser`: a ServiceAccount subject
  without a namespace takes the binding's.
- staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go: the verb of a request
  (GET: get, list or watch; POST create; PUT update; PATCH patch; DELETE delete or deletecollection).
- staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go `forbiddenMessage`
  and apimachinery's `NewForbidden`: the 403's wording.

Not emulated: ClusterRole aggregation (aggregationRule), non-resource URL rules (every identity may
read discovery, /version and /openapi, as the default system:discovery and
system:public-info-viewer bindings allow), impersonation, escalation checks on writes of roles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]

    @classmethod
    def service_account(cls, namespace: str, name: str) -> User:
        """The identity the API server gives a ServiceAccount's token (serviceaccount.MakeUsername)."""
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
        return cls(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}", groups)


@dataclasses.dataclass(frozen=True)
class Attributes:
    """What the authorizer is asked about one resource request."""

    user: User
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def verb_of(method: str, *, named: bool, watch: bool) -> str:
    """The RBAC verb of an HTTP request on a resource (requestinfo.go)."""
    if method == "GET":
        return "watch" if watch else ("get" if named else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def rule_allows(attributes: Attributes, rule: Mapping[str, Any]) -> bool:
    """`RuleAllows` for a resource request: verb, API group, resource and name all match."""

    def matches(field: str, value: str) -> bool:
        values = rule.get(field) or ()
        return "*" in values or value in values

    names = rule.get("resourceNames") or ()
    return (
        matches("verbs", attributes.verb)
        and matches("apiGroups", attributes.group)
        and _resource_matches(rule.get("resources") or (), attributes)
        and (not names or attributes.name in names)
    )


def _resource_matches(resources: Iterable[str], attributes: Attributes) -> bool:
    for resource in resources:
        if resource in ("*", attributes.combined_resource):
            return True
        if attributes.subresource and resource == f"*/{attributes.subresource}":
            return True
    return False


def applies_to(user: User, subjects: Sequence[Mapping[str, Any]], binding_namespace: str) -> bool:
    """Whether a binding's subjects name this user, one of its groups, or its ServiceAccount."""
    for subject in subjects:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == user.name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount":
            namespace = subject.get("namespace") or binding_namespace
            if f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}" == user.name:
                return True
    return False


@dataclasses.dataclass(frozen=True)
class Policy:
    """The RBAC objects stored in the cluster, as the authorizer reads them."""

    roles: Mapping[tuple[str, str], Mapping[str, Any]]  # (namespace, name) -> Role
    cluster_roles: Mapping[str, Mapping[str, Any]]  # name -> ClusterRole
    role_bindings: Sequence[Mapping[str, Any]]
    cluster_role_bindings: Sequence[Mapping[str, Any]]

    def authorize(self, attributes: Attributes) -> tuple[bool, str]:
        """(allowed, reason): the reason names bindings whose role is missing, as RBAC's does."""
        errors: list[str] = []
        for binding in self.cluster_role_bindings:
            if not applies_to(attributes.user, binding.get("subjects") or (), ""):
                continue
            rules = self._rules(binding, "", errors)
            if any(rule_allows(attributes, rule) for rule in rules):
                return True, ""
        if attributes.namespace:
            for binding in self.role_bindings:
                namespace = binding.get("metadata", {}).get("namespace", "")
                if namespace != attributes.namespace:
                    continue
                if not applies_to(attributes.user, binding.get("subjects") or (), namespace):
                    continue
                if any(rule_allows(attributes, rule) for rule in self._rules(binding, namespace, errors)):
                    return True, ""
        return False, f"RBAC: [{', '.join(errors)}]" if len(errors) > 1 else (f"RBAC: {errors[0]}" if errors else "")

    def _rules(self, binding: Mapping[str, Any], namespace: str, errors: list[str]) -> Sequence[Mapping[str, Any]]:
        ref = binding.get("roleRef") or {}
        kind, name = ref.get("kind"), ref.get("name", "")
        role = self.cluster_roles.get(name) if kind == "ClusterRole" else self.roles.get((namespace, name))
        if role is None:
            qualified = "clusterrole" if kind == "ClusterRole" else "role"
            errors.append(f'{qualified}.rbac.authorization.k8s.io "{name}" not found')
            return ()
        rules: Sequence[Mapping[str, Any]] = role.get("rules") or ()
        return rules


def forbidden(attributes: Attributes, reason: str = "") -> dict[str, Any]:
    """The API server's 403 Status for a request the authorizers did not allow."""
    resource = attributes.combined_resource
    where = f"in the namespace {_quote(attributes.namespace)}" if attributes.namespace else "at the cluster scope"
    message = (
        f"User {_quote(attributes.user.name)} cannot {attributes.verb} resource {_quote(resource)} "
        f"in API group {_quote(attributes.group)} {where}"
    )
    if reason:
        message += f": {reason}"
    qualified = f"{attributes.resource}.{attributes.group}" if attributes.group else attributes.resource
    subject = f"{qualified} {_quote(attributes.name)}" if attributes.name else qualified
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"{subject} is forbidden: {message}",
        "reason": "Forbidden",
        # StatusDetails' fields are omitempty.
        "details": {
            key: value
            for key, value in (("name", attributes.name), ("group", attributes.group), ("kind", attributes.resource))
            if value
        },
        "code": 403,
    }


def _quote(text: str) -> str:
    """Go's %q for the plain strings Kubernetes names are."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

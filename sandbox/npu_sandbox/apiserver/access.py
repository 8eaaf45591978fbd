"""Who a request is, and whether RBAC lets it: ServiceAccount tokens and the stored Roles and bindings.

`issue_token` answers `POST serviceaccounts/{name}/token` (TokenRequest) with a token that
authenticates as the account, as the kubelet asks for one to project into a pod. `authorize` finds
the account a request's bearer token was issued to and checks the request against the stored
Roles, ClusterRoles and their bindings (`rbac`), answering the API server's 401 or 403. Static
tokens (kube-apiserver's `--token-auth-file`; the sandbox's own clients present `ADMIN_TOKEN`) are
unrestricted, as the sandbox's admin, and so is a request with no known token while `anonymous` is
on (the default, so that a plain client needs no setup); with `anonymous` off (kube-apiserver's
`--anonymous-auth=false`) such a request is the API server's 401 Unauthorized.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import secrets
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import enums, rendering
from npu_operator.kube.objects import utc_now

from npu_sandbox.apiserver import fields, rbac
from npu_sandbox.apiserver.store import Store

ADMIN_TOKEN = "sandbox"  # the sandbox's own clients and its kubeconfig (ApiClient.kubeconfig_document)


class Access:
    """Tokens issued through `serviceaccounts/{name}/token`, and RBAC for requests that carry one."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Tokens issued through serviceaccounts/{name}/token: token -> (namespace, ServiceAccount name).
        self.tokens: dict[str, tuple[str, str]] = {}
        # Unrestricted tokens (kube-apiserver's --token-auth-file): token -> user name.
        self.static_tokens: dict[str, str] = {ADMIN_TOKEN: "sandbox-admin"}
        # A request without a known token: served as the admin (True) or refused with a 401 (False).
        self.anonymous = True

    def issue_token(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """`POST serviceaccounts/{name}/token` (TokenRequest): a token that authenticates as the account,
        as the kubelet asks for one to project into a pod; else the API server's error (kmock.KubernetesError)."""
        if request.method != enums.method.POST:
            raise kmock.KubernetesError(
                status=405,
                reason="MethodNotAllowed",
                message="the server does not allow this method on the requested resource",
            )
        namespace, name = request.namespace or "", request.name or ""
        if not self.store.exists(request.resource, namespace, name):
            raise kmock.KubernetesObjectNotFoundError(reason="NotFound", message=f'serviceaccounts "{name}" not found')
        spec = dict((request.data or {}).get("spec") or {}) if isinstance(request.data, dict) else {}
        seconds = int(spec.get("expirationSeconds") or 3600)
        token = secrets.token_urlsafe(32)
        self.tokens[token] = (namespace, name)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": utc_now()},
            "spec": {
                "audiences": spec.get("audiences") or ["https://kubernetes.default.svc"],
                "expirationSeconds": seconds,
            }
            | ({"boundObjectRef": spec["boundObjectRef"]} if spec.get("boundObjectRef") else {}),
            "status": {
                "token": token,
                "expirationTimestamp": expires.replace(microsecond=0).isoformat().replace("+00:00", "Z"),
            },
        }
        return aiohttp.web.json_response(body, status=201)

    @staticmethod
    def bearer(request: rendering.Request) -> str | None:
        """The request's bearer token, if it has one."""
        header = request.headers.get("Authorization", "")
        return header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None

    def user(self, request: rendering.Request) -> tuple[str, str] | None:
        """The ServiceAccount (namespace, name) a request's bearer token was issued to; None for any other
        client (unrestricted, or refused by `authorize` when anonymous requests are off)."""
        token = self.bearer(request)
        return self.tokens.get(token) if token is not None else None

    def authorize(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """RBAC for ServiceAccount tokens (see `rbac`): None when allowed, else the API server's 401 or 403."""
        found = self.user(request)
        if found is None:
            known = self.bearer(request) in self.static_tokens
            return None if known or self.anonymous else unauthorized()
        namespace, account = found
        if not self.store.exists(kmock.resource("", "v1", "serviceaccounts"), namespace, account):
            return unauthorized()
        resource = request.resource
        if resource is None or not resource.plural:
            return None  # discovery, /version, /openapi: every identity reads them (system:discovery)
        method = request.method.value
        watch = request.action == enums.action.WATCH
        named = request.name is not None
        verb = rbac.verb_of(method, named=named, watch=watch)
        name = request.name or name_from_field_selector(request.params.get("fieldSelector", ""))
        attributes = rbac.Attributes(
            user=rbac.User.service_account(namespace, account),
            verb=verb,
            group=resource.group or "",
            resource=resource.plural,
            subresource=request.subresource or "",
            namespace=request.namespace or "",
            name=name,
        )
        checks = [attributes]
        applying = request.headers.get("Content-Type", "").startswith(fields.APPLY_PATCH)
        if verb == "patch" and applying and not self.store.exists(resource, request.namespace, request.name or ""):
            checks.append(
                dataclasses.replace(attributes, verb="create")
            )  # an apply that creates (patch.go withAuthorization)
        policy = self.policy()
        for check in checks:
            allowed, reason = policy.authorize(check)
            if not allowed:
                return aiohttp.web.json_response(rbac.forbidden(check, reason), status=403)
        return None

    def policy(self) -> rbac.Policy:
        """The stored Roles, ClusterRoles and their bindings."""
        stored: dict[str, list[dict[str, Any]]] = {}
        for (resource, _, _), obj in self.store.objects.items():
            if resource.group == "rbac.authorization.k8s.io" and not obj.deleted:
                stored.setdefault(str(resource.plural), []).append(obj.raw)
        return rbac.Policy(
            roles={(r["metadata"].get("namespace", ""), r["metadata"]["name"]): r for r in stored.get("roles", [])},
            cluster_roles={r["metadata"]["name"]: r for r in stored.get("clusterroles", [])},
            role_bindings=stored.get("rolebindings", []),
            cluster_role_bindings=stored.get("clusterrolebindings", []),
        )


def unauthorized() -> aiohttp.web.StreamResponse:
    """The API server's answer to a request it cannot authenticate."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return aiohttp.web.json_response(
        status | {"message": "Unauthorized", "reason": "Unauthorized", "code": 401}, status=401
    )


def name_from_field_selector(selector: str) -> str:
    """A list or watch of one object by `metadata.name=x` is authorized for that name (requestinfo.go)."""
    match = re.fullmatch(r"\s*metadata\.name\s*==?\s*([^,\s]+)\s*", selector)
    return match[1] if match else ""

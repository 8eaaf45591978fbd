"""The pod-template policy: how much of a pod an NPUInference may shape (an operator setting).

The operator creates the pods with its own ServiceAccount, so whoever may create an
NPUInference may otherwise make pods that they could not create themselves. `Restricted` (the
default) refuses the parts of a spec that widen a pod's privileges; each refusal is a spec
problem naming the field (Degraded/InvalidSpec, a Warning Event), like any other. `Permissive`
refuses none of them, for clusters that enforce Pod Security admission (or another admission
policy) on the namespaces where NPUInferences live: the pods are checked there whoever made them.

What a spec cannot ask for under any policy, because it has no field for it: privileged
containers, host namespaces (network, PID, IPC), added capabilities, another command, other
volumes. The builders set a fixed security context (capabilities dropped, no privilege
escalation, RuntimeDefault seccomp); the NPUs reach the container as device nodes that the
device plugin allocates, which needs none of them (docs/security.md has the table).
"""

from __future__ import annotations

import posixpath
from typing import Final

from npu_operator.api.config import OperatorConfig, how_to_allow
from npu_operator.api.spec import NPUInferenceSpec, SpecError

RESTRICTED: Final = "Restricted"
PERMISSIVE: Final = "Permissive"
POLICIES: Final = (RESTRICTED, PERMISSIVE)

# Node labels that select control-plane nodes (kubeadm's, and the older name), also the keys of the
# taints that keep pods off them (kubeadm's init phase mark-control-plane).
CONTROL_PLANE_LABELS: Final = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
# Pod annotations that change a pod's confinement or its network, which no field of the spec may:
# AppArmor profiles (Kubernetes' apparmor annotations, `unconfined` included), seccomp profiles (the
# annotations before the securityContext field), and CNI attachments (Multus' network selection,
# which can attach a pod to another namespace's networks).
CONFINEMENT_ANNOTATION_PREFIXES: Final = (
    "container.apparmor.security.beta.kubernetes.io/",
    "apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "k8s.v1.cni.cncf.io/",
    "v1.multus-cni.io/",
)


def image_allowed(image: str, registries: tuple[str, ...]) -> bool:
    """Whether `image` comes from one of `registries` (a host, or host/path: whole segments only)."""
    return any(image.startswith(registry.rstrip("/") + "/") for registry in registries)


def path_under(path: str, prefixes: tuple[str, ...]) -> bool:
    clean = posixpath.normpath(path)
    return any(clean == prefix.rstrip("/") or clean.startswith(prefix.rstrip("/") + "/") for prefix in prefixes)


def registry_of(image: str) -> str:
    """The host/path that `image`'s repository lies under ("" for a bare name such as `vllm:1`)."""
    name = image.split("@", 1)[0]
    return name.rsplit("/", 1)[0] if "/" in name else ""


def allowed_by(field: str, value: str | tuple[str, ...]) -> str:
    """How to allow a refusal: the setting `field` with `value`, or, where no value of it can (a
    bare image name, the host's root), the Permissive policy."""
    return how_to_allow(field, value) or only_permissive()


def only_permissive() -> str:
    hint = how_to_allow("pod_template_policy", PERMISSIVE) or f"{PERMISSIVE} allows it"
    return f"refused by podTemplatePolicy {RESTRICTED}; {hint}"


def policy_problems(spec: NPUInferenceSpec, config: OperatorConfig, namespace: str | None = None) -> list[SpecError]:
    """What the operator's pod-template policy refuses in `spec` (of a resource in `namespace`), each
    naming its field and the setting (chart value, variable) that would allow it."""
    if config.pod_template_policy == PERMISSIVE:
        return []
    problems = _image_and_account(spec, config) + _host_and_priority(spec, config) + _placement(spec)
    problems += _prometheus(spec, config) + _gateway(spec, config, namespace)
    envs = {"spec.engine.env": spec.engine.env}
    if spec.disaggregation is not None:
        envs["spec.disaggregation.prefill.env"] = spec.disaggregation.prefill.env
    for field, env in envs.items():
        for index, var in enumerate(env):
            if "secretKeyRef" in (var.get("valueFrom") or {}):
                why = (
                    "reads a Secret of the namespace into the engine's environment; a hub token goes in"
                    f" model.source.*.tokenSecretRef; {only_permissive()}"
                )
                problems.append(SpecError(f"{field}[{index}].valueFrom.secretKeyRef", why))
    return problems


def _listed(values: tuple[str, ...]) -> str:
    return f"allowed: {', '.join(values) or 'none'}"


def _image_and_account(spec: NPUInferenceSpec, config: OperatorConfig) -> list[SpecError]:
    problems: list[SpecError] = []
    image = spec.engine.image
    if image is not None and image != config.runtime_image and not image_allowed(image, config.allowed_registries):
        registry = registry_of(image)
        allowing = allowed_by("allowed_registries", (*config.allowed_registries, registry)) if registry else None
        why = f"{image!r} is not from an allowed registry ({_listed(config.allowed_registries)})"
        problems.append(SpecError("spec.engine.image", f"{why}; {allowing or only_permissive()}"))
    if spec.template.service_account_name is not None and not config.allow_service_account_token:
        why = "a ServiceAccount puts its API token into the pod; the runtime never needs one"
        problems.append(
            SpecError("spec.template.serviceAccountName", f"{why}; {allowed_by('allow_service_account_token', 'true')}")
        )
    return problems


def _host_and_priority(spec: NPUInferenceSpec, config: OperatorConfig) -> list[SpecError]:
    problems: list[SpecError] = []
    priority = spec.template.priority_class_name
    if priority is not None and priority not in config.allowed_priority_classes:
        why = f"{priority!r} is not an allowed priority class ({_listed(config.allowed_priority_classes)})"
        allowing = allowed_by("allowed_priority_classes", (*config.allowed_priority_classes, priority))
        problems.append(SpecError("spec.template.priorityClassName", f"{why}; {allowing}"))
    host_paths = {"spec.model.source.hostPath.path": spec.model.host_path.path if spec.model.host_path else None}
    for index, adapter in enumerate(spec.lora.adapters if spec.lora else ()):
        host_paths[f"spec.lora.adapters[{index}].source.hostPath.path"] = adapter.host_path
    for field, path in host_paths.items():
        if path is not None and not path_under(path, config.allowed_host_paths):
            why = f"{path!r} is not under an allowed host directory ({_listed(config.allowed_host_paths)})"
            allowing = allowed_by("allowed_host_paths", (*config.allowed_host_paths, path))
            problems.append(SpecError(field, f"{why}; {allowing}"))
    return problems


def same_address(address: str, allowed: str) -> bool:
    """Whether two Prometheus base URLs are the same: KEDA's scaler writes the query URL as
    `serverAddress + "/api/v1/query?..."` (kedacore/keda pkg/scalers/prometheus_scaler.go
    ExecutePromQuery), so only a trailing `/` may differ; anything else (another path, a user part
    such as `http://allowed@elsewhere`) is another address."""
    return address.rstrip("/") == allowed.rstrip("/")


def _prometheus(spec: NPUInferenceSpec, config: OperatorConfig) -> list[SpecError]:
    """A resource's own Prometheus address: KEDA's pod sends a GET there every polling interval
    (the scaler takes any string as `serverAddress`, no scheme or host check), so a tenant's address
    is a request from KEDA's network position to a host the tenant picks. Only the operator's
    address and the listed ones are allowed."""
    address = spec.autoscaling.prometheus.address if spec.autoscaling is not None else None
    allowed = (config.prometheus_address, *config.allowed_prometheus_addresses)
    if address is None or any(same_address(address, known) for known in allowed):
        return []
    why = (
        f"{address!r} is not the operator's Prometheus ({config.prometheus_address}) nor an allowed one"
        f" ({_listed(config.allowed_prometheus_addresses)}): KEDA would send its queries there"
    )
    allowing = allowed_by("allowed_prometheus_addresses", (*config.allowed_prometheus_addresses, address))
    return [SpecError("spec.autoscaling.prometheus.address", f"{why}; {allowing}")]


def _gateway(spec: NPUInferenceSpec, config: OperatorConfig, namespace: str | None) -> list[SpecError]:
    """The HTTPRoute's parent and hosts. A route without hostnames matching `/` takes every request
    of the listeners it attaches to (Gateway API v1 HTTPRoute spec.hostnames: none means every
    host the listener allows), so on a shared Gateway it would catch other tenants' traffic; and a
    Gateway in another namespace is shared by definition: only the resource's own namespace and the
    listed ones may be named."""
    gateway = spec.routing.gateway if spec.routing is not None else None
    if gateway is None:
        return []
    problems: list[SpecError] = []
    if not gateway.hostnames:
        why = "the HTTPRoute would take every host the Gateway's listener serves; name the hosts it answers for"
        problems.append(SpecError("spec.routing.gateway.hostnames", f"{why}; {only_permissive()}"))
    parent = gateway.namespace
    if parent is not None and parent != namespace and parent not in config.allowed_gateway_namespaces:
        why = (
            f"a Gateway in namespace {parent!r} is not the resource's own namespace nor an allowed one"
            f" ({_listed(config.allowed_gateway_namespaces)})"
        )
        allowing = allowed_by("allowed_gateway_namespaces", (*config.allowed_gateway_namespaces, parent))
        problems.append(SpecError("spec.routing.gateway.namespace", f"{why}; {allowing}"))
    return problems


def _placement(spec: NPUInferenceSpec) -> list[SpecError]:
    problems: list[SpecError] = []
    template = spec.template
    for index, toleration in enumerate(template.tolerations):
        if toleration.get("operator") == "Exists" and not toleration.get("key"):
            why = f"tolerates every taint (operator Exists without a key), control-plane ones too; {only_permissive()}"
            problems.append(SpecError(f"spec.template.tolerations[{index}]", why))
        elif toleration.get("key") in CONTROL_PLANE_LABELS:
            # With it, a nodeSelector on a control-plane node's hostname places the pod there.
            why = f"tolerates the control-plane taint {toleration['key']!r}; {only_permissive()}"
            problems.append(SpecError(f"spec.template.tolerations[{index}]", why))
    for key in template.annotations:
        if key.startswith(CONFINEMENT_ANNOTATION_PREFIXES):
            why = f"the annotation {key!r} changes the pod's confinement or network; {only_permissive()}"
            problems.append(SpecError(f"spec.template.metadata.annotations[{key}]", why))
    control_plane = f"selects control-plane nodes; {only_permissive()}"
    for key in template.node_selector:
        if key in CONTROL_PLANE_LABELS:
            problems.append(SpecError(f"spec.template.nodeSelector[{key}]", control_plane))
    if template.affinity and any(label in repr(template.affinity) for label in CONTROL_PLANE_LABELS):
        problems.append(SpecError("spec.template.affinity", control_plane))
    return problems

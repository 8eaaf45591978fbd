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

from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec, SpecError

RESTRICTED: Final = "Restricted"
PERMISSIVE: Final = "Permissive"
POLICIES: Final = (RESTRICTED, PERMISSIVE)

# Node labels that select control-plane nodes (kubeadm's, and the older name).
CONTROL_PLANE_LABELS: Final = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")


def image_allowed(image: str, registries: tuple[str, ...]) -> bool:
    """Whether `image` comes from one of `registries` (a host, or host/path: whole segments only)."""
    return any(image.startswith(registry.rstrip("/") + "/") for registry in registries)


def path_under(path: str, prefixes: tuple[str, ...]) -> bool:
    clean = posixpath.normpath(path)
    return any(clean == prefix.rstrip("/") or clean.startswith(prefix.rstrip("/") + "/") for prefix in prefixes)


def policy_problems(spec: NPUInferenceSpec, config: OperatorConfig) -> list[SpecError]:
    """What the operator's pod-template policy refuses in `spec`, each naming its field."""
    if config.pod_template_policy == PERMISSIVE:
        return []
    setting = "podTemplatePolicy Restricted"
    problems: list[SpecError] = []
    image = spec.engine.image
    if image is not None and image != config.runtime_image and not image_allowed(image, config.allowed_registries):
        allowed = ", ".join(config.allowed_registries) or "none"
        why = f"{image!r} is not from an allowed registry ({allowed}; the operator's allowedRegistries)"
        problems.append(SpecError("spec.engine.image", why))
    template = spec.template
    if template.service_account_name is not None and not config.allow_service_account_token:
        why = (
            "a ServiceAccount puts its API token into the pod; the runtime never needs one"
            f" ({setting}; the operator's allowServiceAccountToken allows it)"
        )
        problems.append(SpecError("spec.template.serviceAccountName", why))
    priority = template.priority_class_name
    if priority is not None and priority not in config.allowed_priority_classes:
        allowed = ", ".join(config.allowed_priority_classes) or "none"
        why = f"{priority!r} is not an allowed priority class ({allowed}; the operator's allowedPriorityClasses)"
        problems.append(SpecError("spec.template.priorityClassName", why))
    host = spec.model.host_path
    if host is not None and not path_under(host.path, config.allowed_host_paths):
        allowed = ", ".join(config.allowed_host_paths) or "none"
        why = f"{host.path!r} is not under an allowed host directory ({allowed}; the operator's allowedHostPaths)"
        problems.append(SpecError("spec.model.source.hostPath.path", why))
    for index, toleration in enumerate(template.tolerations):
        if toleration.get("operator") == "Exists" and not toleration.get("key"):
            why = f"tolerates every taint (operator Exists without a key), control-plane ones too ({setting})"
            problems.append(SpecError(f"spec.template.tolerations[{index}]", why))
    for key in template.node_selector:
        if key in CONTROL_PLANE_LABELS:
            problems.append(SpecError(f"spec.template.nodeSelector[{key}]", f"selects control-plane nodes ({setting})"))
    if template.affinity and any(label in repr(template.affinity) for label in CONTROL_PLANE_LABELS):
        problems.append(SpecError("spec.template.affinity", f"selects control-plane nodes ({setting})"))
    envs = {"spec.engine.env": spec.engine.env}
    if spec.disaggregation is not None:
        envs["spec.disaggregation.prefill.env"] = spec.disaggregation.prefill.env
    for field, env in envs.items():
        for index, var in enumerate(env):
            if "secretKeyRef" in (var.get("valueFrom") or {}):
                why = (
                    "reads a Secret of the namespace into the engine's environment; a hub token goes in"
                    f" model.source.*.tokenSecretRef ({setting})"
                )
                problems.append(SpecError(f"{field}[{index}].valueFrom.secretKeyRef", why))
    return problems

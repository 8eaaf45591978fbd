"""The checks a LeaderWorkerSet must pass, kept from the LeaderWorkerSet API's own CRD.

Read from kubernetes-sigs/lws, config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml at
commit 060ab4da17eea1f0865fcbd3236bb1075e2cea32 (v1): the fields this operator sets, with their
types, enums, bounds and required keys as that CRD declares them, plus the size >= 1 its webhook
enforces (pkg/webhooks/leaderworkerset_webhook.go). The pod templates are checked against
Kubernetes' own PodTemplateSpec schema (kubernetes-validate), as the real CRD embeds it.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KUBERNETES_VERSION = "1.37.0"

_INT32 = {"type": "integer", "format": "int32"}
_POD_TEMPLATE = {"type": "object", "properties": {"metadata": {"type": "object"}, "spec": {"type": "object"}}}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["leaderWorkerTemplate"],
            "additionalProperties": False,
            "properties": {
                "replicas": {**_INT32, "minimum": 0, "maximum": 1000000},
                "startupPolicy": {"type": "string", "enum": ["LeaderCreated", "LeaderReady"]},
                "networkConfig": {
                    "type": "object",
                    "required": ["subdomainPolicy"],
                    "properties": {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}},
                },
                "rolloutStrategy": {
                    "type": "object",
                    "required": ["type"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"type": "string", "enum": ["RollingUpdate"]},
                        "rollingUpdateConfiguration": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "maxSurge": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                                "maxUnavailable": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                                "partition": _INT32,
                            },
                        },
                    },
                },
                "leaderWorkerTemplate": {
                    "type": "object",
                    "required": ["workerTemplate"],
                    "additionalProperties": False,
                    "properties": {
                        "size": {**_INT32, "minimum": 1},
                        "restartPolicy": {
                            "type": "string",
                            "enum": ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"],
                        },
                        "leaderTemplate": _POD_TEMPLATE,
                        "workerTemplate": _POD_TEMPLATE,
                        "subGroupPolicy": {"type": "object"},
                        "volumeClaimTemplates": {"type": "array"},
                        "persistentVolumeClaimRetentionPolicy": {"type": "object"},
                    },
                },
            },
        },
    },
}


def validate(lws: dict[str, Any]) -> None:
    """Raise when `lws` is not a valid LeaderWorkerSet (its own schema, then each pod template)."""
    jsonschema.validate(lws, SCHEMA)
    template = lws["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        if key in template:
            wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template[key]}
            kubernetes_validate.validate(wrapper, KUBERNETES_VERSION, strict=True)

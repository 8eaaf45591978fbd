"""The checks a DisaggregatedSet must pass, kept from LeaderWorkerSet v0.10.0's own sources.

Read from kubernetes-sigs/lws at v0.10.0 (commit 2161f38ff333f9e24d3c44adef7cd5d9787cac00):
- config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml: spec.roles required, 2 to 10
  roles, a list map keyed by name (unique names), each name a DNS label of at most 63 characters,
  role fields name / scaling / metadata / spec (a LeaderWorkerSetSpec), and the spec-level CEL rule
  "replicas must be zero for all non-External roles or non-zero for all non-External roles",
  evaluated here with cel-python as the API server would;
- pkg/webhooks/disaggregatedset/disaggregatedset_webhook.go, `validateRoleRolloutStrategy`: a role's
  rolloutStrategy.type is RollingUpdate or empty, no partition, and maxSurge and maxUnavailable not
  both 0 when the role has replicas.
- api/disaggregatedset/v1/disaggregatedsetrolescaler_types.go and config/crd/bases/
  disaggregatedset.x-k8s.io_disaggregatedsetrolescalers.yaml: a role with `scaling.mode: External`
  takes its replicas from a DisaggregatedSetRoleScaler (short name dsrs) with a scale subresource
  (specReplicasPath .spec.replicas, statusReplicasPath .status.replicas, labelSelectorPath
  .status.selector), which pkg/controllers/disaggregatedset/scaler_manager.go creates as
  `ScalerName(ds, role)` = `<ds>-<role>` (`ROLE_SCALER_*`, `scaler_name`).
Each role's spec is then checked as a LeaderWorkerSet (`lws_schema`, with its pod templates against
Kubernetes' own PodTemplateSpec schema).
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema
from celpy.adapter import json_to_cel

from tests.operator import lws_schema

API_VERSION = "disaggregatedset.x-k8s.io/v1"
ROLE_SCALER_API_VERSION = "disaggregatedset.x-k8s.io/v1"
ROLE_SCALER_KIND = "DisaggregatedSetRoleScaler"
ROLE_SCALER_PLURAL = "disaggregatedsetrolescalers"
ROLE_SCALER_SCALE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}


def scaler_name(ds: str, role: str) -> str:
    """scaler_manager.go ScalerName."""
    return ds + "-" + role


# The CRD's x-kubernetes-validations rule on spec, as written there.
REPLICAS_RULE = (
    "self.roles.filter(r, !has(r.scaling) || r.scaling.mode != 'External').all(r, !has(r.spec.replicas) || "
    "r.spec.replicas == 0) || self.roles.filter(r, !has(r.scaling) || r.scaling.mode != 'External').all(r, "
    "has(r.spec.replicas) && r.spec.replicas > 0)"
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": "DisaggregatedSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["roles"],
            "additionalProperties": False,
            "properties": {
                "roles": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 10,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 63,
                                "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                            },
                            "scaling": {
                                "type": "object",
                                "properties": {"mode": {"enum": ["Static", "External"]}},
                            },
                            "metadata": {"type": "object"},
                            "spec": {"type": "object"},
                        },
                    },
                },
                "slices": {"type": "integer", "minimum": 1, "maximum": 100},
                "placementPolicy": {
                    "type": "object",
                    "properties": {
                        "type": {"enum": ["None", "ExclusiveSlice", "ExclusiveTopology"]},
                        "topology": {"type": "string"},
                    },
                },
            },
        },
    },
}


def validate(ds: dict[str, Any]) -> None:
    """Raise when `ds` is not a DisaggregatedSet its API server and webhook would accept."""
    jsonschema.validate(ds, SCHEMA)
    roles = ds["spec"]["roles"]
    names = [role["name"] for role in roles]
    assert len(set(names)) == len(names), f"role names must be unique (list map keyed by name): {names}"
    program = celpy.Environment().program(celpy.Environment().compile(REPLICAS_RULE))
    assert program.evaluate({"self": json_to_cel(ds["spec"])}), (
        "replicas must be zero for all non-External roles or non-zero for all non-External roles"
    )
    for role in roles:
        spec = role.get("spec", {})
        strategy = spec.get("rolloutStrategy", {})
        assert strategy.get("type", "") in ("", "RollingUpdate"), role["name"]
        update = strategy.get("rollingUpdateConfiguration", {})
        assert not update.get("partition"), f"{role['name']}: partition is not supported by DisaggregatedSet"
        if spec.get("replicas"):
            assert (update.get("maxSurge", 0), update.get("maxUnavailable", 1)) != (0, 0), role["name"]
        lws_schema.validate(
            {
                "apiVersion": lws_schema.API_VERSION,
                "kind": "LeaderWorkerSet",
                "metadata": {"name": f"{ds['metadata']['name']}-0-rev-{role['name']}"},
                "spec": copy.deepcopy(spec),
            }
        )

"""The pure half of reconcile: which change brings a child to what is desired."""

from __future__ import annotations

import json
from typing import Any

from npu_operator import kube
from npu_operator.reconcile import LAST_APPLIED, contains, merge_patch, plan_child

DESIRED: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "x", "namespace": "ns", "labels": {"a": "1"}},
    "spec": {"ports": [{"port": 8000}], "selector": {"a": "1"}},
}


def live_from(desired: dict[str, Any], **extra_spec: Any) -> dict[str, Any]:
    """What the API server would return after applying `desired` (plus fields it adds)."""
    annotation = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    return {
        **desired,
        "metadata": {**desired["metadata"], "uid": "u", "annotations": {LAST_APPLIED: annotation}},
        "spec": {**desired["spec"], "clusterIP": "10.0.0.1", **extra_spec},
    }


def test_missing_child_is_created_with_the_last_applied_annotation() -> None:
    change = plan_child(kube.SERVICES, "x", DESIRED, None)
    assert change is not None and change.action == "create"
    assert change.body is not None
    assert json.loads(change.body["metadata"]["annotations"][LAST_APPLIED]) == DESIRED


def test_child_as_desired_needs_nothing_even_with_server_defaults() -> None:
    assert plan_child(kube.SERVICES, "x", DESIRED, live_from(DESIRED)) is None


def test_hand_edit_is_patched_back() -> None:
    live = live_from(DESIRED)
    live["spec"]["selector"] = {"a": "2"}
    change = plan_child(kube.SERVICES, "x", DESIRED, live)
    assert change is not None and change.action == "patch"
    assert change.body is not None and change.body["spec"]["selector"] == {"a": "1"}


def test_a_key_the_spec_dropped_is_removed_with_null() -> None:
    old = {**DESIRED, "metadata": {**DESIRED["metadata"], "labels": {"a": "1", "b": "2"}}}
    change = plan_child(kube.SERVICES, "x", DESIRED, live_from(old))
    assert change is not None and change.body is not None
    assert change.body["metadata"]["labels"] == {"a": "1", "b": None}


def test_undesired_child_is_deleted() -> None:
    change = plan_child(kube.POD_DISRUPTION_BUDGETS, "x", None, {"metadata": {}})
    assert change is not None and change.action == "delete"
    assert plan_child(kube.POD_DISRUPTION_BUDGETS, "x", None, None) is None


def test_merge_patch_nulls_only_dropped_keys() -> None:
    assert merge_patch({"a": 1, "b": {"c": 1, "d": 2}}, {"b": {"c": 1}}) == {"a": None, "b": {"c": 1, "d": None}}


def test_contains_ignores_added_fields_but_not_changed_ones() -> None:
    assert contains({"a": 1, "b": 2}, {"a": 1})
    assert not contains({"a": 2}, {"a": 1})
    assert not contains({"l": [1, 2]}, {"l": [1]})


def test_quantities_compare_by_value_as_the_api_server_rewrites_them() -> None:
    assert contains({"resources": {"cpu": "8"}}, {"resources": {"cpu": "8000m"}})
    assert contains({"memory": "64Gi"}, {"memory": str(64 * 2**30)})
    assert contains({"npu": "1"}, {"npu": 1})
    assert not contains({"cpu": "7"}, {"cpu": "8000m"})
    assert not contains({"name": "http"}, {"name": "https"})

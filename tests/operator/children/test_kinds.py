"""The pure half of reconcile: which write a child needs, decided from the watch cache alone."""

from __future__ import annotations

import copy
from typing import Any

from npu_operator.children import kinds as children
from npu_operator.children.kinds import DIGEST_ANNOTATION, plan, stamped, taken_fields
from npu_operator.kube.client import FIELD_MANAGER

DESIRED: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "x", "namespace": "ns", "labels": {"a": "1"}, "ownerReferences": [{"uid": "owner"}]},
    "spec": {"ports": [{"port": 8000}], "selector": {"a": "1"}},
}
OURS_V1: dict[str, Any] = {
    "f:metadata": {"f:labels": {"f:a": {}}, "f:annotations": {f"f:{DIGEST_ANNOTATION}": {}}, "f:ownerReferences": {}},
    "f:spec": {"f:ports": {}, "f:selector": {"f:a": {}}},
}
# The controller manager's write of the status subresource (a Service's load balancer).
STATUS_WRITER: dict[str, Any] = {
    "manager": "kube-controller-manager",
    "operation": "Update",
    "subresource": "status",
    "fieldsV1": {"f:status": {"f:loadBalancer": {}}},
}


def live_from(manifest: dict[str, Any], *others: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns after our apply of `manifest` (plus fields it defaults)."""
    live = copy.deepcopy(manifest)
    live["metadata"]["uid"] = "child"
    live["metadata"]["managedFields"] = [
        {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": copy.deepcopy(OURS_V1)},
        *others,
    ]
    live["spec"]["clusterIP"] = "10.0.0.1"
    return live


def test_a_missing_child_is_applied_with_the_digest_of_its_manifest() -> None:
    manifest = stamped(DESIRED)
    assert manifest["metadata"]["annotations"][DIGEST_ANNOTATION]
    assert {k: v for k, v in manifest["metadata"].items() if k != "annotations"} == DESIRED["metadata"]
    step = plan(children.SERVICE, "x", manifest, None, "owner")
    assert step is not None and step.action == "create" and step.body == manifest


def test_a_child_as_last_applied_needs_nothing_whatever_the_server_added() -> None:
    manifest = stamped(DESIRED)
    defaulter = {"manager": "kube-controller-manager", "operation": "Update",
                 "fieldsV1": {"f:metadata": {"f:annotations": {"f:other/annotation": {}}}}}  # fmt: skip
    assert plan(children.SERVICE, "x", manifest, live_from(manifest, STATUS_WRITER, defaulter), "owner") is None


def test_a_changed_manifest_is_applied_again() -> None:
    before = stamped(DESIRED)
    after = stamped({**DESIRED, "spec": {**DESIRED["spec"], "ports": [{"port": 9000}]}})
    assert before["metadata"]["annotations"] != after["metadata"]["annotations"]
    step = plan(children.SERVICE, "x", after, live_from(before), "owner")
    assert step is not None and step.action == "apply"


def test_a_field_taken_by_another_manager_is_taken_back() -> None:
    manifest = stamped(DESIRED)
    live = live_from(manifest, {"manager": "kubectl-edit", "operation": "Update",
                                "fieldsV1": {"f:spec": {"f:selector": {"f:a": {}}}}})  # fmt: skip
    del live["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:selector"]  # moved to kubectl-edit
    assert taken_fields(live, manifest)
    step = plan(children.SERVICE, "x", manifest, live, "owner")
    assert step is not None and step.action == "apply"


def test_a_field_both_managers_hold_is_shared_not_taken() -> None:
    manifest = stamped(DESIRED)
    shared = {"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {"f:selector": {"f:a": {}}}}}
    assert not taken_fields(live_from(manifest, shared), manifest)


def test_a_field_of_ours_another_manager_holds_below_a_list_counts_as_taken() -> None:
    manifest = stamped(DESIRED)
    below = {"manager": "x", "operation": "Update", "fieldsV1": {"f:spec": {"f:ports": {'k:{"port":8000}': {}}}}}
    assert taken_fields(live_from(manifest, below), manifest)


def test_an_unwanted_child_is_deleted_only_if_it_exists() -> None:
    step = plan(children.POD_DISRUPTION_BUDGET, "x", None, {"metadata": {}}, "owner")
    assert step is not None and step.action == "delete"
    assert plan(children.POD_DISRUPTION_BUDGET, "x", None, None, "owner") is None


def test_every_kind_has_a_resource_and_optional_ones_are_named() -> None:
    assert [kind.key for kind in children.KINDS] == [
        "ConfigMap-lora",
        "Deployment",
        "LeaderWorkerSet",
        "DisaggregatedSet",
        "Service",
        "Service-prefill",
        "Service-decode",
        "PodDisruptionBudget",
        "PodMonitor",
        "ScaledObject",
        "ScaledObject-prefill",
        "ServiceAccount-epp",
        "Role-epp",
        "RoleBinding-epp",
        "ConfigMap-epp",
        "Deployment-epp",
        "Service-epp",
        "PodMonitor-epp",
        "DestinationRule-epp",
        "InferencePool",
        "HTTPRoute",
        "ConfigMap-calibration",
    ]
    # Written by the status loop from the pods' reports, never by the spec-driven pass.
    assert [kind.key for kind in children.KINDS if kind.from_reports] == ["ConfigMap-calibration"]
    assert [kind.kind for kind in children.KINDS if kind.optional] == [
        "LeaderWorkerSet",
        "DisaggregatedSet",
        "PodMonitor",
        "ScaledObject",
        "ScaledObject",
        "PodMonitor",
        "DestinationRule",
        "InferencePool",
        "HTTPRoute",
    ]
    # The endpoint picker's objects (and the route to its pool) are only made where InferencePools are served.
    assert {kind.key for kind in children.KINDS if kind.needs == "InferencePool"} == {
        "ServiceAccount-epp",
        "Role-epp",
        "RoleBinding-epp",
        "ConfigMap-epp",
        "Deployment-epp",
        "Service-epp",
        "PodMonitor-epp",
        "HTTPRoute",
    }
    # Istio's rule for the picker is only made where Istio serves it, and never noted where it does not.
    assert {kind.key for kind in children.KINDS if kind.needs == "DestinationRule"} == {"DestinationRule-epp"}
    # A disaggregated resource's role Services are only made where DisaggregatedSets are served.
    assert {kind.key for kind in children.KINDS if kind.needs == "DisaggregatedSet"} == {
        "Service-prefill",
        "Service-decode",
    }
    assert children.WORKLOADS == (children.DEPLOYMENT, children.LEADER_WORKER_SET, children.DISAGGREGATED_SET)
    assert children.owned_by(DESIRED, "owner") and not children.owned_by(DESIRED, "someone")


def test_a_child_name_stays_a_dns_label_however_long_the_owner() -> None:
    assert children.PICKER_SERVICE.child_name("qwen") == "qwen-epp"
    longest = "a" * 63
    name = children.PICKER_SERVICE.child_name(longest)
    assert len(name) == 63 and name.endswith("-epp")
    assert name != children.PICKER_SERVICE.child_name("a" * 62 + "b")  # the digest keeps them apart
    assert children.DEPLOYMENT.child_name(longest) == longest


def test_the_watch_cache_keeps_managed_fields_only_when_another_manager_wrote_the_child() -> None:
    from npu_operator.controller.watches import essentials

    manifest = stamped(DESIRED)
    hand_edit = {"manager": "kubectl-edit", "operation": "Update",
                 "fieldsV1": {"f:spec": {"f:selector": {"f:a": {}}}}}  # fmt: skip
    ours_only = live_from(manifest, STATUS_WRITER)
    assert "managedFields" not in essentials(ours_only)["metadata"]
    edited = live_from(manifest, STATUS_WRITER, hand_edit)
    del edited["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:selector"]  # moved to kubectl-edit
    kept = essentials(edited)["metadata"]["managedFields"]
    assert [e["manager"] for e in kept] == [FIELD_MANAGER, "kubectl-edit"]  # the status write is never read
    # The decision is the same as from the whole object.
    for live in (ours_only, edited):
        assert taken_fields(essentials(live), manifest) == taken_fields(live, manifest)
    assert taken_fields(essentials(edited), manifest)


def test_compact_manifests_read_back_as_built_and_each_read_is_a_fresh_copy() -> None:
    built = {"Service": stamped(DESIRED), "Deployment": stamped({**DESIRED, "kind": "Deployment"})}
    compact = children.CompactManifests(built)
    assert dict(compact) == built and list(compact) == list(built) and compact.get("PodMonitor") is None
    first = compact["Service"]
    first["metadata"]["labels"]["a"] = "changed"
    assert compact["Service"] == built["Service"]
    assert plan(children.SERVICE, "x", compact["Service"], live_from(built["Service"]), "owner") is None


def test_plan_kept_decides_as_plan_does_without_reading_a_settled_manifest() -> None:
    manifest = stamped(DESIRED)
    changed = stamped({**DESIRED, "spec": {**DESIRED["spec"], "ports": [{"port": 9000}]}})
    taken = live_from(manifest, {"manager": "kubectl-edit", "operation": "Update",
                                 "fieldsV1": {"f:spec": {"f:selector": {"f:a": {}}}}})  # fmt: skip
    del taken["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:selector"]
    settled = live_from(manifest)
    del settled["metadata"]["managedFields"]  # what the watch keeps while only our apply wrote it
    manifests = children.CompactManifests({children.SERVICE.key: manifest})
    assert manifests.get("absent") is None and "absent" not in manifests and children.SERVICE.key in manifests
    for live in (None, settled, live_from(manifest), live_from(changed), taken):
        for kept in (manifests, children.CompactManifests({})):
            expected = plan(children.SERVICE, "x", kept.get(children.SERVICE.key), live, "owner")
            assert children.plan_kept(children.SERVICE, "x", kept, live, "owner") == expected

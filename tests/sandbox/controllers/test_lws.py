"""The LeaderWorkerSet stand-in's objects, checked against facts read from LeaderWorkerSet's own sources.

Every expected value below comes from kubernetes-sigs/lws at tag v0.10.0 (the file and function
are named next to each check): the operator's LeaderWorkerSet for a two-node replica goes in,
what LWS v0.10 would create comes out. Pure functions; no API, no process.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import parse_spec
from npu_operator.children import workloads as builders
from npu_sandbox.controllers import lws
from npu_sandbox.controllers.workloads import stateful_pod

from tests.examples import example

NS = "llm"
NAME = "r1"


def two_node_set(policy: str | None = None, **spec: Any) -> dict[str, Any]:
    """The operator's LeaderWorkerSet (UniquePerReplica); `policy` rewrites its subdomainPolicy."""
    manifest = example("sandbox-cpu-2node.yaml")
    manifest["spec"].update(spec)
    built = builders.build_leader_worker_set(NAME, NS, parse_spec(manifest["spec"]), OperatorConfig())
    built["metadata"]["uid"] = "0000-lws"
    if policy is not None:
        built["spec"]["networkConfig"] = {"subdomainPolicy": policy}
    return built


def leader_pod(lws_obj: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """The leader StatefulSet's pod `index`, through the StatefulSet controller and LWS's pod webhook."""
    statefulset = lws.leader_statefulset(lws_obj, 0, 1, lws.revision_key(lws_obj))
    statefulset["metadata"]["uid"] = "0000-leader-sts"
    pod = stateful_pod(statefulset, index, f"{NAME}-abc", statefulset["spec"]["template"])
    lws.admit_pod(pod)
    pod["metadata"]["uid"] = "0000-leader-pod"
    return pod


def worker_pod(lws_obj: dict[str, Any], leader: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The group's worker StatefulSet and its pod `<leader>-1`, through the StatefulSet controller and the webhook."""
    template = lws.defaulted(lws_obj)["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    workers = lws.worker_statefulset(leader, lws_obj, template)
    workers["metadata"]["uid"] = "0000-worker-sts"
    pod = stateful_pod(workers, 1, f"{NAME}-0-xyz", workers["spec"]["template"])
    lws.admit_pod(pod)
    return workers, pod


def test_the_leader_statefulset_is_what_construct_leader_statefulset_builds() -> None:
    """leaderworkerset_controller.go constructLeaderStatefulSetApplyConfiguration; TestLeaderStatefulSetApplyConfig."""
    group = two_node_set()
    key = lws.revision_key(group)
    statefulset = lws.leader_statefulset(group, 0, 1, key)
    meta, spec = statefulset["metadata"], statefulset["spec"]
    assert meta["name"] == NAME
    assert meta["labels"][lws.NAME_LABEL] == NAME and meta["labels"][lws.REVISION_LABEL] == key
    assert meta["annotations"][lws.REPLICAS_ANNOTATION] == "1"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": lws.API_VERSION,
            "kind": lws.KIND,
            "name": NAME,
            "uid": "0000-lws",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert spec["serviceName"] == NAME  # WithServiceName(lws.Name), whatever the subdomain policy
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"] == {"matchLabels": {lws.NAME_LABEL: NAME, lws.WORKER_INDEX_LABEL: "0"}}
    labels = spec["template"]["metadata"]["labels"]
    assert (labels[lws.WORKER_INDEX_LABEL], labels[lws.NAME_LABEL], labels[lws.REVISION_LABEL]) == ("0", NAME, key)
    # The size, and (UniquePerReplica) the policy for the pod webhook.
    assert spec["template"]["metadata"]["annotations"] == {
        lws.SIZE_ANNOTATION: "2",
        lws.SUBDOMAIN_POLICY_ANNOTATION: "UniquePerReplica",
    }
    shared = lws.leader_statefulset(two_node_set("Shared"), 0, 1, key)
    assert lws.SUBDOMAIN_POLICY_ANNOTATION not in shared["spec"]["template"]["metadata"]["annotations"]
    # maxUnavailable 1 + maxSurge 0 (the operator's), partition as asked.
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "partition": 0}}
    # The operator's own pod labels stay (its Service selects leaders by them plus worker-index 0).
    assert labels["inference.npu.dev/name"] == NAME


@pytest.mark.parametrize(("policy", "subdomain"), [("UniquePerReplica", f"{NAME}-0"), ("Shared", NAME)])
def test_the_leader_pod_gets_the_webhooks_labels_subdomain_and_the_lws_environment(policy: str, subdomain: str) -> None:
    """pod_webhook.go Default (group-index from the ordinal, group-key = sha1 of namespace/name, the subdomain
    its own name under UniquePerReplica); pod_utils.go AddLWSVariables (three variables, first in every
    container's env; the address `<lws>-<group>.<subdomain>.<namespace>`)."""
    pod = leader_pod(two_node_set(policy))
    labels = pod["metadata"]["labels"]
    assert labels[lws.GROUP_INDEX_LABEL] == "0"
    assert labels[lws.GROUP_KEY_LABEL] == hashlib.sha1(f"{NS}/{NAME}-0".encode()).hexdigest()
    assert pod["spec"]["hostname"] == f"{NAME}-0" and pod["spec"]["subdomain"] == subdomain
    for container in pod["spec"]["containers"]:
        assert container["env"][:3] == [
            {"name": "LWS_LEADER_ADDRESS", "value": f"{NAME}-0.{subdomain}.{NS}"},
            {"name": "LWS_GROUP_SIZE", "value": "2"},
            {"name": "LWS_WORKER_INDEX", "value": "0"},
        ]
        assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in container["env"]  # the spec's own env stays
    # The operator's args read these variables: they expand to this pod's node rank and its leader.
    args = pod["spec"]["containers"][0]["args"]
    assert "$(LWS_WORKER_INDEX)" in args and "$(LWS_LEADER_ADDRESS)" in args


@pytest.mark.parametrize(("policy", "subdomain"), [("UniquePerReplica", f"{NAME}-0"), ("Shared", NAME)])
def test_the_worker_statefulset_belongs_to_its_leader_pod(policy: str, subdomain: str) -> None:
    """pod_controller.go constructWorkerStatefulSetApplyConfiguration (serviceName: the leader pod's name
    under UniquePerReplica, the set's under Shared) and setControllerReferenceWithStatefulSet."""
    group = two_node_set(policy)
    leader = leader_pod(group)
    workers, pod = worker_pod(group, leader)
    meta, spec = workers["metadata"], workers["spec"]
    assert meta["name"] == leader["metadata"]["name"] == f"{NAME}-0"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": f"{NAME}-0",
            "uid": "0000-leader-pod",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert (spec["replicas"], spec["ordinals"], spec["serviceName"], spec["podManagementPolicy"]) == (
        1,
        {"start": 1},
        subdomain,
        "Parallel",
    )
    group_key = leader["metadata"]["labels"][lws.GROUP_KEY_LABEL]
    selector = {lws.GROUP_INDEX_LABEL: "0", lws.NAME_LABEL: NAME, lws.GROUP_KEY_LABEL: group_key}
    assert spec["selector"] == {"matchLabels": selector}
    assert (
        spec["template"]["metadata"]["labels"].items()
        >= {**selector, lws.REVISION_LABEL: lws.revision_key(group)}.items()
    )
    assert spec["template"]["metadata"]["annotations"] == {
        lws.SIZE_ANNOTATION: "2",
        lws.LEADER_NAME_ANNOTATION: f"{NAME}-0",
    }
    # Its pod: `<leader>-1`, worker-index 1 from the ordinal (pod_webhook.go Default), its subdomain the
    # StatefulSet's serviceName, and the leader's address: the same name the leader got.
    assert pod["metadata"]["name"] == f"{NAME}-0-1"
    assert pod["metadata"]["labels"][lws.WORKER_INDEX_LABEL] == "1"
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"{NAME}-0-1", subdomain)
    assert pod["spec"]["containers"][0]["env"][:3] == [
        {"name": "LWS_LEADER_ADDRESS", "value": f"{NAME}-0.{subdomain}.{NS}"},
        {"name": "LWS_GROUP_SIZE", "value": "2"},
        {"name": "LWS_WORKER_INDEX", "value": "1"},
    ]


def test_the_headless_services_publish_not_ready_addresses() -> None:
    """controller_utils.go CreateHeadlessServiceIfNotExists, with leaderworkerset_controller.go
    reconcileHeadlessServices's arguments (Shared) and pod_controller.go Reconcile's (UniquePerReplica)."""
    shared = lws.headless_service(two_node_set("Shared"))
    assert shared["metadata"]["name"] == NAME
    assert shared["metadata"]["labels"] == {lws.NAME_LABEL: NAME}
    assert shared["spec"] == {"clusterIP": "None", "selector": {lws.NAME_LABEL: NAME}, "publishNotReadyAddresses": True}
    assert shared["metadata"]["ownerReferences"][0]["kind"] == lws.KIND

    group = two_node_set()
    per_group = lws.group_service(group, leader_pod(group))
    assert per_group["metadata"]["name"] == f"{NAME}-0"
    assert per_group["metadata"]["labels"] == {lws.NAME_LABEL: NAME}
    assert per_group["spec"] == {
        "clusterIP": "None",
        "selector": {lws.NAME_LABEL: NAME, lws.GROUP_INDEX_LABEL: "0"},
        "publishNotReadyAddresses": True,
    }
    owner = per_group["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", f"{NAME}-0", "0000-leader-pod")


def test_defaults_are_the_crds_and_the_webhooks() -> None:
    """config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml defaults; leaderworkerset_webhook.go Default."""
    spec = lws.defaulted({"metadata": {"name": NAME}, "spec": {"leaderWorkerTemplate": {"workerTemplate": {}}}})["spec"]
    assert spec["replicas"] == 1 and spec["startupPolicy"] == "LeaderCreated"
    assert spec["leaderWorkerTemplate"]["size"] == 1
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0, "partition": 0},
    }
    assert spec["networkConfig"] == {"subdomainPolicy": "Shared"}


def test_a_changed_template_is_a_new_revision_and_replicas_are_not() -> None:
    """revision_utils.go getPatch: the revision covers leaderWorkerTemplate and networkConfig only."""
    group = two_node_set()
    assert lws.revision_key(two_node_set(replicas=3)) == lws.revision_key(group)
    assert lws.revision_key(two_node_set(engine={"maxNumSeqs": 2, "maxModelLen": 256})) != lws.revision_key(group)


@pytest.mark.parametrize(
    ("replicas", "surge", "unavailable", "unready", "wanted"),
    # leaderworkerset_controller_test.go TestCalculateRollingUpdateReplicas, its six cases.
    [(1, 1, 0, 1, 2), (4, 2, 1, 2, 5), (2, 2, 1, 2, 3), (1, 1, 0, 0, 1), (1, 1, 1, 1, 1), (3, 0, 0, 1, 3)],
)
def test_surge_groups_are_kept_and_reclaimed_as_lws_does(
    replicas: int, surge: int, unavailable: int, unready: int, wanted: int
) -> None:
    assert lws.rolling_update_replicas(replicas, surge, unavailable, unready) == wanted


@pytest.mark.parametrize(
    ("states", "step", "current", "wanted"),
    [
        # Three groups, all ready and outdated, one at a time: the highest index is updated first.
        ([(True, False)] * 3, 1, 3, 2),
        # The last group updated and ready: the next one down.
        ([(True, False), (True, False), (True, True)], 1, 2, 1),
        # An outdated group that is not ready does not hold the rollout: it is next (unavailable anyway).
        ([(True, False), (False, False), (True, True)], 1, 2, 1),
        # Two steps at a time (maxUnavailable 2): the two highest groups at once.
        ([(True, False)] * 3, 2, 3, 1),
        # The partition never moves up.
        ([(True, True)] * 3, 1, 0, 0),
    ],
)
def test_the_partition_moves_down_group_by_group(
    states: list[tuple[bool, bool]], step: int, current: int, wanted: int
) -> None:
    """leaderworkerset_controller.go rollingUpdatePartition."""
    assert lws.rolling_update_partition(states, len(states), step, current) == wanted


def test_a_restarted_container_restarts_the_group_only_while_running_or_pending() -> None:
    """pod_utils.go ContainerRestarted."""
    restarted = {"containerStatuses": [{"restartCount": 1}]}
    assert lws.container_restarted({"status": {"phase": "Running", **restarted}})
    assert lws.container_restarted({"status": {"phase": "Pending", "initContainerStatuses": [{"restartCount": 2}]}})
    assert not lws.container_restarted({"status": {"phase": "Failed", **restarted}})
    assert not lws.container_restarted({"status": {"phase": "Running", "containerStatuses": [{"restartCount": 0}]}})


def test_available_and_progressing_exclude_each_other() -> None:
    """leaderworkerset_controller.go setCondition, exclusiveConditionTypes."""
    now = "2026-12-03T00:00:00Z"
    progressing = lws.set_conditions([], [lws._condition("Progressing", 1, now)], 1, now)
    available = lws.set_conditions(progressing, [lws._condition("Available", 1, now)], 1, now)
    assert {c["type"]: c["status"] for c in available} == {"Progressing": "False", "Available": "True"}
    assert next(c for c in available if c["type"] == "Available")["reason"] == "AllGroupsReady"
    again = lws.set_conditions(available, [lws._condition("Progressing", 1, now)], 1, now)
    assert {c["type"]: c["status"] for c in again} == {"Progressing": "True", "Available": "False"}
    assert next(c for c in again if c["type"] == "Progressing")["reason"] == "GroupsProgressing"

"""Which pods are the resource's own: the controller chain decides, labels never do."""

from __future__ import annotations

from typing import Any

from npu_operator.ownership import owned_pods


def obj(uid: str, owner: str | None = None, *, controller: bool = True) -> dict[str, Any]:
    refs = [{"uid": owner, "controller": controller, "kind": "X", "name": owner}] if owner else []
    return {"metadata": {"uid": uid, "name": uid, "ownerReferences": refs}}


def names(pods: list[Any]) -> list[str]:
    return [pod["metadata"]["name"] for pod in pods]


def test_pod_replica_set_deployment() -> None:
    replica_sets = [obj("rs-1", "deploy"), obj("rs-foreign", "other-deploy")]
    pods = [
        obj("mine", "rs-1"),
        obj("labels-only"),
        obj("foreign", "rs-foreign"),
        obj("unknown-owner", "rs-9"),
        obj("not-controller", "rs-1", controller=False),
        obj("direct", "deploy"),  # a pod that names the Deployment itself is as good as its chain
    ]
    assert names(owned_pods(pods, replica_sets, "deploy")) == ["mine", "direct"]


def test_a_leader_worker_set_chain_needs_only_its_objects_listed() -> None:
    """worker Pod -> worker StatefulSet -> leader Pod -> leader StatefulSet -> LeaderWorkerSet."""
    leader_sts, leader = obj("leader-sts", "lws"), obj("leader-0", "leader-sts")
    worker_sts = obj("worker-sts", "leader-0")
    pods = [leader, obj("leader-0-1", "worker-sts"), obj("stray", "worker-sts-other")]
    assert names(owned_pods(pods, [leader_sts, leader, worker_sts], "lws")) == ["leader-0", "leader-0-1"]


def test_a_cycle_of_owners_ends() -> None:
    assert owned_pods([obj("p", "a")], [obj("a", "b"), obj("b", "a")], "root") == []

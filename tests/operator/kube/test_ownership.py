"""Which pods are the resource's own: the controller chain decides, labels never do."""

from __future__ import annotations

from typing import Any

from npu_operator.kube.ownership import owned_pods, rank_of


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


def lws_pod(name: str, owner: str, group: str, worker: str) -> dict[str, Any]:
    """A pod as LeaderWorkerSet v0.10 makes it, with our resource's labels on (copied by anyone)."""
    pod = obj(name, owner)
    pod["metadata"]["labels"] = {
        "inference.npu.dev/name": "r1",
        "leaderworkerset.sigs.k8s.io/group-index": group,
        "leaderworkerset.sigs.k8s.io/worker-index": worker,
    }
    return pod


def test_a_foreign_leader_worker_sets_pods_with_our_labels_are_not_ours() -> None:
    """Two LeaderWorkerSets, both with our labels on every object: only our LWS's chain counts."""
    ours = [obj("r1", "lws"), obj("r1-0", "r1")]  # leader StatefulSet, worker StatefulSet of group 0
    theirs = [obj("x", "lws-foreign"), obj("x-0", "x")]
    pods = [
        lws_pod("r1-0", "r1", "0", "0"),
        lws_pod("r1-0-1", "r1-0", "0", "1"),
        lws_pod("x-0", "x", "0", "0"),
        lws_pod("x-0-1", "x-0", "0", "1"),  # a worker of the foreign LWS carrying our labels
    ]
    # The leader pods are links too (they control the worker StatefulSets), as reconcile lists them.
    owned = owned_pods(pods, [*ours, *theirs, *pods], "lws")
    assert names(owned) == ["r1-0", "r1-0-1"]
    assert [rank_of(pod) for pod in owned] == [(0, 0), (0, 1)]


def test_a_rank_is_read_only_from_well_formed_lws_labels() -> None:
    assert rank_of(lws_pod("p", "x", "12", "3")) == (12, 3)
    assert rank_of(obj("p")) is None
    assert rank_of(lws_pod("p", "x", "-1", "0")) is None
    assert rank_of(lws_pod("p", "x", "1", "9" * 30)) is None

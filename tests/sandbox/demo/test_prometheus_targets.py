"""The sandbox's scrape targets carry the labels the chart's PodMonitor gives, rank labels included,
and point where a PodMonitor points: the pod's IP and its container port of the endpoint's name."""

from __future__ import annotations

from npu_sandbox.demo.prometheus import pod_targets


def pod(**labels: str) -> dict[str, object]:
    return {
        "metadata": {"name": "r1-0-1", "namespace": "llm", "labels": {"inference.npu.dev/name": "r1", **labels}},
        "spec": {
            "containers": [
                {"ports": [{"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 9090}]}
            ]
        },
        "status": {"podIP": "127.9.0.3"},
    }


def test_a_leader_worker_set_pods_targets_carry_its_group_and_node() -> None:
    lws = pod(**{"leaderworkerset.sigs.k8s.io/group-index": "0", "leaderworkerset.sigs.k8s.io/worker-index": "1"})
    targets = pod_targets(lws)
    assert [(t[0], t[1]["endpoint"], t[1]["group"], t[1]["node_rank"]) for t in targets] == [
        (["127.9.0.3:9090"], "metrics", "0", "1"),
        (["127.9.0.3:8000"], "http", "0", "1"),
    ]
    plain = pod_targets(pod())
    assert all("group" not in labels and "node_rank" not in labels for _, labels in plain)  # empty: dropped

"""Whether any node can run a resource's pods: the ask (per profile, per role) against the Nodes' offer,
and the pods' scheduling verdicts when the Nodes are not known."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import parse_spec
from npu_operator.status import placement
from npu_operator.status.findings import pod_findings
from npu_operator.status.placement import Ask, Offer, asks, is_npu_resource, node_npus, unmet

from tests.examples import example

CHIP = "node.kubernetes.io/npu.chip.name"


def node(allocatable: dict[str, Any], labels: dict[str, str] | None = None, name: str = "n") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"allocatable": {"cpu": "192", "memory": "1500Gi", "pods": "110", **allocatable}},
    }


def offer(*nodes: dict[str, Any]) -> Offer:
    return Offer.of(node_npus(n) for n in nodes)


def spec(name: str = "qwen2.5-7b-910b.yaml", **npu: Any) -> Any:
    document = example(name)["spec"]
    document["npu"] = {**document["npu"], **npu}
    return parse_spec(document)


CCE_NODES = offer(
    *[node({"huawei.com/ascend-1980": "8"}, {"accelerator/huawei-npu": "ascend-snt9b"}) for _ in range(3)]
)


def test_what_counts_as_an_npu_resource() -> None:
    for name in ("huawei.com/Ascend910", "huawei.com/ascend-1980", "huawei.com/Ascend910-4c", "nvidia.com/gpu"):
        assert is_npu_resource(name), name
    for name in ("cpu", "memory", "hugepages-2Mi", "ephemeral-storage", "example.com/dongle", "kubernetes.io/npu"):
        assert not is_npu_resource(name), name


def test_a_node_keeps_only_its_npu_resources_and_chip_labels() -> None:
    kept = node_npus(
        node({"huawei.com/Ascend910": "8", "nvidia.com/gpu": "0"}, {CHIP: "910B3", "zone": "a", "accelerator": "x"})
    )
    assert kept.resources == (("huawei.com/Ascend910", 8), ("nvidia.com/gpu", 0))
    assert kept.labels == (("accelerator", "x"), (CHIP, "910B3"))
    # Equal nodes fold into one shape: the offer is as small as the cluster's kinds of node.
    assert offer(node({"huawei.com/Ascend910": "8"}), node({"huawei.com/Ascend910": "8"}, name="m")).shapes == (
        (node_npus(node({"huawei.com/Ascend910": "8"})), 2),
    )


@pytest.mark.parametrize(
    ("profile", "asked"),
    [
        ("ascend-docker-runtime", "huawei.com/Ascend910"),
        ("device-plugin", "huawei.com/Ascend910"),
        ("volcano", "huawei.com/Ascend910"),
        ("cce", "huawei.com/ascend-1980"),
    ],
)
def test_each_profile_asks_its_resource_and_the_nodes_of_another_profile_are_named(profile: str, asked: str) -> None:
    config = OperatorConfig(cluster_profile=profile)
    (ask,) = asks(spec(chipName=None), config)
    assert (ask.resource, ask.count) == (asked, 1)
    assert ask.selector == ((("accelerator-type", "module-910b-8"),) if profile == "volcano" else ())
    ascend = offer(node({"huawei.com/Ascend910": "8"}, {CHIP: "910B3", "accelerator-type": "module-910b-8"}))
    nodes = ascend if profile == "cce" else CCE_NODES
    why = unmet(ask, nodes)
    assert why is not None
    if profile == "cce":
        assert why == (
            "asks huawei.com/ascend-1980: 1 per pod; the nodes offer huawei.com/Ascend910 (1 node, up to 8); "
            "set spec.npu.resourceName or the chart's operator.npuResourceName / "
            "npu.clusterProfile=ascend-docker-runtime"
        )
    else:
        assert why == (
            f"{ask.text}; the nodes offer huawei.com/ascend-1980 (3 nodes, up to 8); "
            "set spec.npu.resourceName or the chart's operator.npuResourceName / npu.clusterProfile=cce"
        )
    assert unmet(ask, CCE_NODES if profile == "cce" else ascend) is None


def test_the_spec_and_the_operator_setting_decide_the_resource_before_the_profile() -> None:
    config = OperatorConfig(cluster_profile="cce", npu_resource_name="huawei.com/Ascend910")
    assert asks(spec(), config)[0].resource == "huawei.com/Ascend910"
    assert asks(spec(resourceName="huawei.com/Ascend310P"), config)[0].resource == "huawei.com/Ascend310P"
    assert asks(spec("sandbox-cpu.yaml"), config) == ()  # no NPU asked: nothing to judge


def test_a_chip_no_node_with_the_resource_has() -> None:
    (ask,) = asks(spec(), OperatorConfig())  # chipName 910B3
    nodes = offer(
        node({"huawei.com/Ascend910": "8"}, {CHIP: "910B4"}, "a"),
        node({"huawei.com/Ascend910": "8"}, {CHIP: "910B4"}, "b"),
        node({"huawei.com/Ascend910": "8"}, {}, "c"),
        node({}, {CHIP: "910B3"}, "cpu"),  # the label without the NPUs does not help
    )
    assert unmet(ask, nodes) == (
        f"asks huawei.com/Ascend910: 1 per pod on {CHIP}=910B3; the nodes offer huawei.com/Ascend910 "
        f"(3 nodes, up to 8); no node with 1 huawei.com/Ascend910 has {CHIP}=910B3; theirs: 910B4 (2 nodes), "
        "none (1 node): set spec.npu.chipName to one of them, or remove it"
    )
    assert unmet(ask, offer(node({"huawei.com/Ascend910": "8"}, {CHIP: "910B3"}))) is None


def test_the_volcano_profile_asks_its_accelerator_type_of_the_nodes() -> None:
    (ask,) = asks(spec(chipName=None), OperatorConfig(cluster_profile="volcano"))
    assert ask.selector == (("accelerator-type", "module-910b-8"),)
    unlabelled = offer(node({"huawei.com/Ascend910": "8"}, {CHIP: "910B3"}))
    assert unmet(ask, unlabelled) == (
        "asks huawei.com/Ascend910: 1 per pod on accelerator-type=module-910b-8; the nodes offer "
        "huawei.com/Ascend910 (1 node, up to 8); no node with 1 huawei.com/Ascend910 has "
        "accelerator-type=module-910b-8; theirs: none (1 node): label the NPU nodes accelerator-type, or "
        "select one of theirs in spec.template.nodeSelector"
    )
    labelled = offer(node({"huawei.com/Ascend910": "8"}, {"accelerator-type": "module-910b-8"}))
    assert unmet(ask, labelled) is None


def test_a_count_larger_than_any_node_allocates() -> None:
    ask = Ask("huawei.com/Ascend910", 16)
    nodes = offer(node({"huawei.com/Ascend910": "8"}), node({"huawei.com/Ascend910": "4"}, name="m"))
    assert unmet(ask, nodes) == (
        "asks huawei.com/Ascend910: 16 per pod; the nodes offer huawei.com/Ascend910 (2 nodes, up to 8); "
        "no node has 16: ask at most 8 per pod (spec.npu.count, with parallelism to match), or spread a "
        "replica over more nodes (spec.npu.nodes)"
    )
    assert unmet(Ask("huawei.com/Ascend910", 8), nodes) is None


def test_the_prefill_role_asks_its_own_count() -> None:
    pd = spec("deepseek-r1-w8a8-pd.yaml")
    assert pd.disaggregation is not None
    prefill = dataclasses.replace(pd.disaggregation.prefill, npu_count=8)
    pd = dataclasses.replace(
        pd,
        npu=dataclasses.replace(pd.npu, count=16),
        disaggregation=dataclasses.replace(pd.disaggregation, prefill=prefill),
    )
    found = asks(pd, OperatorConfig())
    assert [(a.role, a.resource, a.count) for a in found] == [
        ("prefill", "huawei.com/Ascend910", 8),
        ("decode", "huawei.com/Ascend910", 16),
    ]
    nodes = offer(node({"huawei.com/Ascend910": "8"}))
    message = placement.first_unmet(found, nodes)
    assert message is not None and message.startswith("role decode asks huawei.com/Ascend910: 16 per pod;")
    assert "role prefill" not in message  # the prefill role's 8 fit


def test_nothing_is_judged_without_nodes_or_for_a_resource_not_kept() -> None:
    assert unmet(Ask("huawei.com/Ascend910", 8), Offer()) is None  # no node listed (yet)
    assert unmet(Ask("example.com/dongle", 1), CCE_NODES) is None  # never kept of a node: not known here
    assert unmet(Ask("huawei.com/Ascend910", 0), CCE_NODES) is None


def test_the_offer_of_nodes_with_no_npu_at_all() -> None:
    why = unmet(Ask("huawei.com/Ascend910", 8), offer(node({}), node({}, name="m")))
    assert why is not None and "the nodes offer no NPU resource (2 nodes listed)" in why


# --- the findings: nodes known, or the pods' scheduling verdicts --------------------------------


def pending(name: str = "p-0", message: str | None = None) -> dict[str, Any]:
    conditions = []
    if message is not None:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message})
    return {"metadata": {"name": name, "uid": name}, "status": {"phase": "Pending", "conditions": conditions}}


def test_with_the_nodes_known_a_pending_pod_gets_no_node_offers_npus_first() -> None:
    ask = Ask("huawei.com/Ascend910", 8)
    said = "0/3 nodes are available: 3 Insufficient huawei.com/Ascend910."
    findings = pod_findings([pending(message=said)], [], [ask], CCE_NODES)
    assert findings.worst is not None and findings.worst.reason == "NoNodeOffersNPUs"
    assert "huawei.com/ascend-1980 (3 nodes, up to 8)" in findings.worst.message
    # A pod the scheduler has not judged yet is waiting too.
    assert pod_findings([pending()], [], [ask], CCE_NODES).worst.reason == "NoNodeOffersNPUs"  # type: ignore[union-attr]
    # Once a pod runs, the offer is not questioned (a node evidently runs it).
    running = {
        "metadata": {"name": "r", "uid": "r"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        },
    }
    assert pod_findings([running], [], [ask], CCE_NODES).worst is None


def test_without_the_nodes_the_scheduler_verdict_names_the_resource_asked() -> None:
    ask = Ask("huawei.com/Ascend910", 8)
    said = (
        "0/3 nodes are available: 3 Insufficient huawei.com/Ascend910. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
    )
    findings = pod_findings([pending(message=said)], [], [ask], None)
    assert findings.worst is not None
    assert (findings.worst.reason, findings.worst.message) == (
        "InsufficientNPU",
        f"p-0: asks huawei.com/Ascend910: 8 per pod; the scheduler: {said}",
    )


def test_a_pod_refused_for_anything_else_is_never_silent() -> None:
    ask = Ask("huawei.com/Ascend910", 8, ((CHIP, "910B3"),))
    said = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    findings = pod_findings([pending(message=said)], [], [ask])
    assert findings.worst is not None
    assert (findings.worst.reason, findings.worst.message) == (
        "Unschedulable",
        f"p-0: asks huawei.com/Ascend910: 8 per pod on {CHIP}=910B3; the scheduler: {said}",
    )
    # A pod no scheduler has judged yet is counted as waiting for a node.
    assert pod_findings([pending()], [], [ask]).starting == {"unscheduled": 1}

"""What a real LeaderWorkerSet controller (v0.10.0) makes of our LeaderWorkerSets: the group's leader
address resolves through a headless Service it creates (see `lws_rules`, each rule cited)."""

from __future__ import annotations

from typing import Any

import pytest
from npu_operator.api.spec import parse_spec
from npu_operator.children.kinds import Capabilities
from npu_operator.topologies import build_children

from tests.examples import TEST_CONFIG, example
from tests.upstream import lws_rules

EXAMPLES = ("deepseek-r1-w8a8-2node.yaml", "sandbox-cpu-2node.yaml")


def rendered(name: str) -> list[dict[str, Any]]:
    manifest = example(name)
    spec = parse_spec(manifest["spec"])
    return build_children(manifest["metadata"]["name"], "llm", spec, TEST_CONFIG, Capabilities.everything())


def leader_worker_sets(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [c for c in children if c["kind"] == "LeaderWorkerSet"]
    for ds in (c for c in children if c["kind"] == "DisaggregatedSet"):
        # The DisaggregatedSet controller makes one LeaderWorkerSet per role from its template
        # (pkg/controllers/disaggregatedset/lws_manager.go, Create), named <set>-<slice>-<revision>-<role>.
        for role in ds["spec"]["roles"]:
            name = f"{ds['metadata']['name']}-0-abcdef-{role['name']}"
            found.append({"metadata": {"name": name}, "spec": role["spec"]})
    return found


@pytest.mark.parametrize("example_name", [*EXAMPLES, "deepseek-r1-w8a8-pd.yaml", "sandbox-cpu-pd.yaml"])
def test_every_group_leader_address_resolves_through_a_headless_service(example_name: str) -> None:
    children = rendered(example_name)
    ours = {c["metadata"]["name"] for c in children if c["kind"] == "Service"}
    for lws in leader_worker_sets(children):
        made = {service["name"]: service for service in lws_rules.headless_services(lws, taken=ours)}
        for group in range(int(lws["spec"]["replicas"])):
            address, subdomain = lws_rules.leader_address(lws, group, "llm")
            # A pod's hostname.subdomain record exists only through a headless Service named after the
            # subdomain that selects the pod (Kubernetes DNS specification, "Pod's hostname and subdomain").
            assert subdomain in made, f"{address}: no headless Service {subdomain} (ours take {sorted(ours)})"
            leader = {lws_rules.SET_NAME_LABEL: lws["metadata"]["name"], lws_rules.GROUP_INDEX_LABEL: str(group)}
            assert made[subdomain]["selector"].items() <= leader.items()


def test_the_shared_policy_would_lose_its_service_to_ours() -> None:
    # The break this guards against: the resource's Service <name> is the LeaderWorkerSet's own name.
    lws = leader_worker_sets(rendered("deepseek-r1-w8a8-2node.yaml"))[0]
    shared = {**lws, "spec": {**lws["spec"], "networkConfig": {"subdomainPolicy": "Shared"}}}
    assert lws_rules.headless_services(shared, taken={lws["metadata"]["name"]}) == []

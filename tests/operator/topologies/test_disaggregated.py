"""Prefill/decode disaggregation: the DisaggregatedSet, each role's arguments and connector settings,
the router and the Services, the CRD's rules, the missing-API path, and per-role golden plans.

Per-role plans are golden (golden/pd-plans.json) for two of vllm-ascend's P/D layouts, on Atlas
800 A3 nodes (16 x 64 GiB): DeepSeek-R1 W8A8 from its multi-node P/D tutorial (the example
examples/deepseek-r1-w8a8-pd.yaml) and Qwen3-235B-A22B from its nightly P/D config
(tests/e2e/nightly/multi_node/internal_dp/config/Qwen3-235B-disagg-pd.yaml, v0.23.0). Regenerate
after a deliberate change with UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from npu_operator import topologies
from npu_operator.api import crd
from npu_operator.api import roles as api_roles
from npu_operator.api import spec as api_spec
from npu_operator.api.config import OperatorConfig
from npu_operator.api.host_mounts import DRIVER_TOOLS
from npu_operator.api.spec import parse_spec
from npu_operator.api.validation import validate_spec
from npu_operator.children import disaggregated, engine_pod
from npu_operator.children import kinds as children
from npu_operator.controller import desired as controller_desired
from npu_operator.controller import reconcile
from npu_operator.kube import names as kube_names
from npu_operator.status import findings as aggregate
from npu_operator.status import reports as report_schema
from npu_operator.status import resource
from npu_operator.status import resource as status
from npu_operator.topologies import disaggregated as topologies_disaggregated
from npu_runtime import kv_transfer
from npu_runtime.contract import parse_serve_args
from npu_runtime.planner.plan import make_plan
from npu_runtime.routing.options import parse_route_args

from tests.examples import TEST_CONFIG, example
from tests.operator import ds_schema
from tests.operator.api import test_policy as test_security
from tests.runtime.conftest import POD_ENV, load_model
from tests.runtime.planner.test_golden import A3_NODE

GOLDEN = Path(__file__).parents[1] / "golden" / "pd-plans.json"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
CONFIG = OperatorConfig()
EXAMPLE = "deepseek-r1-w8a8-pd.yaml"
JSON = dict[str, Any]


def qwen3_235b_pd() -> dict[str, Any]:
    """vllm-ascend's nightly Qwen3-235B P/D layout: prefill dp 2 x tp 8, decode dp 4 x tp 4 in
    FULL_DECODE_ONLY, 32 sequences, 8192 tokens; the prefill sets no graph mode there, so it runs
    vLLM's default, FULL_AND_PIECEWISE."""
    manifest = example(EXAMPLE)
    spec = manifest["spec"]
    spec["model"].update(name="qwen3", path="/models/Qwen3-235B-A22B")
    spec["npu"] = {"count": 16, "nodes": 1}
    spec["parallelism"] = {"tensor": 4, "data": 4, "expert": True}
    spec["engine"] = {"maxNumSeqs": 32, "maxModelLen": 8192, "maxNumBatchedTokens": 8192, "env": []}
    spec["disaggregation"]["prefill"] = {
        "npu": {"count": 16},
        "parallelism": {"tensor": 8, "data": 2, "expert": True},
        "graphMode": "FULL_AND_PIECEWISE",
        "maxNumSeqs": 32,
        "maxNumBatchedTokens": 8192,
    }
    spec["disaggregation"]["connector"] = {"name": "MooncakeConnectorV1"}
    return manifest


def roles(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = parse_spec(manifest["spec"])
    ds = disaggregated.build_disaggregated_set("x", "ns", spec, CONFIG)
    return {role["name"]: role["spec"] for role in ds["spec"]["roles"]}


def container(role: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = role["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    return found


def pod_env(role: dict[str, Any], pod: str) -> dict[str, str]:
    """What the kubelet has for $(NAME) in a role's pod (fieldRefs resolved as for pod `pod`)."""
    env = {"LWS_WORKER_INDEX": "0", "LWS_LEADER_ADDRESS": f"{pod}.x.ns"}
    for var in container(role)["env"]:
        ref = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[var["name"]] = var.get("value") or {"metadata.name": pod, "status.podIP": "10.0.0.1"}.get(ref, "")
    return env


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg) for arg in args]


def test_the_example_is_a_disaggregated_set_the_lws_api_accepts() -> None:
    manifest = example(EXAMPLE)
    assert crd.validate(manifest) == []
    spec = parse_spec(manifest["spec"])
    assert validate_spec(spec) == []
    ds = disaggregated.build_disaggregated_set("deepseek-r1-pd", "llm", spec, CONFIG)
    ds_schema.validate(ds)
    assert [role["name"] for role in ds["spec"]["roles"]] == ["prefill", "decode"]


def test_each_role_runs_serve_with_its_own_settings_and_the_connectors_rules() -> None:
    manifest = example(EXAMPLE)
    by_role = roles(manifest)
    configs = {}
    for role, lws in by_role.items():
        args = expand(container(lws)["args"], pod_env(lws, f"{role}-0"))
        assert args[:2] == ["npu-runtime", "serve"]
        options = parse_serve_args(args[2:])
        assert options.kv_transfer_config is not None
        configs[role] = config = json.loads(options.kv_transfer_config)
        assert config["engine_id"] == f"{role}-0", "unique per pod: the pod's name"
        assert kv_transfer.role_of(options.kv_transfer_config) == role
        if role == "prefill":
            assert (options.plan.graph_mode, options.plan.max_num_batched_tokens) == ("NONE", 16384)
            assert (options.plan.tensor_parallel, options.plan.data_parallel, options.plan.nodes) == (8, 2, 1)
            assert options.plan.speculative_tokens == 1, "P nodes propose one token (vllm-ascend's P/D tutorial)"
            assert lws["replicas"] == 2
        else:
            assert (options.plan.graph_mode, options.plan.max_num_seqs) == ("FULL_DECODE_ONLY", 40)
            assert (options.plan.tensor_parallel, options.plan.data_parallel, options.plan.nodes) == (1, 32, 2)
            assert lws["leaderWorkerTemplate"]["size"] == 2
        assert options.model == "/models/DeepSeek-R1-W8A8" and options.plan.quantization == "ascend"
        assert options.extra_engine_args[-1] == "--no-enable-prefix-caching"
    assert configs["prefill"]["kv_role"] == "kv_producer" and configs["decode"]["kv_role"] == "kv_consumer"
    for config in configs.values():
        # MooncakeConnectorWorker._get_prefill_decode_size: both sizes, mirrored on both roles.
        assert config["kv_connector_extra_config"] == {
            "prefill": {"dp_size": 2, "tp_size": 8},
            "decode": {"dp_size": 32, "tp_size": 1},
        }
        assert config["kv_connector"] == "MooncakeConnectorV1" and config["kv_port"] == 36000


def test_each_role_gets_the_host_network_settings_the_connector_needs() -> None:
    for role, lws in roles(example(EXAMPLE)).items():
        pod = lws["leaderWorkerTemplate"]["workerTemplate"]
        assert pod["metadata"]["labels"][kube_names.ROLE_LABEL] == role
        env = {var["name"]: var for var in container(lws)["env"]}
        assert env["HCCL_IF_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert {env[key]["value"] for key in engine_pod.SOCKET_IFNAME_ENV} == {engine_pod.POD_INTERFACE}
        assert env["OMP_PROC_BIND"]["value"] == "false"
        # FileOrCreate: a node without hccn.conf gets an empty one, not a pod stuck in FailedMount.
        hccn = {"name": "hccn-conf", "hostPath": {"path": "/etc/hccn.conf", "type": "FileOrCreate"}}
        tools = {"name": "ascend-driver-tools", "hostPath": {"path": DRIVER_TOOLS.path, "type": "DirectoryOrCreate"}}
        assert hccn in pod["spec"]["volumes"] and tools in pod["spec"]["volumes"]
        mounts = container(lws)["volumeMounts"]
        assert {"name": "hccn-conf", "mountPath": "/etc/hccn.conf", "readOnly": True} in mounts
        assert {"name": "ascend-driver-tools", "mountPath": DRIVER_TOOLS.path, "readOnly": True} in mounts
        # The prefill role's own HCCL_BUFFSIZE (256) wins over the decode role's (600), as in the tutorial.
        assert env["HCCL_BUFFSIZE"]["value"] == ("256" if role == "prefill" else "600")


def test_the_router_is_the_resources_endpoint_and_reaches_each_roles_leaders() -> None:
    spec = parse_spec(example(EXAMPLE)["spec"])
    made = disaggregated.build_children("x", "ns", spec, CONFIG, True)
    built = {(c["kind"], c["metadata"]["name"]): c for c in made}
    router = built[("Deployment", "x")]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    options = parse_route_args(args[2:])
    assert args[:2] == ["npu-runtime", "route"]
    assert options.prefill == ("http://x-prefill.ns.svc:8000",) and options.decode == ("http://x-decode.ns.svc:8000",)
    assert built[("Service", "x")]["spec"]["selector"][kube_names.ROLE_LABEL] == "router"
    assert router["spec"]["selector"]["matchLabels"][kube_names.ROLE_LABEL] == "router"
    for role in ("prefill", "decode"):
        selector = built[("Service", f"x-{role}")]["spec"]["selector"]
        assert selector[kube_names.ROLE_LABEL] == role and selector[kube_names.LWS_WORKER_INDEX_LABEL] == "0"
    services = {kind.child_name("x") for kind in (children.SERVICE, children.PREFILL_SERVICE, children.DECODE_SERVICE)}
    assert {name for kind, name in built if kind == "Service"} == services


def test_scaled_to_zero_both_roles_are_zero() -> None:
    manifest = example(EXAMPLE)
    manifest["spec"]["replicas"] = 0
    spec = parse_spec(manifest["spec"])
    ds = disaggregated.build_disaggregated_set("x", "ns", spec, CONFIG)
    ds_schema.validate(ds)
    assert [role["spec"]["replicas"] for role in ds["spec"]["roles"]] == [0, 0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["parallelism"].update(pipeline=2, data=16), "decode role of a disaggregated resource"),
        (lambda s: s["disaggregation"]["prefill"]["parallelism"].update(data=4), "prefill.parallelism.tensor"),
        (lambda s: s["disaggregation"]["connector"].update(extraConfig={"decode": {}}), "set from the roles"),
        (lambda s: s["disaggregation"]["connector"].update(name="LLMDataDistCMgrConnector"), "is not one of"),
    ],
)
def test_the_crd_refuses_roles_that_disagree(change: Any, message: str) -> None:
    manifest = example(EXAMPLE)
    change(manifest["spec"])
    errors = crd.validate(manifest)
    assert any(message in error for error in errors), errors


def test_a_kv_port_inside_the_transports_range_names_the_field() -> None:
    manifest = example(EXAMPLE)
    manifest["spec"]["disaggregation"]["connector"]["port"] = 30000
    [problem] = validate_spec(parse_spec(manifest["spec"]))
    assert problem.field == "spec.disaggregation.connector.port" and "36000" in problem.message


def test_the_default_kv_port_is_above_the_range_for_the_most_npus_per_node() -> None:
    manifest = example(EXAMPLE)
    del manifest["spec"]["disaggregation"]["connector"]["port"]
    spec = parse_spec(manifest["spec"])
    assert api_roles.kv_transfer(spec, "decode").port == 36000 and validate_spec(spec) == []


def test_an_owned_flag_in_the_prefill_extra_args_names_the_field() -> None:
    manifest = example(EXAMPLE)
    manifest["spec"]["disaggregation"]["prefill"]["extraArgs"] = ["--kv-transfer-config={}"]
    [problem] = validate_spec(parse_spec(manifest["spec"]))
    assert problem.field == "spec.disaggregation.prefill.extraArgs[0]"


def test_an_abbreviated_owned_flag_in_the_prefill_extra_args_is_named_as_in_spec_engine() -> None:
    manifest = example(EXAMPLE)
    manifest["spec"]["disaggregation"]["prefill"]["extraArgs"] = ["--kv-transfer=x"]
    [problem] = validate_spec(parse_spec(manifest["spec"]))
    assert problem.field == "spec.disaggregation.prefill.extraArgs[0]"
    assert problem.message.startswith("'--kv-transfer' is --kv-transfer-config: ")


def test_without_the_disaggregated_set_api_nothing_is_built_and_the_reason_is_given() -> None:
    manifest = example(EXAMPLE)
    manifest["metadata"]["uid"] = "u1"
    served = frozenset({"LeaderWorkerSet", "PodMonitor"})
    desired = controller_desired.desired_state(manifest, CONFIG, served)
    assert desired.manifests == {}
    assert desired.blocked is not None and desired.blocked[0] == status.DS_NOT_INSTALLED
    assert "disaggregatedset.x-k8s.io/v1" in desired.blocked[1]
    with_api = controller_desired.desired_state(manifest, CONFIG, served | {"DisaggregatedSet"})
    assert with_api.blocked is None
    keys = ["Deployment", "DisaggregatedSet", "Service", "Service-decode", "Service-prefill"]
    assert sorted(with_api.manifests) == keys
    assert with_api.manifests["Service-prefill"]["metadata"]["name"] == "deepseek-r1-pd-prefill"


def role_plans(manifest: dict[str, Any], model: str) -> dict[str, Any]:
    spec = parse_spec(manifest["spec"])
    plans = {}
    for role in api_roles.ROLES:
        options = api_spec.plan_options(api_roles.role_spec(spec, role))
        plans[role] = make_plan(options, A3_NODE, load_model(model), environ=POD_ENV).to_dict()
    return plans


def test_per_role_plans_match_the_golden_file() -> None:
    actual = {
        "deepseek-r1-w8a8/a3-2P-dp2-tp8-1D-2nodes-dp32-tp1": role_plans(example(EXAMPLE), "deepseek-r1-w8a8"),
        "qwen3-235b-a22b/a3-1P-dp2-tp8-1D-dp4-tp4": role_plans(qwen3_235b_pd(), "qwen3-235b-a22b"),
    }
    text = json.dumps(actual, indent=1, sort_keys=True) + "\n"
    if UPDATE:
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: UPDATE_GOLDEN=1 pytest {__file__}"
    assert json.loads(GOLDEN.read_text(encoding="utf-8")) == actual, "UPDATE_GOLDEN=1 to accept"
    for layout in actual.values():
        decode = layout["decode"]
        assert decode["effective_mode"] == "FULL_DECODE_ONLY" and decode["capture_sizes"], layout
        assert max(decode["capture_sizes"]) == decode["max_num_seqs"] * decode["decode_query_len"]
        assert all(size % decode["decode_query_len"] == 0 for size in decode["capture_sizes"])
    deepseek = actual["deepseek-r1-w8a8/a3-2P-dp2-tp8-1D-2nodes-dp32-tp1"]
    assert deepseek["prefill"]["effective_mode"] == "NONE" and deepseek["prefill"]["capture_sizes"] == []
    assert deepseek["prefill"]["max_num_batched_tokens"] == 16384


def test_roles_do_not_share_mutable_parts() -> None:
    manifest = example(EXAMPLE)
    first = roles(copy.deepcopy(manifest))
    container(first["prefill"])["env"].append({"name": "X", "value": "1"})
    assert "X" not in {var["name"] for var in container(first["decode"])["env"]}


def role_lws(role: str, uid: str, owner: str = "ds-uid", created: str = "2026-01-01T00:00:00Z", **status: int) -> JSON:
    """A role LeaderWorkerSet as LeaderWorkerSet v0.10's DisaggregatedSet controller makes it."""
    return {
        "metadata": {
            "name": f"x-0-{uid}-{role}",
            "uid": uid,
            "creationTimestamp": created,
            "labels": {kube_names.DS_ROLE_LABEL: role},
            "ownerReferences": [{"kind": "DisaggregatedSet", "uid": owner, "controller": True}],
        },
        "status": status,
    }


ROUTER_READY: JSON = {"status": {"readyReplicas": 1}}


def test_the_roles_counts_come_from_the_role_leader_worker_sets_and_none_is_ready_without_a_ready_prefill() -> None:
    ds: JSON = {"metadata": {"name": "x", "uid": "ds-uid", "generation": 3}}
    foreign = role_lws("decode", "f1", owner="someone", replicas=9, readyReplicas=9)
    roles = topologies_disaggregated.role_workloads([foreign], "ds-uid")
    assert roles == {"prefill": [], "decode": []}  # a copied label makes nothing ours
    assert topologies_disaggregated.workload_view(ds, roles, ROUTER_READY)["status"]["observedGeneration"] == 0, (
        "no role made yet"
    )
    prefill = role_lws("prefill", "p1", replicas=2, readyReplicas=0, updatedReplicas=2)
    decode = role_lws("decode", "d1", replicas=1, readyReplicas=1, updatedReplicas=1)
    roles = topologies_disaggregated.role_workloads([foreign, prefill, decode], "ds-uid")
    view = topologies_disaggregated.workload_view(ds, roles, ROUTER_READY)["status"]
    assert (view["replicas"], view["updatedReplicas"], view["readyReplicas"]) == (1, 1, 0)
    prefill["status"]["readyReplicas"] = 1
    view = topologies_disaggregated.workload_view(ds, roles, ROUTER_READY)["status"]
    assert (view["readyReplicas"], view["observedGeneration"]) == (1, 3)
    assert topologies_disaggregated.workload_view(ds, roles, {"status": {}})["status"]["readyReplicas"] == 0, (
        "no router"
    )
    # A rollout: the newer revision's LeaderWorkerSet counts as updated, both count as replicas.
    newer = role_lws("decode", "d2", created="2026-01-02T00:00:00Z", replicas=1, readyReplicas=0, updatedReplicas=0)
    roles = topologies_disaggregated.role_workloads([prefill, decode, newer], "ds-uid")
    view = topologies_disaggregated.workload_view(ds, roles, ROUTER_READY)["status"]
    assert (view["replicas"], view["updatedReplicas"], view["readyReplicas"]) == (2, 0, 1)


def pod(name: str, owner_uid: str, group: int = 0, node: int = 0) -> JSON:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {kube_names.LWS_GROUP_INDEX_LABEL: str(group), kube_names.LWS_WORKER_INDEX_LABEL: str(node)},
            "ownerReferences": [{"uid": owner_uid, "controller": True}],
        }
    }


def link(name: str, owner_uid: str) -> JSON:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "ownerReferences": [{"uid": owner_uid, "controller": True}]}
    }


def test_each_roles_pods_are_those_whose_chain_leads_to_its_leader_worker_set() -> None:
    roles = {"prefill": [role_lws("prefill", "p1")], "decode": [role_lws("decode", "d1")]}
    # LeaderWorkerSet v0.10's chain: leader pod -> leader StatefulSet -> LWS; worker -> its StatefulSet -> leader.
    links = [link("p-sts", "p1"), link("d-sts", "d1"), link("d-0-workers", "uid-d-0"), link("o-sts", "other-lws")]
    pods = [
        pod("p-0", "uid-p-sts"),
        pod("d-0", "uid-d-sts"),
        pod("d-0-1", "uid-d-0-workers", node=1),
        pod("o-0", "uid-o-sts"),  # someone else's, with our labels
    ]
    found = topologies_disaggregated.role_pods(pods, links, roles)
    assert {role: [p["metadata"]["name"] for p in found[role]] for role in found} == {
        "prefill": ["p-0"],
        "decode": ["d-0", "d-0-1"],
    }


def test_status_graph_has_each_roles_own_graph_and_the_decode_mode_on_top() -> None:
    spec = parse_spec(example(EXAMPLE)["spec"])

    def reports(pod: str, mode: str, rank: tuple[int, int], **extra: Any) -> aggregate.PodReport:
        document = {"schema": 1, "state": "ready", "requested_mode": "FULL_DECODE_ONLY", "effective_mode": mode}
        document["node"] = {"rank": rank[1], "nodes": 2, "data_parallel_ranks": [rank[1]]}
        return aggregate.PodReport(pod, report_schema.parse_report({**document, **extra}), rank=rank)

    downgrade = {
        "from_mode": "FULL_DECODE_ONLY",
        "to_mode": "NONE",
        "reason": "CaptureFailed",
        "message": "m",
        "stage": "engine",
    }
    by_role = {
        "prefill": [reports("p-0", "NONE", (0, 0))],
        "decode": [
            reports("d-0", "FULL_DECODE_ONLY", (0, 0)),
            reports("d-0-1", "NONE", (0, 1), downgrades=[downgrade]),
        ],
    }
    graph = topologies_disaggregated.roles_graph_status(
        spec, by_role, {}, now="2026-01-01T00:00:00Z", same_generation=True
    )
    assert graph["requestedMode"] == "FULL_DECODE_ONLY" and graph["effectiveMode"] == "NONE"  # the worst decode rank
    prefill, decode = graph["roles"]["prefill"], graph["roles"]["decode"]
    assert (prefill["requestedMode"], prefill["effectiveMode"]) == ("NONE", "NONE")
    assert decode["rankModes"] == {"FULL_DECODE_ONLY": "0:0", "NONE": "0:1"}
    assert [d["reason"] for d in decode["downgrades"]] == ["CaptureFailed"] and "downgrades" not in prefill
    # One Event for the role that downgraded, naming the role, group and node.
    events = resource.graph_events({}, decode, "role decode, ")
    assert [e.message.split(":")[0] for e in events] == ["role decode, group 0 node 1 (pod d-0-1)"]
    result_events = [
        e for e in reconcile._result({}, {"graph": graph}, ()).events if e.reason == status.GRAPH_MODE_DOWNGRADED
    ]
    assert [e.message.split(":")[0] for e in result_events] == ["role decode, group 0 node 1 (pod d-0-1)"]
    assert reconcile._result({"graph": graph}, {"graph": graph}, ()).events == ()  # announced once


# --- what a user writes stays data; the pod-template policy covers the prefill role -----------------


def role_containers(built: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every child with a pod template, a DisaggregatedSet's roles as LeaderWorkerSets."""
    found: list[dict[str, Any]] = []
    for child in built:
        if child["kind"] == kube_names.DS_KIND:
            found += [{"spec": role["spec"]} for role in child["spec"]["roles"]]
        else:
            found.append(child)
    return found


def test_no_disaggregation_field_is_expanded_by_the_kubelet() -> None:
    manifest = example(EXAMPLE)
    pd = manifest["spec"]["disaggregation"]
    pd["prefill"].update(extraArgs=["--seed", "1"], env=[{"name": "MY_VAR", "value": "v"}])
    pd["connector"]["extraConfig"] = {"mooncake_protocol": "ascend"}
    reaching: set[str] = set()
    for path in test_security.string_leaves(pd):
        changed = copy.deepcopy(manifest)
        node: Any = changed["spec"]["disaggregation"]
        for key in path:
            node = node[key]
        test_security.set_leaf(changed["spec"]["disaggregation"], path, node + "$(LEAK)$$(LEAK2)")
        try:
            built = topologies.build_children("m", "ns", parse_spec(changed["spec"]), CONFIG)
        except (ValueError, KeyError, TypeError):
            continue
        for value in test_security.container_strings(role_containers(built)):
            names, passed = test_security.kubelet_references(value)
            assert names <= {*test_security.OPERATOR_REFERENCES, api_roles.POD_NAME_ENV}, (path, value)
            if "$(LEAK)$$(LEAK2)" in passed:
                reaching.add(".".join(str(key) for key in path if not isinstance(key, int)))
    assert {"prefill.extraArgs", "prefill.env.value", "connector.extraConfig.mooncake_protocol"} <= reaching
    # The engine_id is the one reference of ours in the connector's settings, and it still expands.
    built = topologies.build_children("m", "ns", parse_spec(manifest["spec"]), CONFIG)
    args = role_containers(built)[1]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config["engine_id"] == "$(POD_NAME)" and config["kv_connector_extra_config"]["mooncake_protocol"] == "ascend"


def test_the_pod_template_policy_covers_the_prefill_env() -> None:
    manifest = example(EXAMPLE)
    secret = {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    manifest["spec"]["disaggregation"]["prefill"]["env"] = [secret]
    manifest["metadata"]["uid"] = "u1"
    _, problems = controller_desired.read_spec(manifest, CONFIG)
    assert [p.field for p in problems] == ["spec.disaggregation.prefill.env[0].valueFrom.secretKeyRef"]
    # Routing in front of a P/D resource is no longer refused (tests/operator/children/test_pd_scaling.py).
    manifest = example(EXAMPLE)
    manifest["spec"]["routing"] = {"failureMode": "FailOpen"}
    assert validate_spec(parse_spec(manifest["spec"])) == []


def revision_lws(role: str, revision: str, ready: int, created: str) -> JSON:
    lws = role_lws(role, f"{revision}-{role}", created=created, readyReplicas=ready)
    lws["metadata"]["labels"][kube_names.DS_REVISION_LABEL] = revision
    return lws


OLD, NEW = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("sets", "previous", "serving"),
    [
        # (role, revision, ready replicas, created) of each role LeaderWorkerSet; the revision selected before
        ([], None, None),  # nothing yet: the Services select every revision
        ([("prefill", "a", 0, OLD), ("decode", "a", 0, OLD)], None, None),  # not ready on any role yet
        ([("prefill", "a", 1, OLD), ("decode", "a", 1, OLD)], None, "a"),
        # a rollout: b is ready on prefill only, so the Services stay on a (service_manager.go, revisionReadyOnAllRoles)
        (
            [("prefill", "a", 1, OLD), ("decode", "a", 1, OLD), ("prefill", "b", 1, NEW), ("decode", "b", 0, NEW)],
            "a",
            "a",
        ),
        # b ready on every role: both Services move to b together
        (
            [("prefill", "a", 1, OLD), ("decode", "a", 1, OLD), ("prefill", "b", 1, NEW), ("decode", "b", 1, NEW)],
            "a",
            "b",
        ),
        # a drained and gone, b not ready yet: keep what was selected
        ([("prefill", "b", 0, NEW), ("decode", "b", 1, NEW)], "a", "a"),
    ],
)
def test_the_role_services_follow_the_newest_revision_ready_on_every_role(
    sets: list[tuple[str, str, int, str]], previous: str | None, serving: str | None
) -> None:
    roles: dict[str, list[JSON]] = {"prefill": [], "decode": []}
    for role, revision, ready, created in sets:
        roles[role].append(revision_lws(role, revision, ready, created))
    assert topologies_disaggregated.serving_revision(roles, previous) == serving


def test_both_role_services_select_the_serving_revision_and_the_router_service_all_routers() -> None:
    spec = parse_spec(example("sandbox-cpu-pd.yaml")["spec"])
    for revision in (None, "b"):
        made = disaggregated.build_children("x", "ns", spec, CONFIG, True, revision)
        selectors = {s["metadata"]["name"]: s["spec"]["selector"] for s in made if s["kind"] == "Service"}
        assert selectors["x-prefill"].get(kube_names.DS_REVISION_LABEL) == revision
        assert selectors["x-decode"].get(kube_names.DS_REVISION_LABEL) == revision
        assert kube_names.DS_REVISION_LABEL not in selectors["x"]  # the router is no role of a revision


def test_the_serving_revision_kept_in_the_status_reaches_the_role_services() -> None:
    manifest = example("sandbox-cpu-pd.yaml")
    manifest["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
    manifest["status"] = {"disaggregation": {"servingRevision": "b"}}
    desired = controller_desired.desired_state(
        manifest, TEST_CONFIG, frozenset({"DisaggregatedSet", "LeaderWorkerSet"})
    )
    assert desired.problems == ()
    name = manifest["metadata"]["name"]
    services = [desired.manifests[kind.key] for kind in (children.PREFILL_SERVICE, children.DECODE_SERVICE)]
    assert [s["spec"]["selector"][kube_names.DS_REVISION_LABEL] for s in services] == ["b", "b"], name

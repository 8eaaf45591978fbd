"""Multi-node replicas: the API fields, the LeaderWorkerSet builder, the args both sides agree on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from npu_operator import topologies
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import parse_spec
from npu_operator.api.validation import validate_spec
from npu_operator.children import engine_pod, workloads
from npu_operator.kube import names
from npu_runtime.contract import parse_serve_args
from npu_runtime.planner.plan import make_plan, node_engine_args
from npu_runtime.planner.probe import DeviceInfo

from tests.examples import EXAMPLES, example
from tests.operator import lws_schema
from tests.operator.children.test_workloads import LWS_POD_ENV, expand

ROOT = Path(__file__).resolve().parents[3]
TWO_NODES = "deepseek-r1-w8a8-2node.yaml"
CONFIG = OperatorConfig()
R1_W8A8 = ROOT / "tests" / "runtime" / "fixtures" / "models" / "deepseek-r1-w8a8"


def two_node_spec() -> Any:
    return parse_spec(example(TWO_NODES)["spec"])


def test_the_two_node_example_is_a_leader_worker_set_group_of_two() -> None:
    spec = two_node_spec()
    assert (spec.npu.nodes, spec.npu.count, spec.parallelism.data, spec.parallelism.expert) == (2, 8, 4, True)
    children = topologies.build_children("r1", "llm", spec, CONFIG)
    kinds = [child["kind"] for child in children]
    assert kinds[:2] == ["LeaderWorkerSet", "Service"] and "Deployment" not in kinds
    lws = children[0]
    lws_schema.validate(lws)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    # Only leaders serve the API.
    assert children[1]["spec"]["selector"][names.LWS_WORKER_INDEX_LABEL] == "0"
    container = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["huawei.com/Ascend910"] == 8  # per node
    env = {var["name"]: var for var in container["env"]}
    assert env["HCCL_IF_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {env[k]["value"] for k in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")} == {"eth0"}


def test_the_lws_schema_check_can_fail() -> None:
    lws = workloads.build_leader_worker_set("r1", "llm", two_node_spec(), CONFIG)
    lws["spec"]["leaderWorkerTemplate"]["size"] = 0
    with pytest.raises(jsonschema.ValidationError):
        lws_schema.validate(lws)
    lws = workloads.build_leader_worker_set("r1", "llm", two_node_spec(), CONFIG)
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    with pytest.raises(Exception, match="containerPort"):
        lws_schema.validate(lws)


@pytest.mark.parametrize(("index", "role"), [("0", "leader"), ("1", "worker")])
def test_each_pod_starts_the_engine_for_its_own_node(index: str, role: str) -> None:
    """The operator's args, expanded as the kubelet does, parsed by the runtime, planned by it."""
    spec = two_node_spec()
    lws = workloads.build_leader_worker_set("r1", "llm", spec, CONFIG)
    args = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
    options = parse_serve_args(expand(args, {**LWS_POD_ENV, "LWS_WORKER_INDEX": index})[2:])
    assert options.node_rank == int(index)
    node = DeviceInfo("npu", "Ascend910B3", 8, 64 << 30, None, "override")
    from npu_runtime.planner.model import inspect_model

    plan = make_plan(options.plan, node, inspect_model(R1_W8A8), environ={"HCCL_OP_EXPANSION_MODE": "AIV"})
    assert plan.effective_mode == "FULL_DECODE_ONLY"
    assert plan.layout.per_node[options.node_rank].role == role
    flags = node_engine_args(plan.layout, options.node_rank, options.data_parallel_address or "", 13389)
    assert ("--headless" in flags) == (role == "worker")
    assert flags[flags.index("--data-parallel-address") + 1] == LWS_POD_ENV["LWS_LEADER_ADDRESS"]


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--enable-expert-parallel", "spec.parallelism.expert"),
        ("--quantization=ascend", "spec.engine.quantization"),
        ("--additional-config", "spec.engine.additionalConfig"),
        ("--headless", "spec.npu.nodes"),
        ("--data-parallel-start-rank", "spec.npu.nodes"),
        ("--max-num-batched-tokens", "spec.engine.maxNumBatchedTokens"),
    ],
)
def test_flags_owned_by_the_new_fields_are_refused_in_extra_args(flag: str, field: str) -> None:
    manifest = example(TWO_NODES)
    manifest["spec"]["engine"]["extraArgs"] = [flag]
    problems = validate_spec(parse_spec(manifest["spec"]))
    assert [p.field for p in problems] == ["spec.engine.extraArgs[0]"]
    assert field in problems[0].message


def test_additional_config_reaches_the_engine_as_json() -> None:
    manifest = example(TWO_NODES)
    manifest["spec"]["engine"]["additionalConfig"] = {"ascend_compilation_config": {"enable_npugraph_ex": True}}
    spec = parse_spec(manifest["spec"])
    options = parse_serve_args(expand(engine_pod.runtime_args(spec), LWS_POD_ENV)[2:])
    assert options.additional_config is not None
    assert json.loads(options.additional_config) == {"ascend_compilation_config": {"enable_npugraph_ex": True}}


def test_one_node_replicas_keep_their_deployment_and_args() -> None:
    spec = parse_spec(example("qwen2.5-7b-910b.yaml")["spec"])
    children = topologies.build_children("q", "ns", spec, CONFIG)
    assert children[0]["kind"] == "Deployment"
    assert names.LWS_WORKER_INDEX_LABEL not in children[1]["spec"]["selector"]
    assert "--nodes" not in engine_pod.runtime_args(spec)


INVALID_LAYOUTS: list[tuple[dict[str, Any], str]] = [
    ({"npu": {"count": 8, "nodes": 0}}, "less than the minimum of 1"),
    (
        {"npu": {"count": 8, "nodes": 2}, "parallelism": {"tensor": 8}},
        "parallelism.tensor x pipeline x data (8) must equal npu.count (8) x npu.nodes (2)",
    ),
    (
        {"npu": {"count": 8, "nodes": 2}, "parallelism": {"tensor": 16}},
        "parallelism.data (1) must be a multiple of npu.nodes (2)",
    ),
    ({"parallelism": {"expert": "yes"}}, "is not of type 'boolean'"),
    ({"engine": {"quantization": "W8A8 please"}}, "does not match"),
    ({"engine": {"additionalConfig": "{}"}}, "is not of type 'object'"),
    ({"engine": {"maxNumBatchedTokens": 0}}, "less than the minimum of 1"),
]


@pytest.mark.parametrize(("change", "fragment"), INVALID_LAYOUTS)
def test_the_crd_rejects_layouts_naming_the_fields(change: dict[str, Any], fragment: str) -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    for section, values in change.items():
        manifest["spec"].setdefault(section, {}).update(values)
    errors = crd.validate(manifest)
    assert any(fragment in error for error in errors), errors


def test_render_prints_the_leader_worker_set() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "npu_operator.cli", "render", "-f", str(EXAMPLES / TWO_NODES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    documents = list(yaml.safe_load_all(out.stdout))
    assert documents[0]["kind"] == "LeaderWorkerSet"
    lws_schema.validate(documents[0])

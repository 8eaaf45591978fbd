"""The decode role's two layouts (`spec.disaggregation.decode.dataParallel`): what `external` renders.

vllm-ascend v0.23.0's P/D tutorial (docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md,
examples/external_online_dp/launch_online_dp.py) runs decode as one `vllm serve` per data-parallel rank,
`--port 7100 + i` on each node, behind a proxy that has every rank's host and port. With `external` each
decode pod's `npu-runtime serve` gets `--data-parallel-external` (one API server per local rank, rank i
on 8000 + i), the pod and the decode Service name each rank's port, the Service selects every decode pod
(not only the leaders) and the router gets one decode URL per rank port. `internal`, the default, renders
what it always did.
"""

from __future__ import annotations

from typing import Any

import pytest
from npu_operator.api import crd
from npu_operator.api.spec import parse_spec
from npu_operator.api.validation import validate_spec
from npu_operator.children import disaggregated
from npu_operator.kube import names as kube_names
from npu_runtime.contract import parse_serve_args
from npu_runtime.routing.options import parse_route_args

from tests.examples import example
from tests.operator import ds_schema
from tests.operator.topologies.test_disaggregated import CONFIG, EXAMPLE, container, expand, pod_env, roles

JSON = dict[str, Any]
RANK_PORTS = list(range(8000, 8016))  # 32 ranks over two nodes: 16 on each pod


def external(name: str = EXAMPLE) -> JSON:
    manifest = example(name)
    manifest["spec"]["disaggregation"]["decode"] = {"dataParallel": "external"}
    return manifest


def children(manifest: JSON) -> dict[tuple[str, str], JSON]:
    made = disaggregated.build_children("x", "ns", parse_spec(manifest["spec"]), CONFIG, True)
    return {(child["kind"], child["metadata"]["name"]): child for child in made}


def test_the_flagship_with_external_decode_is_valid() -> None:
    manifest = external()
    assert crd.validate(manifest) == []
    spec = parse_spec(manifest["spec"])
    assert spec.disaggregation is not None and spec.disaggregation.decode.external
    assert validate_spec(spec) == []
    ds_schema.validate(disaggregated.build_disaggregated_set("deepseek-r1-pd", "llm", spec, CONFIG))


def test_each_decode_pod_serves_one_api_per_local_rank_and_names_its_ports() -> None:
    by_role = roles(external())
    decode, prefill = by_role["decode"], by_role["prefill"]
    for index in ("0", "1"):  # the leader and the worker: the same args, their node from LWS
        env = {**pod_env(decode, "decode-0"), "LWS_WORKER_INDEX": index}
        options = parse_serve_args(expand(container(decode)["args"], env)[2:])
        assert options.data_parallel_external and options.port == 8000
        assert (options.plan.data_parallel, options.plan.nodes, options.node_rank) == (32, 2, int(index))
        assert options.data_parallel_address == "decode-0.x.ns"  # rank 0's API server, the leader
    ports = {port["name"]: port["containerPort"] for port in container(decode)["ports"]}
    assert ports == {"http": 8000, **{f"http-{i}": 8000 + i for i in range(1, 16)}, "metrics": 9090}
    # The prefill role is as it was: one API server per replica.
    assert not parse_serve_args(container(prefill)["args"][2:]).data_parallel_external
    assert [port["name"] for port in container(prefill)["ports"]] == ["http", "metrics"]


def test_the_router_gets_every_decode_rank_and_the_decode_service_every_decode_pod() -> None:
    built = children(external())
    router = built[("Deployment", "x")]["spec"]["template"]["spec"]["containers"][0]["args"]
    options = parse_route_args(router[2:])
    assert options.prefill == ("http://x-prefill.ns.svc:8000",)
    assert options.decode == tuple(f"http://x-decode.ns.svc:{port}" for port in RANK_PORTS)
    decode, prefill = built[("Service", "x-decode")]["spec"], built[("Service", "x-prefill")]["spec"]
    assert decode["clusterIP"] == "None" and kube_names.LWS_WORKER_INDEX_LABEL not in decode["selector"]
    assert decode["selector"][kube_names.ROLE_LABEL] == "decode"
    assert [(p["name"], p["port"]) for p in decode["ports"] if p["name"] != "metrics"] == [
        (disaggregated.rank_port_name(i), port) for i, port in enumerate(RANK_PORTS)
    ]
    assert prefill["selector"][kube_names.LWS_WORKER_INDEX_LABEL] == "0"  # prefill: its leaders, as before


def test_one_node_decode_with_external_ranks() -> None:
    manifest = external()
    manifest["spec"]["npu"] = {"count": 16, "nodes": 1}
    manifest["spec"]["parallelism"] = {"tensor": 4, "data": 4, "expert": True}
    options = parse_serve_args(container(roles(manifest)["decode"])["args"][2:])
    assert options.data_parallel_external and options.plan.nodes == 1 and options.data_parallel_address is None
    route = parse_route_args(
        children(manifest)[("Deployment", "x")]["spec"]["template"]["spec"]["containers"][0]["args"][2:]
    )
    assert route.decode == tuple(f"http://x-decode.ns.svc:{port}" for port in (8000, 8001, 8002, 8003))


def test_the_pod_monitor_scrapes_every_decode_ranks_api() -> None:
    manifest = external()
    manifest["spec"]["metrics"] = {"podMonitor": {"enabled": True}}
    monitor = children(manifest)[("PodMonitor", "x")]["spec"]["podMetricsEndpoints"]
    by_port = {endpoint["port"]: endpoint for endpoint in monitor}
    assert set(by_port) == {"metrics", "http", *(f"http-{i}" for i in range(1, 16))}
    keep = [rule for rule in by_port["http"]["relabelings"] if rule["action"] == "keep"]
    # A decode worker's ranks serve their own API: kept; a prefill worker's (headless) are not.
    assert keep == [
        {
            "action": "keep",
            "sourceLabels": [
                kube_names.pod_label_meta(kube_names.LWS_WORKER_INDEX_LABEL),
                kube_names.pod_label_meta(kube_names.ROLE_LABEL),
            ],
            "separator": ";",
            "regex": "(0|);.*|[^;]*;decode",
        }
    ]
    assert by_port["http-3"]["relabelings"][0] == {
        "action": "keep",
        "sourceLabels": [kube_names.pod_label_meta(kube_names.ROLE_LABEL)],
        "regex": "decode",
    }


def test_internal_is_the_default_and_renders_as_before() -> None:
    written = example(EXAMPLE)
    written["spec"]["disaggregation"]["decode"] = {"dataParallel": "internal"}
    assert children(written) == children(example(EXAMPLE))
    spec = parse_spec(example(EXAMPLE)["spec"])
    assert spec.disaggregation is not None and spec.disaggregation.decode.data_parallel == "internal"


def test_external_with_one_data_parallel_rank_is_refused_with_the_reason() -> None:
    manifest = external("sandbox-cpu-pd.yaml")  # decode parallelism.data 1
    errors = crd.validate(manifest)
    assert any("disaggregation.decode.dataParallel external" in e and "parallelism.data above 1" in e for e in errors)
    manifest["spec"]["npu"] = {"count": 0, "nodes": 2}  # on a CPU a node is one device: a rank per node
    manifest["spec"]["parallelism"] = {"data": 2}
    assert crd.validate(manifest) == []
    manifest["spec"]["disaggregation"]["decode"] = {"dataParallel": "sideways"}
    assert any("is not one of" in e for e in crd.validate(manifest))


@pytest.mark.parametrize(
    "arg", ["--data-parallel-rank", "--data-parallel-rank=3", "-dpn", "-dpn3", "--data_parallel_ra"]
)
def test_a_users_rank_flag_is_refused_only_with_external_ranks(arg: str) -> None:
    manifest = external()
    manifest["spec"]["engine"]["extraArgs"] = ["--seed", "1", arg, "3"] if "=" not in arg else ["--seed", "1", arg]
    found = [str(problem) for problem in validate_spec(parse_spec(manifest["spec"]))]
    assert found == [
        f"spec.engine.extraArgs[2]: {arg.split('=')[0]} is set per rank by "
        "spec.disaggregation.decode.dataParallel external (each rank's API server gets its own "
        "--data-parallel-rank); remove it"
    ]
    internal = example(EXAMPLE)
    internal["spec"]["engine"]["extraArgs"] = manifest["spec"]["engine"]["extraArgs"]
    assert validate_spec(parse_spec(internal["spec"])) == []

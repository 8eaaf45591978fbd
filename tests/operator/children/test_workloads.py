"""Builders: full expected children for every example (golden files), determinism, valid Kubernetes."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import parse_spec
from npu_operator.children import engine_pod, workloads
from npu_operator.children import kinds as children_kinds
from npu_operator.controller.desired import adopted_children
from npu_operator.kube import names
from npu_runtime.contract import ASCEND_RECOMMENDED_ENV, parse_serve_args

from tests.examples import EXAMPLES, example
from tests.operator import ds_schema, lws_schema

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
CONFIG = OperatorConfig()
KUBERNETES_VERSION = "1.37.0"
EXAMPLE_FILES = sorted(path.name for path in EXAMPLES.glob("*.yaml"))


# What LeaderWorkerSet's webhook sets in a worker pod (pkg/utils/pod/pod_utils.go); the kubelet
# expands $(NAME) in args from the container's environment.
LWS_POD_ENV = {"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "x-0.x.ns"}


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(NAME) expansion of container args (unknown names stay as written)."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg) for arg in args]


def render(manifest: dict[str, Any], pod_monitor: bool = True) -> list[dict[str, Any]]:
    manifest["metadata"].setdefault("uid", "11111111-2222-3333-4444-555555555555")
    spec = parse_spec(manifest["spec"])
    return adopted_children(manifest, spec, CONFIG, children_kinds.Capabilities(pod_monitor=pod_monitor))


def dump(children: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(children, sort_keys=True, default_flow_style=False)


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_children_match_the_golden_file(name: str) -> None:
    text = dump(render(example(name)))
    golden = GOLDEN / name
    if UPDATE or not golden.exists():
        golden.write_text(text, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"{golden} did not exist; written now, review and commit it")
    assert text == golden.read_text(encoding="utf-8"), f"run with UPDATE_GOLDEN=1 to accept changes to {name}"


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_rendering_is_byte_identical_across_runs(name: str) -> None:
    assert dump(render(example(name))) == dump(render(example(name)))


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_children_pass_kubernetes_own_schemas(name: str) -> None:
    for child in render(example(name), pod_monitor=False):
        if child["kind"] == names.LWS_KIND:  # not a Kubernetes built-in: its own project's checks
            lws_schema.validate(child)
        elif child["kind"] == "DisaggregatedSet":
            ds_schema.validate(child)
        else:
            assert kubernetes_validate.validate(child, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_runtime_parses_the_rendered_args_back_to_the_spec(name: str) -> None:
    manifest = example(name)
    spec = parse_spec(manifest["spec"])
    deployment = workloads.build_deployment("x", "ns", spec, CONFIG)
    args = expand(deployment["spec"]["template"]["spec"]["containers"][0]["args"], LWS_POD_ENV)
    assert args[:2] == ["npu-runtime", "serve"]
    options = parse_serve_args(args[2:])
    assert options.model == spec.model.path
    assert options.served_model_name == spec.model.name
    assert options.port == names.HTTP_PORT and options.metrics_port == names.METRICS_PORT
    assert options.plan.graph_mode == spec.graph.mode
    assert options.plan.capture_sizes == spec.graph.capture_sizes
    assert options.plan.stream_budget == spec.graph.stream_budget
    assert options.plan.max_num_seqs == spec.engine.max_num_seqs
    assert options.plan.max_model_len == spec.engine.max_model_len
    assert options.plan.gpu_memory_utilization == spec.engine.gpu_memory_utilization
    assert options.plan.tensor_parallel == spec.parallelism.tensor
    assert options.plan.dtype == spec.engine.dtype
    assert options.plan.nodes == spec.npu.nodes
    assert options.plan.data_parallel == spec.parallelism.data
    assert options.plan.enable_expert_parallel == spec.parallelism.expert
    assert options.plan.quantization == spec.engine.quantization
    assert options.plan.max_num_batched_tokens == spec.engine.max_num_batched_tokens
    if spec.npu.nodes > 1:
        assert (options.node_rank, options.data_parallel_address) == (1, LWS_POD_ENV["LWS_LEADER_ADDRESS"])
    assert options.extra_engine_args == spec.engine.extra_args
    assert options.shutdown_timeout < engine_pod.TERMINATION_GRACE_SECONDS


def test_npus_are_requested_as_an_extended_resource_in_requests_and_limits() -> None:
    spec = parse_spec(example("qwen2.5-32b-tp4.yaml")["spec"])
    container = workloads.build_deployment("x", "ns", spec, CONFIG)["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["huawei.com/Ascend910"] == 4
    assert container["resources"]["requests"]["huawei.com/Ascend910"] == 4
    assert "command" not in container, "the vllm-ascend entrypoint must stay: args only"


def test_cpu_replicas_request_no_npu() -> None:
    spec = parse_spec(example("sandbox-cpu.yaml")["spec"])
    container = workloads.build_deployment("x", "ns", spec, CONFIG)["spec"]["template"]["spec"]["containers"][0]
    assert not any("/" in key for key in container["resources"].get("limits", {}))


def test_user_env_overrides_the_recommended_ascend_env() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["engine"]["env"] = [{"name": "TASK_QUEUE_ENABLE", "value": "2"}]
    spec = parse_spec(manifest["spec"])
    env = workloads.build_deployment("x", "ns", spec, CONFIG)["spec"]["template"]["spec"]["containers"][0]["env"]
    values = {var["name"]: var.get("value") for var in env}
    assert values["TASK_QUEUE_ENABLE"] == "2"
    assert set(ASCEND_RECOMMENDED_ENV) <= set(values)
    assert [var["name"] for var in env] == sorted(values)


def test_pdb_only_with_more_than_one_replica() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    kinds = [child["kind"] for child in render(manifest)]
    assert "PodDisruptionBudget" in kinds
    manifest["spec"]["replicas"] = 1
    assert "PodDisruptionBudget" not in [child["kind"] for child in render(manifest)]


def test_pod_monitor_only_when_asked_for_and_served() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    assert "PodMonitor" in [c["kind"] for c in render(manifest, pod_monitor=True)]
    assert "PodMonitor" not in [c["kind"] for c in render(manifest, pod_monitor=False)]
    manifest["spec"]["metrics"]["podMonitor"]["enabled"] = False
    assert "PodMonitor" not in [c["kind"] for c in render(manifest, pod_monitor=True)]


def test_operator_labels_win_over_user_pod_labels() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["template"]["metadata"] = {"labels": {"inference.npu.dev/name": "other", "team": "a"}}
    spec = parse_spec(manifest["spec"])
    labels = workloads.build_deployment("qwen", "ns", spec, CONFIG)["spec"]["template"]["metadata"]["labels"]
    assert labels["inference.npu.dev/name"] == "qwen"
    assert labels["team"] == "a"


def test_startup_probe_covers_the_startup_timeout() -> None:
    spec = parse_spec(example("qwen2.5-32b-tp4.yaml")["spec"])
    probe = workloads.build_deployment("x", "ns", spec, CONFIG)["spec"]["template"]["spec"]["containers"][0][
        "startupProbe"
    ]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= spec.engine.startup_timeout_seconds


# --- hub sources: the fetch init container --------------------------------------------------------


def _hub_manifest(**source: Any) -> dict[str, Any]:
    manifest = example("qwen2.5-7b-modelscope.yaml")
    if source:
        manifest["spec"]["model"]["source"] = source
    return manifest


def _pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    deployment = render(manifest)[0]
    pod_spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod_spec


def test_a_hub_source_downloads_in_an_init_container_the_runtime_parses() -> None:
    from npu_runtime.cli import plan_parser
    from npu_runtime.fetch.download import fetch_parser

    manifest = _hub_manifest(
        huggingFace={
            "repository": "org/model",
            "revision": "v2",
            "ignorePatterns": ["*.bin"],
            "endpoint": "https://m.example",
        }
    )
    pod_spec = _pod_spec(manifest)
    (init,) = pod_spec["initContainers"]
    assert init["args"][:2] == ["npu-runtime", "fetch"]
    args = fetch_parser().parse_args(init["args"][2:])
    assert (args.hub, args.repo, args.revision, args.ignore, args.endpoint) == (
        "huggingface",
        "org/model",
        "v2",
        ["*.bin"],
        "https://m.example",
    )
    assert str(args.cache) == "/models" and str(args.link) == "/var/run/npu-model/model"
    assert args.status_port == names.METRICS_PORT
    # The early plan gets exactly the serving container's planner flags.
    serve = parse_serve_args(pod_spec["containers"][0]["args"][2:])
    plan = plan_parser().parse_args(["--model", "x", *args.plan])
    assert serve.model == "/var/run/npu-model/model"
    assert plan.max_num_seqs == serve.plan.max_num_seqs and plan.graph_mode == serve.plan.graph_mode
    # Both containers see the cache at the same path (the link's target), the server read-only.
    server_mounts = {m["name"]: m for m in pod_spec["containers"][0]["volumeMounts"]}
    assert server_mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert server_mounts["model-link"]["readOnly"] is True
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == {
        "model": "/models",
        "model-link": "/var/run/npu-model",
    }
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "model-cache"}


def test_the_token_reaches_the_download_from_the_secret_only() -> None:
    manifest = _hub_manifest(modelScope={"repository": "org/model", "tokenSecretRef": {"name": "ms-secret"}})
    pod_spec = _pod_spec(manifest)
    (init,) = pod_spec["initContainers"]
    token = next(var for var in init["env"] if var["name"] == engine_pod.TOKEN_ENV)
    assert token == {"name": "NPU_MODEL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "ms-secret", "key": "token"}}}
    assert not any(var["name"] == engine_pod.TOKEN_ENV for var in pod_spec["containers"][0]["env"])
    assert "ms-secret" not in " ".join(init["args"])


def test_the_cache_claim_is_built_only_when_asked_and_never_owned() -> None:
    spec = parse_spec(_hub_manifest()["spec"])
    claim = workloads.build_cache_claim("llm", spec)
    assert claim is not None
    assert claim["metadata"]["name"] == "model-cache" and "ownerReferences" not in claim["metadata"]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "200Gi"}},
        "storageClassName": "nfs-client",
    }
    kubernetes_validate.validate(claim, KUBERNETES_VERSION, strict=True)
    without = _hub_manifest()
    del without["spec"]["model"]["cache"]["create"]
    assert workloads.build_cache_claim("llm", parse_spec(without["spec"])) is None
    assert workloads.build_cache_claim("llm", parse_spec(example("qwen2.5-7b-910b.yaml")["spec"])) is None


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_runtime_pods_are_hardened(name: str) -> None:
    """No token, no privilege escalation, no capabilities, the runtime's seccomp profile."""
    for pod in workload_pod_specs(render(example(name))[0]):
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        context = pod["containers"][0]["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["privileged"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod


def workload_pod_specs(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs a Deployment or a LeaderWorkerSet (leader and worker templates) runs."""
    if workload["kind"] == "Deployment":
        return [workload["spec"]["template"]["spec"]]
    templates = workload["spec"]["leaderWorkerTemplate"]
    found = [templates[key]["spec"] for key in ("leaderTemplate", "workerTemplate") if key in templates]
    assert found, workload
    return found


def test_a_named_service_account_gets_its_token() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"].setdefault("template", {})["serviceAccountName"] = "model-reader"
    pod = render(manifest)[0]["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("model-reader", True)


def test_the_pod_monitor_bounds_what_one_scrape_of_a_pod_may_add() -> None:
    # A pod is untrusted input to Prometheus too: past a limit its scrape fails as a whole.
    monitor = next(c for c in render(example("qwen2.5-7b-910b.yaml")) if c["kind"] == "PodMonitor")
    assert {key: monitor["spec"][key] for key in workloads.POD_MONITOR_LIMITS} == workloads.POD_MONITOR_LIMITS
    assert all(0 < value <= 20000 for value in workloads.POD_MONITOR_LIMITS.values())


def test_prefill_pods_never_mount_the_decode_roles_record() -> None:
    """Issue 33, item 11: a P/D resource's record is the decode role's (its key names the role);
    prefill pods mount none and are given no --calibration, decode pods mount it."""
    (ds,) = [c for c in render(example("sandbox-cpu-pd.yaml")) if c["kind"] == "DisaggregatedSet"]
    by_role = {
        role["name"]: role["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"] for role in ds["spec"]["roles"]
    }
    for role, pod in by_role.items():
        volumes = [v for v in pod["volumes"] if "configMap" in v and v["configMap"]["name"].endswith("-calibration")]
        (container,) = [c for c in pod["containers"] if c["name"] == names.CONTAINER_NAME]
        mounted = [m for m in container["volumeMounts"] if m["mountPath"] == names.RECORD_MOUNT]
        flagged = "--calibration" in container["args"]
        assert (bool(volumes), bool(mounted), flagged) == ((True,) * 3 if role == "decode" else (False,) * 3), role

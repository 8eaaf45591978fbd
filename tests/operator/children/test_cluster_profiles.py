"""Each cluster profile, for every example, renders what the upstream code that consumes it accepts.

`npu-operator render --all-apis --set npu.clusterProfile=P -f examples/F` for every profile and
example; each rule is the upstream's, cited where it is checked:

- device-plugin: the driver as vllm-ascend's `docker run` mounts it (installation.md), read-only
  hostPath volumes whose types the kubelet's check knows (pkg/volume/hostpath/host_path.go);
- volcano: the device plugin's pod filter in Volcano mode (mind-cluster ascend-device-plugin
  pkg/common/common.go FilterPods: limits[huawei.com/<type>] > 0, the annotation of that key,
  which Volcano writes and ASCEND_VISIBLE_DEVICES reads), the Ascend Volcano plugin's policy by
  nodeSelector accelerator-type (ascend-for-volcano internal/npu/factory.go
  get910CardHandlerName), schedulerName on every template of a LeaderWorkerSet, which
  LeaderWorkerSet's volcano provider does not set (lws pkg/schedulerprovider/volcano_provider.go);
- cce: CCE's resource names (vllm-ascend using_volcano_kthena.md), requests equal to limits;
- every profile: the image of the spec's NPU family, the rendered objects valid for Kubernetes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml
from npu_operator.api import clusters
from npu_operator.api.config import CLUSTER_PROFILES, OperatorConfig, load_config
from npu_operator.api.host_mounts import DRIVER_MOUNTS
from npu_operator.api.spec import parse_spec
from npu_operator.children import engine_pod
from npu_operator.children.workloads import build_leader_worker_set
from npu_operator.kube.names import CONTAINER_NAME

from tests.examples import EXAMPLES, example
from tests.operator.conftest import Render

KUBERNETES = "1.37.0"
# The examples' own settings (their comments say which chart values they need).
EXAMPLE_SETTINGS = {
    "qwen2.5-32b-tp4.yaml": ["operator.podTemplatePolicy.allowedPriorityClasses=inference-high"],
    "sandbox-cpu.yaml": ["operator.podTemplatePolicy.allowedHostPaths=/tmp/npu-sandbox/models"],
    "sandbox-cpu-2node.yaml": ["operator.podTemplatePolicy.allowedHostPaths=/tmp/npu-sandbox/models"],
    "sandbox-cpu-pd.yaml": ["operator.podTemplatePolicy.allowedHostPaths=/tmp/npu-sandbox/models"],
}
EXAMPLE_FILES = sorted(path.name for path in EXAMPLES.glob("*.yaml"))
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"}


def pod_templates(children: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every engine pod template of the rendered children (not the router's, not the picker's)."""
    for child in children:
        spec = child.get("spec", {})
        if child["kind"] == "Deployment" and any(
            c["name"] == CONTAINER_NAME for c in spec["template"]["spec"]["containers"]
        ):
            yield spec["template"]
        elif child["kind"] == "LeaderWorkerSet":
            yield spec["leaderWorkerTemplate"]["workerTemplate"]
        elif child["kind"] == "DisaggregatedSet":
            for role in spec["roles"]:
                yield role["spec"]["leaderWorkerTemplate"]["workerTemplate"]


def npu_limits(template: dict[str, Any]) -> dict[str, Any]:
    limits = template["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return {name: count for name, count in limits.items() if "/" in name}


def rendered(render_here: Render, name: str, profile: str) -> list[dict[str, Any]]:
    sets = [f"--set={assignment}" for assignment in [f"npu.clusterProfile={profile}", *EXAMPLE_SETTINGS.get(name, [])]]
    result = render_here("--all-apis", *sets, "-f", str(EXAMPLES / name))
    assert result.returncode == 0, result.stderr
    return [child for child in yaml.safe_load_all(result.stdout) if child]


@pytest.mark.parametrize("profile", CLUSTER_PROFILES)
@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_every_example_renders_what_the_profiles_cluster_needs(render_here: Render, name: str, profile: str) -> None:
    children = rendered(render_here, name, profile)
    templates = list(pod_templates(children))
    assert templates, f"{name}: no engine pod"
    spec = parse_spec(example(name)["spec"])
    for template in templates:
        pod = template["spec"]
        container = pod["containers"][0]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
        limits = npu_limits(template)
        for volume in volumes.values():
            if "hostPath" in volume:
                assert volume["hostPath"].get("type", "") in HOST_PATH_TYPES
        if not limits:  # a CPU example: no NPU, nothing of the profile
            assert "schedulerName" not in pod and not any(m.volume in volumes for m in DRIVER_MOUNTS)
            continue
        (resource, count), *more = limits.items()
        assert not more and container["resources"]["requests"][resource] == count  # extended: requests = limits
        driver = [mount for mount in DRIVER_MOUNTS if mount.volume in volumes]
        if profile == "device-plugin":
            assert [volumes[m.volume]["hostPath"] for m in driver] == [
                {"path": m.path, "type": m.type} for m in DRIVER_MOUNTS
            ]
            assert all(mounts[m.volume] == {"name": m.volume, "mountPath": m.path, "readOnly": True} for m in driver)
        else:
            assert not driver
        if profile == "volcano":
            assert pod["schedulerName"] == (spec.template.scheduler_name or "volcano")
            env = {var["name"]: var for var in container["env"]}
            # FilterPods matches the annotation of the resource's own key, which Volcano writes.
            assert env["ASCEND_VISIBLE_DEVICES"]["valueFrom"] == {
                "fieldRef": {"fieldPath": f"metadata.annotations['{resource}']"}
            }
            family = clusters.spec_family(spec)
            expected = {"A2": "module-910b-8", "A3": "module-a3-16"}.get(family)
            assert pod.get("nodeSelector", {}).get("accelerator-type") == expected
        else:
            assert pod.get("schedulerName") == spec.template.scheduler_name  # the spec's own only
        if profile == "cce":
            assert resource in ("huawei.com/ascend-1980", "huawei.com/ascend-310")
        else:
            assert resource.startswith("huawei.com/Ascend") or resource == "huawei.com/npu"
    for child in children:
        if child["kind"] in ("Deployment", "Service", "ConfigMap", "PodDisruptionBudget"):
            kubernetes_validate.validate(child, KUBERNETES, strict=True)
        for template in pod_templates([child]):
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
                KUBERNETES,
                strict=True,
            )


def image_of(name: str, config: OperatorConfig | None = None, **npu: Any) -> str:
    config = config or OperatorConfig()
    spec = parse_spec(example(name)["spec"])
    return clusters.runtime_image(dataclasses.replace(spec, npu=dataclasses.replace(spec.npu, **npu)), config)


def test_each_family_runs_the_image_built_for_it() -> None:
    base = OperatorConfig().runtime_image
    assert image_of("qwen2.5-7b-910b.yaml") == base  # A2: vllm-ascend's image without a suffix
    assert image_of("deepseek-r1-w8a8-pd.yaml") == f"{base}-a3"  # npu.family A3
    assert image_of("qwen2.5-7b-310p.yaml") == f"{base}-310p"  # chipName 310P3
    assert image_of("qwen2.5-7b-910b.yaml", family="A5") == f"{base}-a5"
    assert image_of("qwen2.5-7b-910b.yaml", chip_name=None, resource_name="huawei.com/Ascend310P") == f"{base}-310p"
    # The chart's own image per family wins over the suffix; a digest or an untagged image is kept.
    chosen = load_config({}, assignments=["operator.chipRuntimeImages={A3=registry.example/rt:7-a3}"])
    assert image_of("deepseek-r1-w8a8-pd.yaml", chosen) == "registry.example/rt:7-a3"
    assert image_of("qwen2.5-7b-310p.yaml", chosen) == f"{base}-310p"
    digest = OperatorConfig(runtime_image="registry.example:5000/rt@sha256:" + "0" * 64)
    assert image_of("deepseek-r1-w8a8-pd.yaml", digest) == digest.runtime_image
    untagged = OperatorConfig(runtime_image="registry.example:5000/rt")
    assert image_of("deepseek-r1-w8a8-pd.yaml", untagged) == untagged.runtime_image


def test_a_spec_image_overrides_the_familys(render_here: Render) -> None:
    manifest = example("deepseek-r1-w8a8-pd.yaml")
    manifest["spec"]["engine"]["image"] = "ghcr.io/npu-inference/npu-runtime:custom"
    spec = parse_spec(manifest["spec"])
    assert clusters.runtime_image(spec, OperatorConfig()) == "ghcr.io/npu-inference/npu-runtime:custom"


@pytest.mark.parametrize(
    ("name", "image_suffix"), [("deepseek-r1-w8a8-pd.yaml", "-a3"), ("qwen2.5-7b-310p.yaml", "-310p")]
)
def test_the_a3_and_310p_examples_render_their_chips_image(render_here: Render, name: str, image_suffix: str) -> None:
    templates = list(pod_templates(rendered(render_here, name, "ascend-docker-runtime")))
    images = {c["image"] for t in templates for c in [*t["spec"]["containers"], *t["spec"].get("initContainers", [])]}
    assert images == {OperatorConfig().runtime_image + image_suffix}


def test_the_resource_is_the_specs_then_the_settings_then_the_profiles_for_the_family() -> None:
    spec = parse_spec(example("qwen2.5-7b-310p.yaml")["spec"])
    assert clusters.npu_resource(spec, OperatorConfig()) == "huawei.com/Ascend310P"
    assert clusters.npu_resource(spec, OperatorConfig(cluster_profile="cce")) == "huawei.com/ascend-310"
    a5 = dataclasses.replace(spec, npu=dataclasses.replace(spec.npu, family="A5", chip_name=None))
    assert clusters.npu_resource(a5, OperatorConfig()) == "huawei.com/npu"
    assert clusters.npu_resource(a5, OperatorConfig(cluster_profile="cce")) == "huawei.com/ascend-1980"  # CCE's default
    assert clusters.npu_resource(spec, OperatorConfig(npu_resource_name="example.com/npu")) == "example.com/npu"
    named = dataclasses.replace(spec, npu=dataclasses.replace(spec.npu, resource_name="huawei.com/Ascend310P-2c"))
    assert clusters.npu_resource(named, OperatorConfig(cluster_profile="cce", npu_resource_name="x.io/y")) == (
        "huawei.com/Ascend310P-2c"
    )


def test_the_runtime_class_reaches_npu_pods_only() -> None:
    config = OperatorConfig(runtime_class_name="ascend")
    npu = parse_spec(example("qwen2.5-7b-910b.yaml")["spec"])
    assert engine_pod.pod_template("q", npu, config)["spec"]["runtimeClassName"] == "ascend"
    cpu = parse_spec(example("sandbox-cpu.yaml")["spec"])
    assert "runtimeClassName" not in engine_pod.pod_template("q", cpu, config)["spec"]


def test_a_specs_own_scheduler_and_accelerator_type_win_over_volcanos() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["template"].update(
        schedulerName="my-scheduler", nodeSelector={"accelerator-type": "module-910b-16"}
    )
    pod = engine_pod.pod_template("q", parse_spec(manifest["spec"]), OperatorConfig(cluster_profile="volcano"))["spec"]
    assert pod["schedulerName"] == "my-scheduler"
    assert pod["nodeSelector"]["accelerator-type"] == "module-910b-16"


def test_a_volcano_queue_annotation_reaches_the_leader_worker_set(render_here: Render) -> None:
    manifest = example("deepseek-r1-w8a8-2node.yaml")
    metadata = manifest["spec"].setdefault("template", {}).setdefault("metadata", {})
    metadata["annotations"] = {"scheduling.volcano.sh/queue-name": "llm"}
    lws = build_leader_worker_set("d", "ns", parse_spec(manifest["spec"]), OperatorConfig(cluster_profile="volcano"))
    assert lws["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "llm"}
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert "leaderTemplate" not in lws["spec"]["leaderWorkerTemplate"]  # the workers' template is the leader's too
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "llm"


def test_multi_node_and_pd_pods_export_what_the_tutorials_do(render_here: Render) -> None:
    for name in ("deepseek-r1-w8a8-2node.yaml", "deepseek-r1-w8a8-pd.yaml"):
        for template in pod_templates(rendered(render_here, name, "ascend-docker-runtime")):
            env = {var["name"]: var.get("value") for var in template["spec"]["containers"][0]["env"]}
            assert env["OMP_PROC_BIND"] == "false"
    single = parse_spec(example("qwen2.5-7b-910b.yaml")["spec"])
    env = engine_pod.pod_template("q", single, OperatorConfig())["spec"]["containers"][0]["env"]
    assert "OMP_PROC_BIND" not in {var["name"] for var in env}


def test_pd_roles_mount_hccn_conf_and_the_driver_tools_without_failing_on_a_node_without_them(
    render_here: Render,
) -> None:
    for template in pod_templates(rendered(render_here, "deepseek-r1-w8a8-pd.yaml", "ascend-docker-runtime")):
        volumes = {v["name"]: v.get("hostPath") for v in template["spec"]["volumes"]}
        assert volumes["hccn-conf"] == {"path": "/etc/hccn.conf", "type": "FileOrCreate"}
        assert volumes["ascend-driver-tools"] == {"path": "/usr/local/Ascend/driver/tools", "type": "DirectoryOrCreate"}
    # On CCE the profile mounts driver/tools already: once.
    for template in pod_templates(rendered(render_here, "deepseek-r1-w8a8-pd.yaml", "cce")):
        names = [v["name"] for v in template["spec"]["volumes"]]
        assert names.count("ascend-driver-tools") == 1


def test_a_model_may_not_be_mounted_over_a_driver_path() -> None:
    from npu_operator.api.validation import validate_spec

    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["model"]["mountPath"] = "/usr/local/dcmi"
    problems = [str(problem) for problem in validate_spec(parse_spec(manifest["spec"]))]
    assert any("/usr/local/dcmi" in problem and "host" in problem for problem in problems), problems

"""How Ascend clusters hand NPUs to pods: the cluster profiles, the chip of a spec and its image. Pure.

A profile (the setting `cluster_profile`, chart value `npu.clusterProfile`) is what one common
way of setting up an Ascend cluster needs of an inference pod: the extended resource its device
plugin announces, the host paths of the driver when no container runtime adds them, the
scheduler and the node labels and pod fields it reads. docs/ascend-clusters.md tells a platform
engineer how to see which profile a cluster is; each setting below names the upstream file that
needs it (Ascend/mind-cluster at v26.1, kubernetes-sigs/lws v0.10, vllm-project/vllm-ascend v0.23).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from npu_runtime.engines import image_variant, npu_family

from npu_operator.api.config import CHIP_FAMILIES, CLUSTER_PROFILES, OperatorConfig
from npu_operator.api.host_mounts import DRIVER_MOUNTS, DRIVER_TOOLS, HostMount
from npu_operator.api.spec import NPUInferenceSpec

DEFAULT_FAMILY: Final = "A2"


@dataclasses.dataclass(frozen=True)
class ClusterProfile:
    name: str
    # The extended resource per NPU family, for specs that do not name one.
    resources: Mapping[str, str]
    # Host paths every NPU pod mounts (read-only).
    host_mounts: tuple[HostMount, ...] = ()
    # Volcano: the scheduler, and the node selector by family its Ascend plugin picks a policy by.
    scheduler_name: str | None = None
    accelerator_types: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The NPUs' ids from the annotation the scheduler writes (env name -> annotation key).
    device_annotation_env: str | None = None


def spec_family(spec: NPUInferenceSpec) -> str:
    """The NPU family a spec runs on: spec.npu.family, else its chip's (910B3 is A2), else its
    resource's (huawei.com/Ascend310P), else A2, the family every other default is for."""
    if spec.npu.family:
        return spec.npu.family
    for name in (spec.npu.chip_name, spec.npu.resource_name):
        if name and (family := npu_family(name.rpartition("/")[2])) in CHIP_FAMILIES:
            return family
    return DEFAULT_FAMILY


def profile(config: OperatorConfig) -> ClusterProfile:
    return PROFILES[config.cluster_profile]


def npu_resource(spec: NPUInferenceSpec, config: OperatorConfig) -> str:
    """The extended resource a spec's pods request: the spec's, else the operator's setting, else
    the cluster profile's for the spec's family. The one place that decides it."""
    if spec.npu.resource_name:
        return spec.npu.resource_name
    if config.npu_resource_name:
        return config.npu_resource_name
    resources = profile(config).resources
    return resources.get(spec_family(spec), resources[DEFAULT_FAMILY])


def runtime_image(spec: NPUInferenceSpec, config: OperatorConfig) -> str:
    """The image a spec's engine runs: spec.engine.image, else the setting's image for the spec's
    family (chip_runtime_images), else runtime_image with vllm-ascend's tag suffix for the family
    (-a3, -a5, -310p): the runtime image of a family is built FROM vllm-ascend's image of that
    suffix (Dockerfile, VLLM_ASCEND_VARIANT), and tagged so by the release workflow."""
    if spec.engine.image:
        return spec.engine.image
    family = spec_family(spec)
    chosen = dict(entry.split("=", 1) for entry in config.chip_runtime_images)
    if family in chosen:
        return chosen[family].strip()
    variant = image_variant(family)
    suffix = variant.suffix if variant is not None else ""
    repository, colon, tag = config.runtime_image.rpartition(":")
    if not suffix or not colon or "/" in tag or "@" in config.runtime_image:
        return config.runtime_image  # no tag to extend (a digest, or none): one image for every family
    return f"{repository}:{tag}{suffix}"


ASCEND_910: Final = "huawei.com/Ascend910"
ASCEND_310P: Final = "huawei.com/Ascend310P"
# The Ascend device plugin names A5's resource huawei.com/npu (mind-cluster
# component/ascend-device-plugin/pkg/device/ascend910.go, getAscend910Name); 910, 910B and A3 are
# all huawei.com/Ascend910 (pkg/server/manager.go), 310P huawei.com/Ascend310P (pkg/device/ascend310p.go).
MIND_CLUSTER_RESOURCES: Final = {"A2": ASCEND_910, "A3": ASCEND_910, "A5": "huawei.com/npu", "310P": ASCEND_310P}
# The node label spec.npu.chipName selects: set by the device plugin from the driver's chip name
# (pkg/server/manager.go getNewNodeLabel: ChipNameLabel), e.g. 910B3, 310P3.
CHIP_LABEL: Final = "node.kubernetes.io/npu.chip.name"
# Set by the cluster's admin on each NPU node, read by the Ascend Volcano plugin from the pods'
# nodeSelector (mind-cluster docs: module-910b-8, module-910b-16, module-a3-16, card, ...).
ACCELERATOR_TYPE_LABEL: Final = "accelerator-type"

PROFILES: Final[Mapping[str, ClusterProfile]] = {
    # The Ascend Docker Runtime mounts the driver (its base.list) from ASCEND_VISIBLE_DEVICES,
    # which the device plugin sets in Allocate (pkg/common/common.go SetAscendRuntimeEnv).
    "ascend-docker-runtime": ClusterProfile("ascend-docker-runtime", MIND_CLUSTER_RESOURCES),
    # The device plugin with useAscendDocker=false hands over /dev/davinci* only (DeviceSpecs), no
    # driver: the pod mounts it as vllm-ascend's containers do.
    "device-plugin": ClusterProfile("device-plugin", MIND_CLUSTER_RESOURCES, DRIVER_MOUNTS),
    # MindCluster's Volcano mode: the device plugin (-volcanoType=true) serves only pods that
    # Volcano scheduled and annotated with huawei.com/<resource> (pkg/common/common.go FilterPods;
    # "not get valid pod" otherwise); the Ascend Volcano plugin picks the 910 policy by the pods'
    # nodeSelector accelerator-type (component/ascend-for-volcano internal/npu/factory.go
    # get910CardHandlerName; none is Atlas 800 910A's); MindCluster's vLLM guides read the NPU ids
    # from that annotation into ASCEND_VISIBLE_DEVICES.
    "volcano": ClusterProfile(
        "volcano",
        MIND_CLUSTER_RESOURCES,
        scheduler_name="volcano",
        accelerator_types={"A2": "module-910b-8", "A3": "module-a3-16"},
        device_annotation_env="ASCEND_VISIBLE_DEVICES",
    ),
    # Huawei Cloud CCE's NPU add-on (CCE AI Suite): its own resource names (vllm-ascend
    # docs/source/user_guide/deployment_guide/using_volcano_kthena.md; huawei.com/ascend-1980 in
    # vllm-ascend's LWS CI for its A3 nodes too), its node label accelerator/huawei-npu, and the
    # driver from the add-on: the CI's pods mount only driver/tools. Its nodes' own chip label,
    # accelerator/huawei-npu, has no documented values: spec.npu.chipName selects CHIP_LABEL here too.
    "cce": ClusterProfile(
        "cce",
        {"A2": "huawei.com/ascend-1980", "A3": "huawei.com/ascend-1980", "310P": "huawei.com/ascend-310"},
        (DRIVER_TOOLS,),
    ),
}
assert tuple(PROFILES) == CLUSTER_PROFILES, "api.config.CLUSTER_PROFILES names these profiles"

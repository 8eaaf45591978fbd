"""The host paths the operator itself mounts into NPU pods (read-only): the driver, its tools, hccn.conf.

Below `spec` (whose POD_MOUNTS a model may not be mounted over) and `clusters` (which profile
mounts which): a path here is never a tenant's hostPath, so the pod-template policy's list of
allowed host paths does not apply to it.
"""

from __future__ import annotations

import dataclasses
from typing import Final


@dataclasses.dataclass(frozen=True)
class HostMount:
    """A host path an NPU pod mounts read-only, as the operator's own volume (never a tenant's)."""

    volume: str
    path: str
    # The hostPath type (kubernetes pkg/volume/hostpath/host_path.go, checkType): Directory and
    # File fail the mount when the path is missing ("hostPath %s doesn't exist"): right for the
    # driver, without which no NPU works; DirectoryOrCreate and FileOrCreate never fail it.
    type: str


# The driver as vllm-ascend's own containers get it where no Ascend Docker Runtime mounts it
# (docs/source/installation.md and every tutorial's `docker run`: -v of these five paths).
DRIVER_MOUNTS: Final = (
    HostMount("ascend-driver-lib64", "/usr/local/Ascend/driver/lib64", "Directory"),
    HostMount("ascend-driver-version", "/usr/local/Ascend/driver/version.info", "File"),
    HostMount("ascend-install-info", "/etc/ascend_install.info", "File"),
    HostMount("ascend-dcmi", "/usr/local/dcmi", "Directory"),
    HostMount("ascend-npu-smi", "/usr/local/bin/npu-smi", "File"),
)
# hccn_tool, which the P/D KV connectors fall back to for the NPUs' network addresses; the Ascend
# Docker Runtime's base.list (mind-cluster component/ascend-docker-runtime/build/scripts/base.list)
# does not mount it, vllm-ascend's LWS CI does (tests/e2e/nightly/multi_node/scripts/lws.yaml.jinja2).
DRIVER_TOOLS: Final = HostMount("ascend-driver-tools", "/usr/local/Ascend/driver/tools", "DirectoryOrCreate")
# The NPUs' network configuration, for the P/D roles' KV connector (vllm-ascend's P/D tutorial
# mounts it). FileOrCreate: on a node without one the kubelet creates an empty file instead of
# failing the pod (type File did), and the connector falls back to hccn_tool.
HCCN_CONF: Final = HostMount("hccn-conf", "/etc/hccn.conf", "FileOrCreate")
# Every path above: a model mounted at one of them would be a second volume at the same path.
HOST_MOUNTS: Final = (*DRIVER_MOUNTS, DRIVER_TOOLS, HCCN_CONF)

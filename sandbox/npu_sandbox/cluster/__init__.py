"""The sandbox's cluster: its API served on a local port, and the calls a client makes to it.

`client` holds the calls over HTTP (`ApiClient`, `ApiRejected`), all that the controllers and the
kubelet need; `local` the cluster itself (`LocalCluster`: the emulator on a port, a kubeconfig,
the product's CRDs, the real operator in a thread). Both names are exported here, the way the
operator's tests import them (`from npu_sandbox.cluster import LocalCluster`).
"""

from npu_sandbox.cluster.client import ApiClient, ApiRejected
from npu_sandbox.cluster.local import LocalCluster

__all__ = ["ApiClient", "ApiRejected", "LocalCluster"]

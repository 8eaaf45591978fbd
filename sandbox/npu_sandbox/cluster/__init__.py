"""The sandbox's cluster: its API served on a local port, and the calls a client makes to it.

`local` holds the cluster (`LocalCluster`: the emulator on a port, a kubeconfig, the product's CRDs,
the real operator in a thread, and the calls over HTTP). Its names are exported here, the way the
operator's tests import them (`from npu_sandbox.cluster import LocalCluster`).
"""

from npu_sandbox.cluster.local import ApiRejected, LocalCluster

__all__ = ["ApiRejected", "LocalCluster"]

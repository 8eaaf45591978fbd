"""Old import path of `npu_sandbox.node.kubelet` (and of `replica_set_owner`), kept for the operator's and
the runtime's tests.

tests/operator and tests/runtime import these names from here and are not this change's to edit;
once they import `npu_sandbox.node.kubelet` and `npu_sandbox.controllers.workloads`, this module
goes. Nothing in the sandbox imports it.
"""

from npu_sandbox.controllers.workloads import replica_set_owner
from npu_sandbox.node.kubelet import free_port

__all__ = ["free_port", "replica_set_owner"]

"""Old import path of `npu_sandbox.node.kubelet`, kept for the operator's and the runtime's tests.

tests/operator and tests/runtime import these names from here and are not this change's to edit;
once they import `npu_sandbox.node.kubelet`, this module goes. Nothing in the sandbox imports it.
"""

from npu_sandbox.node.kubelet import free_port, replica_set_owner

__all__ = ["free_port", "replica_set_owner"]

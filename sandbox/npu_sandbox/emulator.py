"""Old import path of `npu_sandbox.apiserver.emulator`, kept for the operator's tests.

tests/operator imports `KubeEmulator` from here and is not this change's to edit; once it imports
`npu_sandbox.apiserver.emulator`, this module goes. Nothing in the sandbox imports it.
"""

from npu_sandbox.apiserver.emulator import KubeEmulator

__all__ = ["KubeEmulator"]

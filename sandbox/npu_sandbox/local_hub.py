"""Old import path of `npu_sandbox.fixtures.local_hub`, kept for the runtime's tests.

tests/runtime imports these names from here and is not this change's to edit; once it imports
`npu_sandbox.fixtures.local_hub`, this module goes. Nothing in the sandbox imports it.
"""

from npu_sandbox.fixtures.local_hub import LocalHub, Repo, RepoFile

__all__ = ["LocalHub", "Repo", "RepoFile"]

"""Old import path of `npu_sandbox.controllers.disaggregated`, kept for the operator's tests.

tests/operator calls `disaggregated.<name>` after `from npu_sandbox import disaggregated` and is not
this change's to edit; once it imports `npu_sandbox.controllers.disaggregated`, this module goes.
Nothing in the sandbox imports it.
"""

from npu_sandbox.controllers.disaggregated import API_VERSION, PLURAL, ROLE_LABEL, reconcile

__all__ = ["API_VERSION", "PLURAL", "ROLE_LABEL", "reconcile"]

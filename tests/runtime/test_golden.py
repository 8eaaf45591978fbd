"""The old import path of the golden plans' device constants; the tests are tests/runtime/planner/test_golden.py.

Kept (no tests here) because tests/operator/test_disaggregation.py imports A3_NODE from this path;
delete once it imports from tests.runtime.planner.test_golden.
"""

from __future__ import annotations

from tests.runtime.planner.test_golden import A3_NODE

__all__ = ["A3_NODE"]

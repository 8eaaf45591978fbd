"""The old import path of the plan properties' strategy; the tests are tests/runtime/planner/test_plan_properties.py.

Kept (no tests here) because tests/operator/test_scaling.py imports these from this path; delete once
it imports from tests.runtime.planner.test_plan_properties.
"""

from __future__ import annotations

from tests.runtime.planner.test_plan_properties import PROPERTY_SETTINGS, cases, try_plan

__all__ = ["PROPERTY_SETTINGS", "cases", "try_plan"]

"""Fixtures shared by the chart tests: promtool (Debian's `prometheus` package), or a skip that says why."""

from __future__ import annotations

import shutil

import pytest

WHY_SKIPPED = (
    "promtool not found: install Debian's prometheus package (scripts/bootstrap does it as root on Debian: "
    "apt-get install --no-install-recommends prometheus)"
)


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(WHY_SKIPPED)
    return found

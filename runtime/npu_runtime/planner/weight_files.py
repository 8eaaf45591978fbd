"""Weight bytes measured from the files: the safetensors index's total_size, else the files' headers.

A safetensors file starts with an 8-byte little-endian header length, then a JSON header with each
tensor's dtype, shape and byte range; no tensor is read.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Final

from npu_runtime import files
from npu_runtime.planner.config_fields import ModelError, read_json

__all__ = ["INDEX_NAME", "measured_weight_bytes", "safetensors_data_bytes"]

INDEX_NAME: Final = "model.safetensors.index.json"
# A safetensors header larger than this is not a header (the format caps it at 100 MB).
_MAX_HEADER_BYTES: Final = 100 * 1000 * 1000
# safetensors dtype codes -> bytes per element (https://github.com/huggingface/safetensors, format spec).
_SAFETENSORS_DTYPE_BYTES: Final = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def measured_weight_bytes(directory: Path, notes: list[str]) -> tuple[int | None, str]:
    index = directory / INDEX_NAME
    if index.is_file():
        total, shards = _index_entries(index, read_json(index))
        if total is not None:
            return total, "safetensors-index"
        present = [directory / s for s in shards if (directory / s).is_file()]
        if shards and len(present) == len(shards):
            return sum(safetensors_data_bytes(p) for p in present), "safetensors-headers"
        notes.append(f"{index.name} has no metadata.total_size and its shards are not all present")
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return sum(safetensors_data_bytes(p) for p in files), "safetensors-headers"
    return None, "estimated-from-shape"


def _index_entries(index: Path, data: Any) -> tuple[int | None, list[str]]:
    """(metadata.total_size when a positive integer, the shard file names) of a safetensors index."""
    if not isinstance(data, dict):
        return None, []
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ModelError(f"{index}: field 'metadata': expected a JSON object, got {metadata!r}")
    weight_map = data.get("weight_map", {})
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelError(f"{index}: field 'weight_map': expected an object of tensor name -> file name")
    total = metadata.get("total_size")
    return (total if isinstance(total, int) and total > 0 else None), sorted(set(weight_map.values()))


def safetensors_data_bytes(path: Path) -> int:
    """Bytes of tensor data in one .safetensors file, from its header alone."""
    try:
        with files.open_regular(path) as handle:
            head = handle.read(8)
            if len(head) != 8:
                raise ModelError(f"{path}: too short for a safetensors header")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER_BYTES:
                raise ModelError(f"{path}: header length {length} is not plausible")
            raw = handle.read(length)
    except files.FileProblem as exc:
        raise ModelError(str(exc)) from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc}") from None
    if len(raw) != length:
        raise ModelError(f"{path}: header is truncated ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelError(f"{path}: header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: header is not a JSON object")
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = tensor["data_offsets"]
            dtype, shape = tensor["dtype"], tensor["shape"]
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: tensor {name!r} lacks dtype, shape or data_offsets") from None
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise ModelError(f"{path}: tensor {name!r} has invalid data_offsets {tensor['data_offsets']!r}")
        if not isinstance(dtype, str):
            raise ModelError(f"{path}: tensor {name!r} has invalid dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ModelError(f"{path}: tensor {name!r} has invalid shape {shape!r}: expected a list of sizes")
        expected = math.prod(shape) * _SAFETENSORS_DTYPE_BYTES.get(dtype, 0)
        if dtype in _SAFETENSORS_DTYPE_BYTES and expected != end - start:
            raise ModelError(
                f"{path}: tensor {name!r}: {dtype}{shape} needs {expected} bytes, offsets span {end - start}"
            )
        total += end - start
    return total

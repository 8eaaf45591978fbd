"""A runtime's `/status` as the operator trusts it: any JSON value in, a typed, bounded report out.

What a pod says is untrusted input. `parse_report` never raises: every field is checked for
type, range and length; a field that fails its check is dropped (a list item alone, when only
it is bad) and counted in `RuntimeReport.dropped`, so a lying or broken runtime costs the
operator at most a report with less in it. Lists are cut to fixed lengths and strings to fixed
sizes, so a report held in memory has a small, fixed upper size whatever the pod sent.
Reports from older runtimes may lack fields: a missing field is not malformed, it is absent.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from npu_operator.status.calibration import CalibrationSection, parse_section
from npu_operator.status.decode_batches import graph_fields

# Bounds on what one report can hold.
MAX_CAPTURES: Final = 64  # vLLM captures at most a few dozen batch sizes per mode
MAX_REPLAY_ROWS: Final = 64
MAX_DOWNGRADES: Final = 8  # a runtime reports at most a handful (plan and engine stage)
MAX_FALLBACK_REASONS: Final = 16
MAX_NODE_RANKS: Final = 64  # data-parallel ranks one node runs: at most one per device
MAX_MESSAGE: Final = 256  # characters
MAX_SIZE: Final = 1 << 16  # batch sizes
MAX_COUNT: Final = 1 << 62  # counters (decode steps, replays, bytes)
MAX_SECONDS: Final = 86_400.0
MAX_ADAPTERS: Final = 256  # spec.lora.maxCpuLoras' maximum
MAX_ADAPTER_NAME: Final = 128  # spec.lora.adapters[].name's maxLength

# Graph modes (vLLM's CUDAGraphMode names), runtime states, reasons: short identifiers only.
_TOKEN: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_STATES: Final = frozenset({"fetching", "starting", "loading", "capturing", "ready", "failed", "stopping"})
_MODEL_PHASES: Final = frozenset({"Resolving", "Waiting", "Downloading", "Verifying", "Ready", "Failed"})
_STAGES: Final = frozenset({"plan", "engine"})
_ADAPTER_STATES: Final = frozenset({"loaded", "failed", "pending"})
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


@dataclasses.dataclass(frozen=True)
class Capture:
    mode: str
    size: int
    memory_bytes: int | None


@dataclasses.dataclass(frozen=True)
class ReplayRow:
    mode: str
    size: int
    count: int
    p50_seconds: float
    p99_seconds: float


@dataclasses.dataclass(frozen=True)
class Downgrade:
    from_mode: str
    to_mode: str
    reason: str
    stage: str
    message: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.from_mode, self.to_mode, self.reason, self.stage)


@dataclasses.dataclass(frozen=True)
class Failure:
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class ModelProgress:
    """The model download's progress (`npu-runtime fetch`'s /status and final termination message)."""

    repository: str
    revision: str | None
    phase: str
    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int


@dataclasses.dataclass(frozen=True)
class AdapterReport:
    """One LoRA adapter as the runtime holds it (`npu_runtime.serving.lora`): loaded, failed or pending."""

    name: str
    state: str
    reason: str | None
    message: str


@dataclasses.dataclass(frozen=True)
class RuntimeReport:
    """What one runtime said, every field checked; `dropped` counts the fields that were not kept."""

    state: str | None = None
    effective_mode: str | None = None
    planned_sizes: tuple[int, ...] = ()
    captures: tuple[Capture, ...] = ()
    replay: tuple[ReplayRow, ...] = ()
    downgrades: tuple[Downgrade, ...] = ()
    decode_steps: int = 0
    eager_fallbacks: int = 0
    failure: Failure | None = None
    model: ModelProgress | None = None
    # Which node of a multi-node replica the runtime runs (its --node-rank) and its DP ranks.
    node_rank: int | None = None
    data_parallel_ranks: tuple[int, ...] = ()
    calibration: CalibrationSection | None = None
    """Estimated vs measured per memory term (npu_operator.calibration)."""
    adapters: tuple[AdapterReport, ...] = ()
    """The LoRA adapters of the pod's list, with --lora-adapters (none without)."""
    sizes_from: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Issue 37: status.graph's captureSizesFrom and expectedPadding from the plan (status/decode_batches.py)."""
    dropped: int = 0


class _Reader:
    """Checks one field at a time; counts what it drops."""

    def __init__(self) -> None:
        self.dropped = 0

    def drop(self) -> None:
        self.dropped += 1

    def token(self, value: Any, *, optional: bool = True) -> str | None:
        if value is None and optional:
            return None
        if isinstance(value, str) and _TOKEN.fullmatch(value):
            return value
        self.drop()
        return None

    def count(self, value: Any, *, limit: int = MAX_COUNT, low: int = 0) -> int | None:
        # bool is an int to Python, never to a report; a float is accepted only when whole.
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= limit:
            return value
        self.drop()
        return None

    def seconds(self, value: Any) -> float | None:
        if value is None:
            return 0.0
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and math.isfinite(value) and 0.0 <= value <= MAX_SECONDS:
            return float(value)
        self.drop()
        return None

    def items(self, value: Any, limit: int) -> list[Any]:
        """The first `limit` items of a list (None: none); anything else is dropped."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.drop()
            return []
        if len(value) > limit:
            self.dropped += len(value) - limit
        return value[:limit]

    def mapping(self, value: Any) -> Mapping[str, Any] | None:
        if value is None:
            return None
        if isinstance(value, Mapping):
            return value
        self.drop()
        return None


def one_line(value: Any) -> str:
    """A one-line text of at most MAX_MESSAGE characters, control characters removed."""
    text = value if isinstance(value, str) else ""
    text = _CONTROL.sub(" ", text[: MAX_MESSAGE * 4]).strip()
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def parse_report(document: Any) -> RuntimeReport:
    """The checked report in `document` (whatever JSON value the runtime answered). Never raises."""
    read = _Reader()
    if not isinstance(document, Mapping):
        return RuntimeReport(dropped=1)
    state = document.get("state")
    if state is not None and not (isinstance(state, str) and state in _STATES):
        read.drop()
        state = None
    effective = read.token(document.get("effective_mode"))
    planned: list[int] = []
    plan = read.mapping(document.get("plan"))
    for size in read.items((plan or {}).get("capture_sizes"), MAX_CAPTURES):
        if (checked := read.count(size, limit=MAX_SIZE, low=1)) is not None:
            planned.append(checked)
    node = read.mapping(document.get("node"))
    node_rank = None if node is None or node.get("rank") is None else read.count(node["rank"], limit=MAX_SIZE)
    listed = read.items((node or {}).get("data_parallel_ranks"), MAX_NODE_RANKS)
    ranks = [read.count(rank, limit=MAX_SIZE) for rank in listed]
    return RuntimeReport(
        state=state,
        effective_mode=effective,
        planned_sizes=tuple(planned),
        captures=tuple(_captures(read, document.get("captures"))),
        replay=tuple(_replay(read, document.get("replay"))),
        downgrades=tuple(_downgrades(read, document.get("downgrades"))),
        decode_steps=read.count(document.get("decode_steps") or 0) or 0,
        eager_fallbacks=_fallbacks(read, document.get("eager_fallbacks")),
        failure=_failure(read, document.get("failure")),
        model=parse_model_progress(document.get("model"), read),
        node_rank=node_rank,
        data_parallel_ranks=tuple(sorted({rank for rank in ranks if rank is not None})),
        calibration=parse_section(document.get("calibration")),
        sizes_from=graph_fields(plan),
        adapters=tuple(_adapters(read, document.get("adapters"))),
        dropped=read.dropped,
    )


def parse_model_progress(value: Any, read: _Reader | None = None) -> ModelProgress | None:
    """The checked download progress in `value` (None when absent or unusable). Never raises."""
    read = read or _Reader()
    progress = read.mapping(value)
    if progress is None:
        return None
    repository = one_line(progress.get("repository"))
    phase = progress.get("phase")
    if not repository or phase not in _MODEL_PHASES:
        read.drop()
        return None
    figures = [
        read.count(progress.get(key) or 0) or 0 for key in ("bytesDone", "bytesTotal", "filesDone", "filesTotal")
    ]
    return ModelProgress(repository, one_line(progress.get("revision")) or None, str(phase), *figures)


def _captures(read: _Reader, value: Any) -> list[Capture]:
    captures = []
    for item in read.items(value, MAX_CAPTURES):
        if not isinstance(item, Mapping):
            read.drop()
            continue
        mode = read.token(item.get("mode", "FULL"), optional=False)
        size = read.count(item.get("size"), limit=MAX_SIZE, low=1)
        memory = item.get("memory_bytes")
        memory = None if memory is None else read.count(memory)
        if mode is not None and size is not None:
            captures.append(Capture(mode, size, memory))
    return captures


def _replay(read: _Reader, value: Any) -> list[ReplayRow]:
    rows = []
    for item in read.items(value, MAX_REPLAY_ROWS):
        if not isinstance(item, Mapping):
            read.drop()
            continue
        mode = read.token(item.get("mode", ""), optional=False) if item.get("mode", "") != "" else ""
        size = read.count(item.get("size"), limit=MAX_SIZE, low=1)
        count = read.count(item.get("count") or 0)
        p50, p99 = read.seconds(item.get("p50_seconds")), read.seconds(item.get("p99_seconds"))
        if None not in (mode, size, count, p50, p99):
            rows.append(ReplayRow(str(mode), int(size or 0), int(count or 0), float(p50 or 0.0), float(p99 or 0.0)))
    return rows


def _downgrades(read: _Reader, value: Any) -> list[Downgrade]:
    found: dict[tuple[str, str, str, str], Downgrade] = {}
    for item in read.items(value, MAX_DOWNGRADES):
        if not isinstance(item, Mapping):
            read.drop()
            continue
        stage = item.get("stage", "engine")
        fields = [read.token(item.get(key), optional=False) for key in ("from_mode", "to_mode", "reason")]
        if not (isinstance(stage, str) and stage in _STAGES):
            read.drop()
            continue
        if None in fields:
            continue
        from_mode, to_mode, reason = (str(field) for field in fields)
        downgrade = Downgrade(from_mode, to_mode, reason, str(stage), one_line(item.get("message")))
        found.setdefault(downgrade.key, downgrade)
    return list(found.values())


def _adapters(read: _Reader, value: Any) -> list[AdapterReport]:
    adapters = []
    for item in read.items(value, MAX_ADAPTERS):
        name = item.get("name") if isinstance(item, Mapping) else None
        state = item.get("state") if isinstance(item, Mapping) else None
        if not (isinstance(name, str) and 0 < len(name) <= MAX_ADAPTER_NAME and one_line(name) == name):
            read.drop()
            continue
        if state not in _ADAPTER_STATES:
            read.drop()
            continue
        adapters.append(AdapterReport(name, str(state), read.token(item.get("reason")), one_line(item.get("message"))))
    return adapters


def _fallbacks(read: _Reader, value: Any) -> int:
    counts = read.mapping(value)
    total = 0
    for reason, count in list((counts or {}).items())[:MAX_FALLBACK_REASONS]:
        checked = read.count(count)
        if checked is not None and isinstance(reason, str):
            total = min(total + checked, MAX_COUNT)
    if counts is not None and len(counts) > MAX_FALLBACK_REASONS:
        read.dropped += len(counts) - MAX_FALLBACK_REASONS
    return total


def _failure(read: _Reader, value: Any) -> Failure | None:
    failure = read.mapping(value)
    if failure is None:
        return None
    reason = read.token(failure.get("reason"), optional=False)
    return Failure(reason, one_line(failure.get("message"))) if reason is not None else None

"""What the observer records inside one engine process, and how it leaves the process.

The hooks call the `Recorder`; the recorder keeps plain counters and dicts, and a daemon thread
writes them as this process's report (`npu_runtime.reports`) at most once per flush period while
something changed. Phase changes and downgrades are written at once (the runtime's /status shows
"capturing" while it lasts; a downgrade should be visible before a crash that may follow it).

Replay timing: `EventTimer.start()` records a device event on the current stream before the
replay and `stop()` another after it; neither waits for the device. The flush thread later asks
each pending end event whether it has completed (`query()`, non-blocking) and only then reads
`elapsed_time`. The decode path never synchronises because of us. Events are reused once read,
the number pending is bounded (a replay is simply not timed while the bound is reached), and
`sample_every` times one replay in N.

No torch here: the device event factory and the memory probe are handed in by the hooks.
"""

from __future__ import annotations

import array
import collections
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from npu_runtime import metrics, reports
from npu_runtime.observer import batches

log = logging.getLogger("npu_runtime.observer")

RECENT_SAMPLES: Final = 512  # per (mode, size), for /status's p50/p99
MAX_PENDING_EVENTS: Final = 1024

Key = tuple[str, int]  # (mode, size)


class DeviceEvent(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds, as torch's events


class EventTimer:
    """Device-side timing of replays without synchronising: record now, read when complete."""

    def __init__(
        self,
        make_event: Callable[[], DeviceEvent] | None,
        *,
        sample_every: int = 1,
        max_pending: int = MAX_PENDING_EVENTS,
    ) -> None:
        self.make_event = make_event
        self.sample_every = max(1, sample_every)
        self.max_pending = max_pending
        self._calls = 0
        self._pending: collections.deque[tuple[Key, DeviceEvent, DeviceEvent]] = collections.deque()
        self._free: list[tuple[DeviceEvent, DeviceEvent]] = []

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self) -> tuple[DeviceEvent, DeviceEvent] | None:
        """Before a replay (decode path): the event pair to stop, or None when this one is not timed."""
        if self.make_event is None:
            return None
        self._calls += 1
        if self._calls % self.sample_every or len(self._pending) >= self.max_pending:
            return None
        try:
            pair = self._free.pop()
        except IndexError:
            pair = (self.make_event(), self.make_event())
        pair[0].record()
        return pair

    def stop(self, pair: tuple[DeviceEvent, DeviceEvent], key: Key) -> None:
        """After a replay (decode path): record the end event and queue the pair for reading."""
        pair[1].record()
        self._pending.append((key, pair[0], pair[1]))

    def drain(self) -> list[tuple[Key, float]]:
        """(key, seconds) for every queued replay whose end event has completed, oldest first."""
        done: list[tuple[Key, float]] = []
        while self._pending:
            key, start, end = self._pending[0]
            if not end.query():
                break
            self._pending.popleft()
            done.append((key, start.elapsed_time(end) / 1000.0))
            self._free.append((start, end))
        return done


class ReplayStats:
    __slots__ = ("_next", "_percentiles", "_percentiles_at", "buckets", "count", "recent", "sum", "timed")

    def __init__(self) -> None:
        self.count = 0  # replays seen
        self.timed = 0  # replays with a device time
        self.sum = 0.0
        self.buckets = [0] * (len(metrics.REPLAY_LATENCY_BUCKETS) + 1)
        self.recent = array.array("d")  # a ring of the last RECENT_SAMPLES device times (8 bytes each)
        self._next = 0
        self._percentiles: tuple[float | None, float | None] = (None, None)
        self._percentiles_at = 0  # `timed` when _percentiles was computed

    def observe(self, seconds: float) -> None:
        self.timed += 1
        self.sum += seconds
        self.buckets[metrics.bucket_index(seconds)] += 1
        if len(self.recent) < RECENT_SAMPLES:
            self.recent.append(seconds)
        else:
            self.recent[self._next] = seconds
            self._next = (self._next + 1) % RECENT_SAMPLES

    def p50_p99(self) -> tuple[float | None, float | None]:
        """p50 and p99 of the recent device times: one sort, kept until the next `observe`."""
        if self._percentiles_at != self.timed:
            p50, p99 = percentiles(self.recent, (0.50, 0.99))
            self._percentiles = (p50, p99)
            self._percentiles_at = self.timed
        return self._percentiles


def percentiles(samples: Sequence[float], fractions: Sequence[float]) -> list[float | None]:
    """Nearest-rank percentiles of `samples` (sorted here, once) at each fraction; None for no samples."""
    if not samples:
        return [None] * len(fractions)
    ordered = sorted(samples)
    count = len(ordered)
    return [ordered[max(1, min(count, math.ceil(fraction * count))) - 1] for fraction in fractions]


def percentile(samples: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of `samples` (sorted here); None for no samples."""
    return percentiles(samples, (fraction,))[0]


class Recorder:
    """This process's observations, written to `directory` as its report."""

    def __init__(
        self,
        directory: str | None,
        *,
        vllm_version: str | None = None,
        flush_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
        batch_half_life_seconds: float = batches.HALF_LIFE_SECONDS,
    ) -> None:
        self.directory = directory
        self.batch_half_life_seconds = batch_half_life_seconds  # issue 37: decode batch distribution
        self.vllm_version = vllm_version
        self.flush_seconds = flush_seconds
        self.clock = clock
        self.timer = EventTimer(None)
        self.hooks_installed: list[str] = []
        self.hooks_unavailable: list[str] = []
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.pid = os.getpid()
        self.phase = "loaded"
        self.config_mode: dict[str, str] | None = None
        self.resolved_mode: str | None = None
        self.downgrades: list[dict[str, str]] = []
        self.captures: dict[Key, dict[str, Any]] = {}
        self.replay: dict[Key, ReplayStats] = {}
        self.eager_fallbacks: dict[str, int] = {}
        self.decode_steps = 0
        # issue 37: the decode batch sizes the engine really runs (observer/batches.py)
        self.decode_batches = batches.DecodeBatchCounter(half_life_seconds=self.batch_half_life_seconds)
        self.errors: dict[str, int] = {}
        self.memory: dict[str, Any] | None = None
        self.lora_requests: dict[str, int] = {}  # issue 47: adapter -> requests (observer/lora_requests.py)
        self._dirty = True
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()

    def after_fork_in_child(self) -> None:
        """A forked worker inherits the parent's hooks and data but not its thread: start clean."""
        self._lock = threading.Lock()
        self._reset()

    # ----- records (called by hooks) -----

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.flush()

    def record_config_mode(self, requested: str, final: str) -> None:
        self.config_mode = {"requested": requested, "final": final}
        self.flush()

    def record_resolved_mode(self, mode: str) -> None:
        self.resolved_mode = mode
        self._dirty = True

    def record_downgrade(self, from_mode: str, to_mode: str, reason: str, message: str) -> None:
        for known in self.downgrades:
            if (known["from_mode"], known["to_mode"], known["reason"]) == (from_mode, to_mode, reason):
                return
        self.downgrades.append(
            {"from_mode": from_mode, "to_mode": to_mode, "reason": reason, "message": message, "stage": "engine"}
        )
        self.flush()

    def record_capture(self, key: Key, memory_bytes: int | None, seconds: float) -> None:
        """One graph captured for `key`; piecewise modes capture several per size and they add up."""
        self.ensure_flusher()
        entry = self.captures.get(key)
        if entry is None:
            self.captures[key] = {"memory_bytes": memory_bytes, "seconds": seconds, "graphs": 1}
        else:
            if memory_bytes is not None:
                entry["memory_bytes"] = (entry["memory_bytes"] or 0) + memory_bytes
            entry["seconds"] += seconds
            entry["graphs"] += 1
        self._dirty = True

    def count_replay(self, key: Key) -> None:
        if self._flusher is None:
            self.ensure_flusher()
        stats = self.replay.get(key)
        if stats is None:
            stats = self.replay[key] = ReplayStats()
        stats.count += 1
        self._dirty = True

    def record_decode_step(self, eager_reason: str | None, num_tokens: int | None = None) -> None:
        if self._flusher is None:
            self.ensure_flusher()  # started lazily: a forked worker starts its own
        self.decode_steps += 1
        if num_tokens is not None:
            self.decode_batches.count(num_tokens)
        if eager_reason is not None:
            self.eager_fallbacks[eager_reason] = self.eager_fallbacks.get(eager_reason, 0) + 1
        self._dirty = True

    def record_memory(self, device: str, **kinds: int | None) -> None:
        memory = self.memory if self.memory is not None and self.memory.get("device") == device else {}
        memory["device"] = device
        for kind, value in kinds.items():
            if value is not None and kind in metrics.DEVICE_MEMORY_KINDS:
                memory[kind] = int(value)
        self.memory = memory
        self._dirty = True

    def record_lora_request(self, adapter: str) -> None:
        if self._flusher is None:
            self.ensure_flusher()
        self.lora_requests[adapter] = self.lora_requests.get(adapter, 0) + 1
        self._dirty = True

    def record_hook_error(self, hook: str) -> None:
        self.errors[hook] = self.errors.get(hook, 0) + 1
        self.flush()

    # ----- output -----

    def report(self) -> dict[str, Any]:
        for key, seconds in self.timer.drain():
            stats = self.replay.get(key)
            if stats is None:
                stats = self.replay[key] = ReplayStats()
            stats.observe(seconds)
        replay = []
        for (mode, size), stats in sorted(self.replay.items()):
            p50, p99 = stats.p50_p99()
            replay.append(
                {
                    "mode": mode,
                    "size": size,
                    "count": stats.count,
                    "timed": stats.timed,
                    "sum_seconds": stats.sum,
                    "buckets": list(stats.buckets),
                    "p50_seconds": p50,
                    "p99_seconds": p99,
                }
            )
        return {
            "schema": reports.SCHEMA,
            "pid": self.pid,
            "process": _process_name(),
            "vllm_version": self.vllm_version or _vllm_version(),
            "updated": self.clock(),
            "phase": self.phase,
            "config_mode": self.config_mode,
            "resolved_mode": self.resolved_mode,
            "downgrades": list(self.downgrades),
            "captures": [
                {"mode": mode, "size": size, **entry} for (mode, size), entry in sorted(self.captures.items())
            ],
            "replay": replay,
            "eager_fallbacks": dict(self.eager_fallbacks),
            "decode_steps": self.decode_steps,
            "decode_batches": self.decode_batches.to_report(),
            "errors": dict(self.errors),
            "hooks": {"installed": list(self.hooks_installed), "unavailable": list(self.hooks_unavailable)},
            "memory": dict(self.memory) if self.memory is not None else None,
            "lora_requests": dict(self.lora_requests),
        }

    def flush(self) -> None:
        """Write the report now (never raises: reporting must not break the engine)."""
        if self.directory is None:
            return
        try:
            with self._lock:
                self._dirty = False
                reports.write_report(self.directory, self.pid, self.report())
        except Exception:
            log.warning("npu graph observer: cannot write its report to %s", self.directory, exc_info=True)

    def ensure_flusher(self) -> None:
        """Start the periodic writer once per process (cheap to call on every step)."""
        if self._flusher is not None or self.directory is None:
            return
        thread = threading.Thread(target=self._run_flusher, name="npu-graph-observer", daemon=True)
        self._flusher = thread
        thread.start()

    def _run_flusher(self) -> None:
        stop = self._stop
        while not stop.wait(self.flush_seconds):
            if self._dirty or self.timer.pending:
                self.flush()
        self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._flusher is None:
            self.flush()


def _vllm_version() -> str | None:
    import sys

    version = getattr(sys.modules.get("vllm"), "__version__", None)
    return str(version) if version is not None else None


def _process_name() -> str:
    try:
        import multiprocessing

        return multiprocessing.current_process().name
    except Exception:
        return "unknown"

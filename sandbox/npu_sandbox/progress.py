"""Waits that last while something advances: on a busy machine a start is slow, not stuck.

A fixed deadline fails a slow engine start on a loaded machine as if it had hung. `Progress`
watches a value that changes while the awaited thing advances (a log's size, a phase, the pods'
states) and ends the wait only after `stall` seconds without a change, or `ceiling` seconds after
it began whatever happens: a start that truly hangs still fails, a little later, with the reason.

A vLLM engine on CPU writes to its log at least every few seconds while it starts (weights, the
compile, the memory profile, warm-up); its longest quiet stretch seen on the 2-core CI machine was
the compile, under 40 s quiet and under 90 s beside two busy processes, so STALL_SECONDS leaves
twice that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

STALL_SECONDS: Final = 180.0
CEILING_SECONDS: Final = 1200.0


@dataclass
class Progress:
    """`check()` says None while the wait may go on, else why it ends."""

    watch: Callable[[], Hashable]
    stall: float = STALL_SECONDS
    ceiling: float = CEILING_SECONDS
    clock: Callable[[], float] = time.monotonic
    began: float = field(init=False)
    changed: float = field(init=False)
    last: Hashable = field(init=False)

    def __post_init__(self) -> None:
        self.began = self.changed = self.clock()
        self.last = self.watch()

    def check(self) -> str | None:
        """None while what is watched changed within `stall` seconds and `ceiling` has not passed."""
        now, value = self.clock(), self.watch()
        if value != self.last:
            self.last, self.changed = value, now
        if now - self.began > self.ceiling:
            return f"not done within the ceiling of {self.ceiling:.0f} s"
        if now - self.changed > self.stall:
            return f"no progress for {now - self.changed:.0f} s (after {now - self.began:.0f} s in all)"
        return None


def logs_progress(
    logs: Callable[[], Iterable[Path]], stall: float = STALL_SECONDS, ceiling: float = CEILING_SECONDS
) -> Progress:
    """The progress of processes that log as they go (serve's phases, the engine's start): the logs
    there are (pods come and go) and their sizes."""

    def watch() -> Hashable:
        paths = tuple(logs())
        return paths, tuple(size_of(path) for path in paths)

    return Progress(watch, stall, ceiling)


def size_of(path: Path) -> int:
    """The file's size, 0 while it is not there yet."""
    try:
        return path.stat().st_size
    except OSError:
        return 0

"""Keys to work on, now or at a time, each worked on by one worker at a time: client-go's work queue.

The semantics of k8s.io/client-go/util/workqueue (its Type and its delaying queue): a key added while
it waits is not added twice; a key added while a worker has it is handed out again once that worker
is `done` with it, never to two workers at once. A key added `at` a time waits in a heap until then;
a later `add_at` of the same key replaces the time it waits for (the heap's older entry is skipped
when it comes up). One timer for the whole queue, on the earliest time: a thousand waiting keys cost
a heap entry each, not a task or a timer each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Create it inside the event loop that uses it."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._clock = clock or self._loop.time
        self._timed = clock is None  # on another clock (a test's) nothing is timed: `promote_due` is called
        self._ready: collections.deque[K] = collections.deque()
        self._queued: set[K] = set()  # in `_ready`, or to go there once its worker is done
        self._working: set[K] = set()
        self._due: dict[K, float] = {}  # the time each waiting key waits for
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()

    def now(self) -> float:
        """The queue's clock (the event loop's, unless a test brought one)."""
        return self._clock()

    def __len__(self) -> int:
        """Keys ready to be handed out now."""
        return len(self._ready)

    def waiting(self, key: K) -> float | None:
        """The time `key` waits for, or None."""
        return self._due.get(key)

    def add(self, key: K) -> None:
        """Work on `key` as soon as a worker is free (and its current worker, if any, is done)."""
        self._due.pop(key, None)
        if key in self._queued:
            return
        self._queued.add(key)
        if key not in self._working:
            self._ready.append(key)
            self._wake_getter()

    def add_at(self, key: K, when: float) -> None:
        """Work on `key` at `when` (on the queue's clock), replacing any time it waited for."""
        if when <= self._clock():
            self.add(key)
            return
        self._due[key] = when
        heapq.heappush(self._heap, (when, next(self._order), key))
        if self._timer is None or when < self._timer.when():
            self._arm()

    def discard(self, key: K) -> None:
        """Forget `key` (its resource is gone): not handed out again unless added again."""
        self._due.pop(key, None)
        if key in self._queued:
            self._queued.discard(key)
            # Not in `_ready` while its worker has it: `done` hands out only what is still queued.
            with contextlib.suppress(ValueError):
                self._ready.remove(key)

    async def get(self) -> K:
        """The next key to work on; call `done` with it when finished."""
        while not self._ready:
            waiter = self._loop.create_future()
            self._getters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._getters:
                    self._getters.remove(waiter)
        key = self._ready.popleft()
        self._queued.discard(key)
        self._working.add(key)
        if self._ready:
            self._wake_getter()  # more than one was ready: the next getter goes on too
        return key

    def done(self, key: K) -> None:
        self._working.discard(key)
        if key in self._queued:  # added while it was being worked on
            self._ready.append(key)
            self._wake_getter()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake_getter(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._heap:
            when, _, key = self._heap[0]
            if self._due.get(key) != when:  # replaced by a later add, or added now meanwhile
                heapq.heappop(self._heap)
                continue
            self._timer = self._loop.call_at(when, self._on_timer) if self._timed else None
            return

    def _on_timer(self) -> None:
        self._timer = None
        self.promote_due()

    def promote_due(self) -> None:
        """Hand out every key whose time has come (the timer calls it; a test on its own clock does)."""
        now = self._clock()
        while self._heap and self._heap[0][0] <= now:
            when, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == when:
                self.add(key)
        self._arm()

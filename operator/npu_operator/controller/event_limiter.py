"""Events rate-limited per resource and reason: a burst becomes one Event with a count.

Like Kubernetes' own event correlator, a resource cannot flood the namespace's Events: per
(resource, reason) at most one Event is posted per window. Events of one reconcile with the same
reason are folded into one ("... and 249 more"); Events that come while the window is closed are
held and counted, and posted as one Event when it opens again. Pure bookkeeping: the caller
passes the clock and posts what `submit` returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Final

from npu_operator.status.resource import Event

WINDOW_SECONDS: Final = 60.0


@dataclasses.dataclass
class _Held:
    type: str
    message: str
    count: int


class EventLimiter:
    def __init__(self, window: float = WINDOW_SECONDS) -> None:
        self._window = window
        self._posted: dict[tuple[str, str], float] = {}  # (resource uid, reason) -> when last posted
        self._held: dict[tuple[str, str], _Held] = {}

    def submit(self, uid: str, events: Iterable[Event], now: float) -> list[Event]:
        """The Events to post now for resource `uid`: held ones whose window opened, then `events`."""
        grouped: dict[str, _Held] = {}
        for event in events:
            group = grouped.setdefault(event.reason, _Held(event.type, event.message, 0))
            group.count += 1
        out: list[Event] = []
        for (owner, reason), held in list(self._held.items()):
            if owner == uid and reason not in grouped and self._open(uid, reason, now):
                del self._held[(owner, reason)]
                out.append(self._post(uid, reason, held, now))
        for reason, group in grouped.items():
            key = (uid, reason)
            if key in self._held:  # a burst still going on: the held ones come first
                group = _Held(group.type, self._held[key].message, self._held.pop(key).count + group.count)
            if self._open(uid, reason, now):
                out.append(self._post(uid, reason, group, now))
            else:
                self._held[key] = group
        return out

    def holds(self, uid: str) -> bool:
        """Whether Events of resource `uid` wait for their window to open (a later `submit` posts them)."""
        return any(key[0] == uid for key in self._held)

    def forget(self, uid: str) -> None:
        for key in [key for key in (*self._posted, *self._held) if key[0] == uid]:
            self._posted.pop(key, None)
            self._held.pop(key, None)

    def _open(self, uid: str, reason: str, now: float) -> bool:
        last = self._posted.get((uid, reason))
        return last is None or now - last >= self._window

    def _post(self, uid: str, reason: str, held: _Held, now: float) -> Event:
        self._posted[(uid, reason)] = now
        more = f" (and {held.count - 1} more {reason} events)" if held.count > 1 else ""
        return Event(held.type, reason, held.message + more)

"""Events per resource and reason: a burst becomes one Event with a count, held ones come later."""

from __future__ import annotations

from npu_operator.controller.event_limiter import EventLimiter
from npu_operator.status.resource import Event


def downgrade(i: int) -> Event:
    return Event("Warning", "GraphModeDowngraded", f"downgrade {i}")


def test_a_burst_in_one_reconcile_is_one_event_with_a_count() -> None:
    limiter = EventLimiter(window=60)
    posted = limiter.submit("a", [downgrade(i) for i in range(250)] + [Event("Normal", "Ready", "1/1")], now=0)
    assert [(e.reason, e.message) for e in posted] == [
        ("GraphModeDowngraded", "downgrade 0 (and 249 more GraphModeDowngraded events)"),
        ("Ready", "1/1"),
    ]


def test_events_in_a_closed_window_are_held_and_posted_once_when_it_opens() -> None:
    limiter = EventLimiter(window=60)
    assert len(limiter.submit("a", [downgrade(0)], now=0)) == 1
    for second in range(1, 59):
        assert limiter.submit("a", [downgrade(second)], now=second) == []
    assert limiter.submit("b", [downgrade(0)], now=30) != []  # other resources have their own window
    (held,) = limiter.submit("a", [], now=61)
    assert held.message == "downgrade 1 (and 57 more GraphModeDowngraded events)"
    assert limiter.submit("a", [], now=200) == []

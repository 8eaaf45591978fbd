"""The worker's loop: a tick whose inputs cannot have changed is skipped, any change brings the reconcile back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from npu_operator import reconcile, worker
from npu_operator.children import ChildKind
from npu_operator.client import Resource
from npu_operator.config import OperatorConfig
from npu_operator.event_limiter import EventLimiter
from npu_operator.status import Event
from npu_operator.watches import Wakeups

OWNER = ("default", "m")


class Stopped:
    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


class Client:
    """What the worker asks with `reconcile.reconcile` replaced: the optional APIs (none served), status writes."""

    def served_now(self, resource: Resource) -> bool | None:
        return False

    async def serves(self, resource: Resource) -> bool:
        return False

    async def patch_status(self, resource: Resource, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        return {"status": patch}


class View:
    def __init__(self) -> None:
        self.pod_list: list[Mapping[str, Any]] = []

    def child(self, kind: ChildKind, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None

    def pods(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return self.pod_list

    def has_pods(self, namespace: str, name: str) -> bool:
        return bool(self.pod_list)

    def owner_links(self, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return []

    def children_of(self, kind: ChildKind, namespace: str, name: str) -> Sequence[Mapping[str, Any]]:
        return []


class Collector:
    def forget(self, uid: str) -> None:
        pass


def run_ticks(
    monkeypatch: pytest.MonkeyPatch,
    ticks: int,
    between: Callable[[int, dict[str, Any], View, Wakeups], None] = lambda *_: None,
    result: reconcile.Result | None = None,
) -> list[int]:
    """Run the worker for `ticks` ticks (calling `between` after each); the ticks that reconciled."""
    body: dict[str, Any] = {"metadata": {"namespace": "default", "name": "m", "uid": "u1", "resourceVersion": "1"}}
    view, wakeups, stopped = View(), Wakeups(), Stopped()
    reconciled: list[int] = []
    slept = 0

    async def fake_reconcile(*_: Any, **__: Any) -> reconcile.Result:
        reconciled.append(slept)
        return result or reconcile.Result({}, (), ())

    async def fake_sleep(stopped_: Any, wake: Any, seconds: float) -> None:
        nonlocal slept
        between(slept, body, view, wakeups)
        slept += 1
        stopped.flag = slept >= ticks

    monkeypatch.setattr(reconcile, "reconcile", fake_reconcile)
    monkeypatch.setattr(worker, "_sleep", fake_sleep)
    coroutine = worker.run(
        body,  # type: ignore[arg-type]
        Client(),  # type: ignore[arg-type]
        view,
        OperatorConfig(),
        wakeups,
        Collector(),  # type: ignore[arg-type]
        stopped,  # type: ignore[arg-type]
        logging.getLogger("test"),
    )
    asyncio.run(coroutine)
    return reconciled


def test_a_settled_resource_is_reconciled_once_then_only_every_max_skipped_ticks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    every = worker.MAX_SKIPPED_TICKS + 1
    assert run_ticks(monkeypatch, 3 * every) == [0, every, 2 * every]


def test_a_wake_up_a_new_resource_version_or_pods_bring_the_reconcile_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def between(tick: int, body: dict[str, Any], view: View, wakeups: Wakeups) -> None:
        if tick == 2:
            wakeups.wake(OWNER)  # a child or pod changed
        if tick == 4:
            body["metadata"]["resourceVersion"] = "2"  # the resource changed (a spec, a label, our status)
        if tick == 6:
            view.pod_list = [{"metadata": {"name": "m-pod"}}]  # pods: their reports are polled every tick

    assert run_ticks(monkeypatch, 10, between) == [0, 3, 5, 7, 8, 9]


def test_a_tick_that_changed_something_is_never_skipped_after(monkeypatch: pytest.MonkeyPatch) -> None:
    patching = reconcile.Result({"observedGeneration": 1}, (), ())
    assert run_ticks(monkeypatch, 4, result=patching) == [0, 1, 2, 3]


def test_held_events_keep_the_ticks_coming_until_they_are_posted() -> None:
    limiter = EventLimiter(window=60)
    downgrade = Event("Warning", "GraphModeDowngraded", "d")
    limiter.submit("a", [downgrade], now=0)
    assert not limiter.holds("a")
    limiter.submit("a", [downgrade], now=1)
    assert limiter.holds("a") and not limiter.holds("b")
    limiter.submit("a", [], now=61)
    assert not limiter.holds("a")


def test_only_a_new_generation_of_the_resource_wakes_its_worker() -> None:
    wakeups = Wakeups()
    wake = wakeups.for_owner(OWNER)
    wakeups.saw_generation(OWNER, 1)  # the first event: the worker's first tick reads it anyway
    wakeups.saw_generation(OWNER, 1)  # our status write, a label: same generation
    assert not wake.is_set()
    wakeups.saw_generation(OWNER, 2)  # a spec change
    assert wake.is_set()
    wake.clear()
    wakeups.saw_generation(OWNER, 2, deleted=True)
    assert OWNER not in wakeups.generations
    wakeups.saw_generation(OWNER, 1)  # a new resource of the same name starts afresh
    assert not wake.is_set()

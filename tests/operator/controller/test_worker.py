"""The worker's loop: a quiet resource sleeps until its forced reconcile, any change brings the reconcile back."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from npu_operator.api.config import OperatorConfig
from npu_operator.children.kinds import ChildKind
from npu_operator.controller import reconcile, worker
from npu_operator.controller.event_limiter import EventLimiter
from npu_operator.controller.watches import Wakeups
from npu_operator.kube.client import Resource
from npu_operator.status.resource import Event

OWNER = ("default", "m")


class Stopped:
    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag

    async def wait(self) -> None:
        await asyncio.Event().wait()  # the worker's waiter for kopf's stop: never set here


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


class Metadata(dict[str, Any]):
    """The resource's metadata as a dict a weak reference can point at."""


@dataclasses.dataclass
class Ticks:
    """The worker run on a clock of ticks (one resync interval each): when it reconciled, how often it woke."""

    reconciled: list[int] = dataclasses.field(default_factory=list)
    wakeups: int = 0
    now: int = 0


def run_ticks(
    monkeypatch: pytest.MonkeyPatch,
    ticks: int,
    between: Callable[[int, dict[str, Any], View, Wakeups], None] = lambda *_: None,
    result: reconcile.Result | None = None,
    client: Client | None = None,
    during: Callable[[int, dict[str, Any]], None] = lambda *_: None,
) -> Ticks:
    """Run the worker for `ticks` ticks, calling `between` at each tick it sleeps through (a sleep
    ends early once its wake-up is set, as the real one does)."""
    body: dict[str, Any] = {"metadata": Metadata(namespace="default", name="m", uid="u1", resourceVersion="1")}
    view, wakeups, stopped, run = View(), Wakeups(), Stopped(), Ticks()
    interval = worker.tick_seconds(OperatorConfig())

    async def fake_reconcile(*_: Any, **__: Any) -> reconcile.Result:
        run.reconciled.append(run.now)
        during(run.now, body)
        return result or reconcile.Result({}, (), ())

    async def fake_sleep(wake: asyncio.Event, seconds: float) -> None:
        run.wakeups += 1
        for _ in range(max(1, math.ceil(seconds / interval - 1e-9))):
            between(run.now, body, view, wakeups)
            run.now += 1
            stopped.flag = run.now >= ticks
            if wake.is_set() or stopped.flag:
                return

    monkeypatch.setattr(reconcile, "reconcile", fake_reconcile)
    monkeypatch.setattr(worker, "_sleep", fake_sleep)
    monkeypatch.setattr(worker, "_monotonic", lambda: run.now * interval)
    coroutine = worker.run(
        body,  # type: ignore[arg-type]
        client or Client(),  # type: ignore[arg-type]
        view,
        OperatorConfig(),
        wakeups,
        Collector(),  # type: ignore[arg-type]
        stopped,  # type: ignore[arg-type]
        logging.getLogger("test"),
    )
    asyncio.run(coroutine)
    return run


def test_a_settled_resource_sleeps_until_its_forced_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    every = worker.FORCED_RECONCILE_TICKS
    run = run_ticks(monkeypatch, 3 * every)
    assert run.reconciled == [0, every, 2 * every]
    # After each reconcile: one tick to find nothing changed, then one sleep until the next.
    assert run.wakeups == 3 * 2


def test_a_wake_up_a_change_of_the_resource_or_pods_bring_the_reconcile_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def between(tick: int, body: dict[str, Any], view: View, wakeups: Wakeups) -> None:
        if tick == 0:
            wakeups.saw_resource(OWNER, body["metadata"])  # the resource's first event
        if tick == 2:
            wakeups.wake(OWNER)  # a child changed
        if tick == 4:  # a label: the resource's event handler wakes the worker
            body["metadata"] |= {"resourceVersion": "2", "labels": {"team": "a"}}
            wakeups.saw_resource(OWNER, body["metadata"])
        if tick == 6:  # pods: their event wakes the worker, and their reports are polled every tick
            view.pod_list = [{"metadata": {"name": "m-pod"}}]
            wakeups.wake(OWNER)

    run = run_ticks(monkeypatch, 10, between)
    assert run.reconciled == [0, 3, 5, 7, 8, 9]


def test_the_echo_of_our_own_status_write_costs_no_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    def echo(tick: int, body: dict[str, Any]) -> None:
        # The event of an earlier status write arrives while the reconcile runs: a new
        # resourceVersion and nothing the worker reads (no wake-up: `Wakeups.saw_resource`).
        body["metadata"] = body["metadata"] | {"resourceVersion": str(tick + 2)}

    every = worker.FORCED_RECONCILE_TICKS
    assert run_ticks(monkeypatch, 2 * every, during=echo).reconciled == [0, every]


def test_a_sleeping_worker_keeps_no_old_copy_of_its_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    replaced: list[weakref.ref[Metadata]] = []

    def echo(tick: int, body: dict[str, Any]) -> None:
        # kopf replaces its body with each event's: the reconcile's snapshot must not keep the old one.
        replaced.append(weakref.ref(body["metadata"]))
        body["metadata"] = Metadata(body["metadata"], resourceVersion=str(tick + 2))

    alive: list[bool] = []
    run_ticks(monkeypatch, 3, lambda *_: alive.append(replaced[0]() is not None), during=echo)
    assert alive == [False, False, False]


def test_a_tick_that_changed_something_is_never_skipped_after(monkeypatch: pytest.MonkeyPatch) -> None:
    patching = reconcile.Result({"observedGeneration": 1}, (), ())
    assert run_ticks(monkeypatch, 4, result=patching).reconciled == [0, 1, 2, 3]


def test_an_optional_api_served_later_wakes_every_sleeping_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    served = False

    class Discovering(Client):
        def served_now(self, resource: Resource) -> bool | None:
            return served and resource.plural == "podmonitors"

    def between(tick: int, body: dict[str, Any], view: View, wakeups: Wakeups) -> None:
        nonlocal served
        if tick == 4:  # the CRD is installed; a discovery (any worker's) sees it and wakes them all
            served = True
            wakeups.wake_all()

    run = run_ticks(monkeypatch, 10, between, client=Discovering())
    assert run.reconciled == [0, 5]


def test_held_events_keep_the_ticks_coming_until_they_are_posted() -> None:
    limiter = EventLimiter(window=60)
    downgrade = Event("Warning", "GraphModeDowngraded", "d")
    limiter.submit("a", [downgrade], now=0)
    assert not limiter.holds("a")
    limiter.submit("a", [downgrade], now=1)
    assert limiter.holds("a") and not limiter.holds("b")
    limiter.submit("a", [], now=61)
    assert not limiter.holds("a")


def test_only_a_change_the_worker_reads_wakes_it() -> None:
    wakeups = Wakeups()
    wake = wakeups.for_owner(OWNER)
    meta: dict[str, Any] = {"generation": 1, "resourceVersion": "1", "labels": {"a": "1"}}
    wakeups.saw_resource(OWNER, meta)  # the first event: the worker's first tick reads it anyway
    # Our status write, someone's finalizer: a new resourceVersion, nothing the worker reads.
    wakeups.saw_resource(OWNER, meta | {"resourceVersion": "2", "finalizers": ["f"]})
    assert not wake.is_set()
    for change in ({"generation": 2}, {"labels": {"a": "2"}}, {"annotations": {"x": "again"}}):
        meta |= change
        wakeups.saw_resource(OWNER, meta)
        assert wake.is_set(), change
        wake.clear()
    wakeups.saw_resource(OWNER, meta | {"uid": "u1"}, deleted=True)
    assert wake.is_set() and wakeups.deleted == {"u1"} and OWNER not in wakeups.seen  # the worker exits
    wakeups.forget(OWNER, "u1", wake)
    wakeups.saw_resource(("default", "gone"), {"uid": "u0"}, deleted=True)  # no worker: nothing kept
    assert wakeups.deleted == set()
    new = wakeups.for_owner(OWNER)
    wakeups.saw_resource(OWNER, {"generation": 1, "uid": "u2"})  # a new resource of the same name starts afresh
    assert not new.is_set()


def test_kopfs_stop_wakes_a_sleeping_worker_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stopper:
        def __init__(self) -> None:
            self.event = asyncio.Event()

        def __bool__(self) -> bool:
            return self.event.is_set()

        async def wait(self) -> None:
            await self.event.wait()

    async def fake_reconcile(*_: Any, **__: Any) -> reconcile.Result:
        reconciled.set()
        return reconcile.Result({}, (), ())

    async def scenario() -> None:
        body = {"metadata": {"namespace": "default", "name": "m", "uid": "u1", "resourceVersion": "1"}}
        hour = OperatorConfig(resync_seconds=3600, status_poll_seconds=3600)
        args = (View(), hour, Wakeups(), Collector(), stopper, logging.getLogger("test"))
        running = asyncio.create_task(worker.run(body, Client(), *args))  # type: ignore[arg-type]
        await asyncio.wait_for(reconciled.wait(), 5)
        stopper.event.set()  # the resource is deleted, the operator pauses or stops
        await asyncio.wait_for(running, 5)  # not the hour it was sleeping for

    reconciled, stopper = asyncio.Event(), Stopper()
    monkeypatch.setattr(reconcile, "reconcile", fake_reconcile)
    asyncio.run(scenario())


def test_the_resources_deletion_ends_its_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # kopf keeps no finalizer on the resource: nothing but the DELETED event tells the worker.
    seen: list[Wakeups] = []

    def between(tick: int, body: dict[str, Any], view: View, wakeups: Wakeups) -> None:
        seen.append(wakeups)
        if tick == 3:
            wakeups.saw_resource(OWNER, body["metadata"], deleted=True)

    run = run_ticks(monkeypatch, 20, between)
    assert run.reconciled == [0] and run.now == 4  # woken, and gone without another reconcile
    assert seen[-1].events == {} and seen[-1].deleted == set()


def test_a_resource_recreated_under_the_same_name_keeps_its_wake_up() -> None:
    wakeups = Wakeups()
    old = wakeups.for_owner(OWNER)
    wakeups.saw_resource(OWNER, {"uid": "u1"}, deleted=True)
    new = wakeups.for_owner(OWNER)  # the new resource's worker starts before the old one exits
    wakeups.forget(OWNER, "u1", old)
    wakeups.wake(OWNER)
    assert new.is_set() and old is not new and wakeups.deleted == set()


async def test_kopf_stopping_the_worker_ends_its_wait_on_kopf_s_own_event() -> None:
    """The worker waits for kopf's stop on the flag's own event (one task, not kopf's two and a
    `wait_for`: about 5 KB per resource); setting kopf's flag ends that wait."""
    from kopf._cogs.aiokits import aioenums

    setter: aioenums.FlagSetter[Any] = aioenums.FlagSetter()
    waiting = worker._stop_of(setter.async_waiter)
    assert getattr(waiting, "__qualname__", "") == "Event.wait"  # kopf's event, not the fallback
    task = asyncio.ensure_future(waiting)
    await asyncio.sleep(0)
    assert not task.done()
    setter.set()
    await asyncio.wait_for(task, 1)

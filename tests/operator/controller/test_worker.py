"""The workers: a quiet resource waits in the queue until its forced reconcile, any change brings the
reconcile back, a deletion forgets it, and the workers act only while they are let to.

The ticks run on the queue's own clock, one resync interval a step (`Run`), with `reconcile.reconcile`
replaced: what is checked is when a resource is reconciled, not what a reconcile does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf
import pytest
from npu_operator.api.config import OperatorConfig
from npu_operator.children.kinds import ChildKind
from npu_operator.controller import reconcile, worker
from npu_operator.controller.event_limiter import EventLimiter
from npu_operator.controller.worker import Workers
from npu_operator.kube.client import Resource
from npu_operator.status.resource import Event

from tests.examples import example

OWNER = ("default", "m")
EVERY = worker.FORCED_RECONCILE_TICKS


class Client:
    """What the workers ask with `reconcile.reconcile` replaced: the optional APIs (none served), status writes."""

    def __init__(self) -> None:
        self.served = False

    def served_now(self, resource: Resource) -> bool | None:
        return self.served and resource.plural == "podmonitors"

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
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, uid: str) -> None:
        self.forgotten.append(uid)


def resource(uid: str = "u1", *, generation: int = 1, version: str = "1", **meta: Any) -> dict[str, Any]:
    """An NPUInference as its watch event carries it."""
    body = example("sandbox-cpu.yaml")
    body["metadata"] = {"namespace": "default", "name": "m", "uid": uid, "generation": generation}
    body["metadata"] |= {"resourceVersion": version, "managedFields": [{"manager": "x"}], **meta}
    body["status"] = {"observedGeneration": generation}
    return body


@dataclasses.dataclass
class Run:
    """Workers on a clock of steps (one resync interval each): when the resource was reconciled."""

    workers: Workers
    view: View
    client: Client
    collector: Collector
    now: float = 0.0
    reconciled: list[int] = dataclasses.field(default_factory=list)

    async def steps(self, count: int, between: Callable[[int], None] = lambda _: None) -> None:
        """At each step: what is due is ticked, then `between(step)` happens before the next."""
        for step in range(count):
            self.now = float(step)
            self.workers.queue.promote_due()
            while len(self.workers.queue):
                key = await self.workers.queue.get()
                await self.workers._tick(key)
                self.workers.queue.done(key)
            between(step)


async def started(
    monkeypatch: pytest.MonkeyPatch,
    result: reconcile.Result | None = None,
    during: Callable[[Run], None] = lambda _: None,
) -> Run:
    """Workers that know the resource from its first event (tick 0 reconciles it)."""
    config = OperatorConfig(resync_seconds=1, status_poll_seconds=1)
    view, client, collector = View(), Client(), Collector()
    run: Run

    async def fake_reconcile(*_: Any, **__: Any) -> reconcile.Result:
        run.reconciled.append(int(run.now))
        during(run)
        return result or reconcile.Result({}, (), ())

    monkeypatch.setattr(reconcile, "reconcile", fake_reconcile)
    workers = Workers(client, view, config, collector, kopf.OperatorSettings(), clock=lambda: run.now)  # type: ignore[arg-type]
    run = Run(workers, view, client, collector)
    workers.saw(None, resource())
    return run


async def test_a_settled_resource_waits_in_the_queue_until_its_forced_reconcile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = await started(monkeypatch)
    await run.steps(3 * EVERY)
    assert run.reconciled == [0, EVERY, 2 * EVERY]
    # Between them it holds no task and no timer: one entry in the queue's heap, for its forced reconcile.
    assert run.workers.queue.waiting(OWNER) == 3 * EVERY and len(run.workers.queue) == 0


async def test_a_wake_up_a_change_of_the_resource_or_pods_bring_the_reconcile_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = await started(monkeypatch)

    def between(step: int) -> None:
        if step == 2:
            run.workers.wake(OWNER)  # a child changed
        if step == 4:  # a label: the resource's event wakes it
            run.workers.saw("MODIFIED", resource(version="2", labels={"team": "a"}))
        if step == 6:  # pods: their event wakes it, and their reports are polled every tick
            run.view.pod_list = [{"metadata": {"name": "m-pod"}}]
            run.workers.wake(OWNER)

    await run.steps(10, between)
    assert run.reconciled == [0, 3, 5, 7, 8, 9]


async def test_the_echo_of_our_own_status_write_costs_no_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    def echo(run: Run) -> None:
        # The event of an earlier status write arrives while the reconcile runs: a new
        # resourceVersion and nothing a tick reads.
        run.workers.saw("MODIFIED", resource(version=str(run.now + 2)))

    run = await started(monkeypatch, during=echo)
    await run.steps(2 * EVERY)
    assert run.reconciled == [0, EVERY]


async def test_a_waiting_resource_keeps_only_its_latest_event_and_no_managed_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = await started(monkeypatch)
    await run.steps(2)
    event = resource(version="9")
    run.workers.saw("MODIFIED", event)
    kept = run.workers.states[OWNER].body
    assert kept["metadata"]["resourceVersion"] == "9" and "managedFields" not in kept["metadata"]
    assert "status" not in kept  # the status is the one the workers wrote
    run.workers.saw("MODIFIED", resource(version="10"))
    assert run.workers.states[OWNER].body["metadata"]["resourceVersion"] == "10"


async def test_equal_specs_are_kept_once_and_a_deletion_releases_them(monkeypatch: pytest.MonkeyPatch) -> None:
    run = await started(monkeypatch)
    other = resource("u2") | {"metadata": resource("u2")["metadata"] | {"name": "n"}}
    run.workers.saw(None, other)
    first, second = (run.workers.states[key].body["spec"] for key in (OWNER, ("default", "n")))
    assert first is second
    run.workers.saw("DELETED", resource())
    run.workers.saw("DELETED", other)
    assert len(run.workers._specs) == 0 and run.workers.states == {}


async def test_a_tick_that_changed_something_is_never_skipped_after(monkeypatch: pytest.MonkeyPatch) -> None:
    run = await started(monkeypatch, result=reconcile.Result({"observedGeneration": 1}, (), ()))
    await run.steps(4)
    assert run.reconciled == [0, 1, 2, 3]


async def test_an_optional_api_served_later_wakes_every_waiting_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    run = await started(monkeypatch)

    def between(step: int) -> None:
        if step == 4:  # the CRD is installed; a discovery sees it and wakes them all
            run.client.served = True
            run.workers.wake_all()

    await run.steps(10, between)
    assert run.reconciled == [0, 5]


async def test_a_failing_reconcile_is_retried_with_backoff_never_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(run: Run) -> None:
        if run.now < 3:
            raise RuntimeError("a bug")

    run = await started(monkeypatch, during=fail)
    await run.steps(12)
    assert run.reconciled == [0, 1, 3]  # after one interval, then two (doubling), then it succeeds
    assert run.workers.states[OWNER].failures == 0 and run.workers.queue.waiting(OWNER) == 3 + EVERY


def test_held_events_keep_the_ticks_coming_until_they_are_posted() -> None:
    limiter = EventLimiter(window=60)
    downgrade = Event("Warning", "GraphModeDowngraded", "d")
    limiter.submit("a", [downgrade], now=0)
    assert not limiter.holds("a")
    limiter.submit("a", [downgrade], now=1)
    assert limiter.holds("a") and not limiter.holds("b")
    limiter.submit("a", [], now=61)
    assert not limiter.holds("a")


async def test_only_a_change_a_tick_reads_wakes_the_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    run = await started(monkeypatch)
    await run.steps(2)
    state = run.workers.states[OWNER]
    # Our status write, someone's finalizer: a new resourceVersion, nothing a tick reads.
    run.workers.saw("MODIFIED", resource(version="2", finalizers=["f"]))
    assert not state.woken
    for change in ({"generation": 2}, {"labels": {"a": "2"}}, {"annotations": {"x": "again"}}):
        run.workers.saw("MODIFIED", resource(version="3", **change))
        assert state.woken, change
        state.woken = False


async def test_a_deletion_forgets_the_resource_and_a_re_created_one_starts_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = await started(monkeypatch)
    await run.steps(2)
    run.workers.saw("DELETED", resource())
    assert run.workers.states == {} and run.workers.queue.waiting(OWNER) is None
    assert run.collector.forgotten == ["u1"]
    run.workers.saw(None, resource("u2"))  # the same name, a new resource
    await run.steps(1)
    assert run.reconciled == [0, 0] and run.workers.states[OWNER].uid == "u2"
    run.workers.saw(None, resource("u3"))  # re-created before our DELETED event came
    assert run.collector.forgotten == ["u1", "u2"] and run.workers.states[OWNER].uid == "u3"


async def test_the_workers_act_until_the_last_of_those_who_let_them_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Namespaced, kopf runs one daemon per peering object: the workers run while any of them does."""
    ticked = asyncio.Event()

    async def fake_reconcile(*_: Any, **__: Any) -> reconcile.Result:
        ticked.set()
        return reconcile.Result({}, (), ())

    monkeypatch.setattr(reconcile, "reconcile", fake_reconcile)
    hour = OperatorConfig(resync_seconds=3600, status_poll_seconds=3600)
    workers = Workers(Client(), View(), hour, Collector(), kopf.OperatorSettings())  # type: ignore[arg-type]
    workers.saw(None, resource())
    first, second = asyncio.Event(), asyncio.Event()
    serving = [asyncio.create_task(workers.serve(stop.wait())) for stop in (first, second)]
    await asyncio.wait_for(ticked.wait(), 5)
    started = list(workers._running)
    first.set()
    await asyncio.wait_for(serving[0], 5)
    assert workers._running == started and not any(worker.done() for worker in started)  # the other lets them act
    second.set()
    await asyncio.wait_for(serving[1], 5)  # at once: not the hour the resource waits for
    assert workers._running == [] and all(worker.done() for worker in started)  # every worker has ended


async def test_a_stop_lets_the_tick_under_way_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    started_tick, finished = asyncio.Event(), []

    async def slow_reconcile(*_: Any, **__: Any) -> reconcile.Result:
        started_tick.set()
        await asyncio.sleep(0.3)
        finished.append(True)
        return reconcile.Result({}, (), ())

    monkeypatch.setattr(reconcile, "reconcile", slow_reconcile)
    workers = Workers(Client(), View(), OperatorConfig(), Collector(), kopf.OperatorSettings())  # type: ignore[arg-type]
    workers.saw(None, resource())
    stop = asyncio.Event()
    serving = asyncio.create_task(workers.serve(stop.wait()))
    await asyncio.wait_for(started_tick.wait(), 5)
    stop.set()
    await asyncio.wait_for(serving, 5)
    assert finished == [True]

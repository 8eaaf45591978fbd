"""The work queue keeps client-go's promises (k8s.io/client-go/util/workqueue: queue.go and
delaying_queue.go; the cases of its queue_test.go and delaying_queue_test.go as data here): a key is
handed out once however often it is added, never to two workers at once, and a delayed key at its
time, the latest time asked for."""

from __future__ import annotations

import asyncio

from npu_operator.controller.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def drain(queue: WorkQueue[str]) -> list[str]:
    out = []
    while len(queue):
        key = await queue.get()
        out.append(key)
        queue.done(key)
    return out


async def test_a_key_added_twice_while_it_waits_is_handed_out_once() -> None:
    queue: WorkQueue[str] = WorkQueue(Clock())
    for key in ("a", "b", "a", "a", "c", "b"):
        queue.add(key)
    assert await drain(queue) == ["a", "b", "c"]


async def test_a_key_added_while_a_worker_has_it_comes_again_only_once_that_worker_is_done() -> None:
    queue: WorkQueue[str] = WorkQueue(Clock())
    queue.add("a")
    held = await queue.get()
    queue.add("a")  # changed while it is being worked on
    queue.add("a")
    assert len(queue) == 0  # never to a second worker meanwhile
    queue.done(held)
    assert await drain(queue) == ["a"]


async def test_a_delayed_key_comes_at_its_time_and_the_latest_time_asked_for_wins() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(clock)
    queue.add_at("a", 10)
    queue.add_at("b", 5)
    queue.add_at("a", 20)  # a later decision: the entry for 10 is stale
    clock.now = 10
    queue.promote_due()
    assert await drain(queue) == ["b"]
    clock.now = 20
    queue.promote_due()
    assert await drain(queue) == ["a"]
    assert queue.waiting("a") is None


async def test_an_add_now_supersedes_the_time_a_key_waited_for() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(clock)
    queue.add_at("a", 10)
    queue.add("a")
    assert await drain(queue) == ["a"]
    clock.now = 10
    queue.promote_due()
    assert await drain(queue) == []  # its old time is gone with it
    queue.add_at("b", -1)  # a time already past: now
    assert await drain(queue) == ["b"]


async def test_a_discarded_key_is_not_handed_out() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(clock)
    queue.add("a")
    queue.add_at("b", 3)
    queue.discard("a")
    queue.discard("b")
    clock.now = 5
    queue.promote_due()
    assert await drain(queue) == []
    queue.add("c")
    held = await queue.get()
    queue.add("c")
    queue.discard("c")  # deleted while a worker had it: not handed out again
    queue.done(held)
    assert await drain(queue) == []


async def test_on_the_loops_clock_one_timer_hands_out_each_key_at_its_time_to_waiting_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    got: list[str] = []

    async def worker() -> None:
        while True:
            key = await queue.get()
            got.append(key)
            queue.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(3)]
    now = queue.now()
    for index, key in enumerate(("c", "b", "a")):
        queue.add_at(key, now + 0.05 * (3 - index))
    await asyncio.sleep(0.3)
    for task in workers:
        task.cancel()
    assert got == ["a", "b", "c"]

"""The workers: a few coroutines that keep every NPUInference's children as desired and its status true.

Each resource has a `ResourceState` (what it was last seen as, its status as last written, its desired
state's cache) and a place in one `WorkQueue`; `Workers.serve` runs `WORKERS` coroutines that take
the resources that are due, one at a time each, and tick them. A tick reconciles, patches the status
fields that changed, posts the Events that the condition transitions imply, and puts the resource
back in the queue for its next tick (one resync interval on, or sooner after a wake-up: a change of
the spec, labels or annotations, of one of its children or pods: see `watches`). The workers are the
only writers of the status and Events, and one resource is never ticked by two at once, so nothing
races. A tick of a settled resource reads only the informers' caches: it costs no request to the API
server. Once a reconcile changed nothing and nothing it reads can change without a wake-up
(`quiet_inputs`), the resource waits in the queue until it is woken or its forced reconcile is due:
a quiet resource costs no CPU between them and holds no task or timer of its own.

A resource is known from kopf's events (`Workers.saw`, called by the resource's raw event handler):
its first event puts it in the queue, its DELETED event forgets it. Nothing dies on an error:
transient API errors and bugs are logged, counted and retried with backoff; a spec that cannot be
served is reported once and then left alone until it changes.

Only one operator replica acts: `serve` runs while kopf's peering lets this replica act (the kopf
daemon on the peering object that calls it is stopped by kopf when it pauses, `handlers`), or for the
operator's whole life when it runs standalone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import kopf

from npu_operator.api.config import OperatorConfig, backoff_seconds
from npu_operator.controller import apply, metrics, reconcile
from npu_operator.controller.desired import DesiredCache
from npu_operator.controller.event_limiter import EventLimiter
from npu_operator.controller.watches import OwnerKey
from npu_operator.controller.workqueue import WorkQueue
from npu_operator.kube.client import NPU_INFERENCES, ApiError, KubeClient
from npu_operator.kube.objects import SharedDocuments, shared_strings, utc_now
from npu_operator.status.collector import ReportCollector
from npu_operator.status.placement import Offer
from npu_operator.topologies.base import LiveView

logger = logging.getLogger(__name__)

# A full reconcile comes at least every this many ticks even while nothing seems to change.
FORCED_RECONCILE_TICKS: Final = 12
# The coroutines that tick resources at once: a tick waits on the API server and the pods' reports,
# so a few dozen keep a settling fleet's requests flowing; a quiet fleet needs none of them.
WORKERS: Final = 32
# On a stop (a peering pause, the operator exiting), ticks under way get this long to finish.
STOP_GRACE_SECONDS: Final = 10.0


def describe(exc: BaseException) -> str:
    """The exception's type and message: never empty, even for a bare TimeoutError()."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (no message)"


def read_by_worker(metadata: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a tick reads of its resource's metadata: the generation (the spec), the labels (the
    children's), the annotations (a rollout's). Our status writes and kopf's finalizer change none."""
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    return (metadata.get("generation"), tuple(sorted(labels.items())), tuple(sorted(annotations.items())))


@dataclasses.dataclass(slots=True)
class ResourceState:
    """One resource between its ticks."""

    # The resource as last seen: its metadata without managedFields, its spec (one shared copy of
    # equal specs) and no status: the status is `known_status`.
    body: dict[str, Any]
    # The status as the workers last wrote it (the resource's events may lag behind our own writes).
    known_status: dict[str, Any]
    read: tuple[Any, ...]  # `read_by_worker` of the last event
    cache: DesiredCache = dataclasses.field(default_factory=DesiredCache)
    woken: bool = True  # something it reads changed since its last reconcile
    failures: int = 0  # reconciles failed in a row
    quiet: tuple[Any, ...] | None = None  # the inputs of the last reconcile, when it changed nothing
    forced_at: float = 0.0  # while the inputs stay `quiet`, the next reconcile comes at this time

    @property
    def uid(self) -> str:
        return str(self.body["metadata"].get("uid", ""))


async def quiet_inputs(
    body: Mapping[str, Any],
    known_status: Mapping[str, Any],
    client: KubeClient,
    view: LiveView,
    events: EventLimiter,
) -> tuple[Any, ...] | None:
    """The key of what a tick of this resource reads, or None when a tick reads what can change
    without any wake-up (the clock, the runtimes' reports). Two ticks with the same key and no
    wake-up between them decide the same, so the second is skipped and the resource waits on.

    A tick reads: the resource's spec and metadata (what of them it reads, `read_by_worker`, is in
    the key, and a change of it wakes the resource; our own status writes change only its
    resourceVersion, so their echo costs no reconcile), our status as last written
    (`known_status`), its children and pods (a change wakes it), the optional APIs served (in the
    key; a changed answer wakes every resource), the clock and the runtimes' reports. The clock
    matters only for a condition that changes (then its inputs changed) and for graph downgrades
    that age out; the reports only when there are pods to poll; held Events wait for their window.
    """
    meta = body["metadata"]
    if known_status.get("graph", {}).get("downgrades") or events.holds(meta["uid"]):
        return None
    if view.has_pods(meta["namespace"], meta["name"]):
        return None
    try:
        served, refused = await apply.served_kinds(client)
    except ApiError:
        return None
    return (read_by_worker(meta), served, tuple(sorted(refused.items())))


def tick_seconds(config: OperatorConfig) -> float:
    """A tick reads the informers' caches (no request) and the runtimes' reports that are due, so it
    comes as often as the more frequent of the two settings asks."""
    return min(config.resync_seconds, config.status_poll_seconds)


class Workers:
    """Every resource's state, the queue of those due, and the coroutines that tick them (in the memo).
    Create it inside the event loop; the handlers feed it (`saw`, `wake`, `wake_all`)."""

    def __init__(
        self,
        client: KubeClient,
        view: LiveView,
        config: OperatorConfig,
        collector: ReportCollector,
        settings: kopf.OperatorSettings,
        *,
        workers: int = WORKERS,
        clock: Callable[[], float] | None = None,
        nodes: Callable[[], Offer | None] = lambda: None,
    ) -> None:
        self._client, self._view, self._config, self._collector = client, view, config, collector
        self._nodes = nodes  # what the Nodes offer of NPUs, when known (`watches.NodeOffers`)
        self._settings = settings
        self._workers = workers
        self._interval = tick_seconds(config)
        self.states: dict[OwnerKey, ResourceState] = {}
        self.queue: WorkQueue[OwnerKey] = WorkQueue(clock)
        self._now = self.queue.now  # one clock for the ticks and the queue (a test brings its own)
        self._specs = SharedDocuments()
        self._events = EventLimiter()  # a burst of Events becomes one, per resource and reason
        self._serving = 0  # the `serve` calls under way (one per peering object that lets us act)
        self._running: list[asyncio.Task[None]] = []  # the workers, while serving
        self._idle: set[asyncio.Task[Any]] = set()  # those waiting for a key
        self._stopping = False

    # --- what the handlers tell ---------------------------------------------------------------

    def saw(self, event_type: str | None, raw: Mapping[str, Any]) -> None:
        """The resource's watch event: a new resource goes in the queue, a change a tick reads wakes
        it, a deletion forgets it. Kept of the event: the metadata without managedFields, the spec
        as the one shared copy of an equal spec; the status only of the first (after that, the
        status is what the workers wrote)."""
        meta = dict(raw.get("metadata") or {})
        meta.pop("managedFields", None)
        key: OwnerKey = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        uid = meta.get("uid")
        state = self.states.get(key)
        if event_type == "DELETED":
            self._specs.release(uid)
            if state is not None and state.uid == uid:
                self.forget(key)
                logger.info(f"[{key[0]}/{key[1]}] the resource is deleted: the workers forget it")
            return
        body = {
            "apiVersion": raw.get("apiVersion"),
            "kind": raw.get("kind"),
            "metadata": meta,
            "spec": self._specs.share(uid, meta.get("generation"), raw.get("spec") or {}),
        }
        read = read_by_worker(meta)
        if state is None or state.uid != uid:  # new, or re-created under the same name
            if state is not None:
                self.forget(key)
            status = shared_strings(dict(raw.get("status") or {}))
            self.states[key] = ResourceState(body, status, read)
            self.queue.add(key)
            return
        state.body = body
        if read != state.read:
            state.read = read
            self.wake(key)

    def wake(self, key: OwnerKey) -> None:
        state = self.states.get(key)
        if state is not None:  # not known yet: its first tick reads the latest state anyway
            state.woken = True
            self.queue.add(key)

    def wake_all(self) -> None:
        """Every resource: what all of them read has changed (an optional API is served or no longer is)."""
        for key in self.states:
            self.wake(key)

    def forget(self, key: OwnerKey) -> None:
        state = self.states.pop(key, None)
        self.queue.discard(key)
        if state is not None:
            self._collector.forget(state.uid)
            self._events.forget(state.uid)

    # --- acting ---------------------------------------------------------------------------------

    async def serve(self, stopped: Awaitable[Any] | None = None) -> None:
        """Tick the resources that are due until `stopped` completes (or until cancelled). Calls under
        way together share one set of workers, which stops with the last of them; ticks under way
        then get `STOP_GRACE_SECONDS` to finish."""
        self._serving += 1
        try:
            if self._serving == 1:
                for key in self.states:  # another replica may have acted meanwhile: tick everything
                    self.wake(key)
                self._stopping = False
                self._running = [asyncio.ensure_future(self._work()) for _ in range(self._workers)]
            await (stopped if stopped is not None else asyncio.get_running_loop().create_future())
        finally:
            self._serving -= 1
            if self._serving == 0 and self._running:
                await self._stop()

    async def _stop(self) -> None:
        """The workers take no more keys: those waiting for one end now, the others after their tick,
        cancelled once `STOP_GRACE_SECONDS` have passed."""
        running, self._running = self._running, []
        self._stopping = True
        for worker in self._idle:
            worker.cancel()
        _, late = await asyncio.wait(running, timeout=STOP_GRACE_SECONDS)
        for worker in late:
            worker.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _work(self) -> None:
        """Tick one due resource after another, in this task: a tick costs no task of its own."""
        me = asyncio.current_task()
        assert me is not None
        while not self._stopping:
            self._idle.add(me)  # only a worker waiting for a key is cancelled at once by a stop
            try:
                key = await self.queue.get()
            finally:
                self._idle.discard(me)
            try:
                await self._tick(key)
            except Exception:  # a tick catches its own failures; a worker outlives anything else
                logger.exception(f"the tick of {key[0]}/{key[1]} failed")
            finally:
                self.queue.done(key)

    async def _tick(self, key: OwnerKey) -> None:
        state = self.states.get(key)
        if state is None:
            return
        woken, state.woken = state.woken, False
        started = time.perf_counter()
        outcome = "error"
        try:
            inputs = await quiet_inputs(state.body, state.known_status, self._client, self._view, self._events)
            if state.quiet is not None and state.quiet == inputs and not woken and self._now() < state.forced_at:
                # Nothing it reads changes without waking it (an optional API served or no longer
                # served wakes every resource: `KubeClient.serves`): it waits until woken or forced.
                self._reschedule(key, state, state.forced_at)
                return
            state.quiet = None
            outcome, posted = await self._reconcile(state)
            state.failures = 0
            if outcome == "unchanged" and not posted:
                state.quiet, state.forced_at = inputs, self._now() + FORCED_RECONCILE_TICKS * self._interval
        except Exception as exc:  # the workers must outlive any one failure
            state.failures += 1
            transient = exc.transient if isinstance(exc, ApiError) else isinstance(exc, OSError | TimeoutError)
            log = kopf.ObjectLogger(body=kopf.Body(state.body), settings=self._settings)  # type: ignore[arg-type]
            (log.warning if transient else log.exception)(
                f"reconcile failed ({state.failures} in a row): {describe(exc)}"
            )
        metrics.RECONCILES.labels(outcome).inc()
        metrics.RECONCILE_DURATION.labels(outcome).observe(time.perf_counter() - started)
        delay = backoff_seconds(self._interval, state.failures) if state.failures else self._interval
        self._reschedule(key, state, self._now() + delay)

    def _reschedule(self, key: OwnerKey, state: ResourceState, when: float) -> None:
        if self.states.get(key) is not state:
            return  # deleted (or re-created) during the tick
        if state.woken:
            self.queue.add(key)  # woken during the tick: again once this one is done
        else:
            self.queue.add_at(key, when)

    async def _reconcile(self, state: ResourceState) -> tuple[str, bool]:
        """One reconcile, its status patch written and its Events posted: the outcome (changed,
        unchanged, invalid) and whether an Event was posted."""
        body = state.body
        snapshot = {**body, "status": state.known_status}
        result = await reconcile.reconcile(
            snapshot, self._client, self._view, self._config, utc_now(), self._collector, state.cache, self._nodes()
        )
        if result.status_patch:
            state.known_status = await _patch_status(self._client, body, result.status_patch)
        posted = self._events.submit(state.uid, result.events, self._now())
        for event in posted:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)  # type: ignore[arg-type]
        changed = result.changes or result.status_patch
        outcome = "invalid" if result.problems else "changed" if changed else "unchanged"
        return outcome, bool(posted)


async def _patch_status(client: KubeClient, body: Mapping[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    answer = await client.patch_status(NPU_INFERENCES, meta["namespace"], meta["name"], patch)
    # Kept until the next write: a compact copy, its keys, condition types and reasons shared.
    status: dict[str, Any] = shared_strings(answer.get("status") or {})
    return status

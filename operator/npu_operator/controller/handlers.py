"""kopf handlers: wiring only; the work happens in `worker` and `reconcile`. `registry` puts them in a
kopf registry for one run of the operator:

- startup: every kopf setting in one place, the API client, the informers of children and pods
  (`watches.Informers`; of Nodes too with `node_discovery`), the workers (`worker.Workers`), the
  metrics endpoint;
- login: the same credentials for kopf and for our client (kopf's session with a watch throttle);
- resource events: the workers learn of each NPUInference from its raw events (`Workers.saw`): a new
  one is ticked at once, a change a tick reads (a new generation, labels, annotations) wakes it, a
  deletion forgets it. A raw event handler, not kopf's create/update/resume handlers: those make
  kopf keep a diff base and progress annotations per resource (a deep copy of the body per event and
  a patch per change); the workers already report a spec that can never be served (status, Warning
  Event). Nor a kopf daemon per resource, as before: kopf's daemon machinery (its task, flags,
  invocation frames and its own copy of the body) was a quarter of the memory each resource costs;
- acting only while peering lets this replica act: a kopf daemon on the operator's own peering
  object (a ClusterKopfPeering when watching the whole cluster, a KopfPeering in each watched
  namespace otherwise) runs the workers (`act_while_leading`). kopf stops every daemon when another
  replica with a higher priority makes it pause, and starts them again once it resumes (kopf 1.45,
  kopf/_core/engines/daemons.py, daemon_killer: "When pausing, the daemons/timers are stopped";
  spawn_daemons stops one at once while paused); standalone, the workers run from the first resource
  event to cleanup.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import logging
import random
import socket
from collections.abc import Awaitable
from typing import Any

import kopf
import prometheus_client

from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig, python_log_level
from npu_operator.controller import supervision, watches, worker
from npu_operator.kube import client
from npu_operator.status.collector import ReportCollector

PREFIX = crd.GROUP
Logger = logging.Logger | logging.LoggerAdapter[Any]
RESOURCE = (crd.GROUP, crd.VERSION, crd.PLURAL)
IDLE_QUEUE_SECONDS = 0.5
REPORTING_COMPONENT = "npu-operator"


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, kept by nobody: it serves only create/update handlers, which this operator
    has none of (a change wakes the worker through `follow_changes`). kopf still builds one on every
    event of every resource: the default deep-copies the body and reads an annotation each time."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


async def configure(settings: kopf.OperatorSettings, memo: Any, logger: Logger, **_: Any) -> None:
    config: OperatorConfig = memo.config
    logging.getLogger().setLevel(python_log_level(config))
    # The finalizer kopf removes where an earlier version of the operator left it (`without_finalizer`).
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.diffbase_storage = NoDiffBase()
    # Peering: replicas with the same name never act together; the highest priority acts, so a
    # random one per start makes a fresh replica take over cleanly from a vanished one.
    settings.peering.name = config.peering_name
    settings.peering.standalone = config.standalone
    settings.peering.mandatory = not config.standalone
    settings.peering.priority = random.randint(1, 2**31 - 1)
    # Our own Events say what happened; kopf's per-handler "succeeded" chatter would be a write
    # per resync per resource.
    settings.posting.level = logging.WARNING
    # Events name the operator (`kubectl describe`'s From, reportingComponent), not kopf; the
    # instance is the pod (its hostname), as with Kubernetes' own controllers.
    settings.posting.reporting_component = REPORTING_COMPONENT
    settings.posting.reporting_instance = socket.gethostname()
    settings.posting.event_name_prefix = f"{REPORTING_COMPONENT}-"
    # Reconnect watches regularly (server side) and never hang on a dead connection (client side).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # A re-list after 410 Gone or a failed list waits this long; reopening a stream that ended
    # early backs off in the login session's WatchThrottle (see `supervision`).
    settings.watching.reconnect_backoff = 1.0
    # An object's event queue (kopf's per-object worker task) goes 0.5 s after its last event, not
    # kopf's default 5: while a fleet settles, every resource has one; their events come in bursts
    # a few milliseconds apart (kopf 1.45, kopf/_core/reactor/queueing.py
    # worker: `settings.queueing.idle_timeout`).
    settings.queueing.idle_timeout = IDLE_QUEUE_SECONDS
    # The worker is the only status writer: no finalizers needed, children go by owner references.
    # The CRD's schema (its defaults) is read here, not by the first resource's spec check.
    crd.load_crd()
    memo.client = client.KubeClient(
        lambda: client.connection_info(settings, logger), on_served_change=lambda: memo.workers.wake_all()
    )
    memo.informers = watches.Informers(lambda key: memo.workers.wake(key))
    memo.collector = ReportCollector(
        concurrency=config.status_concurrency,
        timeout=config.status_timeout_seconds,
        poll_seconds=config.status_poll_seconds,
    )
    nodes = memo.informers.nodes
    memo.workers = worker.Workers(
        memo.client,
        watches.WatchedView(memo.informers),
        config,
        memo.collector,
        settings,
        nodes=lambda: nodes.offer if config.node_discovery else None,
    )
    memo.informers.start(memo.client, config.namespaces, nodes=config.node_discovery)
    memo.standalone = StandaloneWorkers() if config.standalone else None
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port)
    logger.info(f"npu-operator configured: {config}")


async def close(memo: Any, **_: Any) -> None:
    if memo.standalone is not None:
        await memo.standalone.stop()
    await memo.informers.stop()
    await memo.client.close()
    await memo.collector.close()


async def login(settings: kopf.OperatorSettings, logger: Logger, **_: Any) -> kopf.AiohttpSession:
    # An exec credential plugin may take a while (a cloud CLI): out of the event loop.
    return supervision.throttled_context(await asyncio.to_thread(client.connection_info, settings, logger))


async def follow_changes(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    # Async, so that the workers are told from the event loop.
    memo.workers.saw(event["type"], event["object"])
    if memo.standalone is not None:
        memo.standalone.start(memo)


@dataclasses.dataclass
class StandaloneWorkers:
    """Standalone, nothing pauses this replica: the workers run from the first resource event until
    cleanup. Started by that event's handler, in the context kopf gives its handlers once it runs
    (`kopf.event` needs kopf's posting queue there, which the startup handlers do not have yet).
    One object for the operator: kopf hands each resource's handlers a copy of the memo, whose
    attributes are shared, so `start` is kept here and not in the memo."""

    task: asyncio.Future[None] | None = None

    def start(self, memo: Any) -> None:
        if self.task is None:
            self.task = asyncio.ensure_future(_act(memo))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def act_while_leading(stopped: kopf.DaemonStopped, memo: Any, **_: Any) -> None:
    """The workers, for as long as kopf lets this replica act (see the module's docstring)."""
    await _act(memo, _stop_of(stopped))


async def _act(memo: Any, stopped: Awaitable[Any] | None = None) -> None:
    await memo.informers.ready()  # no worker acts on a half-listed cluster
    await memo.workers.serve(stopped)


def _stop_of(stopped: kopf.DaemonStopped) -> Awaitable[Any]:
    """What ends when kopf stops the daemon: kopf's own stop event (`stopped.wait()` makes a second
    task and an `asyncio.wait_for`: kopf 1.45, kopf/_cogs/aiokits/aioenums.py, AsyncFlagPromise);
    where a kopf has no such event, `stopped.wait()`."""
    event = getattr(getattr(stopped, "_setter", None), "async_event", None)
    return event.wait() if isinstance(event, asyncio.Event) else stopped.wait()


def peering_resource(config: OperatorConfig) -> tuple[str, str, str]:
    """(group, version, plural) of the peering object kopf uses for `config`'s scope."""
    return ("kopf.dev", "v1", "kopfpeerings" if config.namespaces else "clusterkopfpeerings")


def registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of one run of the operator, in a registry of its own (the peering object the
    workers follow depends on the scope)."""
    handlers = kopf.OperatorRegistry()
    kopf.on.startup(registry=handlers)(configure)
    kopf.on.cleanup(registry=handlers)(close)
    kopf.on.login(registry=handlers)(login)
    kopf.on.event(*RESOURCE, registry=handlers)(follow_changes)
    if not config.standalone:
        group, version, plural = peering_resource(config)
        # Longer than the workers' own grace for the ticks under way (`worker.STOP_GRACE_SECONDS`).
        kopf.daemon(
            group,
            version,
            plural,
            registry=handlers,
            field="metadata.name",
            value=config.peering_name,
            cancellation_timeout=worker.STOP_GRACE_SECONDS + 5,
        )(act_while_leading)
        without_finalizer(act_while_leading, handlers)
    return handlers


def without_finalizer(daemon: Any, registry: kopf.OperatorRegistry) -> None:
    """Keep the daemon `daemon` without kopf's finalizer on the object it runs for.

    kopf 1.45 gives every daemon one (`requires_finalizer=True` in `kopf.daemon`) so that it can
    stop the daemon before the object is gone: on the peering object, that would hold its deletion
    (a `helm uninstall`) until an operator removes it. The workers need none: kopf still stops the
    daemon on shutdown and on a peering pause. kopf removes the finalizer an earlier version of the
    operator left on NPUInferences (it does so for any resource whose handlers no longer require
    one). kopf has no public switch for this: the registry's entry is replaced, and a kopf whose
    registry is built differently stops the operator at start with a message saying so.
    """
    spawning = getattr(registry, "_spawning", None)
    entries = getattr(spawning, "_handlers", None)
    found = [i for i, h in enumerate(entries or ()) if getattr(h, "fn", None) is daemon]
    if entries is None or len(found) != 1 or not hasattr(entries[found[0]], "requires_finalizer"):
        raise RuntimeError(
            f"kopf {importlib.metadata.version('kopf')}: its daemon registry is not the one npu-operator"
            " knows (kopf 1.45); the daemon's finalizer cannot be switched off"
        )
    entries[found[0]] = dataclasses.replace(entries[found[0]], requires_finalizer=False)

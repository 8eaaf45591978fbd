"""kopf handlers: decorators and wiring only; the work happens in `worker` and `reconcile`.

- startup: every kopf setting in one place, the API client, the metrics endpoint;
- login: the same credentials for kopf and for our client (kopf's session with a watch throttle);
- resource events: a change the worker reads (a new generation, labels, annotations) wakes the
  resource's worker so it is applied at once. A raw event handler, not kopf's create/update/resume
  handlers: those make kopf keep a diff base and progress annotations per resource (a deep copy of
  the body per event and a patch per change); the worker already reports a spec that can never be
  served (status, Warning Event);
- children and pods: watched by our own informers (started here, `watches.Informers`), cached and
  waking their owner's worker;
- daemon: the per-resource worker (children, status, Events), without kopf's finalizer.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import random
import socket
from typing import Any

import kopf
import prometheus_client

from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig, python_log_level
from npu_operator.controller import supervision, watches, worker
from npu_operator.kube import client
from npu_operator.kube.objects import SharedDocuments
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


@kopf.on.startup()
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
    memo.wakeups = watches.Wakeups()
    memo.specs = SharedDocuments()
    memo.client = client.KubeClient(
        lambda: client.connection_info(settings, logger), on_served_change=memo.wakeups.wake_all
    )
    memo.informers = watches.Informers(memo.wakeups.wake)
    memo.informers.start(memo.client, config.namespaces)
    memo.view = watches.WatchedView(memo.informers)  # one view for every worker
    memo.collector = ReportCollector(
        concurrency=config.status_concurrency,
        timeout=config.status_timeout_seconds,
        poll_seconds=config.status_poll_seconds,
    )
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port)
    logger.info(f"npu-operator configured: {config}")


@kopf.on.cleanup()
async def close(memo: Any, **_: Any) -> None:
    await memo.informers.stop()
    await memo.client.close()
    await memo.collector.close()


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, logger: Logger, **_: Any) -> kopf.AiohttpSession:
    return supervision.throttled_context(client.connection_info(settings, logger))


@kopf.on.event(*RESOURCE)
async def follow_changes(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    # Async, so the wake-up is set from the event loop. The first event seen starts nothing: the
    # worker is being started and its first tick reads this very resource.
    meta = event["object"].get("metadata", {})
    key = (meta.get("namespace", ""), meta.get("name", ""))
    memo.wakeups.saw_resource(key, meta, deleted=event["type"] == "DELETED")
    # A worker that runs has read the status when it started (`Wakeups.for_owner` comes first).
    raw: dict[str, Any] = event["object"]  # type: ignore[assignment]  # kopf's TypedDict: a dict
    watches.drop_unread(raw, worker_running=key in memo.wakeups.events)
    watches.share_spec(raw, memo.specs, deleted=event["type"] == "DELETED")


@kopf.daemon(*RESOURCE, cancellation_timeout=10)
async def keep_reconciled(
    body: kopf.Body, memo: Any, stopped: kopf.DaemonStopped, logger: Logger, **unused: Any
) -> None:
    # kopf passes some 25 arguments (and every index); the worker's frame lives as long as its
    # resource, so the dict of those it does not read goes now (`**` always makes a new one).
    del unused
    await memo.informers.ready()  # no worker acts on a half-listed cluster
    await worker.run(body, memo.client, memo.view, memo.config, memo.wakeups, memo.collector, stopped, logger)


def without_finalizer(daemon: Any, registry: kopf.OperatorRegistry | None = None) -> None:
    """Keep the daemon `daemon` without kopf's finalizer on its resources.

    kopf 1.45 gives every daemon one (`requires_finalizer=True` in `kopf.daemon`) so that it can
    stop the daemon before the resource is gone. It costs a write and an event per resource (a JSON
    patch from a deep copy of the body: 12% of the operator's CPU at 5,000 resources), and without
    the operator a deleted resource stays Terminating until someone removes it by hand. The worker
    needs none: it exits on its resource's DELETED event (`Wakeups.saw_resource`), the children go
    by their owner references, and kopf still stops it on shutdown, on a peering pause and on a
    deletion that waits for others' finalizers. kopf removes the finalizer an earlier version of
    the operator left (it does so for any resource whose handlers no longer require one).
    kopf has no public switch for this: the registry's entry is replaced, and a kopf whose registry
    is built differently stops the operator at import with a message saying so.
    """
    spawning = getattr(registry or kopf.get_default_registry(), "_spawning", None)
    entries = getattr(spawning, "_handlers", None)
    found = [i for i, h in enumerate(entries or ()) if getattr(h, "fn", None) is daemon]
    if entries is None or len(found) != 1 or not hasattr(entries[found[0]], "requires_finalizer"):
        raise RuntimeError(
            f"kopf {importlib.metadata.version('kopf')}: its daemon registry is not the one npu-operator"
            " knows (kopf 1.45); the daemon's finalizer cannot be switched off"
        )
    entries[found[0]] = dataclasses.replace(entries[found[0]], requires_finalizer=False)


without_finalizer(keep_reconciled)

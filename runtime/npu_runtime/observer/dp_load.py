"""The API server's load over all its data-parallel ranks, as series on vLLM's own /metrics (port 8000).

Why: vLLM labels its scheduler gauges with `engine`, one series per DP rank, and llm-d's endpoint
picker keeps the first matching series of a metric (llm-d-router v0.9.0
pkg/epp/framework/plugins/datalayer/extractor/metrics/spec.go `Spec.getLatestMetric`), so with
several ranks behind one API server it would read the queue and KV cache of one rank. For such pods
the operator points the picker at the `npu_engine_*` series instead (`npu_operator.children.routing`,
docs/autoscaling.md); their names, labels and help are `npu_runtime.metrics.ENGINE_LOAD_METRICS`.

How (vLLM 0.31.0, and the same in 0.23.0): `PrometheusStatLogger.__init__`
(vllm/v1/metrics/loggers.py) creates the gauges `vllm:num_requests_waiting`,
`vllm:num_requests_running` and `vllm:kv_cache_usage_perc` with labels (model_name, engine) and one
child per engine index (`vllm.v1.metrics.utils.create_metric_per_engine`), in prometheus_client's
global REGISTRY (no `registry=` argument), and `PrometheusStatLogger.record` sets each rank's child
from its scheduler stats. The API server serves that registry: `attach_router`
(vllm/entrypoints/serve/instrumentator/metrics.py) mounts `make_asgi_app(registry=
get_prometheus_registry())`, and `get_prometheus_registry` (vllm/v1/metrics/prometheus.py) returns
REGISTRY unless PROMETHEUS_MULTIPROC_DIR is set. `DPLoadCollector` is registered in that registry and,
at each scrape, reads those three gauges alone through `CollectorRegistry.restricted_registry` (only
the collectors registered under those names: never itself, never the whole registry, so no recursion)
and yields the sums and the mean per model_name. Nothing is cached: vLLM re-creates its gauges when it
builds another PrometheusStatLogger (`unregister_vllm_metrics` first), and the next scrape reads the
new ones. Before vLLM made its gauges, or with `--disable-log-stats` (no stat loggers), a family
without a source is simply absent.

Where: installed when `vllm.v1.metrics.loggers` is imported, that is by vLLM's frontend (the API
server's AsyncLLM; an offline LLMEngine), never by engine cores or workers, which do not import it.

Refused (not installed; one warning, one `npu_graph_instrumentation_errors_total{hook="dp_load_metrics"}`,
listed as unavailable in the process's report), the engine unaffected:
- PROMETHEUS_MULTIPROC_DIR set: vLLM's /metrics then serves a registry of its own made of the
  multiprocess files (`get_prometheus_registry`: a CollectorRegistry with a MultiProcessCollector),
  which a collector in this process cannot join. vLLM sets the variable itself for several API server
  processes (`vllm serve --api-server-count N`: vllm/entrypoints/cli/serve.py `run_multi_api_server`
  calls `setup_multiprocess_prometheus`), so several API servers are refused by the same rule.
  `npu-runtime serve` runs one (`python -m vllm.entrypoints.openai.api_server`: `entry.main` ->
  `run_server`, one process whatever --api-server-count says) and passes the variable only when the
  pod sets it (docs/serve.md).
- vLLM's `get_prometheus_registry` missing or serving another registry than REGISTRY, or a registry
  without `restricted_registry`.
Disabled at a scrape (the same accounting; it then yields nothing, vLLM's own series are served as
before): a source that is not a gauge or whose labels are not exactly model_name and engine (a sum
would mix series that are not ranks), or any error of its own.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from npu_runtime import metrics
from npu_runtime.observer.hooks import Hook
from npu_runtime.observer.recorder import Recorder

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.metrics_core import Metric


class Observer(Protocol):
    """What this module needs of `process_observer.Observer` (`vllm_hooks.install` installs it): a hook to count its
    failures, the list of what is installed, and the recorder to flush."""

    recorder: Recorder

    def hook(self, name: str) -> Hook: ...

    def installed(self, what: str) -> None: ...


HOOK: Final = "dp_load_metrics"  # the `hook` label of npu_graph_instrumentation_errors_total
MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
LOGGERS_MODULE: Final = "vllm.v1.metrics.loggers"  # imported by vLLM's frontend only: where we install
SERVED_REGISTRY: Final = ("vllm.v1.metrics.prometheus", "get_prometheus_registry")
SOURCE_LABELS: Final = frozenset({"model_name", "engine"})  # PrometheusStatLogger's labelnames
INSTALLED: Final = "dp_load_metrics: npu_engine_* in vLLM's Prometheus registry"

Aggregate = Literal["sum", "mean"]
# (what we export, the vLLM gauge it is derived from, how the ranks combine)
SOURCES: Final[tuple[tuple[metrics.MetricSpec, str, Aggregate], ...]] = (
    (metrics.ENGINE_REQUESTS_WAITING, "vllm:num_requests_waiting", "sum"),
    (metrics.ENGINE_REQUESTS_RUNNING, "vllm:num_requests_running", "sum"),
    (metrics.ENGINE_KV_CACHE_USAGE, "vllm:kv_cache_usage_perc", "mean"),
)
SOURCE_NAMES: Final = frozenset(source for _, source, _ in SOURCES)
# What a registry files a collector under is its sample names (CollectorRegistry._get_names): asking
# for these too finds a source vLLM made into another type, which is then refused rather than missed.
OTHER_TYPE_SUFFIXES: Final = ("_total", "_created", "_bucket", "_sum", "_count", "_gsum", "_gcount", "_info")
ASKED: Final = SOURCE_NAMES | {name + suffix for name in SOURCE_NAMES for suffix in OTHER_TYPE_SUFFIXES}


class UnexpectedShape(Exception):
    """A source gauge is not what PrometheusStatLogger makes: summing it would be wrong."""


class _Reentry(threading.local):
    def __init__(self) -> None:
        self.active = False


class DPLoadCollector:
    """A prometheus_client collector: the npu_engine_* series from vLLM's per-rank gauges, at scrape time."""

    def __init__(self, registry: Any, hook: Hook) -> None:
        self.registry = registry
        self.hook = hook
        self._reentry = _Reentry()

    def describe(self) -> list[Metric]:
        """The names it serves (so the registry registers it under those, and never collects it for a
        restricted scrape of vLLM's names), without reading anything."""
        return [_family(spec) for spec, _, _ in SOURCES]

    def collect(self) -> list[Metric]:
        """Never raises: a failure disables it and counts, and the scrape goes on without it."""
        if self.hook.disabled or self._reentry.active:
            return []
        self._reentry.active = True
        try:
            return self._collect()
        except UnexpectedShape as exc:
            self.hook.refuse(str(exc))
            return []
        except Exception:
            self.hook.fail()
            return []
        finally:
            self._reentry.active = False

    def _collect(self) -> list[Metric]:
        ranks = self.read_ranks()
        out: list[Metric] = []
        for spec, source, aggregate in SOURCES:
            per_model = ranks.get(source)
            if not per_model:
                continue  # vLLM has not made this gauge (yet): no series rather than a wrong zero
            family = _family(spec)
            for model, values in sorted(per_model.items()):
                total = math.fsum(values)
                family.add_metric([model], total if aggregate == "sum" else total / len(values))
            out.append(family)
        return out

    def read_ranks(self) -> dict[str, dict[str, list[float]]]:
        """{vLLM gauge: {model_name: [one value per engine]}}, from the three gauges alone."""
        found: dict[str, dict[str, list[float]]] = {}
        for metric in self.registry.restricted_registry(ASKED).collect():
            if metric.name not in SOURCE_NAMES:
                continue
            if metric.type != "gauge":
                raise UnexpectedShape(f"{metric.name} is a {metric.type}, not a gauge")
            per_model = found.setdefault(metric.name, {})
            for sample in metric.samples:
                if sample.name != metric.name:
                    continue
                if set(sample.labels) != SOURCE_LABELS:
                    raise UnexpectedShape(
                        f"{metric.name} has labels {sorted(sample.labels)}, not {sorted(SOURCE_LABELS)}"
                    )
                per_model.setdefault(sample.labels["model_name"], []).append(float(sample.value))
        return found


def _family(spec: metrics.MetricSpec) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(spec.family_name, spec.help, labels=list(spec.labels))


_lock = threading.Lock()
# One collector per registry: id(registry) -> (the registry, kept so that its id is not reused; its collector).
_installed: dict[int, tuple[Any, DPLoadCollector]] = {}


def on_import(observer: Observer, module: ModuleType) -> None:
    """`when_imported`'s callback for vLLM's loggers module: install in this process."""
    install(observer)


def install(
    observer: Observer, *, registry: Any = None, environ: Mapping[str, str] | None = None
) -> DPLoadCollector | None:
    """Register the collector in the registry vLLM's /metrics serves (`registry` for tests); None when
    refused or failed (logged, counted, the engine unaffected). Idempotent."""
    hook = observer.hook(HOOK)
    env = os.environ if environ is None else environ
    if MULTIPROC_ENV in env:  # get_prometheus_registry's own test (os.getenv(...) is not None)
        hook.refuse(
            f"{MULTIPROC_ENV} is set, so vLLM's /metrics serves the multiprocess files, not this process's "
            "registry; the npu_engine_* series are not served (unset it; serve runs one API server)"
        )
        return None
    try:
        if registry is None:
            registry = served_registry(hook)
            if registry is None:
                return None
        if not callable(getattr(registry, "restricted_registry", None)):
            hook.refuse(f"{type(registry).__name__} has no restricted_registry")
            return None
        with _lock:
            known = _installed.get(id(registry))
            if known is not None:
                collector = known[1]
            else:
                collector = DPLoadCollector(registry, hook)
                registry.register(collector)
                _installed[id(registry)] = (registry, collector)
        observer.installed(INSTALLED)
        observer.recorder.flush()  # into this process's report now: nothing else may change in the API server
        return collector
    except Exception:
        hook.fail()
        return None


def served_registry(hook: Hook) -> Any:
    """prometheus_client's REGISTRY where vLLM's get_prometheus_registry() serves it; else refuse, None."""
    import importlib

    from prometheus_client import REGISTRY

    module_name, function_name = SERVED_REGISTRY
    try:
        served = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError):
        hook.refuse(f"{module_name}.{function_name} is missing: which registry /metrics serves is unknown")
        return None
    if served() is not REGISTRY:
        hook.refuse(f"{module_name}.{function_name}() is not prometheus_client.REGISTRY")
        return None
    return REGISTRY

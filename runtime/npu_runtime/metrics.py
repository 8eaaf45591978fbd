"""Every metric the runtime exports, in one place: names, types, labels, help, buckets.

The names and labels are a contract with the chart's dashboard and alerts and with users' own
queries (docs/design.md's metric table); tests list `RUNTIME_METRICS` to check both sides against it. The
operator's own metrics (`npu_operator_*`) are defined by the operator.

How the values get here: the graph observer runs inside vLLM's processes and writes one JSON
report per process (`npu_runtime.reports`); the runtime aggregates them with the plan into a
`Snapshot` (`npu_runtime.serving.status`) and `families()` turns a snapshot into Prometheus metric
families at scrape time. Nothing here touches vLLM's own metrics or PROMETHEUS_MULTIPROC_DIR. The
`npu_engine_*` series (ENGINE_LOAD_METRICS) come another way: the observer derives them from vLLM's
own gauges inside the API server and serves them on vLLM's port (`npu_runtime.observer.dp_load`).

prometheus_client is imported inside `families()` only, so that the operator (which lists the
names but does not serve them) can import this module without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.metrics_core import Metric

MetricKind = Literal["gauge", "counter", "histogram"]


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One exported metric. `name` is the name as scraped (counters end in `_total`)."""

    name: str
    kind: MetricKind
    labels: tuple[str, ...]
    help: str

    @property
    def family_name(self) -> str:
        """The name prometheus_client wants for the family (counters without `_total`)."""
        if self.kind == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


GRAPH_MODE_INFO: Final = MetricSpec(
    "npu_graph_mode_info",
    "gauge",
    ("requested", "effective"),
    "Always 1: the graph mode asked for and the mode the engine runs.",
)
GRAPH_DOWNGRADES: Final = MetricSpec(
    "npu_graph_downgrades_total",
    "counter",
    ("from_mode", "to_mode", "reason", "stage"),
    "Graph-mode downgrades, by the planner (stage=plan) or by the engine itself (stage=engine).",
)
GRAPH_CAPTURE_SIZES: Final = MetricSpec(
    "npu_graph_capture_sizes",
    "gauge",
    ("mode",),
    "How many batch sizes were captured as graphs.",
)
GRAPH_CAPTURE_MEMORY: Final = MetricSpec(
    "npu_graph_capture_memory_bytes",
    "gauge",
    ("mode", "size"),
    "Device memory one graph capture took (free memory before minus after; largest over devices).",
)
GRAPH_CAPTURE_SECONDS: Final = MetricSpec(
    "npu_graph_capture_seconds",
    "gauge",
    ("mode", "size"),
    "Wall time one graph capture took (largest over devices).",
)
GRAPH_REPLAY_LATENCY: Final = MetricSpec(
    "npu_graph_replay_latency_seconds",
    "histogram",
    ("mode", "size"),
    "Device time of one graph replay, measured with device events read after completion.",
)
GRAPH_EAGER_FALLBACKS: Final = MetricSpec(
    "npu_graph_eager_fallbacks_total",
    "counter",
    ("reason",),
    "Decode steps that ran eagerly although graphs were on.",
)
DEVICE_MEMORY: Final = MetricSpec(
    "npu_device_memory_bytes",
    "gauge",
    ("device", "kind"),
    "Device memory by kind (total, free, weights, kv_cache, graphs): seen by the engine where it "
    "reported it, else the plan's figure (device=plan).",
)
INSTRUMENTATION_ERRORS: Final = MetricSpec(
    "npu_graph_instrumentation_errors_total",
    "counter",
    ("hook",),
    "Observer hooks that failed and disabled themselves instead of breaking the engine.",
)

DECODE_BATCHES: Final = MetricSpec(
    "npu_graph_decode_batches_total",
    "counter",
    ("size",),
    "Decode steps by batch size in tokens before padding (the distribution the planner shapes capture sizes for).",
)

RUNTIME_METRICS: Final[tuple[MetricSpec, ...]] = (
    GRAPH_MODE_INFO,
    GRAPH_DOWNGRADES,
    GRAPH_CAPTURE_SIZES,
    GRAPH_CAPTURE_MEMORY,
    GRAPH_CAPTURE_SECONDS,
    GRAPH_REPLAY_LATENCY,
    GRAPH_EAGER_FALLBACKS,
    DEVICE_MEMORY,
    INSTRUMENTATION_ERRORS,
    DECODE_BATCHES,
)

# issue 47: serve's LoRA adapter series (port 9090 beside RUNTIME_METRICS; only with --lora-adapters).
# Kept apart from RUNTIME_METRICS, whose contract is docs/design.md's table and the dashboard.
LORA_ADAPTER_LOADED: Final = MetricSpec(
    "npu_lora_adapter_loaded",
    "gauge",
    ("adapter",),
    "1 while a listed LoRA adapter is loaded in the engine, 0 while it is pending or failed (/status adapters).",
)
LORA_REQUESTS: Final = MetricSpec(
    "npu_lora_requests_total",
    "counter",
    ("adapter",),
    "Requests the engine accepted for one LoRA adapter (the API server's OutputProcessor.add_request, "
    "counted by the observer); the base model's are not counted.",
)
LORA_METRICS: Final[tuple[MetricSpec, ...]] = (LORA_ADAPTER_LOADED, LORA_REQUESTS)

# The PD router's own series (`npu-runtime route`, routing/series.py), in a registry of their own;
# kept apart from RUNTIME_METRICS, which lists what `serve` exports.
ROUTER_REQUESTS: Final = MetricSpec(
    "npu_router_requests_total",
    "counter",
    ("endpoint", "code"),
    "Client requests, by endpoint and status (499: the client went away first)",
)
ROUTER_REQUEST_SECONDS: Final = MetricSpec(
    "npu_router_request_seconds",
    "histogram",
    ("endpoint",),
    "Time from a client request to the end of its answer",
)
ROUTER_BACKEND_SECONDS: Final = MetricSpec(
    "npu_router_backend_seconds",
    "histogram",
    ("role",),
    "Time one engine took (prefill: whole answer; decode: to its first byte)",
)
ROUTER_BACKEND_ERRORS: Final = MetricSpec(
    "npu_router_backend_errors_total",
    "counter",
    ("role", "reason"),
    "Failed calls to an engine (and prefill KV parameters refused), by role and reason",
)
ROUTER_RETRIES: Final = MetricSpec(
    "npu_router_retries_total",
    "counter",
    ("role",),
    "Calls retried on another engine",
)
ROUTER_ADAPTER_REQUESTS: Final = MetricSpec(
    "npu_router_adapter_requests_total",
    "counter",
    ("adapter",),
    "Client requests for a LoRA adapter some engine holds (each sent only to its holders; retries not counted)",
)
ROUTER_IN_FLIGHT: Final = MetricSpec(
    "npu_router_in_flight",
    "gauge",
    (),
    "Client requests being answered now (at --max-in-flight the next gets 503)",
)
# Per engine (one series per role and engine URL; an engine gone from its URL's addresses goes too),
# read from the router's own state when scraped.
ROUTER_ENGINE_IN_FLIGHT: Final = MetricSpec(
    "npu_router_engine_in_flight",
    "gauge",
    ("role", "engine"),
    "Calls in flight to one engine",
)
ROUTER_ENGINE_WORK: Final = MetricSpec(
    "npu_router_engine_work",
    "gauge",
    ("role", "engine"),
    "Outstanding work on one engine as the router counts it (prompt tokens; decode adds output tokens left)",
)
ROUTER_ENGINE_SECONDS_PER_UNIT: Final = MetricSpec(
    "npu_router_engine_seconds_per_unit",
    "gauge",
    ("role", "engine"),
    "One engine's measured speed: seconds per prompt token (prefill), per output token alone in its batch (decode)",
)
ROUTER_ENGINE_REQUESTS: Final = MetricSpec(
    "npu_router_engine_requests_total",
    "counter",
    ("role", "engine"),
    "Calls the router sent to one engine, retries included",
)
ROUTER_ENGINE_OUT: Final = MetricSpec(
    "npu_router_engine_out",
    "gauge",
    ("role", "engine"),
    "1 while an engine is taken out after a failure, until its /health answers again",
)
ROUTER_ENGINE_EJECTIONS: Final = MetricSpec(
    "npu_router_engine_ejections_total",
    "counter",
    ("role", "engine"),
    "Times an engine was taken out after a failure",
)
# The cache-aware choice of the prefill engine (--cache-aware; routing/choice.py, prefix.py).
ROUTER_PREFIX_HITS: Final = MetricSpec(
    "npu_router_prefix_hits_total",
    "counter",
    ("role", "engine"),
    "Cache-aware choices of an engine taken to hold some of the prompt's prefix",
)
ROUTER_PREFIX_TOKENS_SAVED: Final = MetricSpec(
    "npu_router_prefix_tokens_saved_total",
    "counter",
    ("role", "engine"),
    "Prompt tokens the chosen engine was taken to hold (predicted, not computed again)",
)
ROUTER_CHOICE_REASONS: Final = MetricSpec(
    "npu_router_choice_reasons_total",
    "counter",
    ("role", "reason"),
    "Cache-aware choices by reason: cache, load (a holder was slower), new_prefix (none holds it),"
    " overloaded (a holder past --cache-load-factor), no_tokens (the prompt's tokens unknown)",
)
ROUTER_KV_EVENT_STREAMS: Final = MetricSpec(
    "npu_router_kv_event_streams",
    "gauge",
    ("engine",),
    "A prefill engine's KV event streams live now (one per DP rank; 0: its prompts sent are used instead)",
)
ROUTER_METRICS: Final[tuple[MetricSpec, ...]] = (
    ROUTER_REQUESTS,
    ROUTER_REQUEST_SECONDS,
    ROUTER_BACKEND_SECONDS,
    ROUTER_BACKEND_ERRORS,
    ROUTER_RETRIES,
    ROUTER_ADAPTER_REQUESTS,
    ROUTER_IN_FLIGHT,
    ROUTER_ENGINE_IN_FLIGHT,
    ROUTER_ENGINE_WORK,
    ROUTER_ENGINE_SECONDS_PER_UNIT,
    ROUTER_ENGINE_REQUESTS,
    ROUTER_ENGINE_OUT,
    ROUTER_ENGINE_EJECTIONS,
    ROUTER_PREFIX_HITS,
    ROUTER_PREFIX_TOKENS_SAVED,
    ROUTER_CHOICE_REASONS,
    ROUTER_KV_EVENT_STREAMS,
)
ROUTER_SECONDS_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
)  # fmt: skip

# The API server's load over every data-parallel rank behind it, which the graph observer adds to
# vLLM's own /metrics on the API port (8000; `npu_runtime.observer.dp_load`), beside vLLM's per-rank
# series. vLLM labels each rank's gauges `engine`; llm-d's endpoint picker reads the first matching
# series only, so for pods with several ranks the operator points the picker at these
# (`npu_operator.children.routing`, docs/autoscaling.md). Kept apart from RUNTIME_METRICS (serve's
# port-9090 series, docs/design.md's table and the dashboard): their contract is with the picker's
# configuration, which imports these names. Each is derived at scrape time from one vLLM gauge.
ENGINE_REQUESTS_WAITING: Final = MetricSpec(
    "npu_engine_num_requests_waiting",
    "gauge",
    ("model_name",),
    "Requests waiting, summed over the data-parallel ranks behind this API server (vllm:num_requests_waiting).",
)
ENGINE_REQUESTS_RUNNING: Final = MetricSpec(
    "npu_engine_num_requests_running",
    "gauge",
    ("model_name",),
    "Requests running, summed over the data-parallel ranks behind this API server (vllm:num_requests_running).",
)
ENGINE_KV_CACHE_USAGE: Final = MetricSpec(
    "npu_engine_kv_cache_usage_perc",
    "gauge",
    ("model_name",),
    "KV-cache usage (1 means 100 percent), the mean over the data-parallel ranks behind this API server "
    "(vllm:kv_cache_usage_perc).",
)
ENGINE_LOAD_METRICS: Final[tuple[MetricSpec, ...]] = (
    ENGINE_REQUESTS_WAITING,
    ENGINE_REQUESTS_RUNNING,
    ENGINE_KV_CACHE_USAGE,
)

# Replay of a whole decode step takes from ~100 us (small model, small batch) to tens of ms.
REPLAY_LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
DEVICE_MEMORY_KINDS: Final = ("total", "free", "weights", "kv_cache", "graphs")


@dataclasses.dataclass(frozen=True)
class HistogramValue:
    """Counts per bucket (not cumulative; len(REPLAY_LATENCY_BUCKETS) + 1 with +Inf last) and sum."""

    buckets: tuple[int, ...]
    sum: float


@dataclasses.dataclass(frozen=True)
class MetricValues:
    """What the runtime knows at scrape time, already aggregated over the engine's processes."""

    requested_mode: str
    effective_mode: str | None
    downgrades: Mapping[tuple[str, str, str, str], int]  # (from, to, reason, stage) -> count
    capture_sizes: Mapping[str, int]  # mode -> how many sizes
    capture_memory: Mapping[tuple[str, int], int]  # (mode, size) -> bytes
    capture_seconds: Mapping[tuple[str, int], float]
    replay: Mapping[tuple[str, int], HistogramValue]
    eager_fallbacks: Mapping[str, int]
    device_memory: Mapping[tuple[str, str], int]  # (device, kind) -> bytes
    instrumentation_errors: Mapping[str, int]
    decode_batches: Mapping[int, int] = dataclasses.field(default_factory=dict)  # tokens -> decode steps
    lora_loaded: Mapping[str, bool] = dataclasses.field(default_factory=dict)  # adapter -> loaded
    lora_requests: Mapping[str, int] = dataclasses.field(default_factory=dict)  # adapter -> requests


def _sorted(items: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    return sorted(items, key=lambda item: item[0])


def families(values: MetricValues) -> list[Metric]:
    """Prometheus metric families for `values`, in RUNTIME_METRICS order, labels sorted."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    def gauge(spec: MetricSpec) -> GaugeMetricFamily:
        return GaugeMetricFamily(spec.family_name, spec.help, labels=list(spec.labels))

    def counter(spec: MetricSpec) -> CounterMetricFamily:
        return CounterMetricFamily(spec.family_name, spec.help, labels=list(spec.labels))

    mode_info = gauge(GRAPH_MODE_INFO)
    if values.effective_mode is not None:  # no series until the mode is known
        mode_info.add_metric([values.requested_mode, values.effective_mode], 1)

    downgrades = counter(GRAPH_DOWNGRADES)
    for (from_mode, to_mode, reason, stage), count in _sorted(values.downgrades.items()):
        downgrades.add_metric([from_mode, to_mode, reason, stage], count)

    sizes = gauge(GRAPH_CAPTURE_SIZES)
    for mode, count in _sorted(values.capture_sizes.items()):
        sizes.add_metric([mode], count)

    memory = gauge(GRAPH_CAPTURE_MEMORY)
    for (mode, size), nbytes in _sorted(values.capture_memory.items()):
        memory.add_metric([mode, str(size)], nbytes)

    seconds = gauge(GRAPH_CAPTURE_SECONDS)
    for (mode, size), took in _sorted(values.capture_seconds.items()):
        seconds.add_metric([mode, str(size)], took)

    replay = HistogramMetricFamily(
        GRAPH_REPLAY_LATENCY.name,
        GRAPH_REPLAY_LATENCY.help,
        labels=list(GRAPH_REPLAY_LATENCY.labels),
    )
    for (mode, size), histogram in _sorted(values.replay.items()):
        replay.add_metric([mode, str(size)], cumulative_buckets(histogram.buckets), histogram.sum)

    fallbacks = counter(GRAPH_EAGER_FALLBACKS)
    for reason, count in _sorted(values.eager_fallbacks.items()):
        fallbacks.add_metric([reason], count)

    device_memory = gauge(DEVICE_MEMORY)
    for (device, kind), nbytes in _sorted(values.device_memory.items()):
        device_memory.add_metric([device, kind], nbytes)

    errors = counter(INSTRUMENTATION_ERRORS)
    for hook, count in _sorted(values.instrumentation_errors.items()):
        errors.add_metric([hook], count)

    batches = counter(DECODE_BATCHES)
    for size, count in _sorted(values.decode_batches.items()):
        batches.add_metric([str(size)], count)

    families = [mode_info, downgrades, sizes, memory, seconds, replay, fallbacks, device_memory, errors, batches]
    return families + _lora_families(values, gauge(LORA_ADAPTER_LOADED), counter(LORA_REQUESTS))


def _lora_families(values: MetricValues, loaded: GaugeMetricFamily, requests: CounterMetricFamily) -> list[Metric]:
    """LORA_METRICS' families, none without adapters (serve without --lora-adapters exports as before)."""
    if not values.lora_loaded and not values.lora_requests:
        return []
    for adapter, is_loaded in _sorted(values.lora_loaded.items()):
        loaded.add_metric([adapter], 1 if is_loaded else 0)
    for adapter, count in _sorted(values.lora_requests.items()):
        requests.add_metric([adapter], count)
    return [loaded, requests]


def cumulative_buckets(counts: Sequence[int]) -> list[tuple[str, float]]:
    """Per-bucket counts -> the cumulative (le, count) pairs Prometheus wants, +Inf last."""
    bounds = [*(repr(bound) for bound in REPLAY_LATENCY_BUCKETS), "+Inf"]
    padded = list(counts) + [0] * (len(bounds) - len(counts))
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(bounds, padded, strict=True):
        running += count
        out.append((bound, running))
    return out


def bucket_index(seconds: float) -> int:
    """Index into per-bucket counts for one observation (the last index is +Inf)."""
    for index, bound in enumerate(REPLAY_LATENCY_BUCKETS):
        if seconds <= bound:
            return index
    return len(REPLAY_LATENCY_BUCKETS)

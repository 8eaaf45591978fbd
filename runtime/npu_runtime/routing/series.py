"""The router's own Prometheus series, in a registry of their own (the specs are in `npu_runtime.metrics`).

`npu_router_requests_total` {endpoint, code}, `npu_router_request_seconds` {endpoint},
`npu_router_backend_seconds` {role}, `npu_router_backend_errors_total` {role, reason},
`npu_router_retries_total` {role}, `npu_router_adapter_requests_total` {adapter} (requests for a LoRA
adapter some engine holds, lora.py), with `--cache-aware` (choice.py, kv_events.py)
`npu_router_prefix_hits_total` {role, engine}, `npu_router_prefix_tokens_saved_total` {role, engine},
`npu_router_choice_reasons_total` {role, reason} and `npu_router_kv_event_streams` {engine}, and,
collected from the pools (`engines.EngineCollector`),
`npu_router_in_flight` and per engine {role, engine} `npu_router_engine_in_flight`, `_work`,
`_seconds_per_unit`, `_requests_total`, `_out`, `_ejections_total`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class Metrics:
    """The router's own series, in a registry of their own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        from npu_runtime import metrics

        self.registry: CollectorRegistry = CollectorRegistry()

        def counter(spec: metrics.MetricSpec) -> Counter:
            return Counter(spec.family_name, spec.help, spec.labels, registry=self.registry)

        def histogram(spec: metrics.MetricSpec) -> Histogram:
            buckets = metrics.ROUTER_SECONDS_BUCKETS
            return Histogram(spec.family_name, spec.help, spec.labels, buckets=buckets, registry=self.registry)

        self.requests = counter(metrics.ROUTER_REQUESTS)
        self.request_seconds = histogram(metrics.ROUTER_REQUEST_SECONDS)
        self.backend_seconds = histogram(metrics.ROUTER_BACKEND_SECONDS)
        self.backend_errors = counter(metrics.ROUTER_BACKEND_ERRORS)
        self.retries = counter(metrics.ROUTER_RETRIES)
        self.adapter_requests = counter(metrics.ROUTER_ADAPTER_REQUESTS)
        self.prefix_hits = counter(metrics.ROUTER_PREFIX_HITS)
        self.prefix_tokens_saved = counter(metrics.ROUTER_PREFIX_TOKENS_SAVED)
        self.choice_reasons = counter(metrics.ROUTER_CHOICE_REASONS)
        streams = metrics.ROUTER_KV_EVENT_STREAMS
        self.kv_event_streams = Gauge(streams.family_name, streams.help, streams.labels, registry=self.registry)

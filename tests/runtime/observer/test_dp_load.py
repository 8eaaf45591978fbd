"""The npu_engine_* series: vLLM's per-rank load gauges summed over the DP ranks, on vLLM's own /metrics.

Against registries holding gauges of the shape vLLM's PrometheusStatLogger makes (name, type, labels
model_name and engine, one child per engine), then against vLLM's real logger with two engines in a
child interpreter (the plugin loaded as in the API server). The real engine serving them on its API
port: tests/runtime/serving/test_serve_engine.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_runtime import metrics, reports
from npu_runtime.observer import dp_load
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.recorder import Recorder
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the engine-cpu extra)")

MODEL = "deepseek-ai/DeepSeek-R1"
VLLM_LABELS = ["model_name", "engine"]  # PrometheusStatLogger's labelnames
Samples = dict[str, list[tuple[dict[str, str], float]]]


def vllm_gauges(
    registry: CollectorRegistry, ranks: dict[str, tuple[int, int, float]], *, kv: bool = True
) -> dict[str, Gauge]:
    """The three gauges as PrometheusStatLogger.__init__ makes them, set as its record() sets them."""
    waiting = Gauge("vllm:num_requests_waiting", "Waiting.", VLLM_LABELS, registry=registry)
    running = Gauge("vllm:num_requests_running", "Running.", VLLM_LABELS, registry=registry)
    usage = Gauge("vllm:kv_cache_usage_perc", "KV.", VLLM_LABELS, registry=registry) if kv else None
    for engine, (w, r, u) in ranks.items():
        waiting.labels(MODEL, engine).set(w)
        running.labels(MODEL, engine).set(r)
        if usage is not None:
            usage.labels(MODEL, engine).set(u)
    return {"waiting": waiting, "running": running}


def scrape(registry: CollectorRegistry) -> Samples:
    """The exposition as a scraper reads it: family -> [(labels, value)]."""
    text = generate_latest(registry).decode()
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(text)
    }


@pytest.fixture
def observer() -> Observer:
    return Observer(Recorder(None))


def installed(observer: Observer, registry: CollectorRegistry) -> dp_load.DPLoadCollector:
    collector = dp_load.install(observer, registry=registry, environ={})
    assert collector is not None
    return collector


def test_two_ranks_are_summed_and_averaged_under_the_model_name_alone(observer: Observer) -> None:
    registry = CollectorRegistry()
    vllm_gauges(registry, {"0": (0, 2, 0.10), "1": (7, 16, 0.90)})
    installed(observer, registry)
    families = scrape(registry)
    assert families["npu_engine_num_requests_waiting"] == [({"model_name": MODEL}, 7.0)]
    assert families["npu_engine_num_requests_running"] == [({"model_name": MODEL}, 18.0)]
    [(labels, usage)] = families["npu_engine_kv_cache_usage_perc"]
    assert labels == {"model_name": MODEL}
    assert usage == pytest.approx(0.50)
    assert len(families["vllm:num_requests_waiting"]) == 2, "vLLM's own per-rank series are served as before"
    assert observer.recorder.errors == {}
    assert dp_load.INSTALLED in observer.recorder.hooks_installed


def test_the_series_are_the_ones_the_picker_is_configured_with(observer: Observer) -> None:
    """Names, type and labels: npu_runtime.metrics.ENGINE_LOAD_METRICS, which the operator's picker config
    imports (npu_operator.children.routing)."""
    from npu_operator.children import routing

    registry = CollectorRegistry()
    vllm_gauges(registry, {"0": (1, 1, 0.5)})
    installed(observer, registry)
    text = generate_latest(registry).decode()
    served = {f.name: (f.type, {k for s in f.samples for k in s.labels}) for f in text_string_to_metric_families(text)}
    for spec in metrics.ENGINE_LOAD_METRICS:
        assert served[spec.name] == ("gauge", set(spec.labels)), spec.name
    assert {routing.DP_WAITING_METRIC, routing.DP_RUNNING_METRIC, routing.DP_KV_USAGE_METRIC} == {
        spec.name for spec in metrics.ENGINE_LOAD_METRICS
    }


def test_the_values_are_read_at_each_scrape(observer: Observer) -> None:
    registry = CollectorRegistry()
    installed(observer, registry)
    assert not any(name.startswith("npu_engine_") for name in scrape(registry)), "no source gauge yet, no series"
    gauges = vllm_gauges(registry, {"0": (1, 2, 0.25), "1": (3, 4, 0.75)})
    assert scrape(registry)["npu_engine_num_requests_waiting"] == [({"model_name": MODEL}, 4.0)]
    gauges["waiting"].labels(MODEL, "1").set(10)
    assert scrape(registry)["npu_engine_num_requests_waiting"] == [({"model_name": MODEL}, 11.0)]


def test_a_missing_gauge_leaves_its_series_out_and_the_others_in(observer: Observer) -> None:
    registry = CollectorRegistry()
    vllm_gauges(registry, {"0": (2, 3, 0.0), "1": (4, 5, 0.0)}, kv=False)
    installed(observer, registry)
    families = scrape(registry)
    assert "npu_engine_kv_cache_usage_perc" not in families, "no series rather than a wrong 0"
    assert families["npu_engine_num_requests_waiting"] == [({"model_name": MODEL}, 6.0)]
    assert families["npu_engine_num_requests_running"] == [({"model_name": MODEL}, 8.0)]
    assert observer.recorder.errors == {}


def unexpected_labels(registry: CollectorRegistry) -> None:
    vllm_gauges(registry, {"0": (1, 1, 0.1)}, kv=False)
    gauge = Gauge("vllm:kv_cache_usage_perc", "KV.", [*VLLM_LABELS, "tier"], registry=registry)
    gauge.labels(MODEL, "0", "hbm").set(0.5)
    gauge.labels(MODEL, "0", "dram").set(0.1)


def unexpected_type(registry: CollectorRegistry) -> None:
    Counter("vllm:num_requests_waiting", "Waiting.", VLLM_LABELS, registry=registry).labels(MODEL, "0").inc()
    Gauge("vllm:num_requests_running", "Running.", VLLM_LABELS, registry=registry).labels(MODEL, "0").set(1)


def no_engine_label(registry: CollectorRegistry) -> None:
    Gauge("vllm:num_requests_waiting", "Waiting.", ["model_name"], registry=registry).labels(MODEL).set(3)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (unexpected_labels, "vllm:kv_cache_usage_perc has labels ['engine', 'model_name', 'tier']"),
        (unexpected_type, "vllm:num_requests_waiting is a counter, not a gauge"),
        (no_engine_label, "vllm:num_requests_waiting has labels ['model_name']"),
    ],
)
def test_an_unexpected_shape_disables_it_counts_and_the_scrape_goes_on(
    observer: Observer, make: Any, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    make(registry)
    installed(observer, registry)
    families = scrape(registry)
    assert not [name for name in families if name.startswith("npu_engine_")], "no partial, possibly wrong, sums"
    assert any(name.startswith("vllm:") for name in families), "vLLM's own series are still served"
    assert observer.recorder.errors == {dp_load.HOOK: 1}
    [unavailable] = observer.recorder.hooks_unavailable
    assert unavailable.startswith(f"{dp_load.HOOK}: {reason}"), unavailable
    assert "dp_load_metrics" in caplog.text and "the engine is unaffected" in caplog.text
    scrape(registry)
    assert observer.recorder.errors == {dp_load.HOOK: 1}, "disabled: counted once"


def test_its_own_failure_disables_it_and_the_scrape_goes_on(
    observer: Observer, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()
    vllm_gauges(registry, {"0": (1, 1, 0.1)})
    collector = installed(observer, registry)

    def broken(self: Any) -> Any:
        raise RuntimeError("our bug")

    monkeypatch.setattr(dp_load.DPLoadCollector, "read_ranks", broken)
    families = scrape(registry)
    assert "npu_engine_num_requests_waiting" not in families
    assert "vllm:num_requests_waiting" in families
    assert collector.hook.disabled
    assert observer.recorder.errors == {dp_load.HOOK: 1}


def test_it_never_collects_itself_or_the_whole_registry(observer: Observer) -> None:
    """It reads vLLM's three gauges alone: a collector of anything else in the registry is not asked."""
    registry = CollectorRegistry()
    vllm_gauges(registry, {"0": (1, 2, 0.5)})
    asked: list[str] = []

    class Other:
        def describe(self) -> list[Any]:
            return []

        def collect(self) -> Iterator[Any]:
            asked.append("other")
            return iter(())

    registry.register(Other())
    collector = installed(observer, registry)
    assert [m.name for m in collector.collect()] == [spec.name for spec in metrics.ENGINE_LOAD_METRICS]
    assert asked == []


def test_install_is_idempotent_per_registry(observer: Observer) -> None:
    registry = CollectorRegistry()
    first = installed(observer, registry)
    assert installed(observer, registry) is first  # a second register() would raise DuplicateTimeseries
    assert observer.recorder.errors == {}


def test_with_prometheus_multiproc_dir_it_refuses_clearly(observer: Observer, caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    vllm_gauges(registry, {"0": (1, 2, 0.5)})
    assert dp_load.install(observer, registry=registry, environ={dp_load.MULTIPROC_ENV: "/tmp/prom"}) is None
    assert not [name for name in scrape(registry) if name.startswith("npu_engine_")]
    assert observer.recorder.errors == {dp_load.HOOK: 1}
    [unavailable] = observer.recorder.hooks_unavailable
    assert "PROMETHEUS_MULTIPROC_DIR is set" in unavailable
    assert "PROMETHEUS_MULTIPROC_DIR is set" in caplog.text


def test_a_registry_without_restricted_registry_is_refused(observer: Observer) -> None:
    class Bare:
        def register(self, collector: Any) -> None:
            raise AssertionError("never registered")

    assert dp_load.install(observer, registry=Bare(), environ={}) is None
    assert observer.recorder.errors == {dp_load.HOOK: 1}
    assert "Bare has no restricted_registry" in observer.recorder.hooks_unavailable[0]


# ----- vLLM's real logger, the plugin loaded as in the API server -----

REAL_LOGGER = """
import json, sys
from npu_runtime import observer
observer.register()  # as vLLM's load_general_plugins does in the API server
assert "vllm.v1.metrics.loggers" not in sys.modules
from prometheus_client import generate_latest
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.metrics.loggers import PrometheusStatLogger  # the import installs the collector
from vllm.v1.metrics.prometheus import get_prometheus_registry
from vllm.v1.metrics.stats import SchedulerStats

config = EngineArgs(model=sys.argv[1], max_model_len=512, served_model_name=["tiny"]).create_engine_config()
logger = PrometheusStatLogger(config, engine_indexes=[0, 1])
logger.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5), None, engine_idx=0)
logger.record(SchedulerStats(num_running_reqs=4, num_waiting_reqs=1, num_skipped_waiting_reqs=2,
                             kv_cache_usage=0.25), None, engine_idx=1)
first = generate_latest(get_prometheus_registry()).decode()  # what attach_router's /metrics serves
# vLLM builds its gauges anew with each logger (unregister_vllm_metrics): the next scrape reads the new ones.
logger = PrometheusStatLogger(config, engine_indexes=[0, 1])
logger.record(SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.125), None, engine_idx=1)
second = generate_latest(get_prometheus_registry()).decode()
observer.recorder().flush()
import os
print(json.dumps({"first": first, "second": second, "pid": os.getpid()}))
"""

REFUSED = """
import sys
from npu_runtime import observer
observer.register()
import vllm.v1.metrics.loggers
observer.recorder().flush()
print("ok")
"""


def run_python(code: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )


def families_of(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


@needs_vllm
def test_vllms_real_logger_with_two_engines(tiny_model: Path, tmp_path: Path) -> None:
    result = run_python(REAL_LOGGER, [str(tiny_model)], {reports.ENV_DIR: str(tmp_path)})
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    first, second = families_of(out["first"]), families_of(out["second"])
    assert len(first["vllm:num_requests_waiting"]) == 2  # one series per engine, as the picker would see
    assert first["npu_engine_num_requests_waiting"] == [({"model_name": "tiny"}, 5.0)]  # 2 + 1 + 2 skipped
    assert first["npu_engine_num_requests_running"] == [({"model_name": "tiny"}, 7.0)]
    assert first["npu_engine_kv_cache_usage_perc"] == [({"model_name": "tiny"}, 0.375)]
    assert second["npu_engine_num_requests_running"] == [({"model_name": "tiny"}, 1.0)]  # engine 0 new: 0
    assert second["npu_engine_kv_cache_usage_perc"] == [({"model_name": "tiny"}, 0.0625)]
    # This process's report (vLLM may inspect the model in a child process of its own, which loads
    # the plugins too: on a fresh cache, create_engine_config runs vllm.model_executor.models.registry).
    [report] = [r for r in reports.read_reports(tmp_path) if r["pid"] == out["pid"]]
    assert dp_load.INSTALLED in report["hooks"]["installed"]
    assert report["errors"] == {}


@needs_vllm
def test_vllms_multiprocess_mode_is_refused_in_the_process_report(tmp_path: Path) -> None:
    reports_dir = tmp_path / "reports"
    reports_dir.mkdir()
    env = {reports.ENV_DIR: str(reports_dir), dp_load.MULTIPROC_ENV: str(tmp_path / "prometheus")}
    result = run_python(REFUSED, [], env)
    assert result.stdout.strip().endswith("ok"), result.stderr[-4000:]
    [report] = reports.read_reports(reports_dir)
    assert report["errors"] == {dp_load.HOOK: 1}
    assert any("PROMETHEUS_MULTIPROC_DIR is set" in what for what in report["hooks"]["unavailable"])
    assert dp_load.INSTALLED not in report["hooks"]["installed"]

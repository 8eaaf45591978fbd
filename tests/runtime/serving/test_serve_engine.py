"""`npu-runtime serve` end to end against a real vLLM engine (the CPU build) serving the tiny model.

One engine at a time (the machines have 2 cores): the planned run is shared by the tests of its
section and stopped by the SIGTERM test; the --engine-resolves-mode run is a second engine.
The failure tests at the bottom stop before any engine starts and are fast.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_runtime.contract import DEFAULT_SHUTDOWN_TIMEOUT
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.serve_helpers import ServeRun, alive

SMALL = ["--max-num-seqs", "4", "--max-model-len", "512"]


def labels_of(samples: list[tuple[str, dict[str, str], float]]) -> list[dict[str, str]]:
    return [labels for _, labels, _ in samples]


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


@pytest.fixture(scope="module")
def planned(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeRun]:
    run = ServeRun(tiny_model, SMALL, tmp_path_factory.mktemp("serve-planned"))
    pids: list[int] = []
    try:
        run.wait_ready()
        pids = run.engine_pids()
        yield run
    finally:
        run.cleanup(pids)


@pytest.mark.engine
def test_serve_plans_starts_the_engine_and_answers(planned: ServeRun) -> None:
    answer = planned.complete("Hello, world!", max_tokens=8)
    assert answer["choices"][0]["text"]
    assert answer["usage"]["completion_tokens"] == 8
    assert planned.get("/healthz") == (200, "ok\n")
    assert planned.get("/readyz") == (200, "ready\n")


@pytest.mark.engine
def test_metrics_show_the_mode_and_the_plan_downgrade(planned: ServeRun) -> None:
    families = planned.metrics()
    assert labels_of(families["npu_graph_mode_info"]) == [{"requested": "FULL_DECODE_ONLY", "effective": "NONE"}]
    [(name, labels, value)] = families["npu_graph_downgrades"]
    assert name == "npu_graph_downgrades_total"
    assert labels == {"from_mode": "FULL_DECODE_ONLY", "to_mode": "NONE", "reason": "CpuHasNoGraphs", "stage": "plan"}
    assert value == 1
    assert families["npu_graph_instrumentation_errors"] == []  # no hook failed in the real engine


@pytest.mark.engine
def test_status_agrees_and_shows_the_observer_in_every_engine_process(planned: ServeRun) -> None:
    planned.complete("Once upon a time", max_tokens=4)
    status = wait_for(lambda: (s := planned.status())["decode_steps"] > 0 and s)
    assert status, "the worker's decode-step hook never reported"
    assert status["schema"] == 1
    assert status["state"] == "ready"
    assert (status["requested_mode"], status["effective_mode"]) == ("FULL_DECODE_ONLY", "NONE")
    assert status["effective_mode_source"] == "engine"  # a worker resolved NONE, not just the plan
    assert [(d["reason"], d["stage"]) for d in status["downgrades"]] == [("CpuHasNoGraphs", "plan")]
    assert status["plan"]["effective_mode"] == "NONE"
    assert status["captures"] == []  # the CPU platform captures nothing
    assert status["failure"] is None
    assert status["engine"]["vllm_version"] == "0.31.0"
    assert status["engine"]["pid"] > 0
    processes = {p["process"]: p for p in status["observer"]["processes"]}
    assert {"MainProcess", "EngineCore"} <= set(processes)  # the API server and the engine core
    [worker] = [p for name, p in processes.items() if "Worker" in name]
    assert any(hook.endswith("_determine_batch_execution_and_padding") for hook in worker["hooks"])
    assert status["memory"]["cpu"]["kv_cache"] == 1 << 30  # from the worker's initialize_kv_cache hook


@pytest.mark.engine
def test_the_engines_measurements_become_the_next_pods_plan(planned: ServeRun, tmp_path: Path) -> None:
    # The calibration loop on the CPU build: this pod's /status -> the operator's parser and merge ->
    # the record the ConfigMap holds -> the next pod's plan.
    import json

    from npu_operator.kube import names
    from npu_operator.status import calibration as status_calibration
    from npu_operator.status.reports import parse_report
    from npu_runtime.contract import PlanOptions
    from npu_runtime.planner.plan import plan_for

    status = planned.status()
    section = parse_report(status).calibration
    assert section is not None
    assert section.measured["kv_cache_bytes"] == 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1, measured by the worker
    # The CPU build's runner has no model_memory_usage: weights are measured on NPU/CUDA only.
    assert "weights_bytes" not in section.measured
    # Two pods measured the same (the record keeps a figure only when QUORUM pods agree on it).
    reporters = [status_calibration.Reporter(f"pod-{i}", f"uid-{i}") for i in range(status_calibration.QUORUM)]
    layouts = status_calibration.expected_layouts(1, 1, 1, 1, expert=False)
    record = status_calibration.fold_record(None, [(who, section) for who in reporters], layouts)
    assert record is not None
    path = tmp_path / names.RECORD_FILE
    path.write_text(json.dumps(record))
    options = PlanOptions(max_num_seqs=4, max_model_len=512, calibration=str(path))
    model = planned.argv[planned.argv.index("--model") + 1]
    second = plan_for(options, model, resolve_mode=False, environ={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert second.calibration["record"] == "applied", second.warnings
    assert "kv_cache_bytes" in second.calibration["measured_used"]
    assert second.memory.kv_cache_bytes <= section.measured["kv_cache_bytes"]  # never more than measured
    print("record:", json.dumps(record, indent=1))
    shown = {"calibration": second.calibration, "kv_cache_bytes": second.memory.kv_cache_bytes}
    print("second plan:", json.dumps(shown))


def decode_batch_counts(run: ServeRun) -> dict[int, float]:
    return {int(labels["size"]): value for _, labels, value in run.metrics().get("npu_graph_decode_batches", [])}


@pytest.mark.engine
def test_the_decode_batches_the_engine_runs_shape_the_next_pods_capture_sizes(
    planned: ServeRun, tmp_path: Path
) -> None:
    # Issue 37 on the CPU build: a load of known batch sizes (one request alone, then three at
    # once, each exactly TOKENS tokens: ignore_eos) -> the observer's counts per decode batch
    # size -> /status's calibration.decode_batches -> the operator's fold -> the record -> the
    # next pod's plan, which captures the sizes those batches need.
    import json

    from npu_operator.status import calibration as status_calibration
    from npu_operator.status import decode_batches
    from npu_operator.status.reports import parse_report
    from npu_runtime.contract import PlanOptions
    from npu_runtime.planner.plan import plan_for

    tokens = 160
    # The counts reach /metrics with the observer's next flush: start from counts that no longer
    # move, so that an earlier test's last steps are not counted as this load's.
    previous = [decode_batch_counts(planned)]

    def unchanged() -> dict[int, float] | None:
        time.sleep(2.0)
        now = decode_batch_counts(planned)
        same = now == previous[0]
        previous[0] = now
        return now if same else None

    before = wait_for(unchanged, timeout=30.0)
    assert before is not None, "the decode batch counts never stopped moving before the load"
    planned.complete("A single request:", tokens, ignore_eos=True)
    # Three sequences at once: one request of n=3, which vLLM splits into three requests it admits
    # together (three requests from three clients were admitted a few steps apart on a loaded machine).
    answer = planned.complete("Three at once:", tokens, ignore_eos=True, n=3, temperature=1.0, seed=0)
    assert [len(choice["text"]) > 0 for choice in answer["choices"]] == [True] * 3
    expected_steps = 4 * (tokens - 1)  # each request's first token comes from its prefill step

    def settled() -> dict[int, float] | None:
        delta = {size: count - before.get(size, 0) for size, count in decode_batch_counts(planned).items()}
        delta = {size: count for size, count in delta.items() if count}
        return delta if sum(size * count for size, count in delta.items()) >= expected_steps - 8 else None

    delta = wait_for(settled, timeout=15.0)
    assert delta, f"the observer's decode batch counts never caught up: {decode_batch_counts(planned)}"
    print("decode batches counted under the load (size: steps):", dict(sorted(delta.items())))
    assert set(delta) <= {1, 2, 3}  # max_num_seqs 4, and never more than three requests at once
    assert delta[1] >= tokens - 2  # the request alone
    assert delta[3] >= tokens - 8  # the three at once
    # Request-steps: every generated token after the first, each counted in its step's batch (a
    # token decoded in a step that also prefills a newcomer is a mixed step, not a decode step).
    assert expected_steps - 8 <= sum(size * count for size, count in delta.items()) <= expected_steps

    status = planned.status()
    shown = status["calibration"]["decode_batches"]
    print("status calibration.decode_batches:", json.dumps(shown))
    assert (shown["query_len"], shown["ceiling"], shown["above_ceiling"]) == (1, 4, 0)
    assert shown["steps"] >= sum(delta.values())
    section = parse_report(status).calibration
    assert section is not None and section.decode_batches is not None
    who = status_calibration.Reporter("pod-0", "uid-0")
    layouts = status_calibration.expected_layouts(1, 1, 1, 1, expert=False)
    record = status_calibration.fold_record(None, [(who, section)], layouts)
    # One engine here, and a record's distribution needs QUORUM pods' votes: its section as two
    # replicas' reports (one pod alone votes, and the record has no distribution yet).
    limits = decode_batches.SpecLimits(1, 4)
    alone = decode_batches.fold(None, record, [("uid-0", section.key, section.decode_batches)], limits)
    assert alone is not None and "decode_batches" not in alone and len(alone["decode_batch_votes"]) == 1
    two = [(uid, section.key, section.decode_batches) for uid in ("uid-0", "uid-1")]
    record = decode_batches.fold(alone, record, two, limits)
    assert record is not None and record["decode_batches"]["steps"] == 2 * shown["steps"]
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    options = PlanOptions(max_num_seqs=4, max_model_len=512, calibration=str(path))
    model = planned.argv[planned.argv.index("--model") + 1]
    grid = plan_for(
        PlanOptions(max_num_seqs=4, max_model_len=512),
        model,
        resolve_mode=False,
        environ={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    second = plan_for(options, model, resolve_mode=False, environ={"VLLM_CPU_KVCACHE_SPACE": "1"})
    print("record decode_batches:", json.dumps(record["decode_batches"]))
    print("grid plan:", grid.capture_sizes, "next plan:", second.capture_sizes, json.dumps(second.capture_sizes_from))
    assert grid.capture_sizes == (1, 2, 4)
    assert second.calibration["record"] == "applied", second.warnings
    assert second.capture_sizes_from is not None and second.capture_sizes_from["source"] == "traffic"
    # Batches of 1 and 3 (and a few of 2): 3 is captured, the ceiling 4 kept, never more graphs than the grid.
    assert {1, 3, 4} <= set(second.capture_sizes) and len(second.capture_sizes) <= len(grid.capture_sizes)
    assert (
        second.capture_sizes_from["expected_padding"]["chosen"] < second.capture_sizes_from["expected_padding"]["grid"]
    )


ENGINE_LOAD = {  # ours -> the vLLM gauge it is taken from (npu_runtime.observer.dp_load.SOURCES)
    "npu_engine_num_requests_waiting": "vllm:num_requests_waiting",
    "npu_engine_num_requests_running": "vllm:num_requests_running",
    "npu_engine_kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
}


def api_load(run: ServeRun) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """The engine's own /metrics (API port), just vLLM's three load gauges and ours."""
    code, body = run.get("/metrics", port=run.api_port)
    assert code == 200, body
    wanted = {*ENGINE_LOAD, *ENGINE_LOAD.values()}
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(body)
        if family.name in wanted
    }


@pytest.mark.engine
def test_the_api_port_serves_the_load_over_every_dp_rank_with_the_engines_own_values(planned: ServeRun) -> None:
    """One engine here: each npu_engine_* series is that engine's vLLM series without the engine label.
    Both come from one scrape, which vLLM bakes in its event loop, where its logger's record() also runs:
    they are read at the same instant. Scraped while a long completion runs, so the values are not all 0."""
    import threading

    from npu_runtime import metrics
    from npu_runtime.observer import dp_load

    assert set(ENGINE_LOAD) == {spec.name for spec in metrics.ENGINE_LOAD_METRICS}
    answers: list[dict[str, Any]] = []
    scrapes = [api_load(planned)]
    # Rounds of 3 concurrent 400-token completions (ignore_eos: no early stop), scraped while they
    # run, until a scrape caught them running. How many scrapes fit in a round varies a lot: 3 to
    # 80 were seen on the 2-core CI machine (the engine decodes while a scrape waits its turn in
    # the API server's event loop), so rounds go on up to a deadline rather than a fixed count.
    rounds, deadline = 0, time.monotonic() + 180.0
    while not any(f["vllm:num_requests_running"][0][2] >= 1 for f in scrapes) and time.monotonic() < deadline:
        rounds += 1
        requests = [
            threading.Thread(
                target=lambda: answers.append(planned.complete("Count to a hundred:", 400, ignore_eos=True))
            )
            for _ in range(3)
        ]
        for request in requests:
            request.start()
        while any(request.is_alive() for request in requests):
            scrapes.append(api_load(planned))
        for request in requests:
            request.join()
        scrapes.append(api_load(planned))
    assert answers and all(answer["choices"][0]["text"] for answer in answers)
    for families in scrapes:
        for ours, source in ENGINE_LOAD.items():
            [(_, labels, value)] = families[source]
            assert labels["engine"] == "0"
            [(name, our_labels, our_value)] = families[ours]
            assert (name, our_labels) == (ours, {"model_name": labels["model_name"]})  # no engine label
            assert our_value == value, (ours, families)
    busy = [f for f in scrapes if f["vllm:num_requests_running"][0][2] >= 1]
    assert busy, f"no scrape in {len(scrapes)} saw the request running"
    assert max(f["npu_engine_kv_cache_usage_perc"][0][2] for f in busy) > 0
    seen = {name: sorted({f[name][0][2] for f in scrapes}) for name in ENGINE_LOAD}
    print(f"{rounds} rounds, {len(scrapes)} scrapes, {len(busy)} with the request running; values seen: {seen}")
    api_server = next(p for p in planned.status()["observer"]["processes"] if p["process"] == "MainProcess")
    assert dp_load.INSTALLED in api_server["hooks"]  # this checkout's plugin, in the API server
    assert planned.metrics()["npu_graph_instrumentation_errors"] == []


@pytest.mark.engine
def test_sigterm_exits_zero_within_the_grace_period_and_leaves_no_engine_process(planned: ServeRun) -> None:
    pids = planned.engine_pids()
    assert len(pids) >= 3
    code, took = planned.terminate(timeout=DEFAULT_SHUTDOWN_TIMEOUT + 30)
    assert code == 0, planned.log_tail()
    assert took < DEFAULT_SHUTDOWN_TIMEOUT, f"took {took:.1f} s"
    assert [pid for pid in pids if alive(pid)] == []
    assert not planned.termination.exists()  # a requested stop is not a failure


# Its own engine: --engine-resolves-mode is another engine configuration than `planned`.
@pytest.mark.engine
def test_engine_resolves_mode_and_the_observer_sees_the_downgrade(tiny_model: Path, tmp_path: Path) -> None:
    run = ServeRun(tiny_model, [*SMALL, "--engine-resolves-mode"], tmp_path)
    pids: list[int] = []
    try:
        run.wait_ready()
        pids = run.engine_pids()
        families = run.metrics()
        assert labels_of(families["npu_graph_mode_info"]) == [{"requested": "FULL_DECODE_ONLY", "effective": "NONE"}]
        [(_, labels, value)] = families["npu_graph_downgrades"]
        assert labels == {
            "from_mode": "FULL_DECODE_ONLY",
            "to_mode": "NONE",
            "reason": "CpuHasNoGraphs",
            "stage": "engine",
        }
        assert value == 1
        status = run.status()
        assert status["plan"]["effective_mode"] == "FULL_DECODE_ONLY"  # the plan left the mode to the engine
        assert status["effective_mode"] == "NONE"
        [downgrade] = status["downgrades"]
        assert (downgrade["stage"], downgrade["reason"]) == ("engine", "CpuHasNoGraphs")
        assert "cpu" in downgrade["message"]
        code, _ = run.terminate(timeout=DEFAULT_SHUTDOWN_TIMEOUT + 30)
        assert code == 0, run.log_tail()
    finally:
        run.cleanup(pids)


# ----- failures before the engine starts (fast) -----


def failing_run(model: str | Path, args: list[str], directory: Path) -> tuple[int, str, ServeRun]:
    run = ServeRun(model, args, directory)
    try:
        code = run.wait_exit(60)
    finally:
        run.cleanup()
    return code, run.termination.read_text() if run.termination.exists() else "", run


def assert_one_line(text: str, reason: str) -> str:
    assert text.endswith("\n")
    assert text.count("\n") == 1
    assert text.startswith(f"{reason}: ")
    assert len(text.encode()) < 4096
    return text


def test_a_broken_config_fails_fast_with_a_one_line_cause(tiny_model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model, broken)
    (broken / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": ')
    start = time.monotonic()
    code, text, run = failing_run(broken, SMALL, tmp_path)
    assert code != 0
    assert time.monotonic() - start < 30
    assert_one_line(text, "ModelInvalid")
    assert "config.json" in text
    assert "ModelInvalid: " in run.log_path.read_text()  # the same line on stderr


def test_a_missing_model_is_model_not_found(tmp_path: Path) -> None:
    code, text, _ = failing_run(tmp_path / "nowhere", SMALL, tmp_path)
    assert code == 1
    assert_one_line(text, "ModelNotFound")


def test_a_taken_api_port_is_port_in_use(tiny_model: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        code, text, _ = failing_run(tiny_model, [*SMALL, "--port", str(port)], tmp_path)
    assert code == 1
    assert_one_line(text, "PortInUse")
    assert str(port) in text


def test_bad_flags_are_invalid_configuration_naming_the_field(tiny_model: Path, tmp_path: Path) -> None:
    code, text, _ = failing_run(tiny_model, ["--max-num-seqs", "0"], tmp_path)
    assert code == 2
    assert "--max-num-seqs" in assert_one_line(text, "InvalidConfiguration")
    code, text, _ = failing_run(tiny_model, ["--capture-sizes", "1,2,4", "--max-capture-size", "8"], tmp_path)
    assert code == 2
    assert "--max-capture-size" in assert_one_line(text, "InvalidConfiguration")


def test_a_model_that_does_not_fit_exits_3(tiny_model: Path, tmp_path: Path) -> None:
    tiny_device = ["--device-kind", "npu", "--device-name", "Ascend910B3", "--device-memory", "1Mi"]
    code, text, run = failing_run(tiny_model, [*SMALL, *tiny_device], tmp_path)
    assert code == 3, run.log_path.read_text()
    assert_one_line(text, "ModelDoesNotFit")

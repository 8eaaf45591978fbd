"""Two `npu-runtime serve` processes as the two pods of a LeaderWorkerSet group, on CPU.

Each gets the args the operator renders for a two-node replica (one data-parallel rank per
node), expanded as the kubelet expands $(LWS_WORKER_INDEX) and $(LWS_LEADER_ADDRESS): the leader
starts vLLM's API server with its local rank, the worker vLLM's headless launcher
(`npu_runtime.serving.headless`) from data-parallel rank 1, and the leader answers completions served
by both. Dense model, eager: vLLM's CPU build has no all_gatherv for expert parallelism
(CpuCommunicator), so DP + EP is not run here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api.spec import parse_spec
from npu_operator.children import engine_pod as builders
from npu_runtime import metrics
from npu_runtime.contract import parse_serve_args
from npu_sandbox.node.network import free_port
from npu_sandbox.progress import logs_progress
from prometheus_client.parser import text_string_to_metric_families

from tests.examples import example
from tests.operator.children.test_workloads import expand
from tests.runtime.serve_helpers import ServeRun


def rendered_args(index: str, rpc_port: int) -> list[str]:
    manifest = example("sandbox-cpu.yaml")
    manifest["spec"]["npu"] = {"count": 0, "nodes": 2}
    manifest["spec"]["parallelism"] = {"data": 2}
    args = builders.runtime_args(parse_spec(manifest["spec"]))
    env = {"LWS_WORKER_INDEX": index, "LWS_LEADER_ADDRESS": "127.0.0.1"}
    expanded = expand(args, env)[2:]
    options = parse_serve_args(expanded)  # the runtime's own parser takes what the operator renders
    assert (options.plan.nodes, options.node_rank) == (2, int(index))
    # Model and ports come from ServeRun; the operator's --data-parallel-rpc-port is replaced by a free one.
    cut = expanded.index("--shutdown-timeout")
    rest = expanded[cut:]
    port_at = rest.index("--data-parallel-rpc-port") + 1
    rest[port_at] = str(rpc_port)
    return rest[: rest.index("--")] if "--" in rest else rest


# Its own engines: two serve processes as one LeaderWorkerSet group, without the operator.
@pytest.mark.engine
def test_a_two_node_replica_serves_through_its_leader(tiny_model: Path, tmp_path: Path) -> None:
    rpc_port = free_port()
    (tmp_path / "leader").mkdir()
    (tmp_path / "worker").mkdir()
    small = ["--max-num-seqs", "4", "--max-model-len", "256"]
    leader = ServeRun(tiny_model, [*rendered_args("0", rpc_port), *small], tmp_path / "leader")
    worker = ServeRun(
        tiny_model, [*rendered_args("1", rpc_port), *small, "--port", str(leader.api_port)], tmp_path / "worker"
    )
    try:
        both = logs_progress(lambda: [leader.log_path, worker.log_path])  # the group starts as one
        leader.wait_ready(both)
        worker.wait_ready(both)  # its readiness follows the leader's engine
        answers = [leader.complete(f"Hello {n}", max_tokens=4) for n in range(4)]
        assert all(a["usage"]["completion_tokens"] == 4 for a in answers)
        leader_plan, worker_plan = leader.status()["plan"], worker.status()["plan"]
        assert [n["role"] for n in leader_plan["layout"]["per_node"]] == ["leader", "worker"]
        assert worker_plan["layout"] == leader_plan["layout"]
        assert "Launching 1 data parallel engine(s) in headless mode" in worker.log_tail(400)
        check_the_load_over_both_ranks(leader)
    finally:
        worker.cleanup()
        leader.cleanup()


def check_the_load_over_both_ranks(leader: ServeRun) -> None:
    """The leader's API server fronts both DP ranks (vLLM writes a series per rank, label `engine`); its
    /metrics also carries the npu_engine_* series the picker reads (npu_runtime.observer.dp_load): the
    sums and the mean of the two ranks' series of the same scrape, which vLLM bakes in the event loop
    where its logger's record() runs. Scraped while concurrent completions run on both ranks."""
    answers: list[dict[str, Any]] = []
    scrapes = [api_load(leader)]
    for _ in range(5):  # rounds of concurrent completions, until a scrape caught both ranks running
        requests = [
            threading.Thread(target=lambda n=n: answers.append(leader.complete(f"Count to {n}:", 200)))
            for n in range(6)
        ]
        for request in requests:
            request.start()
        while any(request.is_alive() for request in requests):
            scrapes.append(api_load(leader))
        for request in requests:
            request.join()
        scrapes.append(api_load(leader))
        if any(min(ranks["vllm:num_requests_running"].values()) >= 1 for ranks, _ in scrapes):
            break
    assert answers and all(answer["choices"][0]["text"] for answer in answers)
    for ranks, ours in scrapes:
        assert all(set(per_rank) == {"0", "1"} for per_rank in ranks.values()), ranks
        assert ours["npu_engine_num_requests_waiting"] == sum(ranks["vllm:num_requests_waiting"].values())
        assert ours["npu_engine_num_requests_running"] == sum(ranks["vllm:num_requests_running"].values())
        assert ours["npu_engine_kv_cache_usage_perc"] == pytest.approx(
            sum(ranks["vllm:kv_cache_usage_perc"].values()) / 2
        )
    # Whether a scrape catches both ranks running at once depends on the CPU's speed (an AMX CPU decodes
    # these completions between two scrapes): the sums are checked in every scrape above, and two busy
    # engines' sums in tests/runtime/observer/test_dp_load.py with vLLM's own logger.
    both = [ours for ranks, ours in scrapes if min(ranks["vllm:num_requests_running"].values()) >= 1]
    print(
        f"{len(scrapes)} scrapes, {len(both)} with both ranks running; running seen:",
        sorted(
            {
                (tuple(sorted(r["vllm:num_requests_running"].items())), o["npu_engine_num_requests_running"])
                for r, o in scrapes
            }
        ),
    )


def api_load(run: ServeRun) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """From one scrape of the API port: {vLLM gauge: {engine: value}} and {npu_engine_* series: value}."""
    code, body = run.get("/metrics", port=run.api_port)
    assert code == 200, body
    ranks: dict[str, dict[str, float]] = {}
    ours: dict[str, float] = {}
    sources = {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"}
    for family in text_string_to_metric_families(body):
        if family.name in sources:
            ranks[family.name] = {s.labels["engine"]: s.value for s in family.samples}
        elif family.name.startswith("npu_engine_"):
            [sample] = family.samples  # one series: no engine label
            assert set(sample.labels) == {"model_name"}, sample
            ours[family.name] = sample.value
    assert set(ours) == {spec.name for spec in metrics.ENGINE_LOAD_METRICS}, sorted(ours)
    return ranks, ours

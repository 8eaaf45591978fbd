"""`serve --data-parallel-external`: one API server per local rank, as vllm-ascend's launch_online_dp.py starts them.

vllm-ascend v0.23.0 examples/external_online_dp/launch_online_dp.py: local rank i of a node gets
`--port start + i`, `--data-parallel-rank rank_start + i` and ASCEND_RT_VISIBLE_DEVICES of its tp devices;
run_dp_template.sh adds --data-parallel-size, --data-parallel-address and --data-parallel-rpc-port.
"""

from __future__ import annotations

import sys

import pytest
from npu_runtime.contract import ServeOptions, parse_serve_args, serve_argv
from npu_runtime.planner.plan import Plan, make_plan
from npu_runtime.serving import launch, ranks
from npu_runtime.serving.serve import ServeError, Supervisor

from tests.runtime.conftest import FIXTURES, load_model
from tests.runtime.planner.test_plan_moe import A2

# DeepSeek-R1 W8A8 on two 8-NPU nodes: data parallel 4 x tensor parallel 4, two ranks per node.
ARGS = ["--nodes", "2", "--data-parallel", "4", "--tensor-parallel", "4", "--enable-expert-parallel"]
ARGS += ["--max-model-len", "4096", "--data-parallel-external", "--data-parallel-address", "r1-0.r1.llm"]


def worker(*more: str, model: str = "deepseek-r1-w8a8") -> tuple[ServeOptions, Plan]:
    options = parse_serve_args(["--model", str(FIXTURES / model), *ARGS, "--node-rank", "1", *more])
    return options, make_plan(options.plan, A2, load_model(model))


def test_the_flag_goes_through_the_serve_contract() -> None:
    options, _ = worker()
    assert options.data_parallel_external
    assert parse_serve_args(serve_argv(options)) == options
    assert not parse_serve_args(["--model", "/m"]).data_parallel_external


def test_each_local_rank_gets_its_rank_port_and_devices() -> None:
    options, plan = worker()
    ranks.check_external(options, plan)
    found = ranks.local_ranks(options, plan, {})
    assert found == [
        ranks.Rank(local=0, rank=2, port=8000, devices="0,1,2,3"),
        ranks.Rank(local=1, rank=3, port=8001, devices="4,5,6,7"),
    ]
    # The devices the device plugin gave the pod, where it says which: each rank its own slice of them.
    given = ranks.local_ranks(options, plan, {"ASCEND_RT_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15"})
    assert [rank.devices for rank in given] == ["8,9,10,11", "12,13,14,15"]
    assert ranks.rank_engine_args(options, found[1], "10.0.0.5") == (
        "--data-parallel-rank",
        "3",
        "--data-parallel-address",
        "r1-0.r1.llm",
        "--data-parallel-rpc-port",
        "13389",
    )


def test_on_one_node_rank_0_is_this_pods_own_address_and_a_cpu_has_no_device_variable() -> None:
    options = parse_serve_args(["--model", "/m", "--data-parallel", "2", "--data-parallel-external"])
    rank = ranks.Rank(local=1, rank=1, port=8001, devices=None)
    assert ranks.rank_engine_args(options, rank, "127.0.0.7")[2:4] == ("--data-parallel-address", "127.0.0.7")


def test_the_supervisor_starts_one_api_server_per_rank() -> None:
    options, plan = worker()
    supervisor = Supervisor(options, environ={"PATH": "/bin"})
    try:
        supervisor.ranks = ranks.local_ranks(options, plan, supervisor.environ)
        group = supervisor.start_engine(plan)
        assert isinstance(group, ranks.EngineGroup) and len(group.processes) == 2
        first, second = (process.argv for process in group.processes)
        assert first[first.index("--port") + 1] == "8000" and second[second.index("--port") + 1] == "8001"
        assert second[second.index("--data-parallel-rank") + 1] == "3"
        assert "--data-parallel-size-local" not in second and "--headless" not in second
        assert second[second.index("--data-parallel-size") + 1] == "4"
        assert [process.env["ASCEND_RT_VISIBLE_DEVICES"] for process in group.processes] == ["0,1,2,3", "4,5,6,7"]
        assert second[1:3] == ["-m", launch.ENGINE_MODULE]  # an API server on every node, none headless
        # A worker pod's ranks serve their own API: /readyz asks them, not the leader.
        assert supervisor.health_url == "http://127.0.0.1:8000/health"
    finally:
        supervisor.close()


def test_a_dense_model_or_a_single_rank_is_refused_before_the_engine() -> None:
    options, plan = worker(model="llama-3.1-8b")
    with pytest.raises(Exception, match="needs a MoE model: vLLM refuses external data parallelism"):
        ranks.check_external(options, plan)
    supervisor = Supervisor(options, environ={})
    try:
        with pytest.raises(ServeError, match="--data-parallel: --data-parallel-external needs a MoE model"):
            supervisor.plan_ranks(plan)
    finally:
        supervisor.close()
    single = parse_serve_args(["--model", str(FIXTURES / "deepseek-v2-lite"), "--data-parallel-external"])
    with pytest.raises(Exception, match="needs more than one data-parallel rank"):
        ranks.check_external(single, make_plan(single.plan, A2, load_model("deepseek-v2-lite")))


def test_the_group_fails_when_one_rank_exits_and_stops_the_others() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    failing = [sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(3)"]
    group = ranks.EngineGroup([launch.EngineProcess(sleeper, {}), launch.EngineProcess(failing, {})])
    group.start()
    try:
        assert group.alive() and group.poll() is None
        assert group.processes[1].wait(30) == 3
        assert group.poll() == 3 and not group.alive()
        group.finish()
        assert group.processes[0].wait(10) is not None  # the surviving rank is ended with it
    finally:
        group.kill_group()


def test_a_stop_ends_every_rank() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    group = ranks.EngineGroup([launch.EngineProcess(sleeper, {}) for _ in range(2)])
    group.start()
    code, killed = group.stop(10)
    assert code == -15 and not killed
    assert all(process.poll() == -15 for process in group.processes)

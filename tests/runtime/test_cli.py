"""The command-line contract of `npu-runtime probe` and `npu-runtime plan`, through real processes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from npu_runtime import cli
from npu_sandbox.node.network import free_port

from .conftest import FIXTURES, MODEL_NAMES

NPU_64 = ["--device-kind", "npu", "--device-name", "Ascend910B3", "--device-memory", "64Gi"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_", "VLLM_", "ASCEND_"))}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "npu_runtime.cli", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


def plan_json(*args: str) -> dict[str, Any]:
    done = run("plan", *args, "--json")
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)  # exactly one JSON document, nothing else
    return parsed


def test_plan_json_has_the_contract_keys() -> None:
    plan = plan_json("--model", str(FIXTURES / "qwen2.5-7b"), *NPU_64, "--max-num-seqs", "12", "--tensor-parallel", "2")
    assert plan["requested_mode"] == plan["effective_mode"] == "FULL_DECODE_ONLY"
    assert plan["capture_sizes"] == [1, 2, 4, 8, 12]
    assert plan["downgrades"] == []
    assert {"total_bytes", "weights_bytes", "kv_cache_bytes", "graph_bytes", "activation_bytes"} <= set(plan["memory"])
    assert plan["memory"]["total_bytes"] == 64 << 30
    assert all(isinstance(a, str) for a in plan["vllm_args"])
    assert isinstance(plan["warnings"], list)


def test_plan_json_downgrade_objects() -> None:
    plan = plan_json("--model", str(FIXTURES / "qwen2.5-7b" / "config.json"), "--device-kind", "cpu",
                     "--device-memory", "32GiB", "--max-model-len", "4096")  # fmt: skip
    assert plan["effective_mode"] == "NONE"
    assert plan["capture_sizes"] == []
    assert plan["downgrades"] == [
        {
            "from_mode": "FULL_DECODE_ONLY",
            "to_mode": "NONE",
            "reason": "CpuHasNoGraphs",
            "message": plan["downgrades"][0]["message"],
        }
    ]


def test_size_units() -> None:
    bytes_given = plan_json("--model", str(FIXTURES / "qwen2.5-7b"), "--device-kind", "npu",
                            "--device-memory", str(32 << 30), "--max-model-len", "4096")  # fmt: skip
    gib_given = plan_json("--model", str(FIXTURES / "qwen2.5-7b"), "--device-kind", "npu",
                          "--device-memory", "32Gi", "--max-model-len", "4096")  # fmt: skip
    assert bytes_given["memory"] == gib_given["memory"]


def test_readable_table() -> None:
    done = run("plan", "--model", str(FIXTURES / "deepseek-v2-lite"), *NPU_64, "--tensor-parallel", "2")
    assert done.returncode == 0, done.stderr
    for text in ("memory per device", "kv cache", "FULL_DECODE_ONLY", "vllm args --compilation-config"):
        assert text in done.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--capture-sizes", "1,8,4"], "--capture-sizes"),
        (["--capture-sizes", "1,x"], "--capture-sizes"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--gpu-memory-utilization", "1.2"], "--gpu-memory-utilization"),
        (["--device-memory", "lots"], "--device-memory"),
        (["--graph-mode", "ALWAYS"], "--graph-mode"),
        (["--tensor-parallel", "8"], "--tensor-parallel"),
        (["--speculative-tokens", "2"], "--speculative-method"),
        (["--max-model-len", "999999999"], "--max-model-len"),
    ],
)
def test_invalid_input_exits_2_naming_the_field(args: list[str], field: str) -> None:
    done = run("plan", "--model", str(FIXTURES / "qwen2.5-7b"), *NPU_64, *args, "--json")
    assert done.returncode == 2
    assert field in done.stderr
    assert done.stdout == ""


def test_broken_model_exits_2(tmp_path: Any) -> None:
    missing = run("plan", "--model", str(tmp_path), *NPU_64)
    assert missing.returncode == 2
    assert "model:" in missing.stderr
    assert "config.json" in missing.stderr
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    broken = run("plan", "--model", str(tmp_path), *NPU_64)
    assert broken.returncode == 2
    assert "num_hidden_layers" in broken.stderr


def test_a_device_kind_without_its_memory_exits_2() -> None:
    done = run("plan", "--model", str(FIXTURES / "qwen2.5-7b"), "--device-kind", "npu")  # this machine: a CPU
    assert done.returncode == 2
    assert "--device-memory" in done.stderr


def test_a_named_npu_plans_without_its_memory_and_hccl_buffsize_reaches_the_plan() -> None:
    args = ["--model", str(FIXTURES / "deepseek-r1-w8a8"), "--device-kind", "npu", "--device-name", "Ascend910_9392"]
    args += ["--device-count", "16", "--tensor-parallel", "4", "--data-parallel", "4", "--enable-expert-parallel"]
    args += ["--max-model-len", "16384", "--max-num-seqs", "16"]
    from_env = json.loads(run("plan", *args, "--json", env={"HCCL_BUFFSIZE": "1024"}).stdout)
    from_flag = plan_json(*args, "--hccl-buffsize", "1024")
    assert from_env["device"]["source"] == "device-table"
    assert from_env["memory"]["hccl_buffsize_mb"] == from_flag["memory"]["hccl_buffsize_mb"] == 1024


def test_model_that_cannot_fit_exits_3_with_numbers() -> None:
    done = run("plan", "--model", str(FIXTURES / "qwen2.5-72b-instruct"), "--device-kind", "npu",
               "--device-memory", "32Gi", "--json")  # fmt: skip
    assert done.returncode == 3
    assert "135.43 GiB" in done.stderr
    assert "32.00 GiB" in done.stderr
    assert done.stdout == ""


def test_environment_reaches_the_plan() -> None:
    model = str(FIXTURES / "llama-3.1-70b")
    args = ["--model", model, *NPU_64, "--tensor-parallel", "8", "--graph-mode", "PIECEWISE"]
    args += ["--max-model-len", "8192", "--stream-budget", "1800", "--json"]  # our own cap: no release has one
    default = json.loads(run("plan", *args).stdout)
    aiv = json.loads(run("plan", *args, env={"HCCL_OP_EXPANSION_MODE": "AIV"}).stdout)
    assert (default["streams"]["hccl_op_expansion_mode"], aiv["streams"]["hccl_op_expansion_mode"]) == (
        "default",
        "AIV",
    )
    assert len(default["capture_sizes"]) < len(aiv["capture_sizes"])


def test_engine_release_and_flashcomm1_select_the_rules() -> None:
    model = str(FIXTURES / "qwen3-32b")
    args = ["--model", model, *NPU_64, "--tensor-parallel", "4", "--max-num-seqs", "64", "--json"]
    for release in ("0.23.0", "0.25.1rc1"):
        plan = json.loads(run("plan", *args, "--engine-release", release, "--flashcomm1").stdout)
        assert (plan["engine_release"], plan["flashcomm1"]) == (release, True)
        assert plan["capture_sizes"][:2] == [4, 8]  # flashcomm1 keeps multiples of TP only
        assert plan["capture_size_steps"][-1]["sizes"] == plan["capture_sizes"]
    refused = run("plan", *args, "--engine-release", "0.9.0")
    assert refused.returncode == 2 and "--engine-release" in refused.stderr


def test_probe_json() -> None:
    done = run("probe", "--json")
    assert done.returncode == 0, done.stderr
    device = json.loads(done.stdout)
    assert set(device) == {"kind", "name", "count", "total_bytes", "free_bytes", "source"}
    assert device["kind"] in ("npu", "cuda", "cpu")
    readable = run("probe")
    assert readable.returncode == 0
    assert "found by:" in readable.stdout


def test_usage_and_unknown_commands() -> None:
    assert run().returncode == 2
    assert run("--help").returncode == 0
    assert run("plan", "--help").returncode == 0
    unknown = run("frobnicate")
    assert unknown.returncode == 2
    assert "unknown command" in unknown.stderr


def test_a_subcommand_is_one_table_entry(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.COMMANDS, "serve", ("tests.runtime.test_cli:fake_serve", "start serving"))
    assert cli.main(["serve", "--model", "x"]) == 7
    assert capsys.readouterr().out == "serve ['--model', 'x']\n"


def fake_serve(argv: list[str]) -> int:
    print("serve", argv)
    return 7


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_every_fixture_model_plans_in_process_and_by_the_command(model_name: str) -> None:
    # How fast is measured by scripts/bench_planner.py (in process and the whole command), not here:
    # a timed assertion flakes on a loaded machine.
    from npu_runtime.contract import PlanOptions
    from npu_runtime.planner.plan import DoesNotFitError, PlanError, plan_for

    options = PlanOptions(device_kind="npu", device_name="Ascend910B3", device_memory=64 << 30, tensor_parallel=8)
    with contextlib.suppress(DoesNotFitError, PlanError):
        plan_for(options, str(FIXTURES / model_name))
    done = run("plan", "--model", str(FIXTURES / model_name), *NPU_64, "--tensor-parallel", "4", "--json")
    assert done.returncode in (0, 2, 3), done.stderr


def test_runtime_imports_without_torch_or_vllm() -> None:
    code = (
        "import sys, npu_runtime.cli, npu_runtime.planner.plan, npu_runtime.planner.probe, npu_runtime.planner.model;"
        "import npu_runtime.planner.modes, npu_runtime.planner.sizes;"
        "print(sorted(m for m in ('torch', 'torch_npu', 'vllm', 'vllm_ascend') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_every_plan_field_names_its_option() -> None:
    import dataclasses

    from npu_runtime.contract import PlanOptions, option_name

    known = {option for action in cli.plan_parser()._actions for option in action.option_strings}
    assert {option_name(field.name) for field in dataclasses.fields(PlanOptions)} <= known
    assert option_name("ASCEND_LAUNCH_BLOCKING") == "ASCEND_LAUNCH_BLOCKING"  # environment variables stay


@pytest.mark.parametrize(
    ("kind", "why"),
    [("fifo", "is a FIFO, not a regular file"), ("device", "is a character device"), ("binary", "not UTF-8")],
)
def test_plan_and_serve_refuse_special_and_binary_config_files_up_front(tmp_path: Any, kind: str, why: str) -> None:
    """A FIFO config.json hung `serve` (liveness OK) until the startup probe gave up."""
    config = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "device":
        config.symlink_to("/dev/zero")
    else:
        config.write_bytes(b'{"architectures": ["\xff\xfe"]}')
    plan = run("plan", "--model", str(tmp_path), *NPU_64)
    assert (plan.returncode, "Traceback" in plan.stderr) == (2, False), plan.stderr
    assert f"{config}: {why}" in plan.stderr
    log = tmp_path / "termination-log"
    ports = ["--port", str(free_port()), "--metrics-port", str(free_port())]  # not fixed ones: tests run in parallel
    serve = run("serve", "--model", str(tmp_path), *ports, "--termination-log", str(log), *NPU_64)
    assert serve.returncode != 0 and "Traceback" not in serve.stderr, serve.stderr
    assert log.read_text(encoding="utf-8").startswith(f"ModelInvalid: {config}: {why}")

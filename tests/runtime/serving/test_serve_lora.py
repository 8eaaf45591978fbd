"""`npu-runtime serve --lora-adapters` against a real vLLM engine (the CPU build) and the tiny model's adapters.

Two engines for the whole module, started at once: `npu-runtime serve` with the list file, and vLLM's
own API server started by hand with `--enable-lora --lora-modules` (the reference answer). The tests
run in order on the one serve: its adapter answers as vLLM's does, an adapter added to the list is
served by the same engine process, a broken one is reported while the first serves, a removed one
is unloaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_sandbox.node.network import free_port

from tests.runtime.serve_helpers import ServeRun, serve_environment

SMALL = ["--max-num-seqs", "4", "--max-model-len", "512"]
LORA = ["--max-loras", "2", "--max-lora-rank", "8", "--max-cpu-loras", "4"]
PROMPT = "The capital of France is"
pytestmark = pytest.mark.engine


def build_lora(directory: Path, *flags: str) -> Path:
    subprocess.run([sys.executable, "-m", "npu_sandbox.fixtures.tiny_lora", *flags, str(directory)], check=True)
    return directory


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {
        "a1": build_lora(root / "a1"),
        "a2": build_lora(root / "a2", "--seed", "11"),
        "big": build_lora(root / "big", "--rank", "64"),
    }


def write_list(path: Path, adapters: dict[str, Path]) -> None:
    body = {"base_model": "tiny", "adapters": [{"name": n, "path": str(p)} for n, p in adapters.items()]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)  # as the kubelet swaps a ConfigMap's file


def post(port: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read() or b"{}")


def completion(port: int, model: str) -> tuple[int, str]:
    status, answer = post(
        port, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    )
    return status, (answer["choices"][0]["text"] if status == 200 else json.dumps(answer))


def wait_for(predicate: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return value


@pytest.fixture(scope="module")
def engines(
    tiny_model: Path, loras: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServeRun, int, Path]]:
    """(serve, the hand-started vLLM's port, the list file), both engines started at once."""
    directory = tmp_path_factory.mktemp("serve-lora")
    adapters = directory / "adapters.json"
    write_list(adapters, {"a1": loras["a1"]})
    port = free_port()
    module = {"name": "a1", "path": str(loras["a1"]), "base_model_name": "tiny"}
    # The same engine flags as serve's plan (graph mode, sizes, --enable-lora ...), then vLLM's --lora-modules.
    planned = subprocess.run(
        [sys.executable, "-m", "npu_runtime.cli", "plan", "--model", str(tiny_model), "--json", *SMALL, *LORA],
        check=True, capture_output=True, text=True, env=serve_environment(),
    )  # fmt: skip
    reference_argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        *json.loads(planned.stdout)["vllm_args"], "--lora-modules", json.dumps(module),
    ]  # fmt: skip
    assert "--enable-lora" in reference_argv
    log = open(directory / "vllm.log", "w")  # noqa: SIM115 (closed below)
    reference = subprocess.Popen(
        reference_argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=serve_environment({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}),
        start_new_session=True,
    )
    run = ServeRun(
        tiny_model, ["--served-model-name", "tiny", *LORA, "--lora-adapters", str(adapters), *SMALL], directory
    )
    pids: list[int] = []
    try:
        run.wait_ready()
        pids = run.engine_pids()
        assert wait_for(lambda: _healthy(port), timeout=600), (directory / "vllm.log").read_text()[-3000:]
        yield run, port, adapters
    finally:
        reference.terminate()
        try:
            reference.wait(30)
        except subprocess.TimeoutExpired:
            reference.kill()
        log.close()
        run.cleanup(pids)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def lora_requests(run: ServeRun) -> dict[str, float]:
    return {labels["adapter"]: value for _, labels, value in run.metrics().get("npu_lora_requests", [])}


def adapter_states(run: ServeRun) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in run.status().get("adapters", [])}


def test_the_adapter_answers_as_vllm_serves_it(engines: tuple[ServeRun, int, Path]) -> None:
    run, reference, _ = engines
    assert adapter_states(run) == {"a1": {"name": "a1", "state": "loaded", "reason": None, "message": None}}
    base, adapted = completion(run.api_port, "tiny"), completion(run.api_port, "a1")
    assert base[0] == adapted[0] == 200
    assert adapted[1] != base[1]
    assert adapted == completion(reference, "a1")
    assert base == completion(reference, "tiny")
    loaded = {labels["adapter"]: value for _, labels, value in run.metrics()["npu_lora_adapter_loaded"]}
    assert loaded == {"a1": 1.0}
    assert wait_for(lambda: lora_requests(run).get("a1") == 1.0, timeout=10), lora_requests(run)


def test_an_added_adapter_is_served_by_the_same_engine(
    engines: tuple[ServeRun, int, Path], loras: dict[str, Path]
) -> None:
    run, _, adapters = engines
    pid = run.status()["engine"]["pid"]
    write_list(adapters, {"a1": loras["a1"], "a2": loras["a2"]})
    assert wait_for(lambda: adapter_states(run).get("a2", {}).get("state") == "loaded"), adapter_states(run)
    status, text = completion(run.api_port, "a2")
    assert status == 200 and text != completion(run.api_port, "a1")[1]
    assert run.status()["engine"]["pid"] == pid
    assert run.process.poll() is None


def test_a_broken_adapter_is_reported_while_the_others_serve(
    engines: tuple[ServeRun, int, Path], loras: dict[str, Path]
) -> None:
    run, _, adapters = engines
    write_list(adapters, {"a1": loras["a1"], "a2": loras["a2"], "big": loras["big"]})
    assert wait_for(lambda: adapter_states(run).get("big", {}).get("state") == "failed"), adapter_states(run)
    big = adapter_states(run)["big"]
    assert big["reason"] == "AdapterInvalid"
    assert "rank 64 is greater than --max-lora-rank 8" in big["message"]
    assert completion(run.api_port, "a1")[0] == 200
    assert completion(run.api_port, "big")[0] == 404


def test_a_removed_adapter_is_unloaded(engines: tuple[ServeRun, int, Path], loras: dict[str, Path]) -> None:
    run, _, adapters = engines
    write_list(adapters, {"a1": loras["a1"]})
    assert wait_for(lambda: set(adapter_states(run)) == {"a1"}), adapter_states(run)
    assert completion(run.api_port, "a2")[0] == 404
    assert completion(run.api_port, "a1")[0] == 200
    models = json.loads(run.get("/v1/models", port=run.api_port)[1])
    assert sorted(m["id"] for m in models["data"]) == ["a1", "tiny"]

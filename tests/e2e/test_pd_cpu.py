"""Prefill/decode disaggregation on CPU, end to end: two real vLLM engines (the CPU build) and the router.

The engines are started by the real `npu-runtime serve` with the arguments the operator renders
for examples/sandbox-cpu-pd.yaml (the DisaggregatedSet's prefill and decode roles, $(VAR)s expanded
as the kubelet would, only the model path, ports and storage folder made local); on a CPU the
runtime maps their Mooncake connector to vLLM's file-based ExampleConnector. The router runs as
`npu-runtime route` with the rendered router arguments, pointed at the two engines.

One request through the router must: leave the prompt's KV as files in the shared folder (the
prefill engine's save), make the decode engine log "External Cache Hit!" (its load), and answer
with exactly the text the prefill engine alone (a non-disaggregated engine: it prefills and
decodes itself) generates greedily for the same prompt, which is longer than one KV block. Each
engine's /status names its role, its connector, and its graph mode. Both engines are shared by all
the assertions: one engine pair per CI run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_operator import disaggregation
from npu_operator.api import parse_spec
from npu_operator.config import OperatorConfig
from npu_runtime.contract import parse_serve_args, serve_argv
from npu_runtime.routing.router import parse_route_args, route_argv
from npu_sandbox.kubelet import free_port

from tests.runtime.serve_helpers import ServeRun

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sandbox-cpu-pd.yaml"
READY_TIMEOUT = 600.0  # two cold engine starts sharing 2 cores
# ServeRun sets these itself (local ports, host, termination file, the generated model).
LOCAL_FLAGS = ("--model", "--port", "--metrics-port", "--host", "--termination-log")
PROMPT = " ".join(f"the quick brown fox number {i} jumps over the lazy dog" for i in range(15))
MAX_TOKENS = 12


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(NAME) expansion of container args."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg) for arg in args]


def role_args(role: dict[str, Any], pod: str, model: Path, storage: Path) -> list[str]:
    """The rendered `serve` args of a role's pod, made local."""
    container = role["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    env = {"POD_NAME": pod, "LWS_WORKER_INDEX": "0", "LWS_LEADER_ADDRESS": "127.0.0.1"}
    args = expand(container["args"], env)
    assert args[:2] == ["npu-runtime", "serve"]
    options = parse_serve_args(args[2:])
    assert options.kv_transfer_config is not None
    config = json.loads(options.kv_transfer_config)
    config["kv_connector_extra_config"]["shared_storage_path"] = str(storage)
    options = dataclasses.replace(options, model=str(model), kv_transfer_config=json.dumps(config))
    argv = serve_argv(options)
    for flag in LOCAL_FLAGS:  # ServeRun puts its own first; drop the rendered ones (argparse keeps the last)
        while flag in argv[: argv.index("--") if "--" in argv else len(argv)]:
            at = argv.index(flag)
            del argv[at : at + 2]
    return argv


@dataclasses.dataclass
class PD:
    prefill: ServeRun
    decode: ServeRun
    router_url: str
    storage: Path


def post(url: str, body: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


@pytest.fixture(scope="module")
def pd(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PD]:
    manifest = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    spec = parse_spec(manifest["spec"])
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    ds = disaggregation.build_disaggregated_set(name, namespace, spec, OperatorConfig())
    roles = {role["name"]: role for role in ds["spec"]["roles"]}
    storage = tmp_path_factory.mktemp("kv")
    runs: dict[str, ServeRun] = {}
    router: subprocess.Popen[bytes] | None = None
    try:
        for role in ("prefill", "decode"):
            args = role_args(roles[role], f"{name}-{role}-0", tiny_model, storage)
            runs[role] = ServeRun(tiny_model, args, tmp_path_factory.mktemp(role))
        for run in runs.values():
            run.wait_ready(READY_TIMEOUT)
        rendered = disaggregation.build_router(name, namespace, spec, OperatorConfig())
        router_args = rendered["spec"]["template"]["spec"]["containers"][0]["args"]
        assert router_args[:2] == ["npu-runtime", "route"]
        options = dataclasses.replace(
            parse_route_args(router_args[2:]),
            prefill=(f"http://127.0.0.1:{runs['prefill'].api_port}",),
            decode=(f"http://127.0.0.1:{runs['decode'].api_port}",),
            host="127.0.0.1",
            port=free_port(),
            metrics_port=free_port(),
        )
        argv = [*route_argv(options), "--host", "127.0.0.1"]
        router = subprocess.Popen([sys.executable, "-m", "npu_runtime.cli", "route", *argv])
        url = f"http://127.0.0.1:{options.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = f"http://127.0.0.1:{options.metrics_port}/readyz"
            with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=3):
                break
            time.sleep(0.3)
        yield PD(runs["prefill"], runs["decode"], url, storage)
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        for run in runs.values():
            pids: list[int] = []
            with contextlib.suppress(Exception):
                pids = run.engine_pids()
            run.cleanup(pids)


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_a_completion_through_the_router_equals_one_engines_greedy_output(pd: PD) -> None:
    model = pd.decode.model_name()
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    assert list(pd.storage.iterdir()) == []
    routed = post(pd.router_url + "/v1/completions", body)
    prompt_tokens = routed["usage"]["prompt_tokens"]
    assert prompt_tokens > 128, f"the prompt must fill more than one KV block (128 tokens on CPU): {prompt_tokens}"

    # The transfer: the prefill engine saved the prompt's KV as files, the decode engine loaded them.
    saved = [path for folder in pd.storage.iterdir() for path in folder.glob("*.safetensors")]
    assert saved, f"no KV files in {pd.storage}"
    assert "External Cache Hit!" in pd.decode.log_path.read_text(errors="replace")

    # The same prompt on one engine alone (prefill and decode in the same engine), greedy.
    alone = post(f"http://127.0.0.1:{pd.prefill.api_port}/v1/completions", body)
    assert routed["choices"][0]["text"] == alone["choices"][0]["text"]
    assert routed["usage"]["completion_tokens"] == MAX_TOKENS


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_each_engine_reports_its_role_connector_and_graph_mode(pd: PD) -> None:
    for role, run in (("prefill", pd.prefill), ("decode", pd.decode)):
        status = run.status()
        kv = status["plan"]["kv_transfer"]
        assert kv["role"] == role
        assert (kv["requested_connector"], kv["connector"]) == ("MooncakeConnectorV1", "ExampleConnector")
        assert "needs an NPU" in kv["note"]
        # The decode role asks for FULL_DECODE_ONLY, which a CPU cannot capture: NONE, with the reason.
        requested = "NONE" if role == "prefill" else "FULL_DECODE_ONLY"
        assert (status["requested_mode"], status["effective_mode"]) == (requested, "NONE")
        if role == "decode":
            assert status["downgrades"], "the decode role's downgrade is reported"

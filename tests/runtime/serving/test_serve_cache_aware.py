"""Cache-aware routing with real vLLM CPU engines: a conversation's next turn goes to the prefill engine
whose own KV events hold its first turn, and that engine's own prefix-cache counter shows the hit.

The engines get the args the operator renders for `sandbox-cpu-pd.yaml` with `spec.cacheAwareRouting`
(`serve --kv-events`: prefix caching, sha256_cbor block hashes, block size 128, vLLM's ZMQ publisher
and replay endpoint), two prefill pods and one decode pod, each `npu-runtime serve` on an address of its
own on this machine's loopback (the sandbox's pod network), so that each engine's event ports are its
own as a pod's are. The router gets the rendered `route` args (`--cache-aware`, the event and replay
ports) with the role Services' names replaced by the pods' addresses.

Three conversations are begun one after another, then each is continued in the same order (an order
that ties taken in turn, the load-only choice among idle engines, would not follow). Then the router
is restarted: the new one has seen no request, reads what the engines stored from their replay
buffers, and still sends a third turn to its engine.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from npu_operator.api.spec import parse_spec
from npu_operator.children import disaggregated
from npu_runtime.contract import KV_EVENTS_BLOCK_SIZE
from npu_sandbox.node.network import PodNetwork, free_port
from npu_sandbox.progress import logs_progress
from prometheus_client.parser import text_string_to_metric_families

from tests.examples import example
from tests.operator.topologies.test_disaggregated import container, expand, pod_env, roles
from tests.runtime.serve_helpers import (
    ServeRun,
    post_json,
    rendered_serve_args,
    route_command,
    serve_environment,
    wait_router,
)

MODEL_LEN = 512
SMALL = ["--max-num-seqs", "4", "--max-model-len", str(MODEL_LEN)]
HIT_COUNTER = "vllm:prefix_cache_hits_total"


def manifest() -> dict[str, Any]:
    found = example("sandbox-cpu-pd.yaml")
    found["spec"]["cacheAwareRouting"] = {}
    return found


def serve_args(role: str, storage: Path, address: str) -> list[str]:
    """The role's rendered serve args from --shutdown-timeout on, for a pod at `address`, with this
    test's KV folder."""
    lws = roles(manifest())[role]
    env = {**pod_env(lws, f"{role}-0"), "POD_IP": address}
    rest = rendered_serve_args(expand(container(lws)["args"], env), storage)
    assert "--kv-events" in rest, rest
    return [*rest, *SMALL]


def router_command(prefill: list[ServeRun], decode: ServeRun, port: int, metrics_port: int) -> list[str]:
    options = disaggregated.router_options("x", "ns", parse_spec(manifest()["spec"]))
    assert options.cache_aware and options.kv_events_port and options.kv_replay_port
    prefill_urls = [f"http://{run.host}:{run.api_port}" for run in prefill]
    return route_command(options, prefill_urls, [f"http://{decode.host}:{decode.api_port}"], port, metrics_port)


def counter(run: ServeRun, name: str) -> float:
    """The engine's own counter `name` (vLLM's /metrics on its API port)."""
    with urllib.request.urlopen(f"http://{run.host}:{run.api_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


class Router:
    """`npu-runtime route` with the rendered args, started and stopped by the test."""

    def __init__(self, prefill: list[ServeRun], decode: ServeRun, log: Path) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        with log.open("a") as out:
            self.process = subprocess.Popen(
                router_command(prefill, decode, self.port, self.metrics_port),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=serve_environment(),
            )
        self.log = log
        wait_router(self.metrics_port, self.process, log)

    def streams_live(self, count: int, seconds: float = 10) -> None:
        """Until `count` engines' event streams are live (npu_router_kv_event_streams)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
            live = [
                s
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "npu_router_kv_event_streams"
            ]
            if sum(s.value for s in live) >= count:
                return
            time.sleep(0.5)
        raise AssertionError(f"event streams not live:\n{self.log.read_text()[-3000:]}")

    def complete(self, model: str, prompt: str) -> str:
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        text: str = post_json(f"http://127.0.0.1:{self.port}/v1/completions", body)["choices"][0]["text"]
        return text

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


WORDS = ("graph", "capture", "replay", "decode", "prefill", "token", "cache", "block", "engine", "router", "pod")


def first_turn(run: ServeRun, model: str, seed: int, tokens: int = 320) -> str:
    """A prompt of about `tokens` tokens (as the engine's /tokenize counts them), its own for `seed`."""
    words: list[str] = []
    while True:
        words += [f"{WORDS[(seed * 7 + len(words)) % len(WORDS)]}{seed}" for _ in range(20)]
        prompt = " ".join(words)
        count = post_json(f"http://{run.host}:{run.api_port}/tokenize", {"model": model, "prompt": prompt})["count"]
        if count >= tokens:
            assert count < MODEL_LEN - 64, count  # room for the turns after it
            return prompt


def served_by(prefill: list[ServeRun], router: Router, model: str, prompt: str) -> tuple[int, str]:
    """Which prefill engine served the routed completion of `prompt` (its own prompt-token counter
    moved), and the completion's text."""
    before = [counter(run, "vllm:prompt_tokens_total") for run in prefill]
    answer = router.complete(model, prompt)
    moved = [i for i, run in enumerate(prefill) if counter(run, "vllm:prompt_tokens_total") > before[i]]
    assert len(moved) == 1, moved
    return moved[0], answer


@pytest.mark.engine
def test_a_conversations_next_turn_goes_to_the_engine_whose_events_hold_it(tiny_model: Path, tmp_path: Path) -> None:
    network = PodNetwork()
    storage = tmp_path / "kv"
    runs: list[ServeRun] = []
    router: Router | None = None
    try:
        for name in ("prefill-0", "prefill-1", "decode"):
            (tmp_path / name).mkdir()
            address = network.address(name)
            role = "decode" if name == "decode" else "prefill"
            runs.append(ServeRun(tiny_model, serve_args(role, storage, address), tmp_path / name, host=address))
        *prefill, decode = runs
        started = logs_progress(lambda: [run.log_path for run in runs])
        for run in runs:
            run.wait_ready(started)
        model = decode.model_name()
        router = Router(prefill, decode, tmp_path / "router.log")
        time.sleep(1.0)  # its subscriptions connect (nothing is stored yet: no stream is live before the first)

        # Three first turns of about 320 tokens (two blocks and more), each its own.
        firsts = [first_turn(decode, model, i) for i in range(3)]
        engines, prompts = [], []
        for prompt in firsts:
            engine, text = served_by(prefill, router, model, prompt)
            engines.append(engine)
            prompts.append(prompt + text + " and then?")
        router.streams_live(len(set(engines)))  # each engine that stored a turn says so in its events
        for i, prompt in enumerate(prompts):
            hits = counter(prefill[engines[i]], HIT_COUNTER)
            engine, text = served_by(prefill, router, model, prompt)
            assert engine == engines[i], f"conversation {i}'s second turn left its engine"
            saved = counter(prefill[engine], HIT_COUNTER) - hits
            assert saved >= 2 * KV_EVENTS_BLOCK_SIZE, f"the engine's own counter: {saved} tokens hit"
            prompts[i] = prompt + text + " and then?"

        # A router restarted mid-run knows nothing it routed; the engines' replay buffers tell it.
        router.stop()
        router = Router(prefill, decode, tmp_path / "router.log")
        router.streams_live(len(set(engines)))  # from the engines' replay buffers: nothing was sent since
        for i in reversed(range(3)):
            engine, _ = served_by(prefill, router, model, prompts[i])
            assert engine == engines[i], f"after the restart, conversation {i} left its engine"
    finally:
        if router is not None:
            router.stop()
        for run in runs:
            run.cleanup()
        network.close()

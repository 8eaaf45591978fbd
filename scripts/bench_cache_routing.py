#!/usr/bin/env python3
"""Cache-aware routing measured with real vLLM CPU engines: ours with KV events, ours by load only,
and vllm-ascend's example proxy, on the same engines and the same multi-turn workload, in one run.

    .venv/bin/python scripts/bench_cache_routing.py [--levels 1,8,32] [--prefill 2] [--turns 8]
        [--systems 4] [--system-words 200] [--document-words 330] [--turn-words 60] [--max-tokens 8]
        [--think-seconds 1] [--seed 0] [--json]
        [--routers cache,load,upstream]

The engines, on 127.0.0.x loopback addresses of their own (each engine's KV-event ports are then
its own, as each pod's are): `--prefill` P/D producers and one consumer, vLLM's file-based
ExampleConnector between them (the CPU's stand-in for Mooncake), prefix caching on, the producers
publishing KV events (`--kv-events-config`, ZMQ, replay on) as the operator's engines do with
`spec.cacheAwareRouting`. The model is the generated tiny Llama made larger (4 layers, 4 heads of
64, 8192 positions; `npu_sandbox.fixtures.tiny_model`) so that a prompt of a few thousand tokens
costs a prefill that matters on a CPU. One vLLM thread per engine (`OMP_NUM_THREADS=1`).

The workload (seeded): `--systems` shared system prompts; conversations, each on one system prompt
and a document of its own (RAG's context, an agent's history), of `--turns` turns, where turn
N+1's prompt is turn N's prompt, its answer and a new user message
(completions, greedy, `ignore_eos`, `--max-tokens` each, streamed), its user waiting a think time
(exponential, mean `--think-seconds`) before each turn after the first. At concurrency c, c clients
each take the next conversation and run its turns one after another; c conversations (at least 8)
per level. Before each router's run the engines' prefix caches are reset (vLLM's
`/reset_prefix_cache`, `VLLM_SERVER_DEV_MODE=1`) and the connector's folder emptied, and the router
is started fresh; the order of the routers turns at each level, so that drift hits each.

Figures per router and level: time to first token p50 and p99 (the first streamed chunk, as the
client reads it), requests/s, and the prefix hit rate of the prefill engines (vLLM's own
`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`, in tokens, for the run),
then each figure's ratio to load-only routing, the mean prompt in tokens, and our routers' prefill
choices by reason (`npu_router_choice_reasons_total`). The load average is printed at start and end.

vllm-ascend's proxy (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py,
v0.23.0) runs from the virtual environment `scripts/bench_router.py --setup-upstream` makes under
.cache/bench-upstream; without it that router is left out, and said so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from bench_router import UPSTREAM_PROXY, UPSTREAM_PYTHON, free_port, spawn  # this folder's: the same proxy
from npu_runtime import kv_events
from npu_runtime.contract import KV_EVENTS_BLOCK_SIZE, KV_EVENTS_PORT, KV_REPLAY_PORT
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]

WORK = ROOT / ".cache" / "bench-cache-routing"
MODEL_NAME = "bench"
ENGINE_PORT = 8000
LAYERS, HEADS, POSITIONS = 4, 4, 8192
START_SECONDS = 600.0
ROUTERS = ("cache", "load", "upstream")
LABELS = {"cache": "cache-aware", "load": "load-only", "upstream": "vllm-ascend proxy"}
VOCABULARY = (
    "graph capture replay decode prefill token cache block engine router pod node cluster memory "
    "operator model adapter layer tensor stream batch queue latency budget device kernel shard rank "
    "expert weight scale plan status event prefix system user answer question document search agent "
    "tool result context window history policy volume secret service gateway route picker score"
)
WORDS = VOCABULARY.split()


@dataclass(frozen=True)
class Engine:
    role: str
    host: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{ENGINE_PORT}"


def engines_of(prefill: int) -> list[Engine]:
    return [Engine("prefill", f"127.0.0.{10 + index}") for index in range(prefill)] + [Engine("decode", "127.0.0.20")]


def build_model() -> Path:
    path = WORK / f"model-l{LAYERS}-h{HEADS}-p{POSITIONS}"
    if not (path / "config.json").exists():
        from npu_sandbox.fixtures.tiny_model import build_tiny_model  # torch, only when the model is built

        build_tiny_model(path, layers=LAYERS, heads=HEADS, max_positions=POSITIONS)
    return path


def engine_command(engine: Engine, model: Path, storage: Path) -> list[str]:
    producer = engine.role == "prefill"
    transfer = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_producer" if producer else "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command += ["--served-model-name", MODEL_NAME, "--host", engine.host, "--port", str(ENGINE_PORT)]
    command += ["--max-model-len", str(POSITIONS), "--max-num-batched-tokens", str(POSITIONS)]
    command += ["--max-num-seqs", "32", "--enforce-eager", "--no-enable-chunked-prefill"]
    command += ["--kv-transfer-config", json.dumps(transfer)]
    if producer:  # the flags `npu-runtime serve --kv-events` gives vLLM, on this engine's own address
        command += kv_events.engine_args(f"kv@{engine.host}:{ENGINE_PORT}@{MODEL_NAME}", host=engine.host)
    else:
        command += ["--enable-prefix-caching", "--block-size", str(KV_EVENTS_BLOCK_SIZE)]
    return command


@contextlib.contextmanager
def running_engines(engines: list[Engine], model: Path, storage: Path) -> Any:
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "PYTHONHASHSEED": "0",
    }
    processes = []
    try:
        for engine in engines:
            log_path = WORK / f"engine-{engine.host}.log"
            log_path.unlink(missing_ok=True)
            processes.append(spawn(engine_command(engine, model, storage), env, log_path))
        yield processes
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


async def wait_healthy(session: aiohttp.ClientSession, url: str, processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if any(process.poll() is not None for process in processes):
            raise RuntimeError(f"an engine exited: see {WORK}/engine-*.log")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as answer:
                if answer.status == 200:
                    return
        await asyncio.sleep(1.0)
    raise RuntimeError(f"{url} not healthy within {START_SECONDS:.0f} s")


# --- the workload ------------------------------------------------------------------------------------


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@dataclass
class Conversation:
    system: str  # shared with other conversations
    document: str  # this conversation's own context (a RAG document, an agent's history)
    users: list[str]
    thinks: list[float]  # seconds its user waits before each turn after the first


def workload(seed: int, conversations: int, args: argparse.Namespace) -> list[Conversation]:
    rng = random.Random(seed)
    systems = [f"System {index}: " + words(rng, args.system_words) for index in range(args.systems)]
    return [
        Conversation(
            systems[index % len(systems)],
            words(rng, args.document_words),
            [words(rng, args.turn_words) for _ in range(args.turns)],
            [rng.expovariate(1 / args.think_seconds) if args.think_seconds > 0 else 0.0 for _ in range(args.turns)],
        )
        for index in range(conversations)
    ]


async def first_token(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> tuple[float, str]:
    """Time to the first streamed chunk, and the whole answer's text."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    body |= {"ignore_eos": True, "stream": True}
    started = time.monotonic()
    ttft: float | None = None
    text: list[str] = []
    async with session.post(url + "/v1/completions", json=body) as answer:
        if answer.status != 200:
            raise RuntimeError(f"{answer.status}: {(await answer.text())[:300]}")
        async for line in answer.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            if ttft is None:
                ttft = time.monotonic() - started
            chunk = json.loads(line[6:])
            text += [choice.get("text", "") for choice in chunk.get("choices", [])]
    if ttft is None:
        raise RuntimeError("no chunk streamed")
    return ttft, "".join(text)


@dataclass
class Run:
    router: str
    concurrency: int
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    failed: int = 0
    hits: float = 0.0
    queries: float = 0.0
    prompt_tokens: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)  # our router's prefill choices, by reason

    def figures(self) -> dict[str, float]:
        ordered = sorted(self.ttft) or [float("nan")]
        return {
            "ttft_p50_s": statistics.median(ordered),
            "ttft_p99_s": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
            "requests_per_s": len(self.ttft) / self.seconds if self.seconds else 0.0,
            "prefix_hit_rate": self.hits / self.queries if self.queries else 0.0,
            "prompt_tokens_per_request": self.prompt_tokens / len(self.ttft) if self.ttft else 0.0,
            "requests": float(len(self.ttft)),
            "failed": float(self.failed),
        }


async def drive(url: str, conversations: list[Conversation], concurrency: int, max_tokens: int, run: Run) -> None:
    queue = list(reversed(conversations))
    timeout = aiohttp.ClientTimeout(total=600)

    async def client(session: aiohttp.ClientSession) -> None:
        while queue:
            conversation = queue.pop()
            prompt = f"{conversation.system}\nDocument: {conversation.document}"
            for turn, (user, think) in enumerate(zip(conversation.users, conversation.thinks, strict=True)):
                if turn:
                    await asyncio.sleep(think)
                prompt += f"\nUser: {user}\nAssistant:"
                try:
                    ttft, text = await first_token(session, url, prompt, max_tokens)
                except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                    run.failed += 1
                    print(f"    failed: {exc}", file=sys.stderr)
                    break
                run.ttft.append(ttft)
                prompt += text

    async with aiohttp.ClientSession(timeout=timeout) as session:
        started = time.monotonic()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        run.seconds = time.monotonic() - started


COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:prompt_tokens_total")


async def prefill_counters(session: aiohttp.ClientSession, engines: list[Engine]) -> list[float]:
    """The prefill engines' prefix-cache hits and queries and prompt tokens (vLLM's own counters)."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for engine in engines:
        if engine.role != "prefill":
            continue
        async with session.get(engine.url + "/metrics") as answer:
            text = await answer.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
    return [totals[name] for name in COUNTERS]


async def choice_reasons(session: aiohttp.ClientSession, metrics_url: str) -> dict[str, int]:
    """Our router's prefill choices by reason (`npu_router_choice_reasons_total`), warm-up included."""
    async with session.get(metrics_url) as answer:
        text = await answer.text()
    return {
        sample.labels["reason"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "npu_router_choice_reasons_total" and sample.labels.get("role") == "prefill"
    }


async def reset(session: aiohttp.ClientSession, engines: list[Engine], storage: Path) -> None:
    for engine in engines:
        async with session.post(engine.url + "/reset_prefix_cache") as answer:
            if answer.status != 200:
                raise RuntimeError(f"{engine.url}/reset_prefix_cache: {answer.status} {await answer.text()}")
    await asyncio.to_thread(empty_folder, storage)


def empty_folder(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def router_command(kind: str, engines: list[Engine], port: int, metrics_port: int) -> tuple[list[str], dict[str, str]]:
    prefill = [engine for engine in engines if engine.role == "prefill"]
    decode = [engine for engine in engines if engine.role == "decode"]
    if kind == "upstream":
        command = [str(UPSTREAM_PYTHON), str(UPSTREAM_PROXY), "--host", "127.0.0.1", "--port", str(port)]
        command += [
            "--prefiller-hosts",
            *(e.host for e in prefill),
            "--prefiller-ports",
            *(str(ENGINE_PORT) for _ in prefill),
        ]
        command += [
            "--decoder-hosts",
            *(e.host for e in decode),
            "--decoder-ports",
            *(str(ENGINE_PORT) for _ in decode),
        ]
        return [*command, "--workers", "1", "--log-level", "WARNING"], dict(os.environ)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "npu_runtime.cli", "route", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--metrics-port", str(metrics_port)]
    for engine in prefill:
        command += ["--prefill", engine.url]
    for engine in decode:
        command += ["--decode", engine.url]
    if kind == "cache":
        command += ["--cache-aware", "--kv-events-port", str(KV_EVENTS_PORT), "--kv-replay-port", str(KV_REPLAY_PORT)]
    return command, env


@contextlib.asynccontextmanager
async def router_process(kind: str, engines: list[Engine]) -> AsyncIterator[tuple[str, str]]:
    """The router, started fresh: its URL and its metrics' URL (ours only)."""
    port, metrics_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    command, env = router_command(kind, engines, port, metrics_port)
    log_path = WORK / f"router-{kind}.log"
    process = spawn(command, env, log_path)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                if process.poll() is not None:
                    raise RuntimeError(f"{kind} router exited: see {log_path}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + ("/healthcheck" if kind == "upstream" else "/v1/models")) as answer:
                        if answer.status == 200:
                            break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{kind} router did not answer: see {log_path}")
            await asyncio.sleep(1.0)  # the cache-aware router's event subscriptions connect
        yield url, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def measure(kind: str, engines: list[Engine], storage: Path, concurrency: int, args: argparse.Namespace) -> Run:
    run = Run(kind, concurrency)
    conversations = workload(args.seed + concurrency, max(8, concurrency), args)
    async with aiohttp.ClientSession() as session:
        await reset(session, engines, storage)
        async with router_process(kind, engines) as (url, metrics_url):
            warm = workload(args.seed + 10_000 + concurrency, 2, args)
            await drive(url, warm, 2, args.max_tokens, Run(kind, 2))
            before = await prefill_counters(session, engines)
            await drive(url, conversations, concurrency, args.max_tokens, run)
            after = await prefill_counters(session, engines)
            if kind != "upstream":
                run.reasons = await choice_reasons(session, metrics_url)
    run.hits, run.queries, run.prompt_tokens = (end - start for start, end in zip(before, after, strict=True))
    return run


async def bench(args: argparse.Namespace) -> list[Run]:
    WORK.mkdir(parents=True, exist_ok=True)
    model = build_model()
    storage = WORK / "kv"
    engines = engines_of(args.prefill)
    runs: list[Run] = []
    with running_engines(engines, model, storage) as processes:
        async with aiohttp.ClientSession() as session:
            for engine in engines:
                await wait_healthy(session, engine.url, processes)
        print(f"engines ready: {', '.join(engine.url for engine in engines)}", file=sys.stderr, flush=True)
        for index, concurrency in enumerate(args.levels):
            order = args.routers if index % 2 == 0 else tuple(reversed(args.routers))
            for kind in order:
                run = await measure(kind, engines, storage, concurrency, args)
                runs.append(run)
                f = run.figures()
                print(
                    f"  {LABELS[kind]:<18} c={concurrency:<3} TTFT p50 {f['ttft_p50_s']:6.3f} s  p99 "
                    f"{f['ttft_p99_s']:6.3f} s  {f['requests_per_s']:6.2f} req/s  hit {f['prefix_hit_rate']:5.1%}"
                    f"  failed {run.failed}  {run.reasons or ''}",
                    file=sys.stderr,
                    flush=True,
                )
    return runs


def ratio(figures: dict[str, float], base: dict[str, float] | None, key: str) -> str:
    return f"{figures[key] / base[key]:.2f}" if base and base[key] else "-"


def table(runs: list[Run], levels: Sequence[int], routers: Sequence[str]) -> str:
    by = {(run.router, run.concurrency): run.figures() for run in runs}
    lines = [
        "| c | router | TTFT p50 s | TTFT p99 s | requests/s | prefix hit rate | p50 / load-only | p99 / load-only "
        "| req/s / load-only | prompt tokens | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for concurrency in levels:
        base = by.get(("load", concurrency))
        for kind in routers:
            f = by[(kind, concurrency)]
            ratios = [ratio(f, base, key) for key in ("ttft_p50_s", "ttft_p99_s", "requests_per_s")]
            lines.append(
                f"| {concurrency} | {LABELS[kind]} | {f['ttft_p50_s']:.3f} | {f['ttft_p99_s']:.3f} | "
                f"{f['requests_per_s']:.2f} | {f['prefix_hit_rate']:.1%} | {' | '.join(ratios)} | "
                f"{f['prompt_tokens_per_request']:.0f} | {int(f['failed'])} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32", type=lambda text: [int(x) for x in text.split(",")])
    parser.add_argument("--prefill", type=int, default=2)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--systems", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=200)
    parser.add_argument("--document-words", type=int, default=330)
    parser.add_argument("--turn-words", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--think-seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--routers", default=",".join(ROUTERS), type=lambda text: tuple(text.split(",")))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if "upstream" in args.routers and not (UPSTREAM_PROXY.exists() and UPSTREAM_PYTHON.exists()):
        print(f"vllm-ascend's proxy is missing ({UPSTREAM_PROXY}): left out; see scripts/bench_router.py --help")
        args.routers = tuple(kind for kind in args.routers if kind != "upstream")
    load = os.getloadavg()
    runs = asyncio.run(bench(args))
    end = os.getloadavg()
    if args.json:
        print(json.dumps([{"router": r.router, "concurrency": r.concurrency, **r.figures()} for r in runs], indent=2))
    print(
        f"load average at start {' '.join(f'{x:.2f}' for x in load)}, at end {' '.join(f'{x:.2f}' for x in end)}"
        f" ({os.cpu_count()} CPUs)"
    )
    print(table(runs, args.levels, args.routers))
    return 1 if any(run.failed for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())

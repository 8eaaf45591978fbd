#!/usr/bin/env python3
"""The P/D router measured: its overhead per request, and side by side with vllm-ascend's proxy.

    python scripts/bench_router.py [--requests 300] [--concurrency 1] [--engine-ms 0]
    python scripts/bench_router.py --compare [--upstream-proxy FILE] [--upstream-python PY]
        [--levels 1,16,64] [--requests 16,240,480] [--seed 0] [--json]

Overhead (the default): two fake engines answering at once (or after --engine-ms) in a child
process, the router in this process; for each request the script times a direct decode call, a
direct prefill call and the routed request, and prints p50/p99 of each and of routed - (prefill +
decode): what the router adds beyond the two engine calls that P/D needs anyway.

--compare: the same fake engines behind `npu-runtime route` and behind vllm-ascend's example proxy
(examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py, v0.23.0), one after the
other at each concurrency, each proxy in its own process started fresh per level (a short warm-up
first, not measured). The engines model continuous batching, in a child process:

- two prefill engines, equal: each step takes up to 4096 prompt tokens of the queued prompts,
  5 ms + 30 us per token; a prompt's answer is one token and Mooncake-shaped kv_transfer_params;
- two decode engines, one fast and one three times slower: each step gives every running request
  (at most 64; more wait) one token and takes base + per-request time (fast 20 ms + 0.2 ms, slow
  60 ms + 0.6 ms), as a memory-bound decode step grows little with its batch; a stream writes one
  SSE event per token, a non-streamed answer comes whole at the end.

Requests: a seeded mix of completions and chat completions, prompts of 100 to 8000 characters, 16
to 256 output tokens, half of them streamed. Per proxy and level the script prints requests/s, p50
and p99 latency (the whole answer, as the client reads it), the proxy process's CPU time per
request and its memory (RSS), the share the fast decode engine served and any failed request, then
ours / upstream for each figure.

The upstream proxy runs from its own virtual environment (FastAPI, httpx, uvicorn[standard] from
PyPI; it imports no vLLM). --setup-upstream makes one under .cache/bench-upstream/venv; the proxy's
file comes from vllm-ascend's repository or sdist, e.g.

    git -C vllm-ascend show v0.23.0:examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py \\
        > .cache/bench-upstream/load_balance_proxy_server_example.py

All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from npu_runtime.routing.options import RouterOptions
from npu_runtime.routing.router import Router
from npu_runtime.routing.serve import app_runners

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_DIR = ROOT / ".cache" / "bench-upstream"
UPSTREAM_PROXY = UPSTREAM_DIR / "load_balance_proxy_server_example.py"
UPSTREAM_PYTHON = UPSTREAM_DIR / "venv" / "bin" / "python"
KV = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "p_dp0",
    "remote_request_id": "r",
    "remote_host": "127.0.0.1",
    "remote_port": 36000,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the overhead mode -------------------------------------------------------------------------------


def run_instant_engines(ports: tuple[int, int], engine_ms: float) -> None:
    """The fake prefill and decode engines answering at once (child process)."""

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(engine_ms / 1000)
        if body.get("kv_transfer_params", {}).get("do_remote_decode"):
            return web.json_response({"choices": [{"text": "x"}], "kv_transfer_params": KV})
        return web.json_response({"choices": [{"text": "hello world " * 4}], "usage": {"completion_tokens": 8}})

    async def main() -> None:
        for port in ports:
            app = web.Application()
            app.router.add_post("/v1/completions", completions)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


async def timed(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with session.post(url, json=body) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started


async def measure_overhead(requests: int, concurrency: int, engine_ms: float) -> dict[str, list[float]]:
    prefill_port, decode_port = free_port(), free_port()
    engines = multiprocessing.Process(
        target=run_instant_engines, args=((prefill_port, decode_port), engine_ms), daemon=True
    )
    engines.start()
    prefill, decode = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    router = Router(RouterOptions(prefill=(prefill,), decode=(decode,)))
    await router.start()
    api, _ = app_runners(router)
    await api.setup()
    router_port = free_port()
    await web.TCPSite(api, "127.0.0.1", router_port).start()
    body = {"model": "m", "prompt": "the quick brown fox " * 50, "max_tokens": 8}
    prefill_body = {**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    paths = {
        "direct decode": (decode, body),
        "direct prefill": (prefill, prefill_body),
        "routed": (f"http://127.0.0.1:{router_port}", body),
    }
    results: dict[str, list[float]] = {name: [] for name in paths}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # engines up, connections warm
                try:
                    await timed(session, decode + "/v1/completions", body)
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
            for base, payload in paths.values():
                for _ in range(20):
                    await timed(session, base + "/v1/completions", payload)
            semaphore = asyncio.Semaphore(concurrency)

            async def one(name: str) -> None:
                base, payload = paths[name]
                async with semaphore:
                    results[name].append(await timed(session, base + "/v1/completions", payload))

            for _ in range(requests):  # interleaved, so that drift hits every path alike
                await asyncio.gather(*(one(name) for name in paths))
    finally:
        await api.cleanup()
        await router.close()
        engines.terminate()
    return results


def quantile_ms(values: list[float], q: float) -> float:
    if len(values) < 2:
        return max(values, default=0.0) * 1000
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


def overhead_main(args: argparse.Namespace) -> int:
    results = asyncio.run(measure_overhead(args.requests, args.concurrency, args.engine_ms))
    summary = {name: {"p50_ms": quantile_ms(v, 50), "p99_ms": quantile_ms(v, 99)} for name, v in results.items()}
    overhead = [
        r - p - d
        for r, p, d in zip(results["routed"], results["direct prefill"], results["direct decode"], strict=True)
    ]
    summary["router overhead"] = {"p50_ms": quantile_ms(overhead, 50), "p99_ms": quantile_ms(overhead, 99)}
    ratio = statistics.median(results["routed"]) / statistics.median(results["direct decode"])
    if args.json:
        print(json.dumps({"summary": summary, "routed_over_direct": ratio}, indent=1))
        return 0
    print(f"{args.requests} requests per path, concurrency {args.concurrency}, fake engine time {args.engine_ms:g} ms")
    print(f"{'path':<18}{'p50 ms':>10}{'p99 ms':>10}")
    for name, figures in summary.items():
        print(f"{name:<18}{figures['p50_ms']:>10.2f}{figures['p99_ms']:>10.2f}")
    print(f"routed / direct decode (p50): {ratio:.2f}x (two engine calls instead of one, plus the router)")
    return 0


# --- the batching fake engines (--compare) -----------------------------------------------------------


@dataclass
class Sequence_:
    tokens: int
    stream: bool
    done: int = 0
    ready: asyncio.Queue[int] = field(default_factory=asyncio.Queue)  # each token, for a stream
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # the last one, for a whole answer


class DecodeEngine:
    """Continuous batching: each step gives every running sequence one token."""

    def __init__(self, base_ms: float, per_seq_ms: float, max_seqs: int = 64) -> None:
        self.base, self.per_seq, self.max_seqs = base_ms / 1000, per_seq_ms / 1000, max_seqs
        self.running: list[Sequence_] = []
        self.waiting: deque[Sequence_] = deque()
        self.wake = asyncio.Event()
        self.served = 0

    async def loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
            while self.waiting and len(self.running) < self.max_seqs:
                self.running.append(self.waiting.popleft())
            await asyncio.sleep(self.base + self.per_seq * len(self.running))
            for seq in self.running:
                seq.done += 1
                if seq.stream:
                    seq.ready.put_nowait(seq.done)
                elif seq.done >= seq.tokens:
                    seq.finished.set()
            self.running = [seq for seq in self.running if seq.done < seq.tokens]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = "messages" in body
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        seq = Sequence_(tokens, bool(body.get("stream")))
        self.waiting.append(seq)
        self.wake.set()
        if not seq.stream:
            await seq.finished.wait()
            self.served += 1
            usage = {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens}
            text = " tok" * tokens
            if chat:
                choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
                return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})
            return web.json_response(
                {"object": "text_completion", "choices": [{"index": 0, "text": text}], "usage": usage}
            )
        response = web.StreamResponse()
        response.content_type = "text/event-stream"
        await response.prepare(request)
        while True:
            count = await seq.ready.get()
            last = count >= tokens
            finish = "length" if last else None
            if chat:
                choice = {"index": 0, "delta": {"content": " tok"}, "finish_reason": finish}
                chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
            else:
                choice = {"index": 0, "text": " tok", "finish_reason": finish}
                chunk = {"id": "c", "object": "text_completion", "model": "m", "choices": [choice]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if last:
                break
        await response.write(b"data: [DONE]\n\n")
        self.served += 1
        return response


class PrefillEngine:
    """Chunked prefill: each step takes up to `budget` prompt tokens from the queue, in order."""

    def __init__(self, base_ms: float = 5.0, per_token_us: float = 30.0, budget: int = 4096) -> None:
        self.base, self.per_token, self.budget = base_ms / 1000, per_token_us / 1e6, budget
        self.queue: deque[list[Any]] = deque()  # [tokens left, future]
        self.wake = asyncio.Event()
        self.served = 0

    async def loop(self) -> None:
        while True:
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
            budget, finished = self.budget, []
            for item in self.queue:
                take = min(item[0], budget)
                item[0] -= take
                budget -= take
                if not item[0]:
                    finished.append(item)
                if not budget:
                    break
            await asyncio.sleep(self.base + self.per_token * (self.budget - budget))
            for item in finished:
                self.queue.remove(item)
                item[1].set_result(None)

    async def completions(self, request: web.Request) -> web.Response:
        raw = await request.read()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.append([max(1, len(raw) // 4), done])
        self.wake.set()
        await done
        self.served += 1
        return web.json_response({"choices": [{"index": 0, "text": "x"}], "kv_transfer_params": KV})


def run_batching_engines(ports: dict[str, int]) -> None:
    """prefill, prefill2, fast, slow (child process)."""

    async def main() -> None:
        engines: dict[str, DecodeEngine | PrefillEngine] = {
            "prefill": PrefillEngine(),
            "prefill2": PrefillEngine(),
            "fast": DecodeEngine(20.0, 0.2),
            "slow": DecodeEngine(60.0, 0.6),
        }
        for name, engine in engines.items():
            app = web.Application()
            app.router.add_post("/v1/completions", engine.completions)
            app.router.add_post("/v1/chat/completions", engine.completions)

            async def health(_: web.Request) -> web.Response:
                return web.Response(text="ok")

            async def stats(_: web.Request, engine: Any = engine) -> web.Response:
                return web.json_response({"served": engine.served})

            app.router.add_get("/health", health)
            app.router.add_get("/v1/models", health)
            app.router.add_get("/stats", stats)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", ports[name]).start()
            asyncio.ensure_future(engine.loop())  # noqa: RUF006
        await asyncio.Event().wait()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())


# --- the comparison ----------------------------------------------------------------------------------


def request_mix(seed: int, count: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    mix = []
    for index in range(count):
        prompt = "".join(rng.choice("abcdefghij ") for _ in range(rng.randint(100, 8000)))
        body: dict[str, Any] = {"model": "m", "max_tokens": rng.randint(16, 256), "stream": rng.random() < 0.5}
        if index % 2:
            body["messages"] = [{"role": "user", "content": prompt}]
            mix.append(("/v1/chat/completions", body))
        else:
            body["prompt"] = prompt
            mix.append(("/v1/completions", body))
    return mix


@dataclass
class Run:
    proxy: str
    concurrency: int
    requests: int
    seconds: float
    latencies: list[float]
    cpu_seconds: float
    rss_bytes: int
    fast_share: float
    failed: int

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    def figures(self) -> dict[str, float]:
        return {
            "requests_per_s": self.per_second,
            "p50_s": quantile_ms(self.latencies, 50) / 1000,
            "p99_s": quantile_ms(self.latencies, 99) / 1000,
            "cpu_ms_per_request": self.cpu_seconds * 1000 / self.requests,
            "rss_mib": self.rss_bytes / (1 << 20),
            "fast_share": self.fast_share,
            "failed": self.failed,
        }


async def one_request(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, bool]:
    """Latency of the whole answer, and whether it was a good one."""
    started = time.perf_counter()
    try:
        async with session.post(url, json=body) as response:
            data = await response.read()
            ok = response.status == 200
            if ok and body.get("stream"):
                ok = data.endswith(b"data: [DONE]\n\n") and b'"error"' not in data
            elif ok:
                ok = b"tok" in data
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    return time.perf_counter() - started, ok


async def drive(
    url: str, mix: Sequence[tuple[str, dict[str, Any]]], concurrency: int
) -> tuple[float, list[float], int]:
    """Every request of `mix`, `concurrency` at a time: (wall seconds, latencies, failures)."""
    latencies: list[float] = []
    failed = 0
    queue = deque(mix)
    limit = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=limit, connector=connector) as session:

        async def worker() -> None:
            nonlocal failed
            while queue:
                path, body = queue.popleft()
                took, ok = await one_request(session, url + path, body)
                latencies.append(took)
                failed += not ok

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, latencies, failed


def spawn(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """A proxy's process, its output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=ROOT)


@contextlib.asynccontextmanager
async def proxy_process(kind: str, ports: dict[str, int], args: argparse.Namespace) -> AsyncIterator[tuple[str, int]]:
    """Our router or the upstream proxy, started fresh, on a free port: (its URL, its pid)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engines = {name: f"http://127.0.0.1:{ports[name]}" for name in ports}
    if kind == "ours":
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])}
        command = [sys.executable, "-m", "npu_runtime.cli", "route", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--metrics-port", str(free_port())]
        command += ["--prefill", engines["prefill"], "--prefill", engines["prefill2"]]
        command += ["--decode", engines["fast"], "--decode", engines["slow"]]
    else:
        env = dict(os.environ)
        command = [str(args.upstream_python), str(args.upstream_proxy), "--host", "127.0.0.1", "--port", str(port)]
        command += ["--prefiller-hosts", "127.0.0.1", "127.0.0.1"]
        command += ["--prefiller-ports", str(ports["prefill"]), str(ports["prefill2"])]
        command += ["--decoder-hosts", "127.0.0.1", "127.0.0.1"]
        command += ["--decoder-ports", str(ports["fast"]), str(ports["slow"])]
        command += ["--workers", "1", "--log-level", "WARNING"]
    log_path = UPSTREAM_DIR.parent / f"bench-{kind}.log"
    process = spawn(command, env, log_path)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                with contextlib.suppress(aiohttp.ClientError):
                    body = {"model": "m", "prompt": "warm", "max_tokens": 2}
                    async with session.post(url + "/v1/completions", json=body) as response:
                        if response.status == 200:
                            break
                assert process.poll() is None, f"{kind} proxy exited: see {log_path}"
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{kind} proxy did not answer: see {log_path}")
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def served(ports: dict[str, int]) -> dict[str, int]:
    async with aiohttp.ClientSession() as session:
        counts = {}
        for name in ("fast", "slow"):
            async with session.get(f"http://127.0.0.1:{ports[name]}/stats") as response:
                counts[name] = (await response.json())["served"]
        return counts


async def measure_one(
    kind: str, ports: dict[str, int], concurrency: int, mix: list[tuple[str, dict[str, Any]]], args: argparse.Namespace
) -> Run:
    import psutil  # type: ignore[import-untyped]

    async with proxy_process(kind, ports, args) as (url, pid):
        process = psutil.Process(pid)
        await drive(url, request_mix(args.seed + 1000 + concurrency, max(8, concurrency)), concurrency)  # warm-up
        before, cpu = await served(ports), process.cpu_times()
        seconds, latencies, failed = await drive(url, mix, concurrency)
        after, cpu_after = await served(ports), process.cpu_times()
        rss = process.memory_info().rss
    fast = after["fast"] - before["fast"]
    total = fast + after["slow"] - before["slow"]
    cpu_seconds = (cpu_after.user - cpu.user) + (cpu_after.system - cpu.system)
    return Run(kind, concurrency, len(mix), seconds, latencies, cpu_seconds, rss, fast / max(1, total), failed)


async def compare(args: argparse.Namespace) -> list[Run]:
    names = ("prefill", "prefill2", "fast", "slow")
    ports = {name: free_port() for name in names}
    engines = multiprocessing.Process(target=run_batching_engines, args=(ports,), daemon=True)
    engines.start()
    runs: list[Run] = []
    try:
        for index, (concurrency, count) in enumerate(zip(args.levels, args.counts, strict=True)):
            mix = request_mix(args.seed + concurrency, count)
            order = ("ours", "upstream") if index % 2 == 0 else ("upstream", "ours")  # drift hits both
            for kind in order:
                run = await measure_one(kind, ports, concurrency, mix, args)
                runs.append(run)
                figures = run.figures()
                print(
                    f"  {kind:<9} c={concurrency:<3} {figures['requests_per_s']:6.2f} req/s  "
                    f"p99 {figures['p99_s']:6.2f} s  cpu {figures['cpu_ms_per_request']:5.1f} ms/req  "
                    f"fast {figures['fast_share']:.0%}  failed {run.failed}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        engines.terminate()
    return runs


def setup_upstream() -> int:
    """A virtual environment for the upstream proxy under .cache/bench-upstream/venv."""
    UPSTREAM_DIR.mkdir(parents=True, exist_ok=True)
    venv = UPSTREAM_DIR / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    packages = ["fastapi<0.124", "httpx", "uvicorn[standard]"]
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *packages], check=True)
    if not UPSTREAM_PROXY.exists():
        print(f"now put vllm-ascend v0.23.0's proxy at {UPSTREAM_PROXY} (see --help)", file=sys.stderr)
    return 0


def compare_main(args: argparse.Namespace) -> int:
    for path in (args.upstream_proxy, args.upstream_python):
        if not Path(path).exists():
            print(f"{path} is missing: run with --setup-upstream, see --help", file=sys.stderr)
            return 2
    load = os.getloadavg()
    runs = asyncio.run(compare(args))
    by = {(run.proxy, run.concurrency): run.figures() for run in runs}
    if args.json:
        print(
            json.dumps(
                {"load_average": load, "cpus": os.cpu_count(), "runs": {f"{p} c={c}": f for (p, c), f in by.items()}},
                indent=1,
            )
        )
        return 0
    print(f"{os.cpu_count()} CPUs, load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, seed {args.seed}")
    header = f"{'c':>3} | {'requests/s ours / upstream':>28} | {'p99 s ours / upstream':>24} | "
    header += f"{'CPU ms/request ours / upstream':>31} | {'RSS MiB':>13} | {'fast share':>11} | failed"
    print(header)
    for concurrency in args.levels:
        ours, theirs = by[("ours", concurrency)], by[("upstream", concurrency)]
        rate = ours["requests_per_s"] / theirs["requests_per_s"]
        p99 = ours["p99_s"] / theirs["p99_s"]
        cpu = ours["cpu_ms_per_request"] / theirs["cpu_ms_per_request"]
        print(
            f"{concurrency:>3} | {ours['requests_per_s']:7.2f} / {theirs['requests_per_s']:6.2f} ({rate:.2f}x)"
            f"{'':>4} | {ours['p99_s']:6.2f} / {theirs['p99_s']:6.2f} ({p99:.2f}x) | "
            f"{ours['cpu_ms_per_request']:7.1f} / {theirs['cpu_ms_per_request']:6.1f} ({cpu:.2f}x){'':>6} | "
            f"{ours['rss_mib']:5.0f} / {theirs['rss_mib']:4.0f} | "
            f"{ours['fast_share']:4.0%} / {theirs['fast_share']:4.0%} | {ours['failed']:.0f} / {theirs['failed']:.0f}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", default=None, help="overhead: requests per path (300); --compare: per level")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--engine-ms", type=float, default=0.0, help="overhead: time each fake engine call takes")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare", action="store_true", help="side by side with vllm-ascend's example proxy")
    parser.add_argument("--levels", default="1,16,64", help="--compare: concurrency levels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--upstream-proxy", type=Path, default=UPSTREAM_PROXY)
    parser.add_argument("--upstream-python", type=Path, default=UPSTREAM_PYTHON)
    parser.add_argument("--setup-upstream", action="store_true", help="make the upstream proxy's venv, then exit")
    args = parser.parse_args()
    if args.setup_upstream:
        return setup_upstream()
    if args.compare:
        args.levels = [int(level) for level in args.levels.split(",")]
        default = {1: 16, 16: 240, 64: 480}
        counts = args.requests.split(",") if args.requests else [str(default.get(c, 8 * c)) for c in args.levels]
        args.counts = [int(count) for count in counts]
        return compare_main(args)
    args.requests = int(args.requests or 300)
    return overhead_main(args)


if __name__ == "__main__":
    sys.exit(main())

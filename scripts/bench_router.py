#!/usr/bin/env python3
"""The router's overhead per request: a completion through `npu-runtime route` against direct calls.

    python scripts/bench_router.py [--requests 300] [--concurrency 1] [--engine-ms 0]

Two fake engines (small aiohttp servers answering like vLLM's OpenAI server for a P/D pair, each
taking --engine-ms per call) run in a child process; the router runs in this process on the same
event loop as the client, as it would in its own pod. For each request the script times:

- direct: one call to the decode engine (what a client of a non-disaggregated engine pays);
- routed: the same request through the router (a prefill call, then the decode call);
- the router's own overhead: routed - (a direct prefill call + a direct decode call), i.e. what the
  router adds beyond the two engine calls that P/D needs anyway.

It prints p50/p99 per path and the overhead per request, in milliseconds, and the ratio
routed / direct. With real engines the engine time (tens of ms per decode step, seconds per
prefill) dwarfs the overhead; this isolates it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web
from npu_runtime.routing.router import Router, RouterOptions, build_apps

KV = {"do_remote_prefill": True, "remote_engine_id": "p_dp0", "remote_host": "127.0.0.1", "remote_port": 36000}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_engines(ports: tuple[int, int], engine_ms: float) -> None:
    """The fake prefill and decode engines (child process)."""

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


async def measure(requests: int, concurrency: int, engine_ms: float) -> dict[str, list[float]]:
    prefill_port, decode_port = free_port(), free_port()
    engines = multiprocessing.Process(target=run_engines, args=((prefill_port, decode_port), engine_ms), daemon=True)
    engines.start()
    prefill, decode = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    router = Router(RouterOptions(prefill=(prefill,), decode=(decode,)))
    await router.start()
    api, _ = build_apps(router)
    runner = web.AppRunner(api, access_log=None)
    await runner.setup()
    router_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", router_port).start()
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
        await runner.cleanup()
        await router.close()
        engines.terminate()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--engine-ms", type=float, default=0.0, help="time each fake engine call takes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(measure(args.requests, args.concurrency, args.engine_ms))

    def ms(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[int(q) - 1] * 1000 if q < 100 else max(values) * 1000

    summary = {name: {"p50_ms": ms(v, 50), "p99_ms": ms(v, 99)} for name, v in results.items()}
    overhead = [
        r - p - d
        for r, p, d in zip(results["routed"], results["direct prefill"], results["direct decode"], strict=True)
    ]
    summary["router overhead"] = {"p50_ms": ms(overhead, 50), "p99_ms": ms(overhead, 99)}
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


if __name__ == "__main__":
    sys.exit(main())

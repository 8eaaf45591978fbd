"""`python -m tests.sandbox.node.fake_engine npu-runtime serve ARGS`: a P/D engine without vLLM, for the sandbox.

It reads the same `npu-runtime serve` arguments the kubelet would run (the serve contract's parser) and
answers as one engine of its role does, on the pod's own address:

- the OpenAI port: `/health`; `/v1/completions` and `/v1/chat/completions` as vLLM's OpenAI server does
  for a P/D pair: a prefill engine (`kv_role` kv_producer) answers one token and the `kv_transfer_params`
  that locate its KV (Mooncake's keys, its own address as `remote_host`, as the router checks them);
  a decode engine (kv_consumer) answers the completion, naming its pod (its hostname) in the text so
  that a test sees which decode engine served, after `--decode-seconds` of work;
- the metrics port: `/healthz`, `/readyz`, and `/status` with the role's requested graph mode (a CPU
  has none: effective NONE), one node and one DP rank.

So a P/D resource's whole chain (operator, DisaggregatedSet, role LeaderWorkerSets, pods, role
Services and their DNS, the router) runs in seconds, on a machine too small for three vLLM engines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from typing import Any

from aiohttp import web
from npu_runtime.contract import parse_serve_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decode-seconds", type=float, default=0.05)
    parser.add_argument("serve", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    serve = options.serve[2:] if options.serve[:2] == ["npu-runtime", "serve"] else options.serve
    asyncio.run(run(serve, options.decode_seconds))
    return 0


async def run(serve_args: list[str], decode_seconds: float) -> None:
    args = parse_serve_args(serve_args)
    kv = json.loads(args.kv_transfer_config or "{}")
    prefill = kv.get("kv_role") == "kv_producer"
    host, pod = args.host, socket.gethostname()
    status = {
        "schema": 1,
        "state": "ready",
        "requested_mode": args.plan.graph_mode,
        "effective_mode": "NONE",
        "node": {"rank": 0, "nodes": 1, "data_parallel_ranks": [0]},
    }

    async def complete(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        chat = "messages" in body
        if prefill:
            params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [[1]],
                "remote_engine_id": f"{pod}_dp0",
                "remote_request_id": request.headers.get("X-Request-Id", "r"),
                "remote_host": host,
                "remote_port": int(kv.get("kv_port", 30000)),
            }
            return web.json_response(answer(chat, "", 1, kv_transfer_params=params))
        await asyncio.sleep(decode_seconds)
        tokens = int(body.get("max_tokens") or 4)
        return web.json_response(answer(chat, f"decoded by {pod}", tokens))

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def report(_: web.Request) -> web.Response:
        return web.json_response(status)

    api = web.Application()
    api.router.add_get("/health", ok)
    api.router.add_post("/v1/completions", complete)
    api.router.add_post("/v1/chat/completions", complete)
    runtime = web.Application()
    runtime.router.add_get("/healthz", ok)
    runtime.router.add_get("/readyz", ok)
    runtime.router.add_get("/status", report)
    runners = [web.AppRunner(api, access_log=None), web.AppRunner(runtime, access_log=None)]
    for runner, port in zip(runners, (args.port, args.metrics_port), strict=True):
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
    await asyncio.Event().wait()


def answer(chat: bool, text: str, tokens: int, **extra: Any) -> dict[str, Any]:
    """A non-streamed answer in the OpenAI shape of a chat or a completion."""
    usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        if chat
        else {"index": 0, "text": text, "finish_reason": "length"}
    )
    kind = "chat.completion" if chat else "text_completion"
    return {"id": "cmpl-1", "object": kind, "created": 1, "model": "m", "choices": [choice], "usage": usage, **extra}


if __name__ == "__main__":
    sys.exit(main())

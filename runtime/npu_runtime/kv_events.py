"""The engine flags of `serve --kv-events TOPIC`: vLLM publishes its KV cache events for cache-aware routing.

The operator sets `--kv-events` with spec.cacheAwareRouting.kvEvents; the P/D router and llm-d's
endpoint picker subscribe to each engine's events (`contract.KV_EVENTS_PORT` + its DP rank) and
know which pod holds which prefix blocks. What every engine must agree on is in `contract` (ports,
hash, seed, block size); this module writes it as vLLM's flags (names from vllm/engine/arg_utils.py
EngineArgs.add_cli_args, vLLM 0.23.0 to 0.31.0):

- `--enable-prefix-caching` (on by default in V1, written so that the events have blocks to report);
- `--prefix-caching-hash-algo sha256_cbor` (vllm/config/cache.py CacheConfig.prefix_caching_hash_algo);
- `--block-size` (`contract.KV_EVENTS_BLOCK_SIZE`);
- `--kv-events-config` (vllm/config/kv_events.py KVEventsConfig: enable_kv_cache_events, publisher
  "zmq", endpoint and replay_endpoint, which vllm/distributed/kv_events.py ZmqEventPublisher binds
  at their ports plus the engine core's DP rank, buffer_steps, topic);
- `--enable-scale-out` where the release needs it for `/v1/completions/render` and
  `/v1/chat/completions/render`, which llm-d's token producer calls to tokenize a prompt as the engine
  does (its precise prefix cache producer rehashes the tokens): vLLM 0.23.0 and 0.25.1 mount them with
  every generating model (vllm/entrypoints/openai/api_server.py build_app), 0.31.0 only with that
  flag (vllm/entrypoints/scale_out/factories.py register_scale_out_api_routers).

vllm-ascend runs vLLM's own scheduler, which owns the publisher (vllm/v1/core/sched/scheduler.py
Scheduler.__init__, EventPublisherFactory.create): events come from the scheduler's block pool, not
the model runner, so the graph mode (FULL_DECODE_ONLY's captured decode step) does not touch them.
Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Final

from npu_runtime.contract import (
    KV_EVENTS_BLOCK_SIZE,
    KV_EVENTS_BUFFER_STEPS,
    KV_EVENTS_HASH_ALGO,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
)

__all__ = ["SCALE_OUT_FLAG", "bind_address", "engine_args", "kv_events_config", "render_needs_scale_out"]

SCALE_OUT_FLAG: Final = "--enable-scale-out"
# The first vLLM of engines.RELEASES whose render endpoints need SCALE_OUT_FLAG.
_SCALE_OUT_GATED_FROM: Final = (0, 31)


def bind_address(host: str) -> str:
    """Where the engine's ZMQ sockets listen, given the API's `--host`: every interface for a wildcard
    (or a name, or IPv6), else that IPv4 address written IPv4-mapped, `[::ffff:A]`. vLLM binds an
    endpoint only when it holds "*" or "::" and connects to any other (vllm/distributed/kv_events.py
    ZmqEventPublisher._is_bind_endpoint), and libzmq binds an IPv4-mapped address as the IPv4 one; so
    engines that share a machine on addresses of their own (the sandbox's pods on 127.N.0.x) each
    publish on their own address, as pods do on theirs."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "*"
    if address.version != 4 or address.is_unspecified:
        return "*"
    return f"[::ffff:{address}]"


def kv_events_config(topic: str, host: str = "0.0.0.0") -> dict[str, object]:
    """vLLM's KVEventsConfig for `topic`: ZMQ on the API's address (`bind_address`), the events' and
    the replay's ports."""
    where = bind_address(host)
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://{where}:{KV_EVENTS_PORT}",
        "replay_endpoint": f"tcp://{where}:{KV_REPLAY_PORT}",
        "buffer_steps": KV_EVENTS_BUFFER_STEPS,
        "topic": topic,
    }


def render_needs_scale_out(vllm_version: str | None) -> bool:
    """Whether this vLLM serves its render endpoints only with --enable-scale-out (None: unknown, no)."""
    if not vllm_version:
        return False
    parts = []
    for part in vllm_version.split("+", 1)[0].split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= _SCALE_OUT_GATED_FROM


def engine_args(topic: str, vllm_version: str | None = None, host: str = "0.0.0.0") -> list[str]:
    """The engine's flags for publishing KV events under `topic` on the API's `host`, for the installed
    `vllm_version`."""
    args = [
        "--enable-prefix-caching",
        "--prefix-caching-hash-algo",
        KV_EVENTS_HASH_ALGO,
        "--block-size",
        str(KV_EVENTS_BLOCK_SIZE),
        "--kv-events-config",
        json.dumps(kv_events_config(topic, host), sort_keys=True, separators=(",", ":")),
    ]
    if render_needs_scale_out(vllm_version):
        args.append(SCALE_OUT_FLAG)
    return args

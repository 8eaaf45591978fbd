"""The router's options and the `npu-runtime route` command line that gives them.

    npu-runtime route --prefill URL [--prefill URL ...] --decode URL [--decode URL ...]
        [--port 8000] [--metrics-port 9090] [--connect-timeout 5] [--first-byte-timeout 600]
        [--idle-timeout 60] [--retries 2] [--eject-seconds 2] [--resolve-seconds 5]
        [--max-in-flight 1024] [--max-request-bytes 8388608] [--max-buffered-bytes 134217728]
        [--kv-host-network CIDR ...]
        [--cache-aware [--kv-events-port 5557] [--kv-replay-port 5558] [--kv-events-ranks 1]
         [--cache-load-factor 2] [--prefix-max-blocks 262144]]

`parse_route_args` reads the arguments into `RouterOptions`; `route_argv` writes them back (the
operator renders the router's Deployment with it). `--cache-aware` and the options after it are the
prefix-cache-aware choice of the prefill engine (choice.py, prefix.py, kv_events.py); without it the
router chooses by load alone, as before.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from collections.abc import Sequence
from typing import Any, Final

from npu_runtime.contract import DEFAULT_METRICS_PORT, DEFAULT_PORT, KV_EVENTS_PORT, KV_REPLAY_PORT
from npu_runtime.routing.engines import DEFAULT_EJECT_SECONDS, DEFAULT_RESOLVE_SECONDS
from npu_runtime.routing.prefix import DEFAULT_MAX_BLOCKS

ROLES: Final = ("prefill", "decode")
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_FIRST_BYTE_TIMEOUT: Final = 600.0
DEFAULT_IDLE_TIMEOUT: Final = 60.0
DEFAULT_RETRIES: Final = 2
DEFAULT_MAX_IN_FLIGHT: Final = 1024
DEFAULT_MAX_REQUEST_BYTES: Final = 8 << 20
DEFAULT_MAX_BUFFERED_BYTES: Final = 128 << 20
DEFAULT_CACHE_LOAD_FACTOR: Final = 2.0


@dataclasses.dataclass(frozen=True)
class RouterOptions:
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    retries: int = DEFAULT_RETRIES
    eject_seconds: float = DEFAULT_EJECT_SECONDS
    resolve_seconds: float = DEFAULT_RESOLVE_SECONDS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    kv_host_networks: tuple[str, ...] = ()
    cache_aware: bool = False
    kv_events_port: int = KV_EVENTS_PORT
    kv_replay_port: int = KV_REPLAY_PORT
    kv_events_ranks: int = 1
    cache_load_factor: float = DEFAULT_CACHE_LOAD_FACTOR
    prefix_max_blocks: int = DEFAULT_MAX_BLOCKS


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0: {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _at_least(low: float) -> Any:
    def parse(text: str) -> float:
        value = float(text)
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be {low:g} or more: {text}")
        return value

    parse.__name__ = "float"
    return parse


_not_negative = _at_least(0)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (0 to 65535): {text}")
    return value


def _network(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def route_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-runtime route", description="Send each completion to a prefill engine, then to a decode engine."
    )
    engines = parser.add_argument_group("engines")
    engines.add_argument(
        "--prefill", action="append", required=True, help="a prefill engine's base URL (repeatable; a name is resolved)"
    )
    engines.add_argument(
        "--decode", action="append", required=True, help="a decode engine's base URL (repeatable; a name is resolved)"
    )
    engines.add_argument(
        "--resolve-seconds",
        type=_not_negative,
        default=DEFAULT_RESOLVE_SECONDS,
        help="look the URLs' names up again this often, each address one engine, and ask each engine's /v1/models"
        " (its LoRA adapters) (0: once)",
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    progress = parser.add_argument_group("progress (no bound on a generation that makes progress)")
    progress.add_argument(
        "--connect-timeout",
        type=_positive(float),
        default=DEFAULT_CONNECT_TIMEOUT,
        help="seconds to connect to an engine, and for its /health to answer",
    )
    progress.add_argument(
        "--first-byte-timeout",
        "--timeout",
        dest="first_byte_timeout",
        type=_positive(float),
        default=DEFAULT_FIRST_BYTE_TIMEOUT,
        help="seconds until an engine's answer starts: prefill's answer, a stream's first chunk (--timeout: old name)",
    )
    progress.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=DEFAULT_IDLE_TIMEOUT,
        help="seconds a stream may be silent; while an answer has not started, /health is checked this often",
    )
    failures = parser.add_argument_group("failures")
    failures.add_argument(
        "--retries", type=int, default=DEFAULT_RETRIES, help="retries of a call, each on a different engine of its role"
    )
    failures.add_argument(
        "--eject-seconds",
        type=_positive(float),
        default=DEFAULT_EJECT_SECONDS,
        help="how long a failed engine is out before its /health is probed (doubling in a row, at most 60 s)",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-in-flight", type=_positive(int), default=DEFAULT_MAX_IN_FLIGHT, help="requests at once (503 beyond)"
    )
    limits.add_argument(
        "--max-request-bytes",
        type=_positive(int),
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="one request body (413 beyond)",
    )
    limits.add_argument(
        "--max-buffered-bytes",
        type=_positive(int),
        default=DEFAULT_MAX_BUFFERED_BYTES,
        help="request bodies and prefill answers held at once (503 beyond)",
    )
    parser.add_argument(
        "--kv-host-network",
        dest="kv_host_networks",
        action="append",
        type=_network,
        default=[],
        help="a network whose hosts prefill's KV parameters may name besides the prefill engines (repeatable)",
    )
    cache = parser.add_argument_group("cache-aware choice of the prefill engine (docs/disaggregation.md)")
    cache.add_argument(
        "--cache-aware",
        action="store_true",
        help="send a prompt to the prefill engine where it takes least time, counting the prefix the engine"
        " holds (its KV events, else the prompts sent to it) as not to be computed; the prompt's tokens come"
        " from a prefill engine's /tokenize (one more call per request)",
    )
    cache.add_argument(
        "--kv-events-port",
        type=_port,
        default=KV_EVENTS_PORT,
        help="the port of each prefill engine's KV events (vLLM --kv-events-config endpoint; 0: none, the"
        " prompts sent alone)",
    )
    cache.add_argument(
        "--kv-replay-port",
        type=_port,
        default=KV_REPLAY_PORT,
        help="the port of its KV events' replay endpoint, asked after a gap (0: none; a gap clears the index)",
    )
    cache.add_argument(
        "--kv-events-ranks",
        type=_positive(int),
        default=1,
        help="data parallel ranks per prefill engine, each publishing on the port plus its rank",
    )
    cache.add_argument(
        "--cache-load-factor",
        type=_at_least(1),
        default=DEFAULT_CACHE_LOAD_FACTOR,
        help="the cached prefix counts only on an engine at most this many times as loaded as the least loaded",
    )
    cache.add_argument(
        "--prefix-max-blocks",
        type=_positive(int),
        default=DEFAULT_MAX_BLOCKS,
        help="cached blocks the router keeps per prefill engine and rank (oldest dropped)",
    )
    return parser


def route_argv(options: RouterOptions) -> list[str]:
    """The `route` arguments (without `npu-runtime route`) that parse back to `options`: the engines,
    ports, first-byte timeout and retries always, anything else when it is not the default."""
    argv: list[str] = []
    for role in ROLES:
        for url in options.prefill if role == "prefill" else options.decode:
            argv += [f"--{role}", url]
    argv += ["--port", str(options.port), "--metrics-port", str(options.metrics_port)]
    argv += ["--first-byte-timeout", f"{options.first_byte_timeout:g}", "--retries", str(options.retries)]
    defaults = RouterOptions(prefill=options.prefill, decode=options.decode)
    for field in dataclasses.fields(RouterOptions):
        if field.name in ("prefill", "decode", "port", "metrics_port", "first_byte_timeout", "retries"):
            continue
        value = getattr(options, field.name)
        if value == getattr(defaults, field.name):
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.name == "kv_host_networks":
            for network in value:
                argv += ["--kv-host-network", network]
        elif isinstance(value, bool):
            argv.append(flag)  # a flag, set (its default is off)
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def parse_route_args(argv: Sequence[str]) -> RouterOptions:
    args = route_parser().parse_args(list(argv))
    return RouterOptions(
        prefill=tuple(args.prefill),
        decode=tuple(args.decode),
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        connect_timeout=args.connect_timeout,
        first_byte_timeout=args.first_byte_timeout,
        idle_timeout=args.idle_timeout,
        retries=args.retries,
        eject_seconds=args.eject_seconds,
        resolve_seconds=args.resolve_seconds,
        max_in_flight=args.max_in_flight,
        max_request_bytes=args.max_request_bytes,
        max_buffered_bytes=args.max_buffered_bytes,
        kv_host_networks=tuple(args.kv_host_networks),
        cache_aware=args.cache_aware,
        kv_events_port=args.kv_events_port,
        kv_replay_port=args.kv_replay_port,
        kv_events_ranks=args.kv_events_ranks,
        cache_load_factor=args.cache_load_factor,
        prefix_max_blocks=args.prefix_max_blocks,
    )

"""What the router takes from clients and from engines, and how much of it (docs/security.md).

- The KV parameters decode gets come from the prefill engine only, checked here
  (`check_kv_params`): the keys vllm-ascend's Mooncake connectors write (v0.23.0,
  vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py and mooncake_hybrid_connector.py,
  `MooncakeConnectorScheduler.request_finished`), each of its type and within bounds, and every host
  they name an address of the role's prefill engines (or of a network the router is told to trust).
  A client's own `kv_transfer_params` never reach either engine.
- Bodies are bounded: a client's (`--max-request-bytes`, and `--max-buffered-bytes` for all of them
  together, with the prefill answers being read), a prefill answer (`MAX_PREFILL_ANSWER_BYTES`),
  an engine's error (`MAX_ERROR_BYTES`).
- An engine's error reaches the client as JSON: its own JSON object as written, anything else as
  the text of the router's error object, never with the engine's content type.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from aiohttp import StreamReader

MAX_PREFILL_ANSWER_BYTES: Final = 1 << 20  # one token and the KV location: a few KiB for a long prompt
MAX_ERROR_BYTES: Final = 64 << 10
MAX_ERROR_TEXT: Final = 2000  # characters of a non-JSON error kept in the router's message

# The keys Mooncake's request_finished writes, and what each may hold.
MAX_BLOCK_IDS: Final = 1 << 20  # over all groups; a 1M-token prompt in 128-token blocks is 8192
MAX_ID_LENGTH: Final = 256
MAX_SIZE: Final = 1 << 16  # parallel sizes, block size
MAX_NODES: Final = 1024  # entries of remote_multi_nodes_meta_mapping
MAX_TOKEN_ID: Final = 1 << 31


class Refused(ValueError):
    """Something an engine or a client sent that the router does not pass on; `reason` is a label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


AddressCheck = Callable[[str], bool]


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()


def _block_ids(value: Any) -> int:
    """How many block ids `value` holds (a list of ints, or of lists of ints); -1 if it is neither."""
    if not isinstance(value, list):
        return -1
    if all(_int(item, 0, MAX_TOKEN_ID) for item in value):
        return len(value)
    total = 0
    for group in value:
        if not isinstance(group, list) or not all(_int(item, 0, MAX_TOKEN_ID) for item in group):
            return -1
        total += len(group)
    return total


def _port(value: Any) -> bool:
    return _int(value, 1, 65536)


def _size(value: Any) -> bool:
    return value is None or _int(value, 1, MAX_SIZE)


def _block_size(value: Any) -> bool:
    return _int(value, 0, MAX_SIZE) or (
        isinstance(value, list) and len(value) <= 64 and all(_int(item, 0, MAX_SIZE) for item in value)
    )


_CHECKS: Final[Mapping[str, Callable[[Any], bool]]] = {
    "do_remote_prefill": lambda v: v is True,
    "do_remote_decode": lambda v: v is False,
    "remote_block_ids": lambda v: 0 <= _block_ids(v) <= MAX_BLOCK_IDS,
    "remote_engine_id": _text,
    "remote_request_id": _text,
    "remote_port": _port,
    "remote_pcp_size": _size,
    "remote_dcp_size": _size,
    "remote_ptp_size": _size,
    "last_token_id": lambda v: _int(v, 0, MAX_TOKEN_ID),
    "num_prompt_blocks": lambda v: _int(v, 0, MAX_BLOCK_IDS + 1),
    "remote_block_size": _block_size,
}
HOST_KEYS: Final = frozenset({"remote_host", "remote_multi_nodes_meta_mapping"})
KV_PARAM_KEYS: Final = frozenset(_CHECKS) | HOST_KEYS
REQUIRED_KV_PARAM_KEYS: Final = frozenset({"remote_engine_id", "remote_host", "remote_port"})
NODE_KEYS: Final = frozenset({"host", "engine_id", "handshake_port"})


def check_kv_params(params: Any, host_allowed: AddressCheck) -> dict[str, Any] | None:
    """Prefill's `kv_transfer_params` as decode may get them, or None when it gave none.

    Raises `Refused` for anything else: a key Mooncake does not write, a value of the wrong type or
    out of bounds, a host that is not an address `host_allowed` accepts.
    """
    if params is None or params == {}:
        return None
    if not isinstance(params, dict):
        raise Refused("kv_params_invalid", "kv_transfer_params is not an object")
    unknown = sorted(set(params) - KV_PARAM_KEYS)
    if unknown:
        raise Refused("kv_params_unknown_key", f"kv_transfer_params has keys no known connector writes: {unknown[:5]}")
    missing = sorted(REQUIRED_KV_PARAM_KEYS - set(params))
    if missing:
        raise Refused("kv_params_invalid", f"kv_transfer_params lacks {missing}")
    for key, check in _CHECKS.items():
        if key in params and not check(params[key]):
            raise Refused("kv_params_invalid", f"kv_transfer_params.{key} is not valid")
    _check_host(params["remote_host"], "remote_host", host_allowed)
    nodes = params.get("remote_multi_nodes_meta_mapping", {})
    if not isinstance(nodes, dict) or len(nodes) > MAX_NODES:
        raise Refused("kv_params_invalid", "kv_transfer_params.remote_multi_nodes_meta_mapping is not valid")
    for rank, node in nodes.items():
        where = "remote_multi_nodes_meta_mapping"
        if not (isinstance(rank, str) and len(rank) <= 16 and isinstance(node, dict) and set(node) <= NODE_KEYS):
            raise Refused("kv_params_invalid", f"kv_transfer_params.{where} has an invalid entry")
        if "engine_id" in node and not _text(node["engine_id"]):
            raise Refused("kv_params_invalid", f"kv_transfer_params.{where}.{rank[:16]}.engine_id is not valid")
        if "handshake_port" in node and not _port(node["handshake_port"]):
            raise Refused("kv_params_invalid", f"kv_transfer_params.{where}.{rank[:16]}.handshake_port is not valid")
        _check_host(node.get("host"), f"{where}.{rank}.host", host_allowed)
    return params


def _check_host(value: Any, where: str, host_allowed: AddressCheck) -> None:
    if not isinstance(value, str) or len(value) > 64:
        raise Refused("kv_params_invalid", f"kv_transfer_params.{where} is not an address")
    if not host_allowed(value):
        message = f"kv_transfer_params.{where} {value!r} is not a prefill engine's address"
        raise Refused("kv_params_foreign_host", message)


def address_check(
    engines: Callable[[], frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]],
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...],
) -> AddressCheck:
    """A host is allowed when it is an IP address of one of `engines()` or inside one of `networks`."""

    def allowed(host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a name: it could resolve anywhere
        return address in engines() or any(address in network for network in networks)

    return allowed


# --- bodies ----------------------------------------------------------------------------------------


class ByteBudget:
    """The bytes the router holds for all requests together (bodies and prefill answers)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, count: int) -> bool:
        if self.used + count > self.limit:
            return False
        self.used += count
        return True

    def give(self, count: int) -> None:
        self.used -= count


class Held:
    """What one request took from the budget, given back at its end."""

    __slots__ = ("budget", "count")

    def __init__(self, budget: ByteBudget) -> None:
        self.budget, self.count = budget, 0

    def take(self, count: int) -> bool:
        if not self.budget.take(count):
            return False
        self.count += count
        return True

    def release(self) -> None:
        self.budget.give(self.count)
        self.count = 0


class TooLarge(Exception):
    """A body over its limit."""


class Full(Exception):
    """The router holds as many bytes as it may."""


async def read_bounded(content: StreamReader, limit: int, held: Held | None = None) -> bytes:
    """A whole body, at most `limit` bytes (`TooLarge` beyond), each piece taken from `held`'s budget."""
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await content.readany()
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"over {limit} bytes")
        if held is not None and not held.take(len(chunk)):
            raise Full()
        parts.append(chunk)


def parse_json(data: bytes) -> Any:
    """JSON, or ValueError for anything that is not (nesting too deep for Python included)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None


def dump_json(value: Any) -> bytes:
    """`value` as compact JSON bytes; ValueError when it cannot be written (nesting too deep)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except RecursionError:
        raise ValueError("nested too deeply") from None


def engine_error(role: str, status: int, data: bytes, truncated: bool) -> bytes:
    """An engine's error answer as the client gets it: its JSON object as written, else its text
    inside the router's error object (the engine's content type is never passed on)."""
    if not truncated:
        try:
            value = parse_json(data)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return data
    text = data[: MAX_ERROR_TEXT * 4].decode("utf-8", "replace")[:MAX_ERROR_TEXT]
    if truncated:
        text += " [...]"
    message = f"{role} engine answered {status}: {text}" if text.strip() else f"{role} engine answered {status}"
    return dump_json({"error": {"message": message, "type": f"{role}_http_{status}", "code": status}})


def finite_number(value: Any) -> float | None:
    """`value` when it is a finite, non-negative number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None

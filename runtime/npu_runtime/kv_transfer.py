"""KV transfer between a prefill engine and a decode engine: the connector's settings, checked.

A disaggregated resource runs two engines per request: a prefill engine (vLLM's `kv_producer`)
computes the prompt's KV cache and a decode engine (`kv_consumer`) receives it and generates.
Both are told which connector moves the KV with vLLM's `--kv-transfer-config` (a JSON object).
The operator renders it per role with `KVTransfer.to_json`; the runtime passes it to the engine,
mapped to the device (`for_device`). Pure: no torch, no vllm, no I/O.

The rules come from vllm-ascend v0.23.0's Mooncake connectors
(vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py):
- `MooncakeConnectorWorker._get_prefill_decode_size` asserts `tp_size` and `dp_size` under both
  `kv_connector_extra_config.prefill` and `.decode` (the sizes of the *other* role too: each side
  mirrors both), and that the decode role's `pp_size` is 1;
- every rank listens on `kv_port + dp_rank * tp * pp (+ its device index)`
  (`MooncakeConnectorScheduler.__init__`, `side_channel_port`), so a role uses the ports
  `[kv_port, kv_port + dp * tp * pp)`;
- `_get_remote_metadata` asserts that a peer's engine id differs from its own: engine ids must be
  unique (vLLM appends `_dp<rank>` per data-parallel rank, vllm/v1/engine/utils.py);
and from its P/D tutorial (docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md,
"kv_port Configuration Guide"): Mooncake's AscendDirectTransport takes random ports in
`[20000, 20000 + NPUs per node x 1000)`, so `kv_port` must start above that range.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Final

# vllm-ascend's KV connectors for P/D (registered in vllm_ascend/distributed/kv_transfer/__init__.py).
# MooncakeConnectorV1 is the one its single- and multi-node P/D tutorials start with; the layerwise
# one streams KV layer by layer and pairs with the decode-first proxy.
CONNECTORS: Final = ("MooncakeConnectorV1", "MooncakeLayerwiseConnector")
DEFAULT_CONNECTOR: Final = "MooncakeConnectorV1"
# vLLM's file-based connector (vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py):
# what a Mooncake connector becomes on a CPU, where there is no NPU and no Mooncake transfer engine.
CPU_CONNECTOR: Final = "ExampleConnector"
SHARED_STORAGE_KEY: Final = "shared_storage_path"  # ExampleConnector's extra config key
# The role names of this project and vLLM's kv_role for each.
KV_ROLES: Final = {"prefill": "kv_producer", "decode": "kv_consumer"}
# Keys of kv_connector_extra_config that the sizes of the roles own (the rest is the user's).
SIZE_KEYS: Final = ("prefill", "decode")
MAX_PORT: Final = 65535


def reserved_port_floor(npus_per_node: int) -> int:
    """The first port above AscendDirectTransport's random range for this many NPUs per node."""
    return 20000 + npus_per_node * 1000


@dataclasses.dataclass(frozen=True)
class RoleSizes:
    """A role's parallel sizes, as the connector's extra config mirrors them."""

    data: int
    tensor: int
    pipeline: int = 1

    def ports(self) -> int:
        """How many consecutive ports from kv_port the role's ranks listen on."""
        return self.data * self.tensor * self.pipeline

    def to_config(self) -> dict[str, int]:
        config = {"dp_size": self.data, "tp_size": self.tensor}
        if self.pipeline != 1:
            config["pp_size"] = self.pipeline
        return config


@dataclasses.dataclass(frozen=True)
class KVTransfer:
    """One role's `--kv-transfer-config`."""

    connector: str
    role: str  # prefill | decode
    port: int
    prefill: RoleSizes
    decode: RoleSizes
    engine_id: str | None = None  # None: vLLM draws a uuid4
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_config(self) -> dict[str, Any]:
        extra = {**self.extra, "prefill": self.prefill.to_config(), "decode": self.decode.to_config()}
        config: dict[str, Any] = {
            "kv_connector": self.connector,
            "kv_role": KV_ROLES[self.role],
            "kv_port": self.port,
            "kv_connector_extra_config": {key: extra[key] for key in sorted(extra)},
        }
        if self.engine_id is not None:
            config["engine_id"] = self.engine_id
        return config

    def to_json(self) -> str:
        return json.dumps(self.to_config(), sort_keys=True, separators=(",", ":"))


def problems(transfer: KVTransfer, npus_per_node: int) -> list[tuple[str, str]]:
    """(setting, why) for each rule of vllm-ascend's connectors that `transfer` breaks."""
    found: list[tuple[str, str]] = []
    if transfer.connector not in CONNECTORS:
        found.append(("connector", f"{transfer.connector!r} is not one of {', '.join(CONNECTORS)}"))
    if transfer.role not in KV_ROLES:
        found.append(("role", f"{transfer.role!r} is not prefill or decode"))
    if transfer.decode.pipeline != 1:
        found.append(("decode.pipeline", "the decode role cannot use pipeline parallelism (pp_size must be 1)"))
    floor = reserved_port_floor(npus_per_node)
    if transfer.port < floor:
        found.append(
            (
                "port",
                f"{transfer.port} is inside [20000, {floor}), the ports Mooncake's AscendDirectTransport "
                f"takes at random with {npus_per_node} NPUs per node; use {floor} or more",
            )
        )
    sizes = transfer.prefill if transfer.role == "prefill" else transfer.decode
    if transfer.port + sizes.ports() - 1 > MAX_PORT:
        found.append(("port", f"{transfer.role} ranks listen on {transfer.port}..{transfer.port + sizes.ports() - 1}"))
    reserved = SIZE_KEYS & transfer.extra.keys()
    if reserved:
        found.append(("extraConfig", f"{', '.join(sorted(reserved))} are set from the roles' parallelism"))
    return found


def role_of(config_text: str) -> str | None:
    """The role (prefill/decode) a `--kv-transfer-config` asks for; None when it names none."""
    kv_role = json.loads(config_text).get("kv_role")
    return next((role for role, value in KV_ROLES.items() if value == kv_role), None)


def for_device(config_text: str, device_kind: str) -> tuple[str, str | None]:
    """The `--kv-transfer-config` the engine gets on `device_kind`, and a note when it was mapped.

    On an NPU (or a GPU) the config goes unchanged. On a CPU a Mooncake connector cannot start (it
    needs NPUs and Mooncake's transfer engine), so it becomes vLLM's ExampleConnector: the same
    kv_role, the KV written as files under `shared_storage_path` (taken from the extra config, else
    a folder in the temporary directory) that the decode engine reads back. Both engines must see
    that folder: on one machine they do.
    """
    config = json.loads(config_text)
    if device_kind != "cpu" or config.get("kv_connector") not in CONNECTORS:
        return config_text, None
    extra = dict(config.get("kv_connector_extra_config") or {})
    path = extra.get(SHARED_STORAGE_KEY) or os.path.join(tempfile.gettempdir(), "npu-runtime-kv")
    mapped = {
        "kv_connector": CPU_CONNECTOR,
        "kv_role": config.get("kv_role"),
        "kv_connector_extra_config": {SHARED_STORAGE_KEY: path},
    }
    if "engine_id" in config:
        mapped["engine_id"] = config["engine_id"]
    note = f"{config['kv_connector']} needs an NPU: on this CPU the KV goes through {CPU_CONNECTOR} files in {path}"
    return json.dumps(mapped, sort_keys=True, separators=(",", ":")), note

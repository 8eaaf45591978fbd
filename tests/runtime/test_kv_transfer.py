"""The KV connector settings of a prefill/decode pair, against the rules of vllm-ascend's connectors.

vllm-ascend v0.23.0, vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py:
`_get_prefill_decode_size` asserts tp_size and dp_size under extra config `prefill` and `decode`
and decode pp_size 1; `side_channel_port` = kv_port + dp_rank * tp * pp; engine ids differ
(`_get_remote_metadata`). The tutorial's kv_port table keeps kv_port above AscendDirectTransport's
[20000, 20000 + NPUs per node x 1000).
"""

from __future__ import annotations

import json

from npu_runtime import kv_transfer
from npu_runtime.contract import ServeOptions, parse_serve_args, serve_argv
from npu_runtime.kv_transfer import KVTransfer, RoleSizes
from npu_runtime.serving.launch import engine_argv

# vllm-ascend's multi-node DeepSeek P/D tutorial: prefill dp 2 x tp 8, decode dp 32 x tp 1, 16 NPUs per node.
PREFILL, DECODE = RoleSizes(data=2, tensor=8), RoleSizes(data=32, tensor=1)


def transfer(role: str, **changes: object) -> KVTransfer:
    base: dict[str, object] = {
        "connector": "MooncakeConnectorV1",
        "role": role,
        "port": 36000,
        "prefill": PREFILL,
        "decode": DECODE,
        "engine_id": "$(POD_NAME)",
    }
    return KVTransfer(**{**base, **changes})  # type: ignore[arg-type]


def test_each_role_mirrors_both_roles_sizes_as_the_connector_asserts() -> None:
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        config = json.loads(transfer(role).to_json())
        assert config["kv_role"] == kv_role and config["kv_connector"] == "MooncakeConnectorV1"
        extra = config["kv_connector_extra_config"]
        for side, sizes in (("prefill", PREFILL), ("decode", DECODE)):
            assert {"tp_size", "dp_size"} <= extra[side].keys()
            assert (extra[side]["dp_size"], extra[side]["tp_size"]) == (sizes.data, sizes.tensor)
        assert extra["decode"].get("pp_size", 1) == 1
        assert isinstance(config["kv_port"], int) and config["engine_id"] == "$(POD_NAME)"


def test_the_tutorials_settings_break_no_rule() -> None:
    assert kv_transfer.problems(transfer("prefill"), npus_per_node=16) == []
    assert kv_transfer.problems(transfer("decode"), npus_per_node=16) == []


def test_a_kv_port_inside_ascend_direct_transports_range_is_refused() -> None:
    [(field, why)] = kv_transfer.problems(transfer("decode", port=30000), npus_per_node=16)
    assert field == "port" and "36000" in why
    assert kv_transfer.problems(transfer("decode", port=28000), npus_per_node=8) == []


def test_ranks_must_find_ports_below_65536() -> None:
    [(field, why)] = kv_transfer.problems(transfer("decode", port=65530), npus_per_node=8)
    assert field == "port" and "65530..65561" in why


def test_decode_cannot_be_pipeline_parallel_and_sizes_are_not_the_users() -> None:
    found = kv_transfer.problems(
        transfer("decode", decode=RoleSizes(32, 1, 2), extra={"prefill": {}}), npus_per_node=16
    )
    assert {field for field, _ in found} == {"decode.pipeline", "extraConfig"}


def test_on_an_npu_the_config_goes_unchanged() -> None:
    text = transfer("prefill").to_json()
    assert kv_transfer.for_device(text, "npu") == (text, None)


def test_on_a_cpu_mooncake_becomes_the_file_based_example_connector_with_the_same_role() -> None:
    text = transfer("decode", extra={"shared_storage_path": "/shared/kv"}).to_json()
    mapped, note = kv_transfer.for_device(text, "cpu")
    assert json.loads(mapped) == {
        "engine_id": "$(POD_NAME)",
        "kv_connector": "ExampleConnector",
        "kv_connector_extra_config": {"shared_storage_path": "/shared/kv"},
        "kv_role": "kv_consumer",
    }
    assert note is not None and "MooncakeConnectorV1" in note and "/shared/kv" in note
    assert kv_transfer.role_of(mapped) == "decode"


def test_the_serve_contract_carries_the_config_to_the_engine() -> None:
    text = transfer("prefill").to_json()
    options = ServeOptions(model="/m", kv_transfer_config=text)
    assert parse_serve_args(serve_argv(options)) == options
    argv = engine_argv(options, ())
    assert argv[argv.index("--kv-transfer-config") + 1] == text

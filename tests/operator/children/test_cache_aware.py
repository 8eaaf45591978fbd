"""spec.cacheAwareRouting: the engines' KV events (pod args, ports, env), the P/D router's args, the picker's
scorer, and the refusals (issue 48)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from npu_operator.api import validation
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import parse_spec
from npu_operator.children import disaggregated, engine_pod, kinds, routing, workloads
from npu_operator.controller.desired import adopted_children, read_spec
from npu_runtime import kv_events
from npu_runtime.contract import (
    KV_EVENTS_BLOCK_SIZE,
    KV_EVENTS_HASH_SEED,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    MAX_DATA_PARALLEL,
    parse_serve_args,
)
from npu_runtime.serving.launch import engine_argv

from tests.examples import example
from tests.operator import traffic_schemas

CONFIG = OperatorConfig()
QWEN = "qwen2.5-7b-910b.yaml"  # one DP rank per pod, spec.routing
DEEPSEEK = "deepseek-r1-w8a8-2node.yaml"  # 4 DP ranks behind each leader's API server
PD = "deepseek-r1-w8a8-pd.yaml"


def with_cache_aware(name: str, value: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest = example(name)
    manifest["spec"]["cacheAwareRouting"] = {} if value is None else value
    manifest["metadata"].setdefault("uid", "11111111-2222-3333-4444-555555555555")
    return manifest


def render(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec, problems = read_spec(manifest, CONFIG)
    assert spec is not None and not problems, problems
    return adopted_children(manifest, spec, CONFIG, kinds.Capabilities.everything())


def picker(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{name}-epp"]
    config: dict[str, Any] = yaml.safe_load(config_map["data"][routing.PICKER_CONFIG_FILE])
    traffic_schemas.validate_picker_config(config)
    return config


def test_the_spec_reads_present_as_on_with_events_by_default() -> None:
    assert parse_spec(with_cache_aware(QWEN)["spec"]).kv_events
    off = parse_spec(with_cache_aware(QWEN, {"kvEvents": False})["spec"])
    assert off.cache_aware_routing is not None and not off.kv_events
    assert parse_spec(example(QWEN)["spec"]).cache_aware_routing is None


def test_the_engine_publishes_its_events_with_the_pods_address_in_the_topic() -> None:
    spec = parse_spec(with_cache_aware(QWEN)["spec"])
    container = workloads.build_deployment("x", "ns", spec, CONFIG)["spec"]["template"]["spec"]["containers"][0]
    # The kubelet expands $(POD_IP) only; the model's name stays a literal.
    args = [re.sub(r"(?<!\$)\$\(POD_IP\)", "10.0.0.7", arg).replace("$$", "$") for arg in container["args"]]
    options = parse_serve_args(args[2:])
    assert options.kv_events_topic == f"kv@10.0.0.7:8000@{spec.model.name}"
    env = {var["name"]: var for var in container["env"]}
    assert env["PYTHONHASHSEED"]["value"] == KV_EVENTS_HASH_SEED
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (ports["kv-events"], ports["kv-replay"]) == (KV_EVENTS_PORT, KV_REPLAY_PORT)
    # What the runtime then gives vLLM.
    argv = engine_argv(options, (), python="python", vllm_version="0.23.0")
    at = argv.index("--kv-events-config")
    assert json.loads(argv[at + 1]) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": f"tcp://*:{KV_REPLAY_PORT}",
        "buffer_steps": 10000,
        "topic": options.kv_events_topic,
    }
    assert argv[argv.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"
    assert argv[argv.index("--block-size") + 1] == str(KV_EVENTS_BLOCK_SIZE)
    assert "--enable-prefix-caching" in argv and kv_events.SCALE_OUT_FLAG not in argv


def test_without_events_the_pod_is_unchanged() -> None:
    plain = workloads.build_deployment("x", "ns", parse_spec(example(QWEN)["spec"]), CONFIG)
    off = workloads.build_deployment("x", "ns", parse_spec(with_cache_aware(QWEN, {"kvEvents": False})["spec"]), CONFIG)
    assert plain == off


def test_the_render_endpoints_switch_follows_the_release_and_never_reaches_a_headless_worker() -> None:
    assert not kv_events.render_needs_scale_out("0.25.1") and kv_events.render_needs_scale_out("0.31.0+cpu")
    options = parse_serve_args(["--model", "/m", "--kv-events", "kv@a:8000@m"])
    assert kv_events.SCALE_OUT_FLAG in engine_argv(options, (), python="p", vllm_version="0.31.0")
    assert kv_events.SCALE_OUT_FLAG not in engine_argv(options, ("--headless",), python="p", vllm_version="0.31.0")


def test_the_replay_ports_stay_clear_of_every_ranks_events_port() -> None:
    events = {KV_EVENTS_PORT + rank for rank in range(MAX_DATA_PARALLEL)}
    replay = {KV_REPLAY_PORT + rank for rank in range(MAX_DATA_PARALLEL)}
    assert not events & replay and max(replay) < 20000  # below AscendDirectTransport's range


def test_the_picker_follows_the_engines_events_with_one_rank_per_pod() -> None:
    config = picker(render(with_cache_aware(QWEN)), "qwen25-7b")
    plugins = {plugin["type"]: plugin.get("parameters", {}) for plugin in config["plugins"]}
    assert plugins["token-producer"] == {
        "modelName": "Qwen/Qwen2.5-7B-Instruct",
        "vllm": {"url": "http://qwen25-7b.llm.svc:8000"},
    }
    assert plugins["precise-prefix-cache-producer"] == {
        "tokenProcessorConfig": {"blockSize": KV_EVENTS_BLOCK_SIZE, "hashSeed": KV_EVENTS_HASH_SEED},
        "kvEventsConfig": {"topicFilter": "kv@", "discoverPods": True, "podDiscoveryConfig": {"socketPort": 5557}},
    }
    assert plugins["prefix-cache-scorer"] == {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"}
    sources = {source["pluginRef"]: source["extractors"] for source in config["dataLayer"]["sources"]}
    assert sources["endpoint-notification-source"] == [{"pluginRef": "precise-prefix-cache-producer"}]
    assert sources["metrics-data-source"] == [{"pluginRef": "core-metrics-extractor"}]


def test_the_picker_keeps_the_approximate_scorer_without_events_or_with_several_ranks_per_pod() -> None:
    for manifest, name in (
        (with_cache_aware(QWEN, {"kvEvents": False}), "qwen25-7b"),
        (with_cache_aware(DEEPSEEK), "deepseek-r1"),
        (example(QWEN), "qwen25-7b"),
    ):
        manifest["metadata"].setdefault("uid", "1")
        manifest["spec"].setdefault("routing", {})
        config = picker(render(manifest), name)
        assert {"type": "prefix-cache-scorer"} in config["plugins"] and "dataLayer" not in config
        assert not {p["type"] for p in config["plugins"]} & {"precise-prefix-cache-producer", "token-producer"}


def test_the_router_is_told_to_follow_the_prefill_engines_events() -> None:
    spec = parse_spec(with_cache_aware(PD)["spec"])
    options = disaggregated.router_options("x", "ns", spec)
    assert spec.disaggregation is not None
    prefill = spec.disaggregation.prefill
    assert options.cache_aware and (options.kv_events_port, options.kv_replay_port) == (KV_EVENTS_PORT, KV_REPLAY_PORT)
    assert options.kv_events_ranks == prefill.parallelism.data // prefill.nodes
    off = disaggregated.router_options("x", "ns", parse_spec(with_cache_aware(PD, {"kvEvents": False})["spec"]))
    assert off.cache_aware and off.kv_events_ranks == 1
    assert (off.kv_events_port, off.kv_replay_port) == (0, 0), "no events to subscribe to: by the prompts sent"
    assert not disaggregated.router_options("x", "ns", parse_spec(example(PD)["spec"])).cache_aware


def test_the_prefill_role_publishes_too() -> None:
    spec = parse_spec(with_cache_aware(PD)["spec"])
    ds = disaggregated.build_disaggregated_set("x", "ns", spec, CONFIG)
    for role in ds["spec"]["roles"]:
        container = role["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        args = [arg.replace("$(LWS_WORKER_INDEX)", "0") for arg in container["args"]]
        assert parse_serve_args(args[2:]).kv_events_topic is not None, role["name"]


def test_flags_and_env_that_fight_the_events_are_refused_with_their_field() -> None:
    manifest = with_cache_aware(QWEN)
    manifest["spec"]["engine"]["extraArgs"] = ["--no-enable-prefix-caching", "--block-size=16", "--kv-events-c", "{}"]
    manifest["spec"]["engine"]["env"] = [{"name": "PYTHONHASHSEED", "value": "1"}]
    problems = {p.field: p.message for p in validation.validate_spec(parse_spec(manifest["spec"]))}
    assert "prefix caching off" in problems["spec.engine.extraArgs[0]"]
    assert "--block-size" in problems["spec.engine.extraArgs[1]"]
    assert "--kv-events-config" in problems["spec.engine.extraArgs[2]"]
    assert "PYTHONHASHSEED" in problems["spec.engine.env[0]"]
    # Without events only turning prefix caching off is refused; without cacheAwareRouting nothing.
    manifest["spec"]["cacheAwareRouting"] = {"kvEvents": False}
    fields = {p.field for p in validation.validate_spec(parse_spec(manifest["spec"]))}
    assert fields == {"spec.engine.extraArgs[0]"}
    del manifest["spec"]["cacheAwareRouting"]
    assert not validation.validate_spec(parse_spec(manifest["spec"]))


def test_the_prefill_roles_own_extra_args_are_checked() -> None:
    manifest = with_cache_aware(PD)
    manifest["spec"]["disaggregation"]["prefill"]["extraArgs"] = ["--prefix-caching-hash-algo", "xxhash"]
    fields = {p.field for p in validation.validate_spec(parse_spec(manifest["spec"]))}
    assert "spec.disaggregation.prefill.extraArgs[0]" in fields


def test_the_topic_keeps_a_models_dollar_literal() -> None:
    manifest = with_cache_aware(QWEN)
    manifest["spec"]["model"]["name"] = "a$(B)"
    assert engine_pod.kv_events_topic(parse_spec(manifest["spec"])) == "kv@$(POD_IP):8000@a$$(B)"

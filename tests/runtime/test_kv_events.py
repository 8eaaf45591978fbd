"""The engine's KV-event endpoints (npu_runtime.kv_events), bound by vLLM's own publisher.

vLLM binds an endpoint only when it is a wildcard (or holds "::") and connects to any other; the
runtime writes a specific IPv4 `--host` IPv4-mapped, so that two engines on one machine, each on an
address of its own, publish on the same port without meeting (the sandbox's pods, these tests).
"""

from __future__ import annotations

import json
import time

import pytest
from npu_runtime import kv_events
from npu_runtime.contract import KV_EVENTS_PORT, KV_REPLAY_PORT


@pytest.mark.parametrize(
    ("host", "bound"),
    [
        ("0.0.0.0", "*"),
        ("::", "*"),
        ("pod.example", "*"),
        ("fd00::7", "*"),
        ("10.1.2.3", "[::ffff:10.1.2.3]"),
        ("127.5.0.2", "[::ffff:127.5.0.2]"),
    ],
)
def test_the_events_listen_where_the_api_does(host: str, bound: str) -> None:
    assert kv_events.bind_address(host) == bound
    config = kv_events.kv_events_config("kv@x@m", host)
    assert config["endpoint"] == f"tcp://{bound}:{KV_EVENTS_PORT}"
    assert config["replay_endpoint"] == f"tcp://{bound}:{KV_REPLAY_PORT}"


def test_the_engine_flags_carry_the_hosts_endpoint() -> None:
    args = kv_events.engine_args("kv@127.5.0.2:8000@m", "0.31.0", "127.5.0.2")
    config = json.loads(args[args.index("--kv-events-config") + 1])
    assert config["endpoint"] == f"tcp://[::ffff:127.5.0.2]:{KV_EVENTS_PORT}"
    assert args[-1] == kv_events.SCALE_OUT_FLAG


def test_two_vllm_publishers_on_one_port_of_two_addresses_each_reach_their_own_subscriber() -> None:
    """vLLM's ZmqEventPublisher binds what the runtime renders (a connect would send nothing here)."""
    zmq = pytest.importorskip("zmq")
    from vllm.distributed.kv_events import AllBlocksCleared, KVEventBatch, ZmqEventPublisher

    port = 47000 + int(time.time()) % 1000
    publishers, subscribers = [], []
    context = zmq.Context()
    try:
        for host in ("127.0.0.7", "127.0.0.8"):
            where = kv_events.bind_address(host)
            publishers.append(
                ZmqEventPublisher(
                    0, endpoint=f"tcp://{where}:{port}", replay_endpoint=f"tcp://{where}:{port + 1}", topic=host
                )
            )
            subscriber = context.socket(zmq.SUB)
            subscriber.setsockopt(zmq.SUBSCRIBE, b"")
            subscriber.connect(f"tcp://{host}:{port}")
            subscribers.append(subscriber)
        time.sleep(0.5)  # the subscriptions reach the publishers
        for publisher in publishers:
            publisher.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))
        for host, subscriber in zip(("127.0.0.7", "127.0.0.8"), subscribers, strict=True):
            assert subscriber.poll(5000), f"nothing published on {host}:{port}"
            topic, _seq, _payload = subscriber.recv_multipart()
            assert topic == host.encode(), "each subscriber hears its own engine only"
    finally:
        for publisher in publishers:
            publisher.shutdown()
        for subscriber in subscribers:
            subscriber.close(linger=0)
        context.term()

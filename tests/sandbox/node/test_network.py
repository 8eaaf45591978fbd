"""The sandbox's pod network: a /16 of the loopback per cluster, an address per pod, the DNS view."""

from __future__ import annotations

import ipaddress
import random
import socket

from npu_sandbox.node.network import CLAIM_PORT, PodNetwork


def test_each_cluster_claims_its_own_range_and_each_pod_gets_its_own_address() -> None:
    # The same draw twice: the second finds the first's range held and takes another.
    first, second = PodNetwork(random.Random(7)), PodNetwork(random.Random(7))
    try:
        assert first.network != second.network
        assert first.network.prefixlen == second.network.prefixlen == 16
        assert first.network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8"))
        assert first.nameserver == str(first.network.network_address + 1)
        with socket.socket() as taken, socket.socket() as probe:
            # Held while the cluster lives: another process's claim of it fails.
            taken.bind(("127.0.0.1", 0))
            try:
                probe.bind((first.nameserver, CLAIM_PORT))
                raise AssertionError("the range is not held")
            except OSError:
                pass
        a, b = first.address("uid-a"), first.address("uid-b")
        assert a != b and first.address("uid-a") == a  # once per pod
        assert ipaddress.IPv4Address(a) in first.network and a != first.nameserver
        # Pods of the two clusters never share an address.
        assert second.address("uid-a") not in (a, b)
    finally:
        first.close()
        second.close()


def test_the_dns_view_spans_namespaces_and_knows_addresses_before_the_status_does() -> None:
    network = PodNetwork()
    try:
        address = network.address("uid-1")
        pod = {
            "metadata": {"name": "api-0", "namespace": "a", "uid": "uid-1", "labels": {"app": "x"}},
            "spec": {},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        service = {"metadata": {"name": "api", "namespace": "a"}, "spec": {"selector": {"app": "x"}}}
        network.publish("a", [service], [pod])
        network.publish("b", [], [])
        assert network.dns().lookup("api.a", "b") == [address]  # from another namespace, as on a cluster
    finally:
        network.close()
